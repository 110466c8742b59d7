-- Claiming: rules 1, 2, 3 and 7, expiry, and IK002 at COMMIT and PREPARE.
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idempotency;
RESET client_min_messages;

-- The README's stored procedure (Getting started), from the file the README and the demo use.
\i examples/create_payment.sql

-- First call pays; the retry replays the same response and pays nothing.
CALL create_payment('pay-1', 42, 19.99);
CALL create_payment('pay-1', 42, 19.99);
SELECT count(*) AS payments FROM payments;
-- The same key with a different request: IK001, nothing paid.
CALL create_payment('pay-1', 42, 20.00);
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) AS payments FROM payments;
-- A rolled-back attempt leaves the key free.
BEGIN;
CALL create_payment('pay-2', 7, 5.00);
ROLLBACK;
SELECT count(*) AS rows_for_pay_2 FROM idem_lookup('payments', 'pay-2');
CALL create_payment('pay-2', 7, 5.00);
SELECT count(*) AS payments FROM payments;
-- A key held by a live lease: the procedure raises IK005 (its hint says when to retry,
-- the lease's remaining time, not shown here), so a client can answer 409.
SELECT outcome FROM idem_claim('payments', 'pay-3', lease => '1 hour');
\set VERBOSITY terse
CALL create_payment('pay-3', 7, 5.00);
\set VERBOSITY default
\echo :LAST_ERROR_SQLSTATE
SELECT idem_forget('payments', 'pay-3');
SELECT count(*) AS payments FROM payments;

-- Rule 1: a new key is claimed, attempt 1, state pending.
BEGIN;
SELECT outcome, state, response, attempt, checkpoint, retry_after,
       expires_at - first_claimed_at AS window
FROM idem_claim('s', 'k1', ttl => '1 hour');
-- Rule 7: the same transaction claiming again gets duplicate, never claimed.
SELECT outcome, state, attempt FROM idem_claim('s', 'k1');
SELECT outcome, state, attempt FROM idem_claim('s', 'k1', '\x01');
-- Its own pending claim is visible to idem_lookup inside the transaction.
SELECT state, attempt, response FROM idem_lookup('s', 'k1');
SELECT idem_complete('s', 'k1', '{"ok": true}');
COMMIT;

-- Rule 3: completed keys replay their response, with the first claim's time.
SELECT outcome, state, response, attempt, retry_after,
       first_claimed_at = (SELECT first_claimed_at FROM idem_lookup('s', 'k1')) AS same_first
FROM idem_claim('s', 'k1');
-- Failed keys replay their stored error.
BEGIN;
SELECT outcome FROM idem_claim('s', 'declined');
SELECT idem_fail('s', 'declined', '{"error": "card_declined"}');
COMMIT;
SELECT outcome, state, response FROM idem_claim('s', 'declined');

-- A replay in a transaction that completed the key itself.
BEGIN;
SELECT outcome FROM idem_claim('s', 'k2');
SELECT idem_complete('s', 'k2', '"done"');
SELECT outcome, state, response FROM idem_claim('s', 'k2');
COMMIT;

-- Rule 2: different non-NULL fingerprints are refused, whatever the state.
BEGIN;
SELECT outcome FROM idem_claim('s', 'fp', idem_fingerprint('request A'::text));
SELECT idem_complete('s', 'fp', '{"n": 1}');
COMMIT;
SELECT outcome, response FROM idem_claim('s', 'fp', idem_fingerprint('request A'::text));
SELECT outcome FROM idem_claim('s', 'fp', idem_fingerprint('request B'::text));
\echo :LAST_ERROR_SQLSTATE
-- NULL on either side skips the check.
SELECT outcome FROM idem_claim('s', 'fp');
BEGIN;
SELECT outcome FROM idem_claim('s', 'nofp');
SELECT idem_complete('s', 'nofp');
COMMIT;
SELECT outcome, response FROM idem_claim('s', 'nofp', '\xdeadbeef');

-- Scopes separate keys.
BEGIN;
SELECT outcome FROM idem_claim('other-scope', 'k1');
SELECT idem_release('other-scope', 'k1');
COMMIT;

-- Expiry: after its window a key is free again, its old fingerprint unchecked.
BEGIN;
SELECT outcome FROM idem_claim('s', 'short', '\x01', ttl => '20 milliseconds');
SELECT idem_complete('s', 'short', '1');
COMMIT;
SELECT pg_sleep(0.05);
SELECT count(*) AS visible_after_expiry FROM idem_lookup('s', 'short');
BEGIN;
SELECT outcome, attempt, state, response FROM idem_claim('s', 'short', '\x02');
SELECT idem_complete('s', 'short', '2');
COMMIT;
SELECT outcome, response FROM idem_claim('s', 'short', '\x02');

-- IK002: COMMIT with a pending in-transaction claim fails and rolls back.
BEGIN;
SELECT outcome FROM idem_claim('s', 'unfinished');
COMMIT;
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) AS stored FROM idem_lookup('s', 'unfinished');
-- A bare autocommit claim is the same mistake.
SELECT outcome FROM idem_claim('s', 'autocommit');
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) AS stored FROM idem_lookup('s', 'autocommit');
-- The business write of that transaction is gone too.
BEGIN;
SELECT outcome FROM idem_claim('payments', 'pay-3');
INSERT INTO payments(account, amount) VALUES (1, 1);
COMMIT;
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) AS payments FROM payments;
-- PREPARE TRANSACTION is refused the same way.
BEGIN;
SELECT outcome FROM idem_claim('s', 'prepared');
PREPARE TRANSACTION 'idem_regress';
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) AS prepared FROM pg_prepared_xacts WHERE gid = 'idem_regress';
-- A COMMIT inside a procedure raises it too.
CREATE PROCEDURE claim_and_commit() LANGUAGE plpgsql AS $$
BEGIN
  PERFORM idem_claim('s', 'in-procedure');
  COMMIT;
