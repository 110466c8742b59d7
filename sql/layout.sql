-- A library never writes columns it does not know: if idempotency.keys does not have
-- the columns this library expects (an older library against a newer schema, or a
-- hand-altered table), every function refuses with 55000 before reading or writing.
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idempotency;
RESET client_min_messages;
\set VERBOSITY default

BEGIN;
ALTER TABLE idempotency.keys ADD COLUMN added_later int;
SELECT outcome FROM idem_claim('layout', 'k1');
ROLLBACK;
BEGIN;
ALTER TABLE idempotency.keys RENAME COLUMN response TO reply;
SELECT idem_once('layout', 'k1');
ROLLBACK;
BEGIN;
ALTER TABLE idempotency.keys DROP COLUMN checkpoint_data;
SELECT count(*) FROM idem_lookup('layout', 'k1');
ROLLBACK;
-- Rolled back, the table is as installed and the functions work again.
SELECT idem_once('layout', 'k1');
SELECT idem_forget('layout', 'k1');
