-- SET CONSTRAINTS does not move IK002: it is raised by COMMIT and PREPARE only,
-- whatever the transaction's constraint mode (frameworks issue it: Django's
-- check_constraints() runs SET CONSTRAINTS ALL IMMEDIATE, then ALL DEFERRED).
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idempotency;
RESET client_min_messages;
CREATE TABLE sc_orders (id int PRIMARY KEY);

-- Set before a claim: the claim, its completion and COMMIT work.
BEGIN;
SET CONSTRAINTS ALL IMMEDIATE;
SELECT outcome, attempt FROM idem_claim('sc', 'before');
SELECT idem_complete('sc', 'before', '"before"');
COMMIT;
-- Set after a claim: the same.
BEGIN;
SELECT outcome FROM idem_claim('sc', 'after');
SET CONSTRAINTS ALL IMMEDIATE;
SELECT idem_complete('sc', 'after', '"after"');
COMMIT;
-- Django's pattern: IMMEDIATE then DEFERRED around a completed claim, then another
-- claim in the same transaction.
BEGIN;
SELECT outcome FROM idem_claim('sc', 'django-1');
INSERT INTO sc_orders VALUES (1);
SELECT idem_complete('sc', 'django-1', '"order 1"');
SET CONSTRAINTS ALL IMMEDIATE;
SET CONSTRAINTS ALL DEFERRED;
SELECT outcome FROM idem_claim('sc', 'django-2');
INSERT INTO sc_orders VALUES (2);
SELECT idem_complete('sc', 'django-2', '"order 2"');
COMMIT;
-- Around a claim not finished yet, twice, with several claims.
BEGIN;
SELECT outcome FROM idem_claim('sc', 'open-1');
SELECT outcome FROM idem_claim('sc', 'open-2');
SET CONSTRAINTS ALL IMMEDIATE;
SET CONSTRAINTS ALL DEFERRED;
SET CONSTRAINTS ALL IMMEDIATE;
SELECT outcome FROM idem_claim('sc', 'open-2');
SELECT idem_complete('sc', 'open-1', '1'), idem_fail('sc', 'open-2', '2');
SET CONSTRAINTS ALL DEFERRED;
COMMIT;
SELECT key, l.state, l.response
FROM unnest(ARRAY['before', 'after', 'django-1', 'django-2', 'open-1', 'open-2']) key,
     LATERAL idem_lookup('sc', key::idem_key) l ORDER BY key;

-- An unfinished claim still fails the COMMIT (not the SET), whether the mode is
-- IMMEDIATE or DEFERRED by then.
BEGIN;
SELECT outcome FROM idem_claim('sc', 'left-1');
INSERT INTO sc_orders VALUES (3);
SET CONSTRAINTS ALL IMMEDIATE;
SELECT 'still in the transaction' AS after_set;
COMMIT;
\echo :LAST_ERROR_SQLSTATE
BEGIN;
SET CONSTRAINTS ALL IMMEDIATE;
SELECT outcome FROM idem_claim('sc', 'left-2');
COMMIT;
\echo :LAST_ERROR_SQLSTATE
BEGIN;
SELECT outcome FROM idem_claim('sc', 'left-3');
SET CONSTRAINTS ALL IMMEDIATE;
SET CONSTRAINTS ALL DEFERRED;
COMMIT;
\echo :LAST_ERROR_SQLSTATE
-- Of two claims when IMMEDIATE is set, the one left unfinished fails the COMMIT.
BEGIN;
SELECT outcome FROM idem_claim('sc', 'left-6');
SELECT outcome FROM idem_claim('sc', 'left-7');
SET CONSTRAINTS ALL IMMEDIATE;
SELECT idem_complete('sc', 'left-6');
COMMIT;
\echo :LAST_ERROR_SQLSTATE
-- PREPARE TRANSACTION is refused the same way.
BEGIN;
SET CONSTRAINTS ALL IMMEDIATE;
SELECT outcome FROM idem_claim('sc', 'left-4');
PREPARE TRANSACTION 'idem_set_constraints';
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) AS prepared FROM pg_prepared_xacts WHERE gid = 'idem_set_constraints';
-- A COMMIT inside a procedure too.
CREATE PROCEDURE sc_claim_and_commit() LANGUAGE plpgsql AS $$
BEGIN
  SET CONSTRAINTS ALL IMMEDIATE;
  PERFORM idem_claim('sc', 'left-5');
  COMMIT;
END $$;
CALL sc_claim_and_commit();
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) AS stored, (SELECT count(*) FROM sc_orders) AS orders
FROM unnest(ARRAY['left-1', 'left-2', 'left-3', 'left-4', 'left-5', 'left-6', 'left-7']) key,
     LATERAL idem_lookup('sc', key::idem_key) l;

-- Savepoints: a completion rolled back with its savepoint leaves the claim pending
-- (COMMIT fails); IMMEDIATE set in a savepoint rolled back changes nothing.
BEGIN;
SELECT outcome FROM idem_claim('sc', 'sub-1');
SAVEPOINT a;
SET CONSTRAINTS ALL IMMEDIATE;
SELECT idem_complete('sc', 'sub-1', '"x"');
ROLLBACK TO a;
SET CONSTRAINTS ALL IMMEDIATE;
COMMIT;
\echo :LAST_ERROR_SQLSTATE
BEGIN;
SELECT outcome FROM idem_claim('sc', 'sub-2');
SAVEPOINT a;
SET CONSTRAINTS ALL IMMEDIATE;
ROLLBACK TO a;
SELECT idem_complete('sc', 'sub-2', '"y"');
COMMIT;
SELECT key, l.state, l.response
FROM unnest(ARRAY['sub-1', 'sub-2']) key, LATERAL idem_lookup('sc', key::idem_key) l ORDER BY key;
-- A takeover of a stale lease claim, in the transaction, under IMMEDIATE.
SELECT outcome, attempt FROM idem_claim('sc', 'stale', lease => '1 millisecond');
SELECT pg_sleep(0.01);
BEGIN;
SET CONSTRAINTS ALL IMMEDIATE;
SELECT outcome, attempt FROM idem_claim('sc', 'stale');
SELECT idem_complete('sc', 'stale', '"taken over"');
COMMIT;
SELECT state, attempt, response FROM idem_lookup('sc', 'stale');

DROP PROCEDURE sc_claim_and_commit();
DROP TABLE sc_orders;
DELETE FROM idempotency.keys WHERE scope = 'sc';
