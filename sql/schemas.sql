-- The extension installed into a chosen schema (CREATE EXTENSION ... SCHEMA), into the
-- first schema of the search_path, and into public, each in a database of its own and
-- each used end to end: a claim, its completion and replay, idem_once, idem_lookup,
-- idem_emit through the relay, and idem_apply_version. The store's columns of type
-- idem_key are the extension's own type wherever CREATE EXTENSION put it.
SELECT current_database() AS test_database \gset
SET client_min_messages = warning;
DROP DATABASE IF EXISTS regress_idem_schema_chosen;
DROP DATABASE IF EXISTS regress_idem_schema_path;
DROP DATABASE IF EXISTS regress_idem_schema_public;
CREATE DATABASE regress_idem_schema_chosen;
CREATE DATABASE regress_idem_schema_path;
CREATE DATABASE regress_idem_schema_public;
RESET client_min_messages;

\set use_it 'SELECT (app_claim).outcome AS first_claim FROM (SELECT idem_claim(''pay'', ''k-1''::idem_key, idem_fingerprint(''{"amount": 5}''::jsonb)) AS app_claim) c; SELECT idem_complete(''pay'', ''k-1'', ''{"paid": true}''); SELECT outcome, response FROM idem_claim(''pay'', ''k-1'', idem_fingerprint(''{"amount": 5}''::jsonb)); SELECT idem_once(''once'', ''o-1'') AS first_time, idem_once(''once'', ''o-1'') AS second_time; SELECT state, response FROM idem_lookup(''pay'', ''k-1''); SELECT idem_emit(''orders'', ''{"n": 1}'', ''order-1'', event_id => ''e-1'') AS emitted; SELECT idem_apply_version(''entities'', ''acct-1'', 2) AS applied, idem_apply_version(''entities'', ''acct-1'', 1) AS older_applied;'
\set relay_it 'SELECT event_id, topic, aggregate, seq FROM idem_outbox_claim(''relay''); SELECT idem_outbox_ack(''relay'', ARRAY[''e-1''::idem_key]) AS acked; SELECT keys_total, completed, outbox_undelivered FROM idem_stats();'

-- CREATE EXTENSION ... SCHEMA app
\c regress_idem_schema_chosen
CREATE SCHEMA app;
SET client_min_messages = warning;  -- no install notice on a server without the preload
CREATE EXTENSION idempotency SCHEMA app;
RESET client_min_messages;
SELECT n.nspname AS key_type_schema FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace
WHERE t.typname = 'idem_key';
-- A new session whose search_path does not have the schema: names written out.
\c regress_idem_schema_chosen
SET search_path = pg_catalog;
SELECT (app.idem_claim('pay', 'k-0'::app.idem_key, lease => '1 minute')).outcome AS qualified;
SELECT app.idem_once('once', 'o-0') AS qualified_once;
SET search_path = app;
BEGIN;
:use_it
COMMIT;
:relay_it

-- The first schema of the search_path
\c regress_idem_schema_path
CREATE SCHEMA app2;
SET search_path = app2, public;
SET client_min_messages = warning;  -- no install notice on a server without the preload
CREATE EXTENSION idempotency;
RESET client_min_messages;
SELECT n.nspname AS key_type_schema FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace
WHERE t.typname = 'idem_key';
-- A new session whose search_path does not have the schema: names written out.
\c regress_idem_schema_path
SET search_path = pg_catalog;
SELECT (app2.idem_claim('pay', 'k-0'::app2.idem_key, lease => '1 minute')).outcome AS qualified;
SELECT app2.idem_once('once', 'o-0') AS qualified_once;
SET search_path = app2, public;
BEGIN;
:use_it
COMMIT;
:relay_it

-- public
\c regress_idem_schema_public
SET client_min_messages = warning;  -- no install notice on a server without the preload
CREATE EXTENSION idempotency SCHEMA public;
RESET client_min_messages;
SELECT n.nspname AS key_type_schema FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace
WHERE t.typname = 'idem_key';
-- A new session whose search_path does not have the schema: names written out.
\c regress_idem_schema_public
SET search_path = pg_catalog;
SELECT (public.idem_claim('pay', 'k-0'::public.idem_key, lease => '1 minute')).outcome AS qualified;
SELECT public.idem_once('once', 'o-0') AS qualified_once;
SET search_path = public;
BEGIN;
:use_it
COMMIT;
:relay_it

\c :test_database
DROP DATABASE regress_idem_schema_chosen;
DROP DATABASE regress_idem_schema_path;
DROP DATABASE regress_idem_schema_public;
