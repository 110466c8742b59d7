-- Messages that say what happened and what to do, for mistakes users make: each with
-- its SQLSTATE, detail and hint.
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idempotency;
DROP PROCEDURE IF EXISTS leased_step(idem_key);
DROP PROCEDURE IF EXISTS plain_commit();
RESET client_min_messages;
\set SHOW_CONTEXT never

-- Completing (or failing) a key twice in one transaction: it was completed, not lost
-- (IK003 still, as for any finish of a key no longer pending for this holder).
BEGIN;
SELECT outcome FROM idem_claim('msg', 'twice');
SELECT idem_complete('msg', 'twice', '{"n": 1}');
SAVEPOINT again;
SELECT idem_complete('msg', 'twice', '{"n": 2}');
\echo :LAST_ERROR_SQLSTATE
ROLLBACK TO again;
SELECT idem_fail('msg', 'twice', '{"n": 3}');
\echo :LAST_ERROR_SQLSTATE
ROLLBACK TO again;
COMMIT;
SELECT state, response FROM idem_lookup('msg', 'twice');
-- In a later transaction, with its attempt: no longer pending for this holder.
SELECT idem_complete('msg', 'twice', '{"n": 4}', attempt => 1);
\echo :LAST_ERROR_SQLSTATE

-- A text value where an idem_key is expected: the hint names ::idem_key.
SELECT idem_claim('msg', 'k'::text);
\echo :LAST_ERROR_SQLSTATE
SELECT idem_once('msg', 'k'::varchar);
\echo :LAST_ERROR_SQLSTATE
DO $$
DECLARE k text := 'from-a-text-variable';
BEGIN
  PERFORM idem_complete('msg', k, '{}');
END $$;
\echo :LAST_ERROR_SQLSTATE
-- Other undefined functions keep PostgreSQL's own hint: another function, and a text
-- argument of an idem_ function that is not its key (idem_emit's payload is jsonb).
SELECT no_such_function('k'::text);
\echo :LAST_ERROR_SQLSTATE
SELECT idem_emit('msg', '{}'::text);
\echo :LAST_ERROR_SQLSTATE
SELECT idem_derive('root'::text, 'step');
\echo :LAST_ERROR_SQLSTATE
-- The key named ("key => text") is hinted too.
SELECT state FROM idem_lookup('msg', key => 'k'::text);
\echo :LAST_ERROR_SQLSTATE
-- A text[] where the relay's functions expect idem_key[] (ARRAY['...'] is text[]): the
-- hint names ::idem_key[], positional or named.
SELECT idem_outbox_ack('relay-1', ARRAY['e-1']);
\echo :LAST_ERROR_SQLSTATE
SELECT idem_outbox_dead('relay-1', ARRAY['e-1']::varchar[], 'poison');
\echo :LAST_ERROR_SQLSTATE
SELECT idem_outbox_retry(event_ids => ARRAY['e-1']);
\echo :LAST_ERROR_SQLSTATE
-- A single text where the array is expected is another mistake: PostgreSQL's hint.
SELECT idem_outbox_ack('relay-1', 'e-1'::text);
\echo :LAST_ERROR_SQLSTATE
-- The hinted forms work.
SELECT idem_outbox_ack('relay-1', ARRAY['e-1']::idem_key[]);
SELECT idem_outbox_retry(ARRAY['e-1']::text[]::idem_key[]);
-- The hinted form works.
BEGIN;
SELECT outcome FROM idem_claim('msg', 'k'::text::idem_key);
SELECT idem_release('msg', 'k'::text::idem_key);
COMMIT;

-- A procedure that commits its lease claim (the README's lease pattern), CALLed inside
-- a transaction block: PostgreSQL's 2D000 gets a detail and hint saying why and what to do.
CREATE PROCEDURE leased_step(p_key idem_key) LANGUAGE plpgsql AS $$
BEGIN
  PERFORM idem_claim('msg-lease', p_key, lease => '1 minute');
  COMMIT;  -- publish the lease before the outside call
  PERFORM idem_complete('msg-lease', p_key, '"done"', 1);
END $$;
BEGIN;
CALL leased_step('in-a-block');
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
SELECT count(*) AS stored FROM idem_lookup('msg-lease', 'in-a-block');
-- Called as intended it works.
CALL leased_step('autocommit');
SELECT state, response FROM idem_lookup('msg-lease', 'autocommit');
-- A procedure that commits without a lease claim keeps PostgreSQL's plain error.
CREATE PROCEDURE plain_commit() LANGUAGE plpgsql AS $$ BEGIN COMMIT; END $$;
BEGIN;
CALL plain_commit();
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
DROP PROCEDURE leased_step(idem_key);
DROP PROCEDURE plain_commit();
DELETE FROM idempotency.keys WHERE scope IN ('msg', 'msg-lease');
