-- What only the SQL-only edition has to prove (the project's regression suite covers the
-- contract). Run by a superuser with psql in a database where the edition is installed:
--   psql -v ON_ERROR_STOP=1 -X -f sqlonly/test/edition.sql
-- Each block raises (and psql stops) when a promise does not hold; the last line
-- printed is "edition: all passed".
\set ON_ERROR_STOP on
SET client_min_messages = warning;
DROP ROLE IF EXISTS regress_sqled_a;
DROP ROLE IF EXISTS regress_sqled_b;
CREATE ROLE regress_sqled_a;
CREATE ROLE regress_sqled_b;
RESET client_min_messages;

-- 1. Row-level security: a role reads its own rows directly, never another's.
SET ROLE regress_sqled_a;
SELECT idem_once('sqled', 'a-1') AS a_stored;
SET ROLE regress_sqled_b;
DO $$
BEGIN
  ASSERT (SELECT count(*) FROM idempotency.keys WHERE scope = 'sqled') = 0,
    'role b sees role a''s row';
  ASSERT idem_once('sqled', 'a-1'), 'role b''s key collided with role a''s';
  ASSERT (SELECT count(*) FROM idempotency.keys WHERE scope = 'sqled') = 1,
    'role b does not see exactly its own row';
  UPDATE idempotency.keys SET response = '"b"' WHERE scope = 'sqled';
END $$;
SET ROLE regress_sqled_a;
DO $$
BEGIN
  ASSERT (SELECT response FROM idem_lookup('sqled', 'a-1')) IS NULL, 'role b changed role a''s row';
END $$;
RESET ROLE;

-- 2. Who may add keys: EXECUTE on idem_claim, idem_once or idem_once_many, however the
-- row would be written (the function, an internal helper, a direct INSERT).
REVOKE EXECUTE ON FUNCTION idem_claim(text, idem_key, bytea, interval, interval, interval),
  idem_once(text, idem_key, interval, interval),
  idem_once_many(text, idem_key[], interval, interval) FROM PUBLIC;
SET ROLE regress_sqled_b;
DO $$
DECLARE
  refused integer := 0;
BEGIN
  BEGIN
    PERFORM idem_claim('sqled', 'b-2', lease => '1 minute');
  EXCEPTION WHEN insufficient_privilege THEN refused := refused + 1;
  END;
  BEGIN
    PERFORM idempotency._claim('sqled', 'b-2', NULL, NULL, '1 minute', NULL);
  EXCEPTION WHEN insufficient_privilege THEN refused := refused + 1;
  END;
  BEGIN
    INSERT INTO idempotency.keys (role, attempt, first_claimed_at, expires_at, scope, key, state)
      VALUES (idempotency._me(), 1, now(), now() + interval '1 day', 'sqled', 'b-2', 'c');
  EXCEPTION WHEN insufficient_privilege THEN refused := refused + 1;
  END;
  ASSERT refused = 3, format('%s of 3 ways to add a key refused', refused);
  -- Finishing stays possible, and a key that is not there is IK004, as natively.
  BEGIN
    PERFORM idem_complete('sqled', 'b-2');
    ASSERT false, 'completed a key that does not exist';
  EXCEPTION WHEN SQLSTATE 'IK004' THEN NULL;
  END;
END $$;
RESET ROLE;
GRANT EXECUTE ON FUNCTION idem_claim(text, idem_key, bytea, interval, interval, interval),
  idem_once(text, idem_key, interval, interval),
  idem_once_many(text, idem_key[], interval, interval) TO PUBLIC;

