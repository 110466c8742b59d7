-- Messaging (1.1): the transactional outbox. idem_emit, the relay's functions
-- (idem_outbox_claim, _ack, _dead, _retry, _dead_letters), retention by idem_reap,
-- idem_stats' outbox figures, privileges and bad input. The concurrent cases (an
-- emitter waiting for another, relays racing, late commits) are the isolation specs
-- emit_order, emit_event_id and relay_order.
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idempotency;
DROP ROLE IF EXISTS regress_idem_producer;
DROP ROLE IF EXISTS regress_idem_relay;
DROP ROLE IF EXISTS regress_idem_mallory;
RESET client_min_messages;
-- Start from an empty outbox and no expired keys (a superuser may), so that the
-- counts below are this file's own.
DELETE FROM idempotency.outbox;
DELETE FROM idempotency.outbox_aggregates;
SELECT idem_reap() >= 0 AS reaped_before;

-- Random event ids print as (uuid), so that the output is the same on every run.
CREATE FUNCTION pg_temp.label(id idem_key) RETURNS text LANGUAGE sql AS $$
  SELECT CASE WHEN id::text ~ '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$'
              THEN '(uuid)' ELSE id::text END $$;
-- The outbox as a superuser sees it, in emission order.
CREATE VIEW pg_temp.events AS
  SELECT pg_temp.label(event_id) AS id, topic, aggregate, seq, payload, state, attempt, relay, reason
  FROM idempotency.outbox ORDER BY position;
-- What a relay is handed.
CREATE FUNCTION pg_temp.claim(relay text, max_events integer DEFAULT 100,
                              lease interval DEFAULT '30s', topics text[] DEFAULT NULL)
  RETURNS TABLE(id text, topic text, aggregate text, seq bigint, payload jsonb, attempt integer)
  LANGUAGE sql AS $$
  SELECT pg_temp.label(event_id), topic, aggregate, seq, payload, attempt
  FROM idem_outbox_claim(relay, max_events, lease, topics) $$;

-- An empty outbox: nothing undelivered, nothing dead, no oldest event.
SELECT outbox_undelivered, outbox_dead, outbox_oldest_undelivered_at FROM idem_stats();

------------------------------------------------------------------------------
-- Emitting
------------------------------------------------------------------------------

-- Promise: an event is recorded in the calling transaction and vanishes with it if
-- it rolls back.
BEGIN;
SELECT pg_temp.label(idem_emit('tx', '{"n": 1}'));
SELECT id, topic, payload, state, attempt FROM pg_temp.events WHERE topic = 'tx';
ROLLBACK;
SELECT count(*) AS rolled_back FROM pg_temp.events WHERE topic = 'tx';
-- Promise: a savepoint rolled back takes its events too (and an EXCEPTION block,
-- which is one); the transaction's other events commit.
BEGIN;
SELECT pg_temp.label(idem_emit('tx', '{"n": 2}'));
SAVEPOINT before_3;
SELECT pg_temp.label(idem_emit('tx', '{"n": 3}'));
ROLLBACK TO before_3;
DO $$
BEGIN
  PERFORM idem_emit('tx', '{"n": 4}');
  RAISE EXCEPTION 'the block fails';
EXCEPTION WHEN raise_exception THEN
  NULL;
END $$;
SELECT pg_temp.label(idem_emit('tx', '{"n": 5}', headers => '{"h": "v"}'));
COMMIT;
SELECT id, topic, aggregate, seq, payload, state, attempt FROM pg_temp.events WHERE topic = 'tx';
SELECT headers FROM idempotency.outbox WHERE topic = 'tx' ORDER BY position;

-- Promise: without event_id, a new random UUID, lowercase and hyphenated.
SELECT idem_emit('uuid', '{}')::text ~ '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$'
  AS lowercase_hyphenated_uuid;
SELECT count(DISTINCT idem_emit('uuid', '{}')) AS distinct_ids FROM generate_series(1, 3);

