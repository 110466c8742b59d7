-- idempotency 1.1 -> 1.2
\echo Use "ALTER EXTENSION idempotency UPDATE TO '1.2'" to load this file. \quit

-- Emitting is a privilege. Events belong to the database, not to a role: every role
-- that may emit shares one event-id namespace and one order per (topic, aggregate),
-- so a role could pre-empt another's event id (that event then silently not emitted)
-- or hold another's aggregate. Grant EXECUTE on idem_emit to the roles that produce
-- events.
REVOKE ALL ON FUNCTION idem_emit(text, jsonb, text, jsonb, idem_key) FROM PUBLIC;
