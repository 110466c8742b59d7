-- Hostile input: search_path tricks, roles probing each other, awkward strings.
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idempotency;
DROP ROLE IF EXISTS regress_idem_mallory;
DROP ROLE IF EXISTS regress_idem_victim;
DROP SCHEMA IF EXISTS evil CASCADE;
RESET client_min_messages;

-- Objects named like the extension's internals, earlier on the search_path; each
-- one fails loudly if anything calls it.
CREATE SCHEMA evil;
CREATE TABLE evil.keys (role oid, scope text, key text);
CREATE FUNCTION evil.trap() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN RAISE EXCEPTION 'evil.keys was written'; END $$;
CREATE TRIGGER trap BEFORE INSERT OR UPDATE OR DELETE ON evil.keys
  FOR EACH ROW EXECUTE FUNCTION evil.trap();
CREATE FUNCTION evil.texteq(text, text) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN RAISE EXCEPTION 'evil.texteq was called'; END $$;
CREATE OPERATOR evil.= (LEFTARG = text, RIGHTARG = text, FUNCTION = evil.texteq);
CREATE FUNCTION evil.idem_key_eq(idem_key, idem_key) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN RAISE EXCEPTION 'evil.idem_key_eq was called'; END $$;
CREATE OPERATOR evil.= (LEFTARG = idem_key, RIGHTARG = idem_key, FUNCTION = evil.idem_key_eq);
CREATE FUNCTION evil.sha256(bytea) RETURNS bytea LANGUAGE plpgsql AS $$
BEGIN RAISE EXCEPTION 'evil.sha256 was called'; END $$;
SET search_path = evil, public, pg_catalog;
BEGIN;
SELECT outcome FROM public.idem_claim('h', 'k', public.idem_fingerprint('{"a": 1}'::jsonb));
SELECT public.idem_complete('h', 'k', '"ok"');
COMMIT;
SELECT outcome, response FROM public.idem_claim('h', 'k', public.idem_fingerprint('{"a": 1}'::jsonb));
SELECT state FROM public.idem_lookup('h', 'k');
SELECT public.idem_reap() >= 0 AS reaped, (SELECT keys_total FROM public.idem_stats()) > 0 AS counted;
SELECT count(*) AS evil_rows FROM evil.keys;
RESET search_path;
SELECT idem_forget('h', 'k');
DROP SCHEMA evil CASCADE;

-- A role cannot learn whether another role's key exists: the same key is simply
-- its own, with its own fingerprint, and nothing in the answers differs.
CREATE ROLE regress_idem_victim;
CREATE ROLE regress_idem_mallory;
SET ROLE regress_idem_victim;
BEGIN;
SELECT outcome FROM idem_claim('pay', 'secret', '\x01');
SELECT idem_complete('pay', 'secret', '"victim data"');
COMMIT;
SET ROLE regress_idem_mallory;
SELECT count(*) FROM idem_lookup('pay', 'secret');
SELECT count(*) FROM idem_abandoned('pay');
BEGIN;
SELECT outcome, attempt, response FROM idem_claim('pay', 'secret', '\x02');
SELECT idem_release('pay', 'secret');
COMMIT;
SELECT idem_complete('pay', 'secret');
\echo :LAST_ERROR_SQLSTATE
SELECT idem_forget('pay', 'secret') AS forgot;
SELECT * FROM idem_stats();
\echo :LAST_ERROR_SQLSTATE
SELECT idem_reap();
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;
SET ROLE regress_idem_victim;
SELECT state, response FROM idem_lookup('pay', 'secret');
SELECT idem_forget('pay', 'secret');
RESET ROLE;
DROP ROLE regress_idem_victim;
DROP ROLE regress_idem_mallory;

-- Awkward strings in every text argument are data.
BEGIN;
SELECT outcome FROM idem_claim(E'scope\\with\\backslashes ''and'' "quotes" \t\n', 'k''"\;--');
SELECT idem_checkpoint(E'scope\\with\\backslashes ''and'' "quotes" \t\n', 'k''"\;--',
                       E'point\\0 $$ \r\n', '{"s": "\u0001 \" \\"}');
SELECT checkpoint = E'point\\0 $$ \r\n' AS point_kept, checkpoint_data
FROM idem_lookup(E'scope\\with\\backslashes ''and'' "quotes" \t\n', 'k''"\;--');
SELECT idem_release(E'scope\\with\\backslashes ''and'' "quotes" \t\n', 'k''"\;--');
COMMIT;
SELECT idem_claim(repeat('é', 128), 'k');
\echo :LAST_ERROR_SQLSTATE
SELECT idem_fingerprint('{"nul": "\u0000"}'::jsonb);
\echo :LAST_ERROR_SQLSTATE
SELECT length(idem_fingerprint(repeat('x', 10000000))) AS long_text_digest;
SELECT idem_derive(repeat('k', 255)::idem_key, repeat('step ', 100000)) IS NOT NULL AS long_step;