-- Promise: with event_id, the event is emitted at most once under that id: the same
-- id is returned and nothing new is stored (the first payload stays), in the same
-- transaction or later, in the same statement, whatever the topic or aggregate.
SELECT idem_emit('ids', '{"n": 1}', event_id => 'evt-1');
SELECT idem_emit('ids', '{"n": 2}', event_id => 'evt-1');
SELECT idem_emit('ids', '{"n": 3}', 'agg', event_id => 'evt-1');
SELECT idem_emit('other-topic', '{"n": 4}', event_id => 'evt-1');
SELECT idem_emit('ids', jsonb_build_object('n', g), event_id => 'evt-2') FROM generate_series(1, 3) g;
BEGIN;
SELECT idem_emit('ids', '{"n": 5}', event_id => 'evt-3');
SELECT idem_emit('ids', '{"n": 6}', event_id => 'evt-3');
COMMIT;
SELECT id, topic, aggregate, seq, payload, state FROM pg_temp.events WHERE id LIKE 'evt-%';
-- An id whose emission was rolled back (with a savepoint) is free again.
BEGIN;
SAVEPOINT s;
SELECT idem_emit('ids', '{"n": 7}', event_id => 'evt-4');
ROLLBACK TO s;
SELECT idem_emit('ids', '{"n": 8}', event_id => 'evt-4');
COMMIT;
SELECT id, payload FROM pg_temp.events WHERE id = 'evt-4';

-- Promise: the events of one (topic, aggregate) get seq 1, 2, 3, ... with no gap, even
-- when an emission rolled back in between; each (topic, aggregate) counts on its own;
-- events without an aggregate have seq NULL.
SELECT pg_temp.label(idem_emit('orders', '{"n": 1}', 'o-1'));
BEGIN;
SELECT pg_temp.label(idem_emit('orders', '{"n": 2}', 'o-1'));
ROLLBACK;
BEGIN;
SAVEPOINT s;
SELECT pg_temp.label(idem_emit('orders', '{"n": 3}', 'o-1'));
ROLLBACK TO s;
SELECT pg_temp.label(idem_emit('orders', '{"n": 4}', 'o-1'));
COMMIT;
SELECT pg_temp.label(idem_emit('orders', '{"n": 5}', 'o-2'));
SELECT pg_temp.label(idem_emit('orders', '{"n": 6}'));
SELECT pg_temp.label(idem_emit('invoices', '{"n": 7}', 'o-1'));
SELECT count(*) FROM (SELECT idem_emit('orders', jsonb_build_object('n', 7 + g), 'o-1')
                      FROM generate_series(1, 2) g) e;
SELECT id, topic, aggregate, seq, payload FROM pg_temp.events
WHERE topic IN ('orders', 'invoices') ORDER BY topic, aggregate, seq;

------------------------------------------------------------------------------
-- Relaying
------------------------------------------------------------------------------

-- Promise: the relay is handed committed events only, in the order they were
-- emitted, each with attempt 1 the first time; max_events bounds the batch; topics
-- filters it. First the events of the sections above, in emission order.
SELECT * FROM pg_temp.claim('relay-0', topics => '{tx,uuid,ids,other-topic}');
-- max_events 3: o-1's seq 1 and 2 (one aggregate's consecutive events may share a
-- batch) and o-2's seq 1.
SELECT * FROM pg_temp.claim('relay-0', 3, topics => '{orders,invoices}');
-- The rest, but not o-1's seq 3 and 4: its seq 1 and 2 are leased (even to the same
-- relay, in an earlier batch).
SELECT * FROM pg_temp.claim('relay-0', topics => '{orders,invoices}');
-- Another relay gets nothing: everything is leased or waits for a leased event.
SELECT * FROM pg_temp.claim('relay-1', topics => '{tx,uuid,ids,other-topic,orders,invoices}');
SELECT idem_outbox_ack('relay-0', ARRAY(SELECT event_id FROM idempotency.outbox
                                        WHERE relay = 'relay-0')) AS acked;
-- o-1's seq 1 and 2 are delivered: its seq 3 and 4 follow.
SELECT * FROM pg_temp.claim('relay-1', topics => '{tx,uuid,ids,other-topic,orders,invoices}');
SELECT idem_outbox_ack('relay-1', ARRAY(SELECT event_id FROM idempotency.outbox
                                        WHERE relay = 'relay-1')) AS acked;

