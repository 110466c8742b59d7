-- Finishing: complete, fail, release, checkpoint, forget, once; IK003 and IK004.
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idempotency;
RESET client_min_messages;

-- IK004: nothing to finish.
SELECT idem_complete('f', 'never-claimed');
\echo :LAST_ERROR_SQLSTATE
SELECT idem_fail('f', 'never-claimed');
\echo :LAST_ERROR_SQLSTATE
SELECT idem_release('f', 'never-claimed');
\echo :LAST_ERROR_SQLSTATE
SELECT idem_checkpoint('f', 'never-claimed', 'step');
\echo :LAST_ERROR_SQLSTATE
-- IK003: an attempt given for a key that does not exist.
SELECT idem_complete('f', 'never-claimed', attempt => 1);
\echo :LAST_ERROR_SQLSTATE

-- IK003: finishing a key that is no longer pending.
BEGIN;
SELECT outcome FROM idem_claim('f', 'done');
SELECT idem_complete('f', 'done', '{"id": 1}');
SELECT idem_complete('f', 'done', '{"id": 2}');
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
BEGIN;
SELECT outcome FROM idem_claim('f', 'done');
SELECT idem_complete('f', 'done', '{"id": 1}');
COMMIT;
SELECT idem_fail('f', 'done', '{"e": 1}');
\echo :LAST_ERROR_SQLSTATE
SELECT idem_release('f', 'done');
\echo :LAST_ERROR_SQLSTATE
SELECT state, response FROM idem_lookup('f', 'done');
-- IK003: the wrong attempt for the transaction's own claim.
BEGIN;
SELECT outcome, attempt FROM idem_claim('f', 'attempts');
SELECT idem_complete('f', 'attempts', '1', attempt => 2);
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
BEGIN;
SELECT outcome, attempt FROM idem_claim('f', 'attempts');
SELECT idem_complete('f', 'attempts', '1', attempt => 1);
COMMIT;
SELECT state, response, attempt FROM idem_lookup('f', 'attempts');

-- idem_release removes the key: the next retry executes afresh.
BEGIN;
SELECT outcome FROM idem_claim('f', 'transient');
SELECT idem_release('f', 'transient');
SELECT count(*) AS stored FROM idem_lookup('f', 'transient');
COMMIT;
BEGIN;
SELECT outcome, attempt FROM idem_claim('f', 'transient');
SELECT idem_complete('f', 'transient');
COMMIT;
SELECT state, response FROM idem_lookup('f', 'transient');

-- idem_checkpoint records a recovery point on the transaction's own claim.
BEGIN;
SELECT outcome FROM idem_claim('f', 'phased');
SELECT idem_checkpoint('f', 'phased', 'charged', '{"charge": "ch_1"}');
SELECT state, checkpoint, checkpoint_data FROM idem_lookup('f', 'phased');
SELECT outcome, checkpoint, checkpoint_data FROM idem_claim('f', 'phased');
SELECT idem_complete('f', 'phased', '{"ok": true}');
COMMIT;
SELECT state, checkpoint, checkpoint_data, response FROM idem_lookup('f', 'phased');

-- A committed lease claim is finished only with its current attempt.
SELECT outcome, state, attempt, checkpoint FROM idem_claim('f', 'leased', lease => '1 hour');
SELECT lease_expires_at > now() AS leased, state FROM idem_lookup('f', 'leased');
SELECT idem_complete('f', 'leased', '1');
\echo :LAST_ERROR_SQLSTATE
SELECT idem_complete('f', 'leased', '1', attempt => 7);
\echo :LAST_ERROR_SQLSTATE
SELECT outcome, state, attempt, retry_after > '59 minutes' AS lease_left FROM idem_claim('f', 'leased');
SELECT idem_checkpoint('f', 'leased', 'step-1', '{"n": 1}', attempt => 1);
SELECT idem_complete('f', 'leased', '{"ok": 1}', attempt => 1);
SELECT state, response, checkpoint, lease_expires_at FROM idem_lookup('f', 'leased');

-- idem_forget evicts a key whatever its state.
SELECT idem_forget('f', 'done') AS forgot_done, idem_forget('f', 'done') AS forgot_again;
SELECT count(*) AS stored FROM idem_lookup('f', 'done');
SELECT idem_forget('f', 'leased') AS forgot_leased;

-- idem_once: claim and complete in one call, for message consumers.
SELECT idem_once('inbox', 'msg-1') AS first, idem_once('inbox', 'msg-1') AS redelivered;
SELECT state, attempt, response FROM idem_lookup('inbox', 'msg-1');
BEGIN;
SELECT outcome FROM idem_claim('inbox', 'msg-2');
SELECT idem_once('inbox', 'msg-2') AS held_by_this_transaction;
SELECT idem_complete('inbox', 'msg-2');
COMMIT;
-- It never checks fingerprints and fails for a live lease holder (IK005).
SELECT outcome FROM idem_claim('inbox', 'msg-3', lease => '1 hour');
SELECT idem_once('inbox', 'msg-3');
\echo :LAST_ERROR_SQLSTATE
SELECT idem_forget('inbox', 'msg-3');
SELECT idem_once('inbox', 'msg-3') AS after_forget;
-- A rolled-back once leaves the message unapplied.
BEGIN;
SELECT idem_once('inbox', 'msg-4');
ROLLBACK;
SELECT idem_once('inbox', 'msg-4') AS after_rollback;

-- A batch of messages delivered, delivered again, and overlapping: each message
-- applied once, one row per key. (What each call costs, index scans and insertions,
-- is the native edition's own test: cost.sql.)
BEGIN;
SELECT count(*) FILTER (WHERE idem_once('redelivery', ('m-' || g)::idem_key)) AS applied
  FROM generate_series(1, 100) g;
SELECT count(*) FILTER (WHERE idem_once('redelivery', ('m-' || g)::idem_key)) AS applied
  FROM generate_series(1, 100) g;
SELECT count(*) FILTER (WHERE idem_once('redelivery', ('m-' || g)::idem_key)) AS applied
  FROM generate_series(51, 150) g;
COMMIT;
SELECT count(*) AS keys, count(DISTINCT key) AS distinct_keys
  FROM idempotency.keys WHERE scope = 'redelivery';
-- A transaction whose calls only find their keys writes nothing and takes no
-- transaction id, though the backend's last call inserted.
SELECT idem_once('redelivery', 'one-more') AS inserted;
BEGIN;
SELECT idem_once('redelivery', 'm-1') AS applied, idem_once('redelivery', 'm-2') AS applied;
SELECT pg_current_xact_id_if_assigned() IS NULL AS took_no_transaction_id;
COMMIT;
-- An expired key found by an insertion is claimed again in its row.
UPDATE idempotency.keys SET expires_at = now() - interval '1 second'
  WHERE scope = 'redelivery' AND key = 'm-7';
SELECT idem_once('redelivery', 'new') AS new_key;
SELECT idem_once('redelivery', 'm-7') AS expired_applied_again;
SELECT count(*) AS rows_of_m7 FROM idempotency.keys WHERE scope = 'redelivery' AND key = 'm-7';
DELETE FROM idempotency.keys WHERE scope = 'redelivery';
