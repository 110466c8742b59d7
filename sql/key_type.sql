-- The idem_key type: validation, comparison, indexes, casts, binary I/O.
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idempotency;
RESET client_min_messages;

-- Output is exactly the input.
SELECT 'order-1001'::idem_key AS k1, '!~'::idem_key AS k2, 'Az09_-.:/'::idem_key AS k3;
SELECT length(repeat('a', 255)::idem_key::text) AS longest;

-- Invalid text forms: 22P02 with what is wrong.
SELECT ''::idem_key;
\echo :LAST_ERROR_SQLSTATE
SELECT repeat('a', 256)::idem_key;
\echo :LAST_ERROR_SQLSTATE
SELECT 'has space'::idem_key;
\echo :LAST_ERROR_SQLSTATE
SELECT E'tab\there'::idem_key;
\echo :LAST_ERROR_SQLSTATE
SELECT E'del\x7f'::idem_key;
\echo :LAST_ERROR_SQLSTATE
SELECT 'café'::idem_key;
\echo :LAST_ERROR_SQLSTATE

-- Bytewise, case-sensitive comparison with every operator.
SELECT 'a'::idem_key = 'a'::idem_key AS eq, 'a'::idem_key = 'A'::idem_key AS eq_case,
       'a'::idem_key <> 'A'::idem_key AS ne, 'A'::idem_key < 'a'::idem_key AS lt,
       'ab'::idem_key <= 'abc'::idem_key AS le, 'b'::idem_key > 'abc'::idem_key AS gt,
       'b'::idem_key >= 'b'::idem_key AS ge;
SELECT k FROM (VALUES ('b'::idem_key), ('B'), ('a'), ('aa'), ('_'), ('~'), ('0')) v(k) ORDER BY k;

-- A primary key, a hash index, hash aggregation.
CREATE TABLE key_table (k idem_key PRIMARY KEY);
INSERT INTO key_table VALUES ('alpha'), ('beta'), ('Alpha');
INSERT INTO key_table VALUES ('alpha');
\echo :LAST_ERROR_SQLSTATE
CREATE TABLE hashed (k idem_key);
INSERT INTO hashed VALUES ('alpha'), ('beta'), ('Beta');
CREATE INDEX hashed_k ON hashed USING hash (k);
SET enable_seqscan = off;
SET enable_bitmapscan = off;
EXPLAIN (COSTS OFF) SELECT k FROM hashed WHERE k = 'beta';
SELECT k FROM hashed WHERE k = 'beta';
DROP TABLE hashed;
EXPLAIN (COSTS OFF) SELECT k FROM key_table WHERE k > 'Alpha' ORDER BY k;
SELECT k FROM key_table WHERE k > 'Alpha' ORDER BY k;
RESET enable_seqscan;
RESET enable_bitmapscan;
SET enable_sort = off;
EXPLAIN (COSTS OFF) SELECT k, count(*) FROM (VALUES ('x'::idem_key), ('x'), ('y')) v(k) GROUP BY k;
SELECT k, count(*) FROM (VALUES ('x'::idem_key), ('x'), ('y')) v(k) GROUP BY k ORDER BY k;
RESET enable_sort;

-- Casts: text and varchar (assignment and explicit), uuid, back to text.
SELECT 'abc'::text::idem_key AS from_text, 'abc'::varchar::idem_key AS from_varchar,
       '6ECD8C99-4036-403D-BF84-CF8400F67836'::uuid::idem_key AS from_uuid,
       'k'::idem_key || '-suffix' AS as_text;
INSERT INTO key_table SELECT 'gamma'::text;
INSERT INTO key_table SELECT 'delta'::varchar;
INSERT INTO key_table SELECT 'not valid'::text;
\echo :LAST_ERROR_SQLSTATE
-- A text variable passed to a function needs ::idem_key.
DO $$
DECLARE t text := 'order-1';
BEGIN
  PERFORM idem_lookup('s', t);
END $$;
\echo :LAST_ERROR_SQLSTATE
DO $$
DECLARE t text := 'order-1';
BEGIN
  PERFORM idem_lookup('s', t::idem_key);
  RAISE NOTICE 'with ::idem_key the call works';
END $$;

-- Binary send/receive round trip, and receive validates like input.
SELECT idem_key_send('abc') AS wire;
COPY (SELECT k FROM key_table ORDER BY k) TO '/tmp/idem_key_regress.bin' WITH (FORMAT binary);
CREATE TABLE key_copy (k idem_key);
COPY key_copy FROM '/tmp/idem_key_regress.bin' WITH (FORMAT binary);
SELECT (SELECT array_agg(k ORDER BY k) FROM key_copy) = (SELECT array_agg(k ORDER BY k) FROM key_table) AS same;
COPY (SELECT 'bad key'::text) TO '/tmp/idem_key_regress.bin' WITH (FORMAT binary);
COPY key_copy FROM '/tmp/idem_key_regress.bin' WITH (FORMAT binary);
\echo :LAST_ERROR_SQLSTATE
DROP TABLE key_table, key_copy;

-- A canonical UUID key is stored in 17 bytes (plus the 4-byte header of a value in
-- memory); any other spelling, and any other key, as its characters.
SELECT pg_column_size('0a1b2c3d-4e5f-6789-abcd-ef0123456789'::idem_key) AS uuid,
       pg_column_size('0A1B2C3D-4E5F-6789-ABCD-EF0123456789'::idem_key) AS uppercase,
       pg_column_size('order-1001'::idem_key) AS other;
-- It reads back, casts, compares and sends as its characters.
SELECT k::text, k = '0a1b2c3d-4e5f-6789-abcd-ef0123456789'::uuid::idem_key AS same_as_uuid,
       k = '0A1B2C3D-4E5F-6789-ABCD-EF0123456789' AS same_as_uppercase,
       encode(idem_key_send(k), 'escape') AS wire, length(k) AS text_length
  FROM (SELECT '0a1b2c3d-4e5f-6789-abcd-ef0123456789'::idem_key AS k) s;
-- Mixed keys order exactly as their characters do.
CREATE TEMP TABLE mixed (k idem_key);
INSERT INTO mixed SELECT gen_random_uuid()::idem_key FROM generate_series(1, 200);
INSERT INTO mixed SELECT left(k::text, 35) FROM mixed LIMIT 50;
INSERT INTO mixed SELECT upper(k::text) FROM mixed LIMIT 50;
INSERT INTO mixed VALUES ('0'), ('9'), ('a'), ('g'), ('~'), ('-'),
  ('00000000-0000-0000-0000-000000000000'), ('ffffffff-ffff-ffff-ffff-ffffffffffff');
SELECT (SELECT array_agg(k::text ORDER BY k) FROM mixed)
     = (SELECT array_agg(k::text ORDER BY k::text COLLATE "C") FROM mixed) AS text_order;
CREATE INDEX ON mixed (k);
SET enable_seqscan = off;
SELECT count(*) AS found_by_index
  FROM mixed m WHERE EXISTS (SELECT FROM mixed n WHERE n.k = m.k::text::idem_key);
RESET enable_seqscan;
DROP TABLE mixed;