END $$;
CALL claim_and_commit();
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) AS stored FROM idem_lookup('s', 'in-procedure');

-- Subtransactions: a claim rolled back with its savepoint does not count.
BEGIN;
SAVEPOINT a;
SELECT outcome FROM idem_claim('s', 'sub-1');
ROLLBACK TO a;
COMMIT;
SELECT count(*) AS stored FROM idem_lookup('s', 'sub-1');
-- A completion rolled back with its savepoint leaves the claim pending.
BEGIN;
SELECT outcome FROM idem_claim('s', 'sub-2');
SAVEPOINT a;
SELECT idem_complete('s', 'sub-2', '"x"');
ROLLBACK TO a;
SELECT state FROM idem_lookup('s', 'sub-2');
COMMIT;
\echo :LAST_ERROR_SQLSTATE
-- A completion in a released savepoint counts.
BEGIN;
SELECT outcome FROM idem_claim('s', 'sub-3');
SAVEPOINT a;
SELECT idem_complete('s', 'sub-3', '"x"');
RELEASE a;
COMMIT;
SELECT state, response FROM idem_lookup('s', 'sub-3');
-- A claim in a released savepoint still has to be finished.
BEGIN;
SAVEPOINT a;
SELECT outcome FROM idem_claim('s', 'sub-4');
RELEASE a;
COMMIT;
\echo :LAST_ERROR_SQLSTATE
-- PL/pgSQL exception blocks are subtransactions too.
DO $$
DECLARE c idem_claim_result;
BEGIN
  BEGIN
    c := idem_claim('s', 'sub-5');
    RAISE EXCEPTION 'business failure';
  EXCEPTION WHEN raise_exception THEN
    RAISE NOTICE 'caught: %, the claim went with the block', SQLERRM;
  END;
END $$;
SELECT count(*) AS stored FROM idem_lookup('s', 'sub-5');
DO $$
DECLARE c idem_claim_result;
BEGIN
  c := idem_claim('s', 'sub-6');
  BEGIN
    PERFORM idem_complete('s', 'sub-6', '"done"');
    RAISE EXCEPTION 'late failure';
  EXCEPTION WHEN raise_exception THEN
    RAISE NOTICE 'caught: %, the completion went with the block', SQLERRM;
  END;
END $$;
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) AS stored FROM idem_lookup('s', 'sub-6');

-- A batch applies a message held twice only once (rule 7).
BEGIN;
SELECT m AS message, c.outcome
FROM (VALUES ('m1'), ('m2'), ('m1')) v(m), LATERAL idem_claim('batch', m::idem_key) c;
SELECT idem_complete('batch', 'm1'), idem_complete('batch', 'm2');
COMMIT;
SELECT m AS message, c.outcome FROM (VALUES ('m1'), ('m2')) v(m), LATERAL idem_claim('batch', m::idem_key) c;
