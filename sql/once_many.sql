-- idem_once_many: idem_once for a batch of message keys in one call. Element i of the
-- result is what idem_once(scope, keys[i]) would return, the keys processed one by one
-- in array order in the calling transaction; any error fails the whole call and
-- stores nothing of it.
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idempotency;
DROP ROLE IF EXISTS regress_idem_batch_a;
DROP ROLE IF EXISTS regress_idem_batch_b;
RESET client_min_messages;

-- New keys are applied; a key repeated in the batch is true at its first position
-- only; a redelivered batch is all false.
SELECT idem_once_many('mb', ARRAY['m-1', 'm-2', 'm-1', 'm-3', 'm-2']::idem_key[]) AS first;
SELECT idem_once_many('mb', ARRAY['m-3', 'm-1', 'm-4', 'm-2']::idem_key[]) AS redelivered;
SELECT key, state, attempt, response FROM idempotency.keys WHERE scope = 'mb' ORDER BY key;
-- Element i answers keys[i], whatever the array's lower bound.
SELECT idem_once_many('mb', '[0:2]={m-5,m-1,m-5}'::idem_key[]) AS zero_based;
-- An empty array: an empty result.
SELECT idem_once_many('mb', '{}'::idem_key[]) AS empty;
-- The window: ttl (NULL: idempotency.default_ttl) from the call.
SELECT idem_once_many('mb-ttl', ARRAY['t-1', 't-2']::idem_key[], ttl => '10 minutes');
SELECT key, expires_at - first_claimed_at AS window FROM idempotency.keys
  WHERE scope = 'mb-ttl' ORDER BY key;
SELECT idem_once_many('mb-ttl', ARRAY['t-3']::idem_key[]);
SELECT expires_at - first_claimed_at AS window FROM idempotency.keys
  WHERE scope = 'mb-ttl' AND key = 't-3';
-- UUID keys (stored in 17 bytes) and text keys in one batch.
SELECT idem_once_many('mb-uuid', ARRAY['7f1b5c1e-8a1f-4e0e-9c43-5b3e8e2d1a00', 'a',
  '7f1b5c1e-8a1f-4e0e-9c43-5b3e8e2d1a00', 'A']::idem_key[]) AS mixed;

-- The same answers as idem_once, key by key in array order, over keys completed,
-- failed, pending in this transaction (written, and unwritten), abandoned, stale,
-- expired and new, each repeated: the batch against the same keys, one call each, in
-- a twin scope prepared alike.
CREATE FUNCTION pg_temp.prepare(p_scope text) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
  PERFORM idem_once(p_scope, 'completed');
  PERFORM idem_claim(p_scope, 'failed');
  PERFORM idem_fail(p_scope, 'failed', '{"error": "declined"}');
  PERFORM idem_claim(p_scope, 'abandoned', lease => '1 hour');
  PERFORM idem_claim(p_scope, 'stale', lease => '1 hour');
  PERFORM idem_once(p_scope, 'expired');
  UPDATE idempotency.keys SET state = 'a', lease_expires_at = NULL
    WHERE scope = p_scope AND key = 'abandoned';
  UPDATE idempotency.keys SET lease_expires_at = now() - interval '1 second'
    WHERE scope = p_scope AND key = 'stale';
  UPDATE idempotency.keys SET expires_at = now() - interval '1 second'
    WHERE scope = p_scope AND key = 'expired';
END $$;
SELECT pg_temp.prepare('mb-eq-batch'), pg_temp.prepare('mb-eq-single');
BEGIN;
SELECT outcome FROM idem_claim('mb-eq-batch', 'pending-written', lease => '1 hour');
SELECT outcome FROM idem_claim('mb-eq-single', 'pending-written', lease => '1 hour');
SELECT outcome FROM idem_claim('mb-eq-batch', 'pending-unwritten');
SELECT outcome FROM idem_claim('mb-eq-single', 'pending-unwritten');
CREATE TEMP TABLE mb_eq AS
  SELECT ARRAY['new', 'completed', 'failed', 'pending-written', 'pending-unwritten',
               'abandoned', 'stale', 'expired', 'new', 'abandoned', 'stale', 'expired',
               'completed', 'other-new']::idem_key[] AS keys;
CREATE TEMP TABLE mb_eq_batch AS
  SELECT u.key, u.applied, u.i FROM mb_eq,
    unnest(keys, idem_once_many('mb-eq-batch', keys)) WITH ORDINALITY AS u(key, applied, i);
CREATE TEMP TABLE mb_eq_single(key idem_key, applied boolean, i bigint);
DO $$
DECLARE
  k idem_key;
  i bigint := 0;
