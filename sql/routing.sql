-- The routing value (1.3) on a server without Citus: every key function takes
-- route => ..., a store that is not distributed refuses it (55000) and stores
-- nothing, and the Citus functions say what they need.
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idempotency;
RESET client_min_messages;
\set VERBOSITY terse

SELECT outcome FROM idem_claim('routing', 'k1', route => 42);
\echo :LAST_ERROR_SQLSTATE
SELECT idem_complete('routing', 'k1', '{}', route => 42::bigint);
\echo :LAST_ERROR_SQLSTATE
SELECT idem_fail('routing', 'k1', route => 'text route');
\echo :LAST_ERROR_SQLSTATE
SELECT idem_release('routing', 'k1', route => 42);
\echo :LAST_ERROR_SQLSTATE
SELECT idem_checkpoint('routing', 'k1', 'step', route => 42);
\echo :LAST_ERROR_SQLSTATE
SELECT idem_once('routing', 'k1', route => 42);
\echo :LAST_ERROR_SQLSTATE
SELECT idem_forget('routing', 'k1', route => 42);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idem_lookup('routing', 'k1', route => 42);
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) FROM idempotency.keys WHERE scope = 'routing';

-- A NULL route is no route: the call works as without one.
SELECT idem_once('routing', 'k2', route => NULL::bigint);
BEGIN;
SELECT outcome FROM idem_claim('routing', 'k3', route => NULL);
SELECT idem_complete('routing', 'k3', '"done"', route => NULL);
COMMIT;
SELECT state, response FROM idem_lookup('routing', 'k3');

-- Untyped literals still find the one function (no overload to choose from).
BEGIN;
SELECT outcome FROM idem_claim('routing', 'k4', '\x01');
SELECT idem_complete('routing', 'k4', '{"ok": true}');
COMMIT;
SELECT idem_fail('routing', 'k5', '{}');
\echo :LAST_ERROR_SQLSTATE

-- Without Citus.
SELECT idem_distribute('pg_class');
\echo :LAST_ERROR_SQLSTATE
SELECT idem_undistribute();
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idem_node_stats();
\echo :LAST_ERROR_SQLSTATE
SELECT keys_total >= 3 FROM idem_stats(node_only => true);

-- Distributing is for superusers (the store's owner).
CREATE ROLE regress_idem_routing;
SET ROLE regress_idem_routing;
SELECT idem_distribute('pg_class');
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;
DROP ROLE regress_idem_routing;

SELECT idem_forget('routing', k) FROM unnest(ARRAY['k2', 'k3', 'k4']::idem_key[]) k;