-- Promise: per aggregate, an event is handed out only once every earlier event of
-- its aggregate is delivered or dead, or handed out earlier in the same batch.
SELECT idem_emit('r.a', '{"n": 1}', 'A1', event_id => 'a1-1');
SELECT idem_emit('r.a', '{"n": 2}', 'A2', event_id => 'a2-1');
SELECT idem_emit('r.b', '{"n": 3}', event_id => 'b-x');
SELECT idem_emit('r.a', '{"n": 4}', 'A1', event_id => 'a1-2');
SELECT idem_emit('r.a', '{"n": 5}', 'A1', event_id => 'a1-3');
SELECT idem_emit('r.b', '{"n": 6}', 'B1', event_id => 'b1-1');
-- relay-1 takes the first two (max_events 2): A1's and A2's first events.
SELECT * FROM pg_temp.claim('relay-1', 2, topics => '{r.a,r.b}');
-- relay-2 gets nothing of A1 (its seq 1 is leased to relay-1) nor of A2, but the
-- other events: the one without aggregate and B1's.
SELECT * FROM pg_temp.claim('relay-2', topics => '{r.a,r.b}');
-- The topics filter: relay-3 asks only for r.a, where nothing is free.
SELECT * FROM pg_temp.claim('relay-3', topics => '{r.a}');

-- Promise: an ack counts only from the relay the event is leased to; unknown ids and
-- NULL elements are ignored.
SELECT idem_outbox_ack('relay-2', '{a1-1}') AS wrong_relay;
SELECT idem_outbox_ack('relay-1', '{a1-1,no-such-event,NULL}') AS acked;
SELECT idem_outbox_ack('relay-1', '{a1-1}') AS acked_again;
SELECT idem_outbox_ack('relay-1', '{}') AS none;
SELECT id, seq, state, attempt, relay FROM pg_temp.events WHERE aggregate = 'A1';
-- A1's seq 1 is delivered: its seq 2 and 3 are handed out, both in one batch, in order.
SELECT * FROM pg_temp.claim('relay-3', topics => '{r.a,r.b}');
SELECT idem_outbox_ack('relay-3', '{a1-3,a1-2}') AS acked;
SELECT idem_outbox_ack('relay-1', '{a2-1}') + idem_outbox_ack('relay-2', '{b-x,b1-1}') AS acked;

-- Promise: a relay that dies loses nothing: when its lease runs out the event is
-- handed out again with attempt + 1, and the first relay's late ack is then ignored.
SELECT idem_emit('lease', '{"n": 1}', 'L', event_id => 'l-1');
SELECT idem_emit('lease', '{"n": 2}', 'L', event_id => 'l-2');
SELECT * FROM pg_temp.claim('relay-a', 1, lease => '10 ms', topics => '{lease}');
SELECT pg_sleep(0.05);
SELECT * FROM pg_temp.claim('relay-b', 1, topics => '{lease}');
SELECT idem_outbox_ack('relay-a', '{l-1}') AS late_ack;
SELECT idem_outbox_ack('relay-b', '{l-1}') AS acked;
SELECT id, seq, state, attempt, relay FROM pg_temp.events WHERE topic = 'lease';
-- A lease that ran out still counts while no other relay has taken the event.
SELECT * FROM pg_temp.claim('relay-a', 1, lease => '10 ms', topics => '{lease}');
SELECT pg_sleep(0.05);
SELECT idem_outbox_ack('relay-a', '{l-2}') AS acked_after_its_lease;

