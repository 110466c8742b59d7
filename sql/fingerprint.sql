-- idem_fingerprint and idem_derive.
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idempotency;
RESET client_min_messages;

-- text and bytea hash their bytes: the same as core sha256().
SELECT idem_fingerprint('hello'::text) = sha256('hello'::bytea) AS text_is_sha256,
       idem_fingerprint('\x000102'::bytea) = sha256('\x000102'::bytea) AS bytea_is_sha256,
       idem_fingerprint('héllo'::text) = sha256(convert_to('héllo', 'UTF8')) AS text_is_utf8,
       length(idem_fingerprint('x'::text)) AS bytes;

-- jsonb hashes its canonical text (the examples of docs/fingerprint.md).
SELECT idem_fingerprint('{"b":1,"a":[1.50,"x"]}'::jsonb)
         = sha256(convert_to('{"a":[1.5,"x"],"b":1}', 'UTF8')) AS sorted_and_trimmed,
       idem_fingerprint('1e3'::jsonb) = sha256(convert_to('1000', 'UTF8')) AS exponent,
       idem_fingerprint('-0'::jsonb) = sha256(convert_to('0', 'UTF8')) AS minus_zero,
       idem_fingerprint('[1.0, -2.500, 0.000]'::jsonb) = sha256(convert_to('[1,-2.5,0]', 'UTF8')) AS zeros,
       idem_fingerprint('{"s":"a\"b\\c\u0001\n\t/é"}'::jsonb)
         = sha256(convert_to(E'{"s":"a\\"b\\\\c\\u0001\\n\\t/é"}', 'UTF8')) AS escapes,
       idem_fingerprint('{"aa":1,"b":2,"a":3}'::jsonb)
         = sha256(convert_to('{"a":3,"aa":1,"b":2}', 'UTF8')) AS key_bytes_order,
       idem_fingerprint('[true,false,null,{}]'::jsonb)
         = sha256(convert_to('[true,false,null,{}]', 'UTF8')) AS literals;

-- Values equal under jsonb = get equal fingerprints.
SELECT a::jsonb = b::jsonb AS jsonb_equal,
       idem_fingerprint(a::jsonb) = idem_fingerprint(b::jsonb) AS same_fingerprint
FROM (VALUES ('{"x": 1.50, "y": [1, 2]}', '{"y":[1,2],"x":1.5}'),
             ('{"amount": 100}', '{"amount": 1e2}'),
             ('{"amount": 100}', '{"amount": 101}')) v(a, b);

-- idem_derive: hex of the first 16 bytes of sha256(root || 0x00 || step).
SELECT idem_derive('order-123', 'charge') AS derived,
       idem_derive('order-123', 'charge')::text
         = left(encode(sha256(convert_to('order-123', 'UTF8') || '\x00'::bytea || convert_to('charge', 'UTF8')), 'hex'), 32) AS matches,
       idem_derive('order-123', 'charge') <> idem_derive('order-123', 'email') AS per_step;

-- NULL is an error, never a missing fingerprint.
SELECT idem_fingerprint(NULL::jsonb);
\echo :LAST_ERROR_SQLSTATE
SELECT idem_fingerprint(NULL::text);
\echo :LAST_ERROR_SQLSTATE
SELECT idem_derive(NULL, 'x');
\echo :LAST_ERROR_SQLSTATE
SELECT idem_derive('k', NULL);
\echo :LAST_ERROR_SQLSTATE
