-- idem_abandoned reads the calling role's lease claims through keys_leased_idx, oldest
-- first, and stops after max_rows: its cost follows what it returns, not how many keys
-- the role has.
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idempotency;
RESET client_min_messages;

-- Buffers a query touches, its function calls included.
CREATE FUNCTION buffers_of(query text) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
  plan json;
BEGIN
  EXECUTE 'EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) ' || query INTO plan;
  RETURN (plan -> 0 -> 'Plan' ->> 'Shared Hit Blocks')::bigint
       + (plan -> 0 -> 'Plan' ->> 'Shared Read Blocks')::bigint;
END $$;

-- 30,000 completed keys, a completed lease claim (it leaves the index), a live lease,
-- and three stale leases that the reaper marks abandoned.
SELECT count(*) FROM generate_series(1, 30000) g WHERE idem_once('done', ('d-' || g)::idem_key);
BEGIN;
SELECT outcome FROM idem_claim('ab', 'finished', lease => '1 hour');
SELECT idem_complete('ab', 'finished', '"ok"');
COMMIT;
SELECT outcome FROM idem_claim('ab', 'live', lease => '1 hour');
SELECT c.outcome FROM generate_series(1, 3) g,
  LATERAL idem_claim('ab', ('stale-' || g)::idem_key, lease => '1 hour') c;
UPDATE idempotency.keys
  SET lease_expires_at = now() - interval '1 minute',
      first_claimed_at = first_claimed_at - (right(key::text, 1) || ' minutes')::interval
  WHERE scope = 'ab' AND key::text LIKE 'stale-%';
SELECT idem_reap() >= 0 AS reaped;
SELECT key, state FROM idempotency.keys WHERE scope = 'ab' ORDER BY key;
-- The index holds the live, stale and abandoned lease claims, nothing else.
SELECT count(*) AS leased_idx_entries FROM idempotency.keys WHERE lease IS NOT NULL;

-- Oldest first (stale-3 was claimed first), limited by max_rows.
SELECT scope, key, attempt FROM idem_abandoned();
SELECT key FROM idem_abandoned(max_rows => 2);
SELECT key FROM idem_abandoned('no-such-scope');
-- A handful of buffers, not the 30,000 keys' hundreds of pages.
SELECT buffers_of('SELECT * FROM idem_abandoned()') < 20 AS reads_only_what_it_returns;

SELECT count(*) > 0 AS forgotten FROM generate_series(1, 3) g WHERE idem_forget('ab', ('stale-' || g)::idem_key);
SELECT idem_forget('ab', 'live'), idem_forget('ab', 'finished');
DELETE FROM idempotency.keys WHERE scope = 'done';
DROP FUNCTION buffers_of(text);
