-- A key (or a messaging row) that the calling transaction row-locked itself, by hand
-- (a superuser's SELECT ... FOR UPDATE on the extension's tables): a write of it goes
-- over the transaction's own lock at once, as an UPDATE would, with the answer the
-- rules give for the row as it is. Waiting for its own transaction would never end:
-- each call below would run into statement_timeout (57014), or end with IK005 after
-- idempotency.wait_timeout, if it waited.
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idempotency;
RESET client_min_messages;
SET statement_timeout = '2s';
SET idempotency.wait_timeout = '5s';

-- Keys whose dedup window has passed, a committed lease claim, an abandoned one.
BEGIN;
SELECT idem_once('self', k::idem_key) FROM unnest('{once,claim,many-1,many-2,forgotten}'::text[]) k;
COMMIT;
UPDATE idempotency.keys SET expires_at = now() - interval '1 second'
WHERE scope = 'self' AND key::text <> 'forgotten';
SELECT k, (idem_claim('self', k::idem_key, lease => '1 hour')).outcome
FROM unnest('{leased,released,failed,checkpointed,abandoned}'::text[]) k;
UPDATE idempotency.keys SET state = 'a' WHERE scope = 'self' AND key = 'abandoned';

-- idem_once on an expired key it locked: applied again (rule 1).
BEGIN;
SELECT key FROM idempotency.keys WHERE scope = 'self' AND key = 'once' FOR UPDATE;
SELECT idem_once('self', 'once');
COMMIT;
-- idem_claim: claimed (rule 1), then completed.
BEGIN;
SELECT key FROM idempotency.keys WHERE scope = 'self' AND key = 'claim' FOR UPDATE;
SELECT outcome, attempt FROM idem_claim('self', 'claim');
SELECT idem_complete('self', 'claim', '"done"');
COMMIT;
-- idem_once_many: each expired key locked, in a weaker lock too (FOR SHARE).
BEGIN;
SELECT key FROM idempotency.keys WHERE scope = 'self' AND key = 'many-1' FOR UPDATE;
SELECT key FROM idempotency.keys WHERE scope = 'self' AND key = 'many-2' FOR SHARE;
SELECT idem_once_many('self', '{many-1,many-2}');
COMMIT;
-- The finishing functions on the committed lease claims they hold.
BEGIN;
SELECT key FROM idempotency.keys
WHERE scope = 'self' AND key::text IN ('leased', 'released', 'failed', 'checkpointed')
ORDER BY key FOR UPDATE;
SELECT idem_checkpoint('self', 'checkpointed', 'charged', attempt => 1);
SELECT idem_complete('self', 'leased', '"shipped"', attempt => 1);
SELECT idem_fail('self', 'failed', '"declined"', attempt => 1);
SELECT idem_release('self', 'released', attempt => 1);
COMMIT;
-- A takeover of an abandoned claim (rule 6), locked FOR NO KEY UPDATE.
BEGIN;
SELECT key FROM idempotency.keys WHERE scope = 'self' AND key = 'abandoned' FOR NO KEY UPDATE;
SELECT outcome, attempt FROM idem_claim('self', 'abandoned');
SELECT idem_complete('self', 'abandoned', '"resumed"');
COMMIT;
-- idem_forget of a live key it locked.
BEGIN;
SELECT key FROM idempotency.keys WHERE scope = 'self' AND key = 'forgotten' FOR UPDATE;
SELECT idem_forget('self', 'forgotten');
COMMIT;
SELECT key, state, attempt, checkpoint, response FROM idempotency.keys
WHERE scope = 'self' ORDER BY key;

-- The same guard serves the messaging tables: an applied version and an aggregate's
-- counter that the transaction locked itself.
SELECT idem_apply_version('self', 'entity', 1);
BEGIN;
SELECT version FROM idempotency.applied_versions WHERE scope = 'self' FOR UPDATE;
SELECT idem_apply_version('self', 'entity', 2);
COMMIT;
SELECT idem_emit('self', '{"n": 1}', 'self-aggregate') IS NOT NULL AS emitted;
BEGIN;
SELECT last_seq FROM idempotency.outbox_aggregates WHERE topic = 'self' FOR UPDATE;
SELECT idem_emit('self', '{"n": 2}', 'self-aggregate') IS NOT NULL AS emitted;
COMMIT;
SELECT aggregate, seq, payload FROM idempotency.outbox WHERE topic = 'self' ORDER BY seq;

RESET statement_timeout;
RESET idempotency.wait_timeout;
DELETE FROM idempotency.keys WHERE scope = 'self';
DELETE FROM idempotency.applied_versions WHERE scope = 'self';
DELETE FROM idempotency.outbox WHERE topic = 'self';
DELETE FROM idempotency.outbox_aggregates WHERE topic = 'self';