BEGIN
  FOREACH k IN ARRAY (SELECT keys FROM mb_eq) LOOP
    i := i + 1;
    INSERT INTO mb_eq_single VALUES (k, idem_once('mb-eq-single', k), i);
  END LOOP;
END $$;
SELECT b.key, b.applied AS batch, s.applied AS single
  FROM mb_eq_batch b JOIN mb_eq_single s USING (i) ORDER BY i;
SELECT idem_complete('mb-eq-batch', 'pending-unwritten'), idem_complete('mb-eq-single', 'pending-unwritten');
SELECT idem_complete('mb-eq-batch', 'pending-written', attempt => 1),
       idem_complete('mb-eq-single', 'pending-written', attempt => 1);
COMMIT;
-- Both scopes hold the same rows: takeovers completed as attempt 2.
SELECT key, state, attempt, response FROM idempotency.keys WHERE scope = 'mb-eq-batch'
EXCEPT
SELECT key, state, attempt, response FROM idempotency.keys WHERE scope = 'mb-eq-single';
SELECT key, state, attempt, response FROM idempotency.keys WHERE scope = 'mb-eq-batch'
  ORDER BY key;

-- A live lease holds a key: IK005 at once, and nothing of the call is stored.
SELECT outcome FROM idem_claim('mb-err', 'leased', lease => '1 hour');
SELECT idem_once_many('mb-err', ARRAY['e-1', 'leased', 'e-2']::idem_key[]);
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) AS stored FROM idempotency.keys WHERE scope = 'mb-err' AND key <> 'leased';
-- Nor in a transaction that goes on after a savepoint: the keys the call wrote
-- before the error (e-1 sorts before leased) are gone with it.
BEGIN;
SELECT idem_once_many('mb-err', ARRAY['before']::idem_key[]) AS before;
SAVEPOINT batch;
SELECT idem_once_many('mb-err', ARRAY['e-1', 'leased', 'e-2']::idem_key[]);
\echo :LAST_ERROR_SQLSTATE
ROLLBACK TO batch;
SELECT key FROM idempotency.keys WHERE scope = 'mb-err' ORDER BY key;
SELECT idem_once_many('mb-err', ARRAY['e-1', 'e-2', 'before']::idem_key[]) AS after_rollback;
COMMIT;
-- A PL/pgSQL consumer that catches IK005 and goes on.
DO $$
BEGIN
  PERFORM idem_once_many('mb-err', ARRAY['e-3', 'leased']::idem_key[]);
EXCEPTION WHEN SQLSTATE 'IK005' THEN
  RAISE NOTICE 'caught %: %', SQLSTATE, SQLERRM;
END $$;
SELECT count(*) AS e3_stored FROM idempotency.keys WHERE scope = 'mb-err' AND key = 'e-3';

-- Another transaction's key in flight: two_phase.sql (it needs prepared transactions).

