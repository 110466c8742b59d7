-- A row the calling transaction wrote (or holds as a claim not yet written) is live
-- until that transaction ends, whatever its expires_at: a row written by a transaction
-- in progress is live, and the caller's transaction is in progress. So its window
-- cannot pass inside it: never `claimed` twice, idem_once true once. Windows of 10 or
-- 20 ms, then a sleep of 100 ms past them (expires_at is taken from the clock at the
-- call, not at the transaction's start). The reaper is off in the test cluster.
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idempotency;
RESET client_min_messages;

-- Claimed and completed, then past its window: replayed (a lease claim too), its
-- fingerprint still checked, finishing it again IK003, idem_once false; all as inside
-- the window.
BEGIN;
SELECT outcome, attempt FROM idem_claim('own', 'done', '\x01', ttl => '20 ms');
SELECT idem_complete('own', 'done', '{"n": 1}');
SELECT pg_sleep(0.1);
SELECT state, response, attempt, expires_at < clock_timestamp() AS window_passed
  FROM idem_lookup('own', 'done');
SELECT outcome, state, attempt, response FROM idem_claim('own', 'done', '\x01');
SELECT outcome, attempt FROM idem_claim('own', 'done', lease => '1 minute');
SAVEPOINT again;
SELECT idem_complete('own', 'done', '{"n": 2}');
\echo :LAST_ERROR_SQLSTATE
ROLLBACK TO SAVEPOINT again;
SELECT outcome FROM idem_claim('own', 'done', '\x02');
\echo :LAST_ERROR_SQLSTATE
ROLLBACK TO SAVEPOINT again;
SELECT idem_once('own', 'done') AS once;
COMMIT;
-- Another transaction: the window has passed, the key is free again.
SELECT count(*) AS visible_after_commit FROM idem_lookup('own', 'done');
BEGIN;
SELECT outcome, attempt FROM idem_claim('own', 'done', '\x02');
SELECT idem_release('own', 'done');
COMMIT;

-- idem_once: one key, one true per transaction (after an insert the next call inserts
-- first and finds the row by its conflict; the one after that looks first).
BEGIN;
SELECT idem_once('own', 'msg', ttl => '20 ms') AS first;
SELECT pg_sleep(0.1);
SELECT idem_once('own', 'msg') AS second;
SELECT idem_once('own', 'msg', ttl => '20 ms') AS third;
SELECT outcome, state FROM idem_claim('own', 'msg');
COMMIT;

-- A pending claim past its window: rule 7, and idem_lookup shows it, unwritten and
-- written (a checkpoint writes it), and completed. idem_forget of a written one says
-- it removed a live key. A completion undone by a rolled-back savepoint leaves the
-- claim pending, its own still.
BEGIN;
SELECT outcome FROM idem_claim('own', 'pending', ttl => '20 ms');
SELECT outcome FROM idem_claim('own', 'forget', ttl => '20 ms');
SELECT idem_checkpoint('own', 'forget', 'step-1');
SELECT outcome FROM idem_claim('own', 'forget-unwritten', ttl => '20 ms');
SELECT outcome FROM idem_claim('own', 'undone', ttl => '20 ms');
SAVEPOINT c;
SELECT idem_complete('own', 'undone', '"undone"');
ROLLBACK TO SAVEPOINT c;
SELECT pg_sleep(0.1);
SELECT outcome, state, attempt FROM idem_claim('own', 'pending');
SELECT state, attempt, expires_at < clock_timestamp() AS window_passed
  FROM idem_lookup('own', 'pending');
SELECT idem_checkpoint('own', 'pending', 'step-1');
SELECT state, checkpoint FROM idem_lookup('own', 'pending');
SELECT outcome FROM idem_claim('own', 'pending');
SELECT idem_complete('own', 'pending', '"ok"');
SELECT state, response FROM idem_lookup('own', 'pending');
SELECT idem_forget('own', 'forget') AS forgot_checkpointed,
       idem_forget('own', 'forget-unwritten') AS forgot_unwritten;
SELECT count(*) AS forgotten_visible FROM idem_lookup('own', 'forget');
SELECT outcome, state FROM idem_claim('own', 'undone');
SELECT state FROM idem_lookup('own', 'undone');
SELECT idem_complete('own', 'undone', '"done"');
COMMIT;
SELECT count(*) AS visible_after_commit FROM idem_lookup('own', 'pending');

-- A key this transaction claimed over an expired row, and one a released savepoint
-- completed: this transaction's. Rolled back, the replacement is gone and the expired
-- row it replaced is free again.
SELECT idem_once('own', 'old', ttl => '10 ms') AS stored, idem_once('own', 'sub', ttl => '10 ms') AS stored;
SELECT pg_sleep(0.1);
BEGIN;
SELECT outcome, attempt FROM idem_claim('own', 'old', ttl => '20 ms');
SELECT idem_complete('own', 'old', '"replaced"');
SAVEPOINT a;
SELECT outcome, attempt FROM idem_claim('own', 'sub', ttl => '20 ms');
SAVEPOINT b;
SELECT idem_complete('own', 'sub', '"in b"');
RELEASE SAVEPOINT b;
SELECT pg_sleep(0.1);
SELECT outcome, response FROM idem_claim('own', 'old');
SELECT idem_once('own', 'old') AS once;
SELECT outcome, response FROM idem_claim('own', 'sub');
ROLLBACK TO SAVEPOINT a;
SELECT outcome, attempt FROM idem_claim('own', 'sub');
SELECT idem_release('own', 'sub');
COMMIT;

-- idem_abandoned lists this transaction's stale lease claim past its window as inside
-- it; idem_reap in this transaction leaves its expired rows (a reaper in another
-- transaction could not delete them either); after COMMIT they are reaped.
BEGIN;
SELECT outcome FROM idem_claim('own', 'leased', ttl => '20 ms', lease => '20 ms');
SELECT idem_once('own', 'reap', ttl => '20 ms') AS stored;
SELECT pg_sleep(0.1);
SELECT scope, key, attempt FROM idem_abandoned('own');
SELECT idem_complete('own', 'leased');
SELECT idem_reap() >= 0 AS reaped;
SELECT key, state FROM idempotency.keys WHERE scope = 'own' AND key IN ('leased', 'reap') ORDER BY key;
SELECT idem_once('own', 'reap') AS once;
COMMIT;
SELECT idem_reap() >= 2 AS reaped;
SELECT count(*) AS left_after_commit FROM idempotency.keys WHERE scope = 'own' AND key IN ('leased', 'reap');
