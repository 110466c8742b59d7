-- Prepared transactions (two-phase commit). A test of its own because it needs
-- max_prepared_transactions > 0 (test/regress.conf): `make installcheck-server` skips
-- it, saying so, on a server without. (An unwritten claim refusing PREPARE is in
-- claim.sql: that needs no prepared transaction.)
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idempotency;
RESET client_min_messages;
DELETE FROM idempotency.outbox;
DELETE FROM idempotency.outbox_aggregates;
CREATE FUNCTION pg_temp.claim(relay text, topics text[])
  RETURNS TABLE(id idem_key, topic text, aggregate text, seq bigint, payload jsonb, attempt integer)
  LANGUAGE sql AS $$
  SELECT event_id, topic, aggregate, seq, payload, attempt
  FROM idem_outbox_claim(relay, 100, '30s', topics) $$;

-- PREPARE TRANSACTION closes the tables the library keeps open for the transaction,
-- as a commit does (PostgreSQL would warn of a reference leak otherwise), and what
-- the prepared transaction wrote is stored once COMMIT PREPARED commits it.
BEGIN;
SELECT idem_once('2pc', 'prepared') AS first_time;
SELECT idem_emit('or.2pc', '{}', 'agg-2pc') IS NOT NULL AS emitted;
PREPARE TRANSACTION 'idem_two_phase_keys';
SELECT count(*) AS stored_while_prepared FROM idempotency.keys WHERE scope = '2pc';
COMMIT PREPARED 'idem_two_phase_keys';
SELECT count(*) AS stored FROM idempotency.keys WHERE scope = '2pc';
SELECT idem_once('2pc', 'prepared') AS first_time_again;

-- A prepared transaction's events are relayed once COMMIT PREPARED commits them, and
-- vanish with ROLLBACK PREPARED.
BEGIN;
SELECT idem_emit('2pc', '{"n": 1}', 'P', event_id => 'p-1');
PREPARE TRANSACTION 'idem_outbox_rolled_back';
SELECT * FROM pg_temp.claim('relay-p', topics => '{2pc}');
ROLLBACK PREPARED 'idem_outbox_rolled_back';
SELECT * FROM pg_temp.claim('relay-p', topics => '{2pc}');
BEGIN;
SELECT idem_emit('2pc', '{"n": 2}', 'P', event_id => 'p-2');
PREPARE TRANSACTION 'idem_outbox_committed';
SELECT * FROM pg_temp.claim('relay-p', topics => '{2pc}');
COMMIT PREPARED 'idem_outbox_committed';
SELECT * FROM pg_temp.claim('relay-p', topics => '{2pc}');
SELECT idem_outbox_ack('relay-p', '{p-2}') AS acked;

SELECT idem_forget('2pc', 'prepared');
DELETE FROM idempotency.outbox;
DELETE FROM idempotency.outbox_aggregates;

-- idem_once_many (once_many.sql) meets another transaction's key in flight (here a
-- prepared one): waited for at most `wait` for the whole call, then IK005, and nothing
-- of the call stored.
BEGIN;
SELECT idem_once('mb-2pc', 'prepared') AS applied;
PREPARE TRANSACTION 'mb_holder';
SELECT idem_once_many('mb-2pc', ARRAY['w-1', 'prepared', 'w-2']::idem_key[], wait => '50ms');
\echo :LAST_ERROR_SQLSTATE
SELECT idem_once_many('mb-2pc', ARRAY['w-1', 'prepared']::idem_key[], wait => '0');
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) AS stored FROM idempotency.keys WHERE scope = 'mb-2pc' AND key::text LIKE 'w-%';
COMMIT PREPARED 'mb_holder';
SELECT idem_once_many('mb-2pc', ARRAY['w-1', 'prepared', 'w-2']::idem_key[]) AS after_commit;