-- Promise: idem_outbox_dead moves an event leased to the relay to the dead letters
-- with its reason, so it stops blocking its aggregate.
SELECT idem_emit('dead', '{"n": 1}', 'D', event_id => 'd-1');
SELECT idem_emit('dead', '{"n": 2}', 'D', event_id => 'd-2');
SELECT idem_emit('dead', '{"n": 3}', 'D', event_id => 'd-3');
SELECT idem_emit('dead.other', '{"n": 4}', event_id => 'x-1');
SELECT * FROM pg_temp.claim('relay-d', 1, topics => '{dead}');
SELECT * FROM pg_temp.claim('relay-x', topics => '{dead}');
SELECT idem_outbox_dead('relay-x', '{d-1}', 'not yours') AS wrong_relay;
SELECT idem_outbox_dead('relay-d', '{d-1,no-such-event,NULL}', 'poison: bad schema') AS buried;
SELECT id, seq, state, attempt, reason FROM pg_temp.events WHERE topic = 'dead';
-- An ack of a dead letter counts for nothing; a second dead neither.
SELECT idem_outbox_ack('relay-d', '{d-1}') AS ack_of_dead;
SELECT idem_outbox_dead('relay-d', '{d-1}') AS dead_again;
-- D's next event is free now.
SELECT * FROM pg_temp.claim('relay-x', 1, topics => '{dead}');
SELECT idem_outbox_ack('relay-x', '{d-2}') AS acked;
SELECT * FROM pg_temp.claim('relay-x', topics => '{dead.other}');
SELECT idem_outbox_dead('relay-x', '{x-1}') AS buried_without_reason;
-- Promise: an event_id that is stored dead (or delivered) is not emitted again.
SELECT idem_emit('dead', '{"n": 99}', 'D', event_id => 'd-1') AS dead_id,
       idem_emit('dead', '{"n": 99}', 'D', event_id => 'd-2') AS delivered_id;
SELECT count(*) AS rows_of_d1_d2 FROM pg_temp.events WHERE id IN ('d-1', 'd-2');

-- Promise: idem_outbox_dead_letters lists the dead letters oldest first, with their
-- reason; topic filters, max_rows bounds.
SELECT pg_temp.label(event_id) AS id, topic, aggregate, seq, payload, headers, attempt, reason,
       emitted_at = (SELECT emitted_at FROM idempotency.outbox o WHERE o.event_id = d.event_id)
         AS emitted_at_kept
FROM idem_outbox_dead_letters() d;
SELECT pg_temp.label(event_id) AS id FROM idem_outbox_dead_letters(max_rows => 1);
SELECT pg_temp.label(event_id) AS id FROM idem_outbox_dead_letters('dead.other');
SELECT pg_temp.label(event_id) AS id FROM idem_outbox_dead_letters('no-such-topic');
SELECT pg_temp.label(event_id) AS id FROM idem_outbox_dead_letters(max_rows => 0);

-- Promise: idem_outbox_retry puts the given dead letters back for delivery with their
-- original seq and returns how many (ids that are not dead letters count for nothing);
-- the aggregate is blocked again until the retried event is delivered.
SELECT idem_outbox_retry('{d-1,d-2,no-such-event,NULL}') AS requeued;
SELECT pg_temp.label(event_id) AS id FROM idem_outbox_dead_letters();
SELECT id, seq, state, attempt FROM pg_temp.events WHERE topic = 'dead';
SELECT * FROM pg_temp.claim('relay-d', 1, topics => '{dead}');
-- d-3 waits for d-1 (seq 1), leased to relay-d again.
SELECT * FROM pg_temp.claim('relay-x', topics => '{dead}');
SELECT idem_outbox_ack('relay-d', '{d-1}') AS acked;
SELECT * FROM pg_temp.claim('relay-x', topics => '{dead}');
SELECT idem_outbox_dead('relay-x', '{d-3}', 'again') AS buried;
-- NULL: every dead letter.
SELECT pg_temp.label(event_id) AS id FROM idem_outbox_dead_letters();
SELECT idem_outbox_retry() AS requeued;
SELECT idem_outbox_retry() AS requeued_again;
SELECT pg_temp.label(event_id) AS id FROM idem_outbox_dead_letters();
SELECT * FROM pg_temp.claim('relay-x', topics => '{dead,dead.other}');
SELECT idem_outbox_ack('relay-x', '{d-3,x-1}') AS acked;

-- Promise: the relay is handed committed events only: not those of a transaction
-- still in progress, not even the relay's own.
BEGIN;
SELECT idem_emit('own', '{"n": 1}', event_id => 'own-1');
SELECT * FROM pg_temp.claim('relay-own', topics => '{own}');
ROLLBACK;

-- A prepared transaction's events: two_phase.sql (it needs max_prepared_transactions).

------------------------------------------------------------------------------
-- Retention and idem_stats
------------------------------------------------------------------------------

