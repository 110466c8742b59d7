-- Identity is (role, scope, key); the store is closed to ordinary roles.
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idempotency;
DROP ROLE IF EXISTS regress_idem_alice;
DROP ROLE IF EXISTS regress_idem_bob;
RESET client_min_messages;
CREATE ROLE regress_idem_alice;
CREATE ROLE regress_idem_bob;

SET ROLE regress_idem_alice;
BEGIN;
SELECT outcome FROM idem_claim('shared-scope', 'k', '\x0a');
SELECT idem_complete('shared-scope', 'k', '"alice"');
COMMIT;
-- Bob neither sees, replays nor conflicts with Alice's key.
SET ROLE regress_idem_bob;
SELECT count(*) AS bob_sees FROM idem_lookup('shared-scope', 'k');
BEGIN;
SELECT outcome, attempt FROM idem_claim('shared-scope', 'k', '\x0b');
SELECT idem_complete('shared-scope', 'k', '"bob"');
COMMIT;
SELECT idem_complete('shared-scope', 'k', '"again"');
\echo :LAST_ERROR_SQLSTATE
SELECT idem_forget('shared-scope', 'nothing-here') AS forgot;
-- The key store itself is out of reach.
SELECT count(*) FROM idempotency.keys;
\echo :LAST_ERROR_SQLSTATE
DELETE FROM idempotency.keys;
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;
-- Even with the schema opened to it, the table grants nothing.
GRANT USAGE ON SCHEMA idempotency TO regress_idem_bob;
SET ROLE regress_idem_bob;
SELECT count(*) FROM idempotency.keys;
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;
REVOKE USAGE ON SCHEMA idempotency FROM regress_idem_bob;
SET ROLE regress_idem_alice;
SELECT response FROM idem_lookup('shared-scope', 'k');
SELECT outcome, response FROM idem_claim('shared-scope', 'k', '\x0a');
RESET ROLE;

-- SECURITY DEFINER code acts with its owner's keys.
CREATE FUNCTION alice_lookup(k idem_key) RETURNS jsonb
  LANGUAGE sql SECURITY DEFINER AS $$ SELECT response FROM idem_lookup('shared-scope', k) $$;
ALTER FUNCTION alice_lookup(idem_key) OWNER TO regress_idem_alice;
SET ROLE regress_idem_bob;
SELECT alice_lookup('k') AS through_alice, (SELECT response FROM idem_lookup('shared-scope', 'k')) AS as_bob;
RESET ROLE;

-- A superuser may inspect the table; roles are stored by name.
SELECT role, scope, key, state, attempt, response
FROM idempotency.keys WHERE scope = 'shared-scope' ORDER BY role::text;

-- Limiting who may add keys is a matter of EXECUTE grants.
REVOKE EXECUTE ON FUNCTION idem_claim(text, idem_key, bytea, interval, interval, interval, "any") FROM PUBLIC;
SET ROLE regress_idem_bob;
SELECT outcome FROM idem_claim('shared-scope', 'k2');
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;
GRANT EXECUTE ON FUNCTION idem_claim(text, idem_key, bytea, interval, interval, interval, "any") TO PUBLIC;

-- Clean up.
SET ROLE regress_idem_alice;
SELECT idem_forget('shared-scope', 'k');
SET ROLE regress_idem_bob;
SELECT idem_forget('shared-scope', 'k');
RESET ROLE;
DROP FUNCTION alice_lookup(idem_key);
DROP ROLE regress_idem_alice;
DROP ROLE regress_idem_bob;
