-- idem_apply_version (1.1): a consumer applies a version of an entity only if it is
-- above the last one applied for (role, scope, entity). The concurrent case (one call
-- at a time per entity) is the isolation spec apply_race.
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idempotency;
DROP ROLE IF EXISTS regress_idem_consumer;
DROP ROLE IF EXISTS regress_idem_gone;
RESET client_min_messages;
DELETE FROM idempotency.applied_versions;  -- start from no records (a superuser may)

-- Promise: true for a first version, false for the same or an older one, true for a
-- greater one.
SELECT idem_apply_version('accounts', 'a-1', 5) AS first;
SELECT idem_apply_version('accounts', 'a-1', 5) AS same;
SELECT idem_apply_version('accounts', 'a-1', 3) AS older;
SELECT idem_apply_version('accounts', 'a-1', 6) AS greater;
SELECT idem_apply_version('accounts', 'a-1', 6) AS same_again;
SELECT idem_apply_version('accounts', 'a-1', 1000000000000) AS much_greater;
SELECT idem_apply_version('accounts', 'a-1', 7) AS older_again;
-- Any bigint is a version, the first one included.
SELECT idem_apply_version('accounts', 'negative', -5) AS first,
       idem_apply_version('accounts', 'negative', -6) AS older,
       idem_apply_version('accounts', 'negative', 0) AS greater;

-- Promise: per (role, scope, entity): another entity, another scope, another role
-- each have their own record.
SELECT idem_apply_version('accounts', 'a-2', 1) AS other_entity;
SELECT idem_apply_version('ledger', 'a-1', 1) AS other_scope;
CREATE ROLE regress_idem_consumer;
SET ROLE regress_idem_consumer;
SELECT idem_apply_version('accounts', 'a-1', 2) AS other_role;
SELECT idem_apply_version('accounts', 'a-1', 2) AS other_role_same;
RESET ROLE;
-- The first role's record is as it was.
SELECT idem_apply_version('accounts', 'a-1', 1000000000000) AS same;
SELECT idem_apply_version('accounts', 'a-1', 1000000000001) AS greater;
-- Names are compared bytewise, case-sensitively.
SELECT idem_apply_version('accounts', 'A-1', 1) AS other_case;
SELECT pg_get_userbyid(role) AS role, scope, entity, version
FROM idempotency.applied_versions ORDER BY 2, 3, 1;

-- Promise: it belongs to the calling transaction: rolled back, nothing is recorded.
BEGIN;
SELECT idem_apply_version('accounts', 'tx', 10) AS applied;
ROLLBACK;
SELECT idem_apply_version('accounts', 'tx', 1) AS after_rollback;
-- Within a transaction the record is seen at once.
BEGIN;
SELECT idem_apply_version('accounts', 'tx', 5) AS applied;
SELECT idem_apply_version('accounts', 'tx', 5) AS same_in_transaction;
COMMIT;
-- A savepoint rolled back, and an EXCEPTION block that failed, record nothing.
BEGIN;
SAVEPOINT s;
SELECT idem_apply_version('accounts', 'tx', 8) AS applied;
ROLLBACK TO s;
SELECT idem_apply_version('accounts', 'tx', 6) AS after_savepoint;
DO $$
BEGIN
  PERFORM idem_apply_version('accounts', 'tx', 100);
  RAISE EXCEPTION 'the block fails';
EXCEPTION WHEN raise_exception THEN
  NULL;
END $$;
COMMIT;
SELECT idem_apply_version('accounts', 'tx', 7) AS after_block;
SELECT version FROM idempotency.applied_versions WHERE entity = 'tx';

-- Promise: the record expires ttl (NULL: idempotency.default_ttl) after its last
-- change; an expired record is forgotten (an old version applies again) and is
-- reaped like a key.
SET idempotency.default_ttl = '90min';
SELECT idem_apply_version('accounts', 'window', 1) AS applied;
SELECT expires_at > now() + interval '89 minutes' AND expires_at <= now() + interval '91 minutes'
         AS default_ttl
FROM idempotency.applied_versions WHERE entity = 'window';
RESET idempotency.default_ttl;
SELECT idem_apply_version('accounts', 'window', 2, ttl => '10 days') AS applied;
SELECT expires_at > now() + interval '9 days' AS ttl_of_last_change
FROM idempotency.applied_versions WHERE entity = 'window';
-- A call that applies nothing changes nothing: the record still expires 200 ms after
-- its last change, not an hour after the second call.
SELECT idem_apply_version('accounts', 'short', 10, ttl => '200 ms') AS applied,
       idem_apply_version('accounts', 'short', 10, ttl => '1 hour') AS same;
SELECT pg_sleep(0.3);
SELECT idem_apply_version('accounts', 'short', 3, ttl => '10 ms') AS older_after_expiry;
SELECT pg_sleep(0.05);
SELECT count(*) AS expired_records FROM idempotency.applied_versions WHERE expires_at <= now();
SELECT idem_reap() >= 1 AS reaped;
SELECT count(*) AS records_of_short FROM idempotency.applied_versions WHERE entity = 'short';
SELECT idem_apply_version('accounts', 'short', 1) AS after_reap;