-- One event left pending (leased), one dead, one pending and never handed out.
SELECT idem_emit('keep', '{"n": 1}', 'K', event_id => 'k-1');
SELECT idem_emit('keep', '{"n": 2}', 'K', event_id => 'k-2');
SELECT idem_emit('keep', '{"n": 3}', event_id => 'k-3');
SELECT * FROM pg_temp.claim('relay-k', 1, topics => '{keep}');
SELECT idem_outbox_dead('relay-k', '{k-1}', 'kept dead') AS buried;
SELECT * FROM pg_temp.claim('relay-k', 1, topics => '{keep}');
SELECT state, count(*) FROM idempotency.outbox GROUP BY state ORDER BY state;

-- Promise: idem_stats counts the undelivered (pending, leased or not) and dead events,
-- and gives the emission time of the oldest undelivered one.
SELECT outbox_undelivered, outbox_dead,
       outbox_oldest_undelivered_at = (SELECT emitted_at FROM idempotency.outbox WHERE event_id = 'k-2')
         AS oldest_is_k2
FROM idem_stats();

-- Promise: with idempotency.outbox_retention at its default 0, idem_reap removes
-- delivered events at once, and never pending or dead ones.
SHOW idempotency.outbox_retention;
SELECT count(*) AS delivered FROM idempotency.outbox WHERE state = 'd' \gset
SELECT idem_reap(2) AS reaped_at_most_2;
SELECT idem_reap() = :delivered - 2 AS reaped_the_rest;
SELECT id, topic, aggregate, seq, state FROM pg_temp.events;
SELECT idem_reap() AS reaped_again;
SELECT outbox_undelivered, outbox_dead FROM idem_stats();
-- The aggregates' counters stay: a new event continues its aggregate's seq.
SELECT pg_temp.label(idem_emit('orders', '{"n": 10}', 'o-1'));
SELECT seq FROM idempotency.outbox WHERE topic = 'orders' AND aggregate = 'o-1';
-- An id whose event was removed is emitted anew (at most once while it is stored).
SELECT idem_emit('ids', '{"n": 9}', event_id => 'evt-1');
SELECT id, payload, state, attempt FROM pg_temp.events WHERE id = 'evt-1';
-- (1.4) Not an event the calling transaction delivered: idem_reap in it leaves it (as
-- the worker, another transaction, must), so its id is still taken there; after
-- COMMIT it is removed.
SELECT idem_emit('own-ack', '{"n": 1}', event_id => 'own-1');
BEGIN;
SELECT event_id FROM idem_outbox_claim('relay-own', topics => '{own-ack}');
SELECT idem_outbox_ack('relay-own', '{own-1}') AS acked;
SELECT idem_reap() >= 0 AS reaped;
SELECT idem_emit('own-ack', '{"n": 2}', event_id => 'own-1');
SELECT id, payload, state FROM pg_temp.events WHERE topic = 'own-ack';
COMMIT;
SELECT idem_reap() >= 1 AS reaped;
SELECT count(*) AS own_ack_events FROM idempotency.outbox WHERE topic = 'own-ack';

------------------------------------------------------------------------------
-- Privileges
------------------------------------------------------------------------------

-- Promise: idem_apply_version is granted to PUBLIC; since 1.2 idem_emit is not (42501
-- without the grant: a role could otherwise pre-empt another's event id or hold its
-- aggregate), and neither are the relay's functions, until granted.
CREATE ROLE regress_idem_producer;
CREATE ROLE regress_idem_relay;
CREATE ROLE regress_idem_mallory;
SELECT p AS function, has_function_privilege('regress_idem_producer', p, 'EXECUTE') AS executable
FROM unnest(ARRAY['idem_emit(text,jsonb,text,jsonb,idem_key,"any")',
                  'idem_apply_version(text,text,bigint,interval,"any")',
                  'idem_outbox_claim(text,integer,interval,text[])',
                  'idem_outbox_ack(text,idem_key[])',
                  'idem_outbox_dead(text,idem_key[],text)',
                  'idem_outbox_retry(idem_key[])',
                  'idem_outbox_dead_letters(text,integer)']) p;
