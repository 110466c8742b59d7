-- idem_reap (one pass by hand) and idem_stats. The test cluster preloads the
-- library with idempotency.reaper_enabled = off, so only idem_reap reaps here.
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idempotency;
DROP ROLE IF EXISTS regress_idem_monitor;
RESET client_min_messages;
DELETE FROM idempotency.keys;  -- start from an empty store (a superuser may)

-- Expired keys, a live one, a stale lease and a live lease.
BEGIN;
SELECT count(*) FROM generate_series(1, 30) g
  WHERE idem_once('reap', ('old-' || g)::idem_key, ttl => '1 millisecond');
SELECT idem_once('reap', 'fresh');
COMMIT;
SELECT outcome FROM idem_claim('reap', 'stale-lease', lease => '1 millisecond');
SELECT outcome FROM idem_claim('reap', 'live-lease', lease => '1 hour');
SELECT pg_sleep(0.01);

SELECT keys_total, pending, completed, failed, abandoned, expired_awaiting_reap, stale_leases FROM idem_stats();

-- max_rows bounds the deletions; the stale lease is marked abandoned either way.
SELECT idem_reap(10) AS deleted;
SELECT idem_reap() AS deleted;
SELECT idem_reap() AS deleted_again;
SELECT key, state FROM idempotency.keys WHERE scope = 'reap' ORDER BY key;
SELECT keys_total, pending, completed, failed, abandoned, expired_awaiting_reap, stale_leases FROM idem_stats();
-- Counters exist only with the preloaded library; worker_pid is NULL while no worker
-- serves the database (here: reaper_enabled is off; test/t/019_lifecycle.pl has the rest).
SELECT (reaped_total >= 30 AND reclaimed_total >= 1 AND last_reap_at IS NOT NULL)
         = (current_setting('shared_preload_libraries') LIKE '%idempotency%')
         AS counters_as_expected,
       worker_pid IS NULL AS unserved_with_reaper_off
FROM idem_stats();

-- Rows of a dropped role are deleted.
CREATE ROLE regress_idem_gone;
SET ROLE regress_idem_gone;
SELECT idem_once('reap', 'orphan');
RESET ROLE;
DROP ROLE regress_idem_gone;
SELECT count(*) AS orphans FROM idempotency.keys WHERE key = 'orphan';
SELECT idem_reap() AS deleted;
SELECT count(*) AS orphans FROM idempotency.keys WHERE key = 'orphan';

-- Bad input and privileges.
SELECT idem_reap(-1);
\echo :LAST_ERROR_SQLSTATE
BEGIN READ ONLY;
SELECT idem_reap();
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
CREATE ROLE regress_idem_monitor IN ROLE pg_monitor;
SET ROLE regress_idem_monitor;
SELECT keys_total FROM idem_stats();
SELECT idem_reap();
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;
DROP ROLE regress_idem_monitor;
SELECT idem_forget('reap', 'fresh'), idem_forget('reap', 'stale-lease'), idem_forget('reap', 'live-lease');