-- 3. IK002 holds when the transaction switches role before COMMIT (the check must see
-- the claiming role's row whoever commits).
SET ROLE regress_sqled_a;
BEGIN;
SELECT outcome FROM idem_claim('sqled', 'switch');
RESET ROLE;
SET ROLE regress_sqled_b;
DO $$ BEGIN RAISE NOTICE 'committing as b'; END $$;
\set ON_ERROR_STOP off
COMMIT;
\set ON_ERROR_STOP on
SELECT :'LAST_ERROR_SQLSTATE' = 'IK002' AS ik002_after_a_role_switch \gset
\if :ik002_after_a_role_switch
\else
  DO $$ BEGIN RAISE EXCEPTION 'COMMIT after a role switch did not fail with IK002'; END $$;
\endif
RESET ROLE;

-- 4. Many new keys in one transaction: at most 48 subtransactions, all claimed, IK002
-- still guards each (here: all completed), and the claims stay bounded by their index.
BEGIN;
DO $$
DECLARE
  claimed integer;
BEGIN
  SELECT count(*) INTO claimed FROM generate_series(1, 200) g,
    LATERAL idem_claim('sqled-many', ('m-' || g)::idem_key) c WHERE c.outcome = 'claimed';
  ASSERT claimed = 200, format('%s of 200 new keys claimed', claimed);
  ASSERT current_setting('idempotency.subtransactions') = '48',
    format('%s subtransactions taken', current_setting('idempotency.subtransactions'));
  PERFORM idem_complete('sqled-many', ('m-' || g)::idem_key) FROM generate_series(1, 200) g;
END $$;
COMMIT;
DO $$
BEGIN
  ASSERT (SELECT count(*) FROM idempotency.keys WHERE scope = 'sqled-many' AND state = 'c') = 200,
    'the 200 keys are not stored completed';
END $$;

-- 5. idem_stats says which edition serves, with no worker; reading the store by key
-- never plans a sequential scan (a generic plan made on a near-empty store).
DO $$
DECLARE
  s record;
BEGIN
  SELECT * INTO s FROM idem_stats();
  ASSERT s.edition = 'sql' AND s.worker_pid IS NULL AND s.claims_total IS NULL, 'idem_stats';
  ASSERT (SELECT bool_and(coalesce(p.proconfig @> '{enable_seqscan=off}', false))
          FROM pg_proc p
          WHERE p.oid IN ('idem_claim(text, idem_key, bytea, interval, interval, interval)'::regprocedure,
                          'idem_once(text, idem_key, interval, interval)'::regprocedure,
                          'idem_once(text, idem_key, interval, interval)'::regprocedure,
                          'idem_complete(text, idem_key, jsonb, integer)'::regprocedure,
                          'idem_lookup(text, idem_key)'::regprocedure)),
    'a key function may plan a sequential scan of the store';
END $$;

-- 6. Messaging (20_messaging.sql). A role's applied versions are its own, read and
-- written directly too; a new record needs EXECUTE on idem_apply_version, however it
-- is written. Emitting and relaying are granted by the edition's signatures (no
-- route), run as the installing role, and the outbox is read through them only.
SET ROLE regress_sqled_a;
SELECT idem_apply_version('sqled', 'e', 5) AS a_applied;
SET ROLE regress_sqled_b;
DO $$
BEGIN
  ASSERT (SELECT count(*) FROM idempotency.applied_versions WHERE scope = 'sqled') = 0,
    'role b sees role a''s applied version';
  ASSERT idem_apply_version('sqled', 'e', 1), 'role a''s version decided role b''s';
  UPDATE idempotency.applied_versions SET version = 0 WHERE scope = 'sqled';
END $$;
SET ROLE regress_sqled_a;
DO $$
BEGIN
  ASSERT NOT idem_apply_version('sqled', 'e', 5), 'role b changed role a''s version';
END $$;
RESET ROLE;
REVOKE EXECUTE ON FUNCTION idem_apply_version(text, text, bigint, interval) FROM PUBLIC;
SET ROLE regress_sqled_b;
DO $$
DECLARE
  refused integer := 0;
BEGIN
  BEGIN
    PERFORM idem_apply_version('sqled', 'f', 1);
  EXCEPTION WHEN insufficient_privilege THEN refused := refused + 1;
  END;
  BEGIN
    INSERT INTO idempotency.applied_versions (role, expires_at, version, scope, entity, xact)
      VALUES (idempotency._me(), now() + interval '1 day', 1, 'sqled', 'f', '1');
  EXCEPTION WHEN insufficient_privilege THEN refused := refused + 1;
  END;
  ASSERT refused = 2, format('%s of 2 ways to record a version refused', refused);
