-- The identity lock's tag (visible to every role in pg_locks) is HMAC-SHA256, keyed
-- with a per-database secret generated at install that no ordinary role can read, of
-- (role, length of scope, scope, key). So no role can compute another role's tag
-- from a guessed scope and key, or craft one that collides with another role's.
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idempotency;
CREATE EXTENSION IF NOT EXISTS pgcrypto;
DROP ROLE IF EXISTS regress_idem_carol;
RESET client_min_messages;
CREATE ROLE regress_idem_carol;

-- One secret of 32 bytes; closed to ordinary roles, as the whole schema is.
SELECT count(*), bool_and(octet_length(secret) = 32) AS bytes_32 FROM idempotency.lock_secret;
SET ROLE regress_idem_carol;
SELECT * FROM idempotency.lock_secret;
RESET ROLE;

-- Four little-endian bytes, as the library lays out the role and the scope's length.
CREATE FUNCTION le32(n bigint) RETURNS bytea LANGUAGE sql IMMUTABLE AS $$
  SELECT set_byte(set_byte(set_byte(set_byte('\x00000000'::bytea,
           0, (n & 255)::int), 1, ((n >> 8) & 255)::int),
           2, ((n >> 16) & 255)::int), 3, ((n >> 24) & 255)::int) $$;
CREATE FUNCTION le32_at(b bytea, i int) RETURNS bigint LANGUAGE sql IMMUTABLE AS $$
  SELECT get_byte(b, i) + get_byte(b, i + 1) * 256 + get_byte(b, i + 2) * 65536
         + get_byte(b, i + 3)::bigint * 16777216 $$;
-- The tag Carol's claim holds (pg_locks is readable by every role), and the one the
-- superuser computes with the secret.
SET ROLE regress_idem_carol;
BEGIN;
SELECT outcome FROM idem_claim('orders', 'order-77');
CREATE TEMP TABLE carol_locks AS
  SELECT classid::bigint, objid::bigint FROM pg_locks
  WHERE locktype = 'advisory' AND objsubid = 3 AND pid = pg_backend_pid();
SELECT idem_release('orders', 'order-77');
COMMIT;
RESET ROLE;
CREATE TEMP TABLE expected_tag AS
  SELECT le32_at(d, 4) AS classid, le32_at(d, 0) AS objid
  FROM (SELECT hmac(le32('regress_idem_carol'::regrole::oid::bigint) || le32(length('orders'))
                    || convert_to('orders', 'UTF8') || convert_to('order-77', 'UTF8'),
                    (SELECT secret FROM idempotency.lock_secret), 'sha256') AS d) h;
SELECT (SELECT count(*) FROM carol_locks) AS locks,
       (SELECT (classid, objid) FROM carol_locks) = (SELECT (classid, objid) FROM expected_tag)
         AS keyed_with_the_secret;
-- Without the secret the same inputs give another tag.
SELECT (SELECT (le32_at(d, 4), le32_at(d, 0)) FROM
          (SELECT hmac(le32('regress_idem_carol'::regrole::oid::bigint) || le32(6)
                       || convert_to('orders', 'UTF8') || convert_to('order-77', 'UTF8'),
                       '\x00'::bytea, 'sha256') AS d) h)
       = (SELECT (classid, objid) FROM carol_locks) AS guessable;

DROP FUNCTION le32(bigint), le32_at(bytea, int);
DROP TABLE carol_locks, expected_tag;
DROP ROLE regress_idem_carol;

-- The secret is read once per session, with the store's other catalog facts, and kept
-- until the store's own relations change: without Citus preloaded, a change to another
-- table (each SET STATISTICS invalidates its relation) does not drop the cache, so the
-- calls after it read the secret table no more.
CREATE TABLE regress_unrelated (x int);
BEGIN;
SELECT idem_once('secret-cache', 'warm');
SELECT seq_scan AS secret_reads_before FROM pg_stat_xact_user_tables
WHERE relid = 'idempotency.lock_secret'::regclass \gset
ALTER TABLE regress_unrelated ALTER x SET STATISTICS 1;
SELECT idem_once('secret-cache', 'k1');
ALTER TABLE regress_unrelated ALTER x SET STATISTICS 2;
SELECT idem_once('secret-cache', 'k2');
ALTER TABLE regress_unrelated ALTER x SET STATISTICS 3;
SELECT idem_once('secret-cache', 'k3');
SELECT seq_scan - :secret_reads_before AS secret_reads_after FROM pg_stat_xact_user_tables
WHERE relid = 'idempotency.lock_secret'::regclass;
COMMIT;
SELECT idem_forget('secret-cache', k::idem_key) FROM unnest(ARRAY['warm', 'k1', 'k2', 'k3']) k;
DROP TABLE regress_unrelated;