-- Promise (1.4): a record the calling transaction wrote is live until it ends, whatever
-- its expires_at (a row written by a transaction in progress is live): past its window
-- inside that transaction a duplicate or an older version is still skipped, and
-- idem_reap in it leaves the record. Windows of 10 ms, sleeps of 100 ms past them.
BEGIN;
SELECT idem_apply_version('accounts', 'own', 10, ttl => '10 ms') AS applied;
SELECT pg_sleep(0.1);
SELECT expires_at < clock_timestamp() AS window_passed
FROM idempotency.applied_versions WHERE entity = 'own';
SELECT idem_apply_version('accounts', 'own', 3) AS older,
       idem_apply_version('accounts', 'own', 10) AS same;
SELECT idem_reap() >= 0 AS reaped;
SELECT version FROM idempotency.applied_versions WHERE entity = 'own';
SELECT idem_apply_version('accounts', 'own', 3) AS older_after_reap;
-- A greater version applies, with a new window from this call.
SELECT idem_apply_version('accounts', 'own', 11, ttl => '10 ms') AS greater;
SELECT pg_sleep(0.1);
SELECT idem_apply_version('accounts', 'own', 11) AS same;
COMMIT;
-- Another transaction: the window has passed, the record is forgotten.
SELECT idem_apply_version('accounts', 'own', 3, ttl => '10 ms') AS older_after_commit;
-- A subtransaction's record is this transaction's once released; rolled back, the
-- record before it (another transaction's, expired) is forgotten again.
SELECT pg_sleep(0.1);
BEGIN;
SAVEPOINT a;
SELECT idem_apply_version('accounts', 'own', 8, ttl => '10 ms') AS over_expired;
SAVEPOINT b;
SELECT idem_apply_version('accounts', 'own', 9, ttl => '10 ms') AS greater;
RELEASE SAVEPOINT b;
SELECT pg_sleep(0.1);
SELECT idem_apply_version('accounts', 'own', 9) AS same_from_released,
       idem_apply_version('accounts', 'own', 4) AS older_from_released;
ROLLBACK TO SAVEPOINT a;
SELECT idem_apply_version('accounts', 'own', 2, ttl => '1 hour') AS older_than_forgotten;
COMMIT;
SELECT version FROM idempotency.applied_versions WHERE entity = 'own';

-- Promise ("reaped like a key"): the records of a role that no longer exists are
-- deleted by the next pass, as its keys are.
CREATE ROLE regress_idem_gone;
SET ROLE regress_idem_gone;
SELECT idem_apply_version('accounts', 'orphan', 1) AS applied;
RESET ROLE;
DROP ROLE regress_idem_gone;
SELECT count(*) AS orphans FROM idempotency.applied_versions WHERE entity = 'orphan';
SELECT idem_reap() >= 1 AS reaped;
SELECT count(*) AS orphans FROM idempotency.applied_versions WHERE entity = 'orphan';

-- Bad input. NULL scope, entity or version: 22004.
SELECT idem_apply_version(NULL, 'e', 1);
\echo :LAST_ERROR_SQLSTATE
SELECT idem_apply_version('s', NULL, 1);
\echo :LAST_ERROR_SQLSTATE
SELECT idem_apply_version('s', 'e', NULL);
\echo :LAST_ERROR_SQLSTATE
-- Empty or over-long scope or entity (bytes), non-positive ttl: 22023.
SELECT idem_apply_version('', 'e', 1);
\echo :LAST_ERROR_SQLSTATE
SELECT idem_apply_version(repeat('s', 256), 'e', 1);
\echo :LAST_ERROR_SQLSTATE
SELECT idem_apply_version('s', '', 1);
\echo :LAST_ERROR_SQLSTATE
SELECT idem_apply_version('s', repeat('e', 256), 1);
\echo :LAST_ERROR_SQLSTATE
SELECT idem_apply_version('s', repeat('é', 128), 1);
\echo :LAST_ERROR_SQLSTATE
SELECT idem_apply_version('s', 'e', 1, ttl => '0');
\echo :LAST_ERROR_SQLSTATE
SELECT idem_apply_version('s', 'e', 1, ttl => '-1 hour');
\echo :LAST_ERROR_SQLSTATE
-- 255 bytes are fine.
SELECT idem_apply_version(repeat('s', 255), repeat('e', 255), 1) AS applied;
-- In a read-only transaction: 25006, even for what would be a duplicate.
BEGIN READ ONLY;
SELECT idem_apply_version('accounts', 'a-1', 1);
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
-- Nothing was recorded by a failed call.
SELECT count(*) AS records FROM idempotency.applied_versions
WHERE scope IN ('s', '') OR entity IN ('e', '');

DELETE FROM idempotency.applied_versions;
DROP ROLE regress_idem_consumer;