END $$;
RESET ROLE;
GRANT EXECUTE ON FUNCTION idem_apply_version(text, text, bigint, interval) TO PUBLIC;
GRANT EXECUTE ON FUNCTION idem_emit(text, jsonb, text, jsonb, idem_key) TO regress_sqled_a;
GRANT EXECUTE ON FUNCTION idem_outbox_claim(text, integer, interval, text[]),
  idem_outbox_ack(text, idem_key[]) TO regress_sqled_b;
SET ROLE regress_sqled_a;
SELECT idem_emit('sqled', '{"n": 1}', 'agg', event_id => 'sqled-1') AS emitted;
SET ROLE regress_sqled_b;
DO $$
DECLARE
  refused integer := 0;
BEGIN
  BEGIN
    PERFORM idem_emit('sqled', '{}', event_id => 'sqled-2');
  EXCEPTION WHEN insufficient_privilege THEN refused := refused + 1;
  END;
  BEGIN
    PERFORM FROM idempotency.outbox;
  EXCEPTION WHEN insufficient_privilege THEN refused := refused + 1;
  END;
  BEGIN
    PERFORM idempotency._settle('retry', NULL, NULL, NULL);
  EXCEPTION WHEN insufficient_privilege THEN refused := refused + 1;
  END;
  ASSERT refused = 3, format('%s of 3 ways around the grants refused', refused);
  ASSERT (SELECT array_agg(event_id::text) FROM idem_outbox_claim('sqled-relay', topics => '{sqled}'))
         = '{sqled-1}', 'the relay''s role was not handed another role''s event';
  ASSERT idem_outbox_ack('sqled-relay', '{sqled-1}') = 1, 'the relay''s ack did not count';
END $$;
RESET ROLE;
REVOKE EXECUTE ON FUNCTION idem_emit(text, jsonb, text, jsonb, idem_key) FROM regress_sqled_a;
REVOKE EXECUTE ON FUNCTION idem_outbox_claim(text, integer, interval, text[]),
  idem_outbox_ack(text, idem_key[]) FROM regress_sqled_b;
-- Messaging's writes share the transaction's 48 subtransactions with the keys' (a
-- transaction of many emits and applies does not overflow PostgreSQL's cache of 64).
BEGIN;
DO $$
BEGIN
  ASSERT (SELECT count(idem_emit('sqled', '{}', 'agg-' || g, event_id => ('sqled-m' || g)::idem_key))
          FROM generate_series(1, 60) g) = 60, 'emits';
  ASSERT (SELECT count(*) FILTER (WHERE idem_apply_version('sqled', 'm' || g, 1))
          FROM generate_series(1, 60) g) = 60, 'applies';
  ASSERT current_setting('idempotency.subtransactions') = '48',
    format('%s subtransactions taken', current_setting('idempotency.subtransactions'));
  ASSERT (SELECT count(*) FROM idempotency.outbox
          WHERE topic = 'sqled' AND aggregate LIKE 'agg-%' AND seq = 1) = 60,
    'not every emit stored its event';
END $$;
COMMIT;
DELETE FROM idempotency.applied_versions WHERE scope = 'sqled';
DELETE FROM idempotency.outbox WHERE topic = 'sqled';
DELETE FROM idempotency.outbox_aggregates WHERE topic = 'sqled';