-- Bad input, checked before any key is looked at, in this order: a NULL array or
-- element (22004), more than one dimension (22023), then scope, ttl and wait as
-- idem_once (22004, 22023), then a read-only transaction (25006).
SELECT idem_once_many('mb-bad', NULL);
\echo :LAST_ERROR_SQLSTATE
\set VERBOSITY default
SELECT idem_once_many('mb-bad', ARRAY['a', NULL, 'b']::idem_key[]);
SELECT idem_once_many('mb-bad', '[5:6]={a,NULL}'::idem_key[]);
SELECT idem_once_many('mb-bad', '{{a,b},{c,d}}'::idem_key[]);
\set VERBOSITY terse
SELECT idem_once_many('mb-bad', '{{a,NULL},{c,d}}'::idem_key[]);
\echo :LAST_ERROR_SQLSTATE
SELECT idem_once_many(NULL, '{{a,b},{c,d}}'::idem_key[]);
\echo :LAST_ERROR_SQLSTATE
SELECT idem_once_many(NULL, ARRAY['a']::idem_key[]);
\echo :LAST_ERROR_SQLSTATE
SELECT idem_once_many(NULL, NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT idem_once_many('', ARRAY['a']::idem_key[]);
\echo :LAST_ERROR_SQLSTATE
SELECT idem_once_many(repeat('s', 256), ARRAY['a']::idem_key[]);
\echo :LAST_ERROR_SQLSTATE
SELECT idem_once_many('mb-bad', ARRAY['a']::idem_key[], ttl => '0');
\echo :LAST_ERROR_SQLSTATE
SELECT idem_once_many('mb-bad', ARRAY['a']::idem_key[], wait => '-1 second');
\echo :LAST_ERROR_SQLSTATE
SELECT idem_once_many('mb-bad', ARRAY['a']::idem_key[], ttl => '0', wait => '-1 second');
\echo :LAST_ERROR_SQLSTATE
-- The argument checks come before the empty array's answer.
SELECT idem_once_many('', '{}'::idem_key[]);
\echo :LAST_ERROR_SQLSTATE
BEGIN READ ONLY;
SELECT idem_once_many('mb-bad', '{}'::idem_key[]);
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
-- Even a batch that would only find its keys is refused in a read-only transaction.
BEGIN READ ONLY;
SELECT idem_once_many('mb', ARRAY['m-1']::idem_key[]);
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
-- Invalid keys never reach the function (the array's cast rejects them); 255 bytes is
-- the longest key.
SELECT idem_once_many('mb-bad', ARRAY['ok', 'bad key']::idem_key[]);
\echo :LAST_ERROR_SQLSTATE
SELECT idem_once_many('mb-bad', ARRAY[repeat('k', 256)]::idem_key[]);
\echo :LAST_ERROR_SQLSTATE
SELECT idem_once_many('mb-bad', ARRAY[repeat('k', 255)]::idem_key[]) AS longest;
-- A routing value on a store that is not distributed: 55000, as idem_once.
SELECT idem_once_many('mb-bad', ARRAY['r']::idem_key[], route => 42);
\echo :LAST_ERROR_SQLSTATE
SELECT length(key::text) FROM idempotency.keys WHERE scope = 'mb-bad';

-- Roles never see each other's keys: the same batch is new for each.
CREATE ROLE regress_idem_batch_a;
CREATE ROLE regress_idem_batch_b;
SET ROLE regress_idem_batch_a;
SELECT idem_once_many('mb-roles', ARRAY['x', 'y']::idem_key[]) AS role_a;
SELECT idem_once_many('mb-roles', ARRAY['y', 'z']::idem_key[]) AS role_a_again;
SET ROLE regress_idem_batch_b;
SELECT idem_once_many('mb-roles', ARRAY['x', 'y', 'z']::idem_key[]) AS role_b;
RESET ROLE;
SELECT role, count(*) FROM idempotency.keys WHERE scope = 'mb-roles' GROUP BY role ORDER BY role;

-- Expiry and reaping: an expired key is applied again (its row claimed afresh), a
-- reaped one too.
UPDATE idempotency.keys SET expires_at = now() - interval '1 second'
  WHERE scope = 'mb' AND key IN ('m-1', 'm-2');
SELECT idem_once_many('mb', ARRAY['m-1', 'm-3']::idem_key[]) AS after_expiry;
SELECT idem_reap() >= 1 AS reaped;
SELECT count(*) AS m2_stored FROM idempotency.keys WHERE scope = 'mb' AND key = 'm-2';
SELECT idem_once_many('mb', ARRAY['m-2', 'm-3']::idem_key[]) AS after_reaping;

-- A batch of 1000 new keys, then the same batch delivered again: all applied, then
-- none, one row per key; a batch that names a key this transaction wrote finds it
-- (false). (What each batch costs, index scans and insertions, is the native edition's
-- own test: cost.sql.)
BEGIN;
SELECT cardinality(array_positions(
         idem_once_many('mb-many', ARRAY(SELECT ('n-' || g)::idem_key FROM generate_series(1, 1000) g)),
         true)) AS applied;
SELECT cardinality(array_positions(
         idem_once_many('mb-many', ARRAY(SELECT ('n-' || g)::idem_key FROM generate_series(1, 1000) g)),
         true)) AS applied;
COMMIT;
SELECT count(*) AS keys, count(DISTINCT key) AS distinct_keys FROM idempotency.keys
  WHERE scope = 'mb-many';
BEGIN;
SELECT idem_once_many('mb-own', ARRAY['k1', 'k2']::idem_key[]) AS first;
SELECT idem_once_many('mb-own', ARRAY['k3', 'k0', 'k2']::idem_key[]) AS second;
COMMIT;
SELECT key, state FROM idempotency.keys WHERE scope = 'mb-own' ORDER BY key;
-- A batch that only finds its keys writes nothing and takes no transaction id.
BEGIN;
SELECT idem_once_many('mb-many', ARRAY['n-1', 'n-2']::idem_key[]) AS seen;
SELECT pg_current_xact_id_if_assigned() IS NULL AS took_no_transaction_id;
COMMIT;

DROP ROLE regress_idem_batch_a;
DROP ROLE regress_idem_batch_b;