-- A role without the grant cannot emit: not a forged event id, not a held aggregate.
SET ROLE regress_idem_mallory;
SELECT idem_emit('priv', '{"forged": true}', 'account-1', event_id => 'priv-1');
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;
GRANT EXECUTE ON FUNCTION idem_emit(text, jsonb, text, jsonb, idem_key, "any") TO regress_idem_producer;
SET ROLE regress_idem_producer;
SELECT idem_emit('priv', '{"n": 1}', event_id => 'priv-1');
SELECT idem_apply_version('priv', 'entity', 1);
SELECT count(*) FROM idem_outbox_claim('relay-p');
\echo :LAST_ERROR_SQLSTATE
SELECT idem_outbox_ack('relay-p', '{priv-1}');
\echo :LAST_ERROR_SQLSTATE
SELECT idem_outbox_dead('relay-p', '{priv-1}');
\echo :LAST_ERROR_SQLSTATE
SELECT idem_outbox_retry();
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) FROM idem_outbox_dead_letters();
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) FROM idempotency.outbox;
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;
-- Events belong to the database, not a role: a relay's role relays every role's events.
GRANT EXECUTE ON FUNCTION idem_outbox_claim(text, integer, interval, text[]),
  idem_outbox_ack(text, idem_key[]) TO regress_idem_relay;
SET ROLE regress_idem_relay;
SELECT event_id, topic, payload, attempt FROM idem_outbox_claim('relay-p', topics => '{priv}');
SELECT idem_outbox_ack('relay-p', '{priv-1}') AS acked;
RESET ROLE;
REVOKE EXECUTE ON FUNCTION idem_outbox_claim(text, integer, interval, text[]),
  idem_outbox_ack(text, idem_key[]) FROM regress_idem_relay;
REVOKE EXECUTE ON FUNCTION idem_emit(text, jsonb, text, jsonb, idem_key, "any") FROM regress_idem_producer;
DELETE FROM idempotency.applied_versions WHERE scope = 'priv';
DROP ROLE regress_idem_producer;
DROP ROLE regress_idem_relay;
DROP ROLE regress_idem_mallory;

------------------------------------------------------------------------------
-- Bad input
------------------------------------------------------------------------------

-- NULL where a value is required: 22004.
SELECT idem_emit(NULL, '{}');
\echo :LAST_ERROR_SQLSTATE
SELECT idem_emit('t', NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) FROM idem_outbox_claim(NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) FROM idem_outbox_claim('r', NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) FROM idem_outbox_claim('r', 10, NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT idem_outbox_ack(NULL, '{k-2}');
\echo :LAST_ERROR_SQLSTATE
SELECT idem_outbox_ack('r', NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT idem_outbox_dead(NULL, '{k-2}');
\echo :LAST_ERROR_SQLSTATE
SELECT idem_outbox_dead('r', NULL);
\echo :LAST_ERROR_SQLSTATE

-- Empty or over-long topic, aggregate, relay (bytes, not characters): 22023.
SELECT idem_emit('', '{}');
\echo :LAST_ERROR_SQLSTATE
SELECT idem_emit(repeat('t', 256), '{}');
\echo :LAST_ERROR_SQLSTATE
SELECT idem_emit('t', '{}', '');
\echo :LAST_ERROR_SQLSTATE
SELECT idem_emit('t', '{}', repeat('a', 256));
\echo :LAST_ERROR_SQLSTATE
SELECT idem_emit('t', '{}', repeat('é', 128));
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) FROM idem_outbox_claim('');
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) FROM idem_outbox_claim(repeat('r', 256));
\echo :LAST_ERROR_SQLSTATE
SELECT idem_outbox_ack('', '{k-2}');
\echo :LAST_ERROR_SQLSTATE
SELECT idem_outbox_dead(repeat('r', 256), '{k-2}');
\echo :LAST_ERROR_SQLSTATE
-- Non-positive max_events or lease: 22023.
SELECT count(*) FROM idem_outbox_claim('r', 0);
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) FROM idem_outbox_claim('r', -1);
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) FROM idem_outbox_claim('r', 10, '0');
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) FROM idem_outbox_claim('r', 10, '-1 second');
\echo :LAST_ERROR_SQLSTATE
-- 255 bytes are fine (and k-2, leased to relay-k, stays where it is).
SELECT pg_temp.label(idem_emit(repeat('t', 255), '{}', repeat('a', 255)));
SELECT count(*) FROM idem_outbox_claim(repeat('r', 255), topics => ARRAY[repeat('t', 255)]);
-- A bad event id is a bad idem_key: 22P02.
SELECT idem_emit('t', '{}', event_id => 'bad key');
\echo :LAST_ERROR_SQLSTATE

