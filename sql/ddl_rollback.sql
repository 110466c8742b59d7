-- DDL on the extension's tables inside a subtransaction that rolls back (a PL/pgSQL
-- block with an EXCEPTION clause, a savepoint), with writes through the extension
-- after the DDL inside it: the relations the library keeps open for the transaction
-- must not outlive the abort that undid what they describe. After each block, more
-- writes in the same transaction, and amcheck (heapallindexed) over every index.
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idempotency;
CREATE EXTENSION IF NOT EXISTS amcheck;
RESET client_min_messages;
DELETE FROM idempotency.outbox;
DELETE FROM idempotency.outbox_aggregates;

CREATE FUNCTION pg_temp.indexes_consistent(tab regclass) RETURNS TABLE(index_name name, ok boolean)
LANGUAGE sql AS $$
  SELECT c.relname, bt_index_parent_check(c.oid, true) IS NOT NULL
  FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
  WHERE i.indrelid = tab ORDER BY c.relname
$$;

-- A dropped index comes back with the rollback: the lease claim after the block must
-- get its entry in keys_leased_idx.
BEGIN;
SELECT idem_once('ddl', 'before') AS first_time;
DO $$
BEGIN
  DROP INDEX idempotency.keys_leased_idx;
  PERFORM idem_once('ddl', 'inside-drop');
  RAISE EXCEPTION 'undo the drop';
EXCEPTION WHEN raise_exception THEN NULL;
END $$;
SELECT outcome FROM idem_claim('ddl', 'leased-after-drop', lease => '1 minute');
SELECT idem_once('ddl', 'after-drop') AS first_time;
COMMIT;
SELECT * FROM pg_temp.indexes_consistent('idempotency.keys');
SELECT key FROM idempotency.keys WHERE scope = 'ddl' ORDER BY key;

-- An index created in the block is gone with the rollback: the writes after it must
-- not insert into it.
BEGIN;
SELECT idem_once('ddl', 'before-create') AS first_time;
SAVEPOINT s;
CREATE INDEX keys_ddl_idx ON idempotency.keys (scope);
SELECT idem_once('ddl', 'inside-create') AS first_time;
ROLLBACK TO SAVEPOINT s;
SELECT idem_once('ddl', 'after-create') AS first_time;
SELECT outcome FROM idem_claim('ddl', 'leased-after-create', lease => '1 minute');
COMMIT;
SELECT * FROM pg_temp.indexes_consistent('idempotency.keys');

-- TRUNCATE undone: the keys stored before it are there again, and later writes go to
-- the table's files of before the TRUNCATE.
BEGIN;
SELECT idem_once('ddl', 'before-truncate') AS first_time;
DO $$
BEGIN
  TRUNCATE idempotency.keys;
  PERFORM idem_once('ddl', 'inside-truncate');
  RAISE EXCEPTION 'undo the truncate';
EXCEPTION WHEN raise_exception THEN NULL;
END $$;
SELECT idem_once('ddl', 'after-truncate') AS first_time;
SELECT idem_once('ddl', 'before') AS first_time_again;
COMMIT;
SELECT * FROM pg_temp.indexes_consistent('idempotency.keys');
SELECT key FROM idempotency.keys WHERE scope = 'ddl' ORDER BY key;

-- The messaging tables: the outbox, the aggregates' counters and the applied versions.
BEGIN;
SELECT idem_emit('ddl.topic', '{"n": 1}', 'agg') IS NOT NULL AS emitted;
SELECT idem_apply_version('ddl', 'entity', 1) AS applied;
DO $$
BEGIN
  CREATE INDEX outbox_ddl_idx ON idempotency.outbox (topic);
  CREATE INDEX aggregates_ddl_idx ON idempotency.outbox_aggregates (last_seq);
  CREATE INDEX applied_ddl_idx ON idempotency.applied_versions (version);
  PERFORM idem_emit('ddl.topic', '{"n": 2}', 'agg');
  PERFORM idem_emit('ddl.topic', '{"n": 3}', 'agg-new');
  PERFORM idem_apply_version('ddl', 'entity', 2);
  PERFORM idem_apply_version('ddl', 'entity-new', 1);
  RAISE EXCEPTION 'undo the indexes';
EXCEPTION WHEN raise_exception THEN NULL;
END $$;
SELECT idem_emit('ddl.topic', '{"n": 4}', 'agg') IS NOT NULL AS emitted;
SELECT idem_emit('ddl.topic', '{"n": 5}', 'agg-other') IS NOT NULL AS emitted;
SELECT idem_apply_version('ddl', 'entity', 3) AS applied;
SELECT idem_apply_version('ddl', 'entity-other', 1) AS applied;
DO $$
BEGIN
  TRUNCATE idempotency.outbox, idempotency.outbox_aggregates, idempotency.applied_versions;
  PERFORM idem_emit('ddl.topic', '{"n": 6}', 'agg');
  PERFORM idem_apply_version('ddl', 'entity', 4);
  RAISE EXCEPTION 'undo the truncate';
EXCEPTION WHEN raise_exception THEN NULL;
END $$;
SELECT idem_emit('ddl.topic', '{"n": 7}', 'agg') IS NOT NULL AS emitted;
SELECT idem_apply_version('ddl', 'entity', 5) AS applied;
COMMIT;
SELECT * FROM pg_temp.indexes_consistent('idempotency.outbox');
SELECT * FROM pg_temp.indexes_consistent('idempotency.outbox_aggregates');
SELECT * FROM pg_temp.indexes_consistent('idempotency.applied_versions');
SELECT aggregate, seq, payload FROM idempotency.outbox WHERE topic = 'ddl.topic' ORDER BY aggregate, seq;
SELECT entity, version FROM idempotency.applied_versions WHERE scope = 'ddl' ORDER BY entity;

-- Another unique index on the store (a copy of the primary key, as REINDEX
-- CONCURRENTLY builds one): every unique index is an arbiter, so a key found in it is
-- a key found, never 23505.
CREATE UNIQUE INDEX keys_second_unique_idx ON idempotency.keys (role, scope, key);
BEGIN;
SELECT idem_once('ddl-unique', 'new') AS first_time;
SELECT idem_once('ddl-unique', 'new') AS first_time_again;
SELECT idem_once('ddl', 'before') AS stored_before;
COMMIT;
BEGIN;
SELECT outcome FROM idem_claim('ddl-unique', 'claimed');
SELECT outcome FROM idem_claim('ddl-unique', 'claimed');
SELECT idem_complete('ddl-unique', 'claimed', '{"ok": true}');
COMMIT;
SELECT outcome, response FROM idem_claim('ddl-unique', 'claimed');
DROP INDEX idempotency.keys_second_unique_idx;
SELECT * FROM pg_temp.indexes_consistent('idempotency.keys');

SELECT count(*) > 0 AS forgot FROM idempotency.keys k, LATERAL idem_forget(k.scope, k.key) f
 WHERE k.scope IN ('ddl', 'ddl-unique') AND f;
DELETE FROM idempotency.outbox;
DELETE FROM idempotency.outbox_aggregates;
DELETE FROM idempotency.applied_versions;
