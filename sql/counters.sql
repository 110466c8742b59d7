-- idem_stats' answer counters: claims_total, replays_total,
-- fingerprint_mismatches_total, in_progress_total (since server start, per database,
-- in shared memory) and edition. Each block makes known calls and shows the counters'
-- deltas. Without the preloaded library they are NULL (expected/counters_1.out).
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idempotency;
DROP ROLE IF EXISTS regress_idem_counter_reader;
DROP ROLE IF EXISTS regress_idem_dashboard;
DROP DATABASE IF EXISTS regress_idem_counters_update;
RESET client_min_messages;
SELECT current_database() AS test_database \gset

CREATE TEMP TABLE seen AS
  SELECT claims_total, replays_total, fingerprint_mismatches_total, in_progress_total
  FROM idem_stats();
-- The counters' change since the last look, then the look remembered.
CREATE FUNCTION pg_temp.deltas(OUT claims bigint, OUT replays bigint, OUT mismatches bigint,
                               OUT in_progress bigint) LANGUAGE plpgsql AS $$
DECLARE
  now_ record;
BEGIN
  SELECT s.claims_total, s.replays_total, s.fingerprint_mismatches_total, s.in_progress_total
    INTO now_ FROM idem_stats() s;
  SELECT now_.claims_total - o.claims_total, now_.replays_total - o.replays_total,
         now_.fingerprint_mismatches_total - o.fingerprint_mismatches_total,
         now_.in_progress_total - o.in_progress_total
    INTO claims, replays, mismatches, in_progress FROM seen o;
  UPDATE seen SET claims_total = now_.claims_total, replays_total = now_.replays_total,
                  fingerprint_mismatches_total = now_.fingerprint_mismatches_total,
                  in_progress_total = now_.in_progress_total;
END $$;

SELECT edition FROM idem_stats();
SELECT (claims_total IS NULL) = (current_setting('shared_preload_libraries') NOT LIKE '%idempotency%')
         AS null_exactly_without_preload
FROM idem_stats();

-- A new claim, its replay, a reused key with another body (IK001).
BEGIN;
SELECT outcome FROM idem_claim('count', 'k1', '\x01');
SELECT idem_complete('count', 'k1', '{"id": 1}');
COMMIT;
SELECT outcome FROM idem_claim('count', 'k1', '\x01');
SELECT outcome FROM idem_claim('count', 'k1', '\x02');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM pg_temp.deltas();

-- Claimed twice in one transaction: the second is `duplicate`, not counted.
BEGIN;
SELECT outcome FROM idem_claim('count', 'k2');
SELECT outcome FROM idem_claim('count', 'k2');
ROLLBACK;
-- Answers are counted as given: a claim whose transaction rolled back counts.
SELECT * FROM pg_temp.deltas();

-- A live lease: idem_claim answers in_progress, idem_once raises IK005 (both counted);
-- a lease run out is taken over (a claim).
SELECT outcome FROM idem_claim('count', 'leased', lease => '1 hour');
SELECT outcome FROM idem_claim('count', 'leased', lease => '1 hour');
SELECT idem_once('count', 'leased');
\echo :LAST_ERROR_SQLSTATE
SELECT outcome FROM idem_claim('count', 'short', lease => '1 millisecond');
SELECT pg_sleep(0.01);
SELECT outcome, attempt FROM idem_claim('count', 'short', lease => '1 hour');
SELECT * FROM pg_temp.deltas();

-- idem_once: true counts a claim, false (a finished key) a replay; idem_once_many counts
-- each distinct key once.
SELECT idem_once('count', 'm1');
SELECT idem_once('count', 'm1');
SELECT idem_once_many('count', ARRAY['m1', 'm2', 'm2', 'm3']::idem_key[]);
SELECT * FROM pg_temp.deltas();

-- Read-only calls count nothing.
SELECT state FROM idem_lookup('count', 'k1');
SELECT * FROM pg_temp.deltas();

-- pg_monitor reads them.
CREATE ROLE regress_idem_counter_reader IN ROLE pg_monitor;
SET ROLE regress_idem_counter_reader;
SELECT claims_total >= 6 OR claims_total IS NULL AS readable, edition FROM idem_stats();
RESET ROLE;
DROP ROLE regress_idem_counter_reader;

SELECT idem_forget('count', k::idem_key) FROM unnest(ARRAY['k1', 'leased', 'short', 'm1', 'm2', 'm3']) k
  ORDER BY 1;
DROP TABLE seen;

-- The update from 1.4 remakes idem_stats (a new result type): a view over it stops the
-- update with 2BP01 naming the view, nothing changed; without the view it goes
-- through, the grants (pg_monitor's and one an administrator added) carried over.
CREATE DATABASE regress_idem_counters_update;
CREATE ROLE regress_idem_dashboard;
\c regress_idem_counters_update
SET client_min_messages = warning;
CREATE EXTENSION idempotency VERSION '1.4';
RESET client_min_messages;
GRANT EXECUTE ON FUNCTION idem_stats(boolean) TO regress_idem_dashboard;
CREATE VIEW key_figures AS SELECT keys_total, reaped_total FROM idem_stats();
\set SHOW_CONTEXT never
ALTER EXTENSION idempotency UPDATE TO '1.5';
\echo :LAST_ERROR_SQLSTATE
\set SHOW_CONTEXT errors
SELECT extversion FROM pg_extension WHERE extname = 'idempotency';
DROP VIEW key_figures;
ALTER EXTENSION idempotency UPDATE TO '1.5';
CREATE VIEW key_figures AS SELECT keys_total, replays_total FROM idem_stats();
SELECT extversion FROM pg_extension WHERE extname = 'idempotency';
SELECT r.rolname, has_function_privilege(r.rolname, 'idem_stats(boolean)', 'EXECUTE') AS stats,
       has_function_privilege(r.rolname, 'idem_node_stats()', 'EXECUTE') AS node_stats
FROM pg_roles r WHERE r.rolname IN ('pg_monitor', 'regress_idem_dashboard') ORDER BY 1;
SELECT has_function_privilege('public', 'idem_stats(boolean)', 'EXECUTE') AS public_may;
SELECT idem_once('count', 'after-update');
SELECT claims_total, replays_total, edition FROM idem_stats();
\c :test_database
DROP DATABASE regress_idem_counters_update;
DROP ROLE regress_idem_dashboard;