-- Oversized payload or headers (idempotency.max_response_size): 54000, nothing stored.
SET idempotency.max_response_size = '1kB';
SELECT idem_emit('big', jsonb_build_object('blob', repeat('x', 2000)));
\echo :LAST_ERROR_SQLSTATE
SELECT idem_emit('big', '{}', headers => jsonb_build_object('blob', repeat('x', 2000)));
\echo :LAST_ERROR_SQLSTATE
SELECT idem_emit('big', jsonb_build_object('blob', repeat('x', 2000)), event_id => 'big-1');
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) AS stored FROM idempotency.outbox WHERE topic = 'big';
SELECT idem_emit('big', jsonb_build_object('blob', repeat('x', 900)), event_id => 'big-2');
-- Payload and headers count together: each under the limit, both over it.
SELECT idem_emit('big', jsonb_build_object('blob', repeat('x', 600)),
                 headers => jsonb_build_object('blob', repeat('x', 600)));
\echo :LAST_ERROR_SQLSTATE
RESET idempotency.max_response_size;

-- Writing functions in a read-only transaction: 25006; listing dead letters works.
BEGIN READ ONLY;
SELECT idem_emit('ro', '{}');
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
BEGIN READ ONLY;
SELECT idem_emit('ro', '{}', event_id => 'k-2');
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
BEGIN READ ONLY;
SELECT count(*) FROM idem_outbox_claim('r');
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
BEGIN READ ONLY;
SELECT idem_outbox_ack('relay-k', '{k-2}');
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
BEGIN READ ONLY;
SELECT idem_outbox_dead('relay-k', '{k-2}');
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
BEGIN READ ONLY;
SELECT idem_outbox_retry();
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
BEGIN READ ONLY;
SELECT idem_outbox_retry('{k-1}');
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
BEGIN READ ONLY;
SELECT idem_apply_version('ro', 'entity', 1);
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
BEGIN READ ONLY;
SELECT pg_temp.label(event_id) AS id, reason FROM idem_outbox_dead_letters();
SELECT outbox_undelivered, outbox_dead FROM idem_stats();
COMMIT;
-- Nothing changed.
SELECT id, topic, seq, state, attempt, relay FROM pg_temp.events WHERE topic IN ('keep', 'ro');

DELETE FROM idempotency.outbox;
DELETE FROM idempotency.outbox_aggregates;

-- No lock outlives a call: one transaction emits for 20,000 aggregates under 20,000
-- event ids and applies 20,000 entities (a lock held per aggregate, id or entity
-- until commit would run out of the shared lock table), and holds no advisory lock
-- after its calls.
BEGIN;
SELECT count(idem_emit('many', '{}', 'agg-' || g, event_id => ('many-' || g)::idem_key))
  FROM generate_series(1, 20000) g;
SELECT count(*) FILTER (WHERE idem_apply_version('many', 'entity-' || g, 1))
  FROM generate_series(1, 20000) g;
SELECT count(*) AS advisory_locks_held FROM pg_locks
  WHERE locktype = 'advisory' AND pid = pg_backend_pid();
COMMIT;
SELECT count(*) AS events, count(DISTINCT aggregate) AS aggregates, max(seq) AS max_seq
  FROM idempotency.outbox WHERE topic = 'many';
DELETE FROM idempotency.outbox;
DELETE FROM idempotency.outbox_aggregates;
DELETE FROM idempotency.applied_versions;
-- (1.4) A routing value is for a store distributed with Citus (idem_distribute): on one
-- node it is refused, and nothing is stored.
SELECT idem_emit('routed', '{}', 'agg', route => 42);
SELECT idem_apply_version('routed', 'entity', 1, route => 42);
SELECT count(*) FROM idempotency.outbox WHERE topic = 'routed';
