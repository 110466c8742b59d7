-- The library keeps its tables, their indexes and the executor state that inserts
-- index entries open from a transaction's first call until the transaction ends, owned
-- by the top-level transaction. What that must not change: utility commands in the
-- same transaction find the tables closed, an index created in the transaction gets
-- the later rows' entries, a rolled-back savepoint or a caught error leaves the next
-- call working, and no transaction ends with a relation left open (PostgreSQL would
-- warn of a reference leak here, at every commit of this file).
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idempotency;
RESET client_min_messages;
DELETE FROM idempotency.outbox;
DELETE FROM idempotency.outbox_aggregates;

-- TRUNCATE and ALTER TABLE refuse a table the session has open ("is being used by
-- active queries in this session"): the utility hook closes them first.
BEGIN;
SELECT idem_once('or-scope', 'k1') AS first_time;
TRUNCATE idempotency.keys;
SELECT idem_once('or-scope', 'k1') AS first_time_again;
SELECT idem_emit('or.topic', '{"n": 1}', 'agg-1') IS NOT NULL AS emitted;
ALTER TABLE idempotency.outbox SET (fillfactor = 80);
SELECT idem_emit('or.topic', '{"n": 2}', 'agg-1') IS NOT NULL AS emitted;
ROLLBACK;

-- An index created after an emit, in the same transaction, gets the entries of the
-- emits after it (the executor state made before it is not reused).
BEGIN;
SELECT idem_emit('or.index', '{"n": 1}', 'agg-1') IS NOT NULL AS emitted;
CREATE INDEX outbox_topic_idx ON idempotency.outbox (topic);
SELECT idem_emit('or.index', '{"n": 2}', 'agg-1') IS NOT NULL AS emitted;
SELECT idem_emit('or.index', '{"n": 3}', 'agg-2') IS NOT NULL AS emitted;
SET LOCAL enable_seqscan = off;
SET LOCAL enable_bitmapscan = off;
EXPLAIN (COSTS OFF) SELECT count(*) FROM idempotency.outbox WHERE topic = 'or.index';
SELECT count(*) AS through_the_new_index FROM idempotency.outbox WHERE topic = 'or.index';
ROLLBACK;

-- A savepoint rolled back after the first call opened the tables: they stay open for
-- the transaction (a subtransaction's cleanup does not close them under it).
BEGIN;
SAVEPOINT first_call;
SELECT idem_emit('or.savepoint', '{"n": 1}', 'agg-sp') IS NOT NULL AS emitted;
SELECT idem_once('or-savepoint', 'rolled-back') AS first_time;
ROLLBACK TO first_call;
SELECT idem_emit('or.savepoint', '{"n": 2}', 'agg-sp') IS NOT NULL AS emitted;
SELECT idem_once('or-savepoint', 'kept') AS first_time;
COMMIT;
SELECT seq, payload FROM idempotency.outbox WHERE topic = 'or.savepoint';
SELECT key FROM idempotency.keys WHERE scope = 'or-savepoint' ORDER BY key;

-- An error inside a savepoint, then ROLLBACK TO (a utility command, which closes them
-- while the subtransaction is aborted), then more calls.
BEGIN;
SELECT idem_once('or-savepoint', 'before-error') AS first_time;
SAVEPOINT before_error;
SELECT idem_emit('or.savepoint', '{"n": 3}', 'agg-sp') IS NOT NULL AS emitted;
SELECT 1 / 0;
ROLLBACK TO before_error;
SELECT idem_emit('or.savepoint', '{"n": 4}', 'agg-sp') IS NOT NULL AS emitted;
COMMIT;
SELECT seq, payload FROM idempotency.outbox WHERE topic = 'or.savepoint' ORDER BY seq;
SELECT idem_forget('or-savepoint', 'before-error');

-- An error caught in a PL/pgSQL block, raised after the call opened the key store.
DO $$
BEGIN
  BEGIN
    PERFORM idem_once('or-caught', 'inside');
    PERFORM idem_complete('or-caught', 'never-claimed', '{}');
  EXCEPTION WHEN OTHERS THEN
    RAISE NOTICE 'caught %', SQLSTATE;
  END;
  PERFORM idem_once('or-caught', 'after');
  PERFORM idem_emit('or.caught', '{}', 'agg-c');
END $$;
SELECT key FROM idempotency.keys WHERE scope = 'or-caught' ORDER BY key;

-- A prepared transaction closes them too: two_phase.sql.

-- idem_reap in the transaction that opened the key store, then another call. (The
-- expired key is another transaction's: the transaction's own rows are live until it
-- ends, and idem_reap leaves them.)
SELECT idem_once('or-reap', 'k', ttl => '1 millisecond') AS first_time;
SELECT pg_sleep(0.01);
BEGIN;
SELECT idem_once('or-reap', 'opener') AS first_time;
SELECT idem_reap() >= 1 AS reaped_it;
SELECT idem_once('or-reap', 'k') AS first_time_again;
SELECT idem_forget('or-reap', 'opener');
COMMIT;

-- What inserting into the indexes needs to know of them (key columns, uniqueness, the
-- partial indexes' predicates compiled) is kept for the session, not rebuilt in every
-- transaction. An index created, replaced or dropped between transactions is seen by
-- the next call: the new partial index gets exactly the rows its predicate selects.
SELECT idem_emit('or.session', '{"n": 1}', 'agg-s') IS NOT NULL AS emitted;
SELECT idem_once('or-session', 'before') AS first_time;
CREATE INDEX outbox_session_idx ON idempotency.outbox (aggregate) WHERE topic = 'or.session';
CREATE INDEX keys_session_idx ON idempotency.keys (scope) WHERE scope = 'or-session';
SELECT idem_emit('or.session', '{"n": 2}', 'agg-s') IS NOT NULL AS emitted;
SELECT idem_emit('or.other', '{"n": 3}', 'agg-s') IS NOT NULL AS emitted;
SELECT idem_once('or-session', 'after') AS first_time;
SELECT idem_once('or-other', 'after') AS first_time;
SET enable_seqscan = off;
SET enable_bitmapscan = off;
-- The rows emitted or claimed after the index was made, through the index.
EXPLAIN (COSTS OFF)
SELECT count(*) FROM idempotency.outbox WHERE topic = 'or.session' AND aggregate = 'agg-s';
SELECT count(*) AS through_the_new_index FROM idempotency.outbox
 WHERE topic = 'or.session' AND aggregate = 'agg-s' AND payload->>'n' = '2';
SELECT count(*) AS through_the_new_index FROM idempotency.keys
 WHERE scope = 'or-session' AND key::text = 'after';
-- Rebuilt under new OIDs (the predicates compiled again): still maintained.
REINDEX INDEX CONCURRENTLY idempotency.outbox_session_idx;
SELECT idem_emit('or.session', '{"n": 4}', 'agg-s') IS NOT NULL AS emitted;
SELECT count(*) AS through_the_rebuilt_index FROM idempotency.outbox
 WHERE topic = 'or.session' AND aggregate = 'agg-s' AND payload->>'n' = '4';
-- A hash index, or an index on an expression, is not kept for the session (the
-- access method may keep state of its own in the description; an expression is
-- compiled in the transaction's memory): described in each transaction, maintained.
CREATE INDEX keys_session_hash_idx ON idempotency.keys USING hash (scope);
SELECT idem_once('or-session', 'hashed') AS first_time;
EXPLAIN (COSTS OFF) SELECT count(*) FROM idempotency.keys WHERE scope = 'or-session';
SELECT count(*) AS through_the_hash_index FROM idempotency.keys WHERE scope = 'or-session';
DROP INDEX idempotency.keys_session_hash_idx;
CREATE INDEX keys_session_expr_idx ON idempotency.keys (upper(scope));
SELECT idem_once('or-session', 'expression-1') AS first_time;
SELECT idem_once('or-session', 'expression-2') AS first_time;
EXPLAIN (COSTS OFF) SELECT count(*) FROM idempotency.keys WHERE upper(scope) = 'OR-SESSION';
SELECT count(*) AS through_the_expression_index FROM idempotency.keys
 WHERE upper(scope) = 'OR-SESSION';
RESET enable_seqscan;
RESET enable_bitmapscan;
-- Dropped: the next calls do not look for them.
DROP INDEX idempotency.outbox_session_idx, idempotency.keys_session_idx,
           idempotency.keys_session_expr_idx;
SELECT idem_emit('or.session', '{"n": 5}', 'agg-s') IS NOT NULL AS emitted;
SELECT idem_once('or-session', 'dropped') AS first_time;
SELECT seq, payload FROM idempotency.outbox WHERE topic = 'or.session' ORDER BY seq;

SELECT idem_forget('or-savepoint', 'kept'), idem_forget('or-caught', 'after'),
       idem_forget('or-reap', 'k');
SELECT idem_forget('or-session', k::idem_key) FROM unnest(ARRAY['before', 'after', 'hashed', 'expression-1', 'expression-2', 'dropped']) k;
SELECT idem_forget('or-other', 'after');
DELETE FROM idempotency.outbox;
DELETE FROM idempotency.outbox_aggregates;