-- 7. IK002 for every pending version a claim writes: the trigger is queued by an
-- UPDATE only when it sets attempt (a takeover) or checkpoint, so both must still fail
-- at COMMIT when the claim is left unfinished; and the store refuses a state that is
-- none of p, c, f, a (the key_state domain, the table's CHECK before). (SQLSTATE: the
-- COMMIT's own status; LAST_ERROR_SQLSTATE would still hold an earlier error.)
SET ROLE regress_sqled_a;
BEGIN;
SELECT outcome FROM idem_claim('sqled', 'checkpointed');
SELECT idem_checkpoint('sqled', 'checkpointed', 'step 1');
\set ON_ERROR_STOP off
COMMIT;
\set ON_ERROR_STOP on
SELECT :'SQLSTATE' = 'IK002' AS ik002_after_a_checkpoint \gset
\if :ik002_after_a_checkpoint
\else
  DO $$ BEGIN RAISE EXCEPTION 'COMMIT after a checkpoint of an unfinished claim did not fail with IK002'; END $$;
\endif
SELECT idem_once('sqled', 'taken-over', ttl => '1 ms');
SELECT pg_sleep(0.01);
BEGIN;
SELECT outcome, attempt FROM idem_claim('sqled', 'taken-over');
\set ON_ERROR_STOP off
COMMIT;
\set ON_ERROR_STOP on
SELECT :'SQLSTATE' = 'IK002' AS ik002_after_a_takeover \gset
\if :ik002_after_a_takeover
\else
  DO $$ BEGIN RAISE EXCEPTION 'COMMIT after taking over an expired key unfinished did not fail with IK002'; END $$;
\endif
\set ON_ERROR_STOP off
INSERT INTO idempotency.keys (role, attempt, first_claimed_at, expires_at, scope, key, state)
  VALUES (quote_ident(current_user)::regrole, 1, now(), now() + interval '1 h', 'sqled', 'bad-state', 'x');
\set ON_ERROR_STOP on
SELECT :'SQLSTATE' = '23514' AS bad_state_refused \gset
\if :bad_state_refused
\else
  DO $$ BEGIN RAISE EXCEPTION 'a row with state x was stored'; END $$;
\endif
RESET ROLE;

-- 8. A batch looks its keys up one by one, by the whole primary key: a scope that the
-- store's statistics do not know yet (filled after the last ANALYZE) is not read whole
-- for each batch (PostgreSQL 15 planned `key = ANY(batch)` so: 20,000 rows read for a
-- batch of 100 new keys).
ALTER TABLE idempotency.keys SET (autovacuum_enabled = off);
ANALYZE idempotency.keys;
SET ROLE regress_sqled_a;
SELECT count(*) FILTER (WHERE added) AS bulk_added
  FROM unnest(idem_once_many('sqled-bulk', ARRAY(SELECT ('bulk-' || g)::idem_key
                                                 FROM generate_series(1, 20000) g))) AS u(added);
-- (Read before and after in one transaction: the counters also hold what earlier
-- transactions read and the server has not yet collected.)
BEGIN;
SELECT idx_tup_fetch AS fetched_before FROM pg_stat_xact_user_tables
  WHERE relid = 'idempotency.keys'::regclass \gset
SELECT count(*) FILTER (WHERE added) AS batch_added
  FROM unnest(idem_once_many('sqled-bulk', ARRAY(SELECT ('batch-' || g)::idem_key
                                                 FROM generate_series(1, 100) g))) AS u(added);
SELECT idx_tup_fetch - :fetched_before AS fetched,
       idx_tup_fetch - :fetched_before < 1000 AS batch_by_key
  FROM pg_stat_xact_user_tables WHERE relid = 'idempotency.keys'::regclass \gset
COMMIT;
\if :batch_by_key
\else
  \echo a batch of 100 new keys read :fetched rows of the store
  DO $$ BEGIN RAISE EXCEPTION 'a batch of 100 new keys read the scope''s rows'; END $$;
\endif
RESET ROLE;
ALTER TABLE idempotency.keys RESET (autovacuum_enabled);

-- 9. An ack reads the acknowledged events by their ids, not the relay's whole backlog:
-- with the statistics taken before the backlog (few pending events), `state = 'p'`,
-- the pending index's predicate, made the ack scan every pending event.
ALTER TABLE idempotency.outbox SET (autovacuum_enabled = off);
SELECT count(idem_emit('sqled.backlog', '{}', 'early-' || g)) AS early FROM generate_series(1, 500) g;
SELECT idem_outbox_ack('sqled-relay', ARRAY(SELECT event_id FROM idem_outbox_claim('sqled-relay', 500)))
  AS early_acked;
ANALYZE idempotency.outbox;
SELECT count(idem_emit('sqled.backlog', '{}', 'late-' || g)) AS late FROM generate_series(1, 2000) g;
CREATE TEMP TABLE sqled_batch AS
  SELECT array_agg(event_id) AS ids FROM idem_outbox_claim('sqled-relay', 2000) WHERE aggregate LIKE 'late-1_';
BEGIN;
SELECT idx_tup_fetch AS fetched_before FROM pg_stat_xact_user_tables
  WHERE relid = 'idempotency.outbox'::regclass \gset
SELECT idem_outbox_ack('sqled-relay', ids) AS batch_acked FROM sqled_batch;
SELECT idx_tup_fetch - :fetched_before AS fetched,
       idx_tup_fetch - :fetched_before < 1000 AS ack_by_id
  FROM pg_stat_xact_user_tables WHERE relid = 'idempotency.outbox'::regclass \gset
COMMIT;
\if :ack_by_id
\else
  \echo an ack of 10 events read :fetched rows of the outbox
  DO $$ BEGIN RAISE EXCEPTION 'an ack read the relay''s backlog'; END $$;
\endif
ALTER TABLE idempotency.outbox RESET (autovacuum_enabled);
DELETE FROM idempotency.outbox WHERE topic = 'sqled.backlog';
DELETE FROM idempotency.outbox_aggregates WHERE topic = 'sqled.backlog';

-- 10. idem_fingerprint(jsonb) writes most flat objects from jsonb's own text (no query):
-- the same digest as the general path (idempotency._canonical_json) for objects made of
-- keys that sort differently by length and by bytes, a prefix before a key that extends
-- it with a space or '!', the empty key, non-ASCII keys, and values that come close to
-- the separators; then with escapes, nesting, fractions ending in 0 and long texts
-- mixed in, which the general path writes.
DO $$
DECLARE
  plain_keys text[] := ARRAY['a', 'b', 'ab', 'a b', 'a!', 'a#', 'A', 'B', '_', '', ' ', '!', '#',
                             '{', '[', ':', ': ', ', ', ',', '0', '.', '~', E'\u00e9', E'\ufb01', E'\U0001F600', 'amount', 'account'];
  plain_values jsonb[] := ARRAY['1', '10', '100', '1.5', '-7', '0', '12.34', '-0.05', 'true', 'false', 'null',
                                '"x"', '"a b"', '""', '"1.50"', '"x0"', '"{"', '"[1]"', '", "', '": ["', '"10.50}"',
                                '"x.y"', '": x"', '"x, "', '", "', '": "', '"x: "', '", x"', E'"\u00e9"']::jsonb[];
  tricky_keys text[] := ARRAY['"', '\', E'\n', E'\u0001', 'k"', E'a\tb'];
  tricky_values jsonb[] := ARRAY['10.50', '1.0', '-0.0', '0.00', '1e3', '"a\"b"', '"\\"', '"\n"', '[1, 2.50]',
                                 '{"b": 1, "a": 2}', '{}', '[]', '"' || repeat('x', 1990) || '"',
                                 '"' || repeat('y', 2030) || '"', '"' || repeat('z', 2060) || '"']::jsonb[];
  keys text[];
  vals jsonb[];
  v jsonb;
BEGIN
  PERFORM setseed(0.25);
  FOR i IN 1 .. 4000 LOOP
    IF i <= 2500 THEN
      keys := plain_keys; vals := plain_values;
    ELSE
      keys := plain_keys || tricky_keys; vals := plain_values || tricky_values;
    END IF;
    v := '{}';
    FOR j IN 1 .. 1 + floor(random() * 6)::int LOOP
      v := v || jsonb_build_object(
             keys[1 + floor(random() * cardinality(keys))::int]
               || CASE WHEN random() < 0.3 THEN keys[1 + floor(random() * cardinality(keys))::int] ELSE '' END,
             vals[1 + floor(random() * cardinality(vals))::int]);
    END LOOP;
    ASSERT idem_fingerprint(v) = sha256(convert_to(idempotency._canonical_json(v), 'UTF8')),
      format('idem_fingerprint(%L) is not the digest of its canonical text %s', v, idempotency._canonical_json(v));
  END LOOP;
END $$;

DELETE FROM idempotency.keys WHERE scope IN ('sqled', 'sqled-many', 'sqled-bulk');
DROP ROLE regress_sqled_a;
DROP ROLE regress_sqled_b;
\echo edition: all passed
