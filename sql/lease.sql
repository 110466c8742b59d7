-- Lease claims: rule 5 (a live lease), rule 6 (takeover of a stale or abandoned
-- claim), checkpoints, fencing with IK003, and idem_abandoned.
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idempotency;
RESET client_min_messages;

-- A lease claim may commit while pending: IK002 does not apply to it.
SELECT outcome, state, attempt, checkpoint FROM idem_claim('l', 'job', '\x01', lease => '1 hour');
SELECT state, attempt, lease_expires_at - first_claimed_at AS lease FROM idem_lookup('l', 'job');
-- Rule 5: while the lease lives, others get in_progress with its remaining time.
SELECT outcome, state, attempt, checkpoint,
       retry_after > '59 minutes' AND retry_after <= '1 hour' AS lease_remaining
FROM idem_claim('l', 'job', '\x01');
-- Rule 2 still applies to a leased key.
SELECT outcome FROM idem_claim('l', 'job', '\x02');
\echo :LAST_ERROR_SQLSTATE
-- The holder moves through phases, passing its attempt.
SELECT idem_checkpoint('l', 'job', 'charged', '{"charge": "ch_1"}', attempt => 1);
SELECT idem_checkpoint('l', 'job', 'emailed', '{"charge": "ch_1", "mail": "m_1"}', attempt => 1);
SELECT state, checkpoint, checkpoint_data FROM idem_lookup('l', 'job');
SELECT idem_complete('l', 'job', '{"ok": true}', attempt => 1);
SELECT outcome, state, response, attempt, checkpoint FROM idem_claim('l', 'job', '\x01');

-- A lease may not outlive the key's window.
SELECT idem_claim('l', 'too-long', ttl => '10 minutes', lease => '11 minutes');
\echo :LAST_ERROR_SQLSTATE
SET idempotency.default_ttl = '5min';
SELECT idem_claim('l', 'too-long', lease => '6 minutes');
\echo :LAST_ERROR_SQLSTATE
RESET idempotency.default_ttl;
-- Granting a lease extends expires_at to at least the lease's end.
SELECT expires_at >= now() + interval '1 hour' AS covers_lease
FROM idem_claim('l', 'window', ttl => '2 hours', lease => '1 hour');

-- Stale claims: the lease ran out.
SELECT outcome FROM idem_claim('l', 'stale', lease => '40 milliseconds');
SELECT idem_checkpoint('l', 'stale', 'phase-1', '{"step": 1}', attempt => 1);
SELECT outcome FROM idem_claim('l', 'fenced', '\xaa', lease => '40 milliseconds');
SELECT outcome FROM idem_claim('l', 'late', lease => '40 milliseconds');
SELECT outcome FROM idem_claim('other', 'stale', lease => '40 milliseconds');
SELECT pg_sleep(0.1);

-- idem_abandoned lists them, oldest first, with their checkpoints.
SELECT scope, key, attempt, checkpoint, checkpoint_data FROM idem_abandoned();
SELECT scope, key FROM idem_abandoned('other');
SELECT count(*) AS limited FROM idem_abandoned(max_rows => 2);
SELECT count(*) FROM idem_abandoned(max_rows => -1);
\echo :LAST_ERROR_SQLSTATE

-- A holder whose lease ran out but that nobody took over may still finish.
SELECT idem_complete('l', 'late', '"late but fine"', attempt => 1);
SELECT state, response FROM idem_lookup('l', 'late');

-- Rule 6: an in-transaction takeover resumes from the checkpoint as attempt 2.
BEGIN;
SELECT outcome, state, attempt, checkpoint, checkpoint_data FROM idem_claim('l', 'stale');
SELECT idem_complete('l', 'stale', '{"resumed": true}');
COMMIT;
-- The first holder, back late, is fenced out and changes nothing.
SELECT idem_complete('l', 'stale', '{"late": 1}', attempt => 1);
\echo :LAST_ERROR_SQLSTATE
SELECT state, response, attempt FROM idem_lookup('l', 'stale');

-- A takeover with a new lease: the old attempt is fenced out of every function.
SELECT outcome, attempt FROM idem_claim('l', 'fenced', lease => '1 hour');
SELECT idem_complete('l', 'fenced', '"old"', attempt => 1);
\echo :LAST_ERROR_SQLSTATE
SELECT idem_fail('l', 'fenced', '"old"', attempt => 1);
\echo :LAST_ERROR_SQLSTATE
SELECT idem_checkpoint('l', 'fenced', 'old', attempt => 1);
\echo :LAST_ERROR_SQLSTATE
SELECT idem_release('l', 'fenced', attempt => 1);
\echo :LAST_ERROR_SQLSTATE
-- The takeover kept the stored fingerprint.
SELECT outcome FROM idem_claim('l', 'fenced', '\xbb');
\echo :LAST_ERROR_SQLSTATE
SELECT idem_release('l', 'fenced', attempt => 2);
SELECT count(*) AS stored FROM idem_lookup('l', 'fenced');

-- An in-transaction takeover that is not finished fails with IK002 and leaves the
-- stale claim as it was.
SELECT outcome FROM idem_claim('l', 'retry-me', lease => '40 milliseconds');
SELECT pg_sleep(0.1);
BEGIN;
SELECT outcome, attempt FROM idem_claim('l', 'retry-me');
COMMIT;
\echo :LAST_ERROR_SQLSTATE
SELECT state, attempt FROM idem_lookup('l', 'retry-me');
SELECT key FROM idem_abandoned('l');

-- idem_checkpoint renews the lease by its original length.
SELECT outcome FROM idem_claim('l', 'renew', lease => '10 minutes');
SELECT lease_expires_at AS lease_before FROM idem_lookup('l', 'renew') \gset
SELECT pg_sleep(0.01);
SELECT idem_checkpoint('l', 'renew', 'step', attempt => 1);
SELECT lease_expires_at > :'lease_before'::timestamptz AS renewed,
       lease_expires_at - clock_timestamp() > interval '9 minutes' AS by_its_length
FROM idem_lookup('l', 'renew');

-- idem_once takes over a stale claim.
SELECT idem_once('l', 'retry-me') AS applied;
SELECT state, attempt FROM idem_lookup('l', 'retry-me');

-- A holder that checkpoints in a transaction has not claimed the key in it: finishing
-- still needs its attempt, and another claim meets the live lease.
SELECT outcome FROM idem_claim('l', 'holder', lease => '1 hour');
BEGIN;
SELECT idem_checkpoint('l', 'holder', 'p1', attempt => 1);
SELECT outcome, attempt FROM idem_claim('l', 'holder');
SELECT idem_complete('l', 'holder', '1');
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
-- A lease claim made in this transaction is its own: duplicate, and finished without
-- an attempt.
BEGIN;
SELECT outcome FROM idem_claim('l', 'mine', lease => '1 hour');
SELECT outcome FROM idem_claim('l', 'mine');
SELECT idem_complete('l', 'mine', '"done"');
COMMIT;
SELECT state, response FROM idem_lookup('l', 'mine');

-- Clean up this role's keys in these scopes.
SELECT count(*) FROM (SELECT idem_forget(scope, key) FROM idempotency.keys
                      WHERE scope IN ('l', 'other') AND role = current_user::regrole) f;
