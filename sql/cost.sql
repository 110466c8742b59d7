-- What idem_once and idem_once_many cost in the native edition: index scans of the
-- primary key and insertions into the store, counted with the transaction's own
-- statistics. These are the native edition's internals (how its library chooses to
-- look or insert first), not the contract: finish.sql and once_many.sql test the
-- answers, which both editions give; the SQL-only edition's run leaves this file out
-- (test/sqlonly/native_only).
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idempotency;
RESET client_min_messages;
CREATE FUNCTION pg_temp.pkey_scans() RETURNS bigint LANGUAGE sql AS $$
  SELECT pg_stat_get_xact_numscans('idempotency.keys_pkey'::regclass) $$;
CREATE FUNCTION pg_temp.insertions() RETURNS bigint LANGUAGE sql AS $$
  SELECT pg_stat_get_xact_tuples_inserted('idempotency.keys'::regclass) $$;

-- idem_once inserts first after a call that inserted (the primary key is then its one
-- look: no index scan), in a transaction that already writes, and looks first after
-- a call that found its key (a batch delivered again), so that a redelivered batch
-- takes back one insertion, not one per message.
SELECT idem_once('cost-inbox', 'msg-1') AS inserted;
BEGIN;
SELECT pg_temp.pkey_scans() AS scans_before \gset
SELECT count(*) FILTER (WHERE idem_once('cost-redelivery', ('m-' || g)::idem_key)) AS applied
  FROM generate_series(1, 100) g;
-- (Without the library preloaded there are no insert counts in shared memory, and the
-- first key is looked at once more before its insert: 2.)
SELECT pg_temp.pkey_scans() - :scans_before
         = CASE WHEN current_setting('shared_preload_libraries') LIKE '%idempotency%' THEN 1 ELSE 2 END
         AS scans_for_new_keys_as_expected;
SELECT pg_temp.pkey_scans() AS scans_before, pg_temp.insertions() AS insertions_before \gset
SELECT count(*) FILTER (WHERE idem_once('cost-redelivery', ('m-' || g)::idem_key)) AS applied
  FROM generate_series(1, 100) g;
SELECT pg_temp.pkey_scans() - :scans_before AS scans_for_a_batch_seen,
       pg_temp.insertions() - :insertions_before AS insertions_taken_back;
COMMIT;

-- A batch of new keys in a transaction that already writes inserts each key first
-- (the primary key's unique check is its look): one scan of the primary key for the
-- first key alone. A batch delivered again looks at each key and inserts none.
SELECT idem_once_many('cost-mb', ARRAY['m-1']::idem_key[]) AS inserted;
BEGIN;
SELECT pg_temp.pkey_scans() AS scans_before, pg_temp.insertions() AS insertions_before \gset
SELECT cardinality(array_positions(
         idem_once_many('cost-many', ARRAY(SELECT ('n-' || g)::idem_key FROM generate_series(1, 1000) g)),
         true)) AS applied;
SELECT pg_temp.pkey_scans() - :scans_before AS scans_for_new_keys,
       pg_temp.insertions() - :insertions_before AS insertions;
SELECT pg_temp.pkey_scans() AS scans_before, pg_temp.insertions() AS insertions_before \gset
SELECT cardinality(array_positions(
         idem_once_many('cost-many', ARRAY(SELECT ('n-' || g)::idem_key FROM generate_series(1, 1000) g)),
         true)) AS applied;
SELECT pg_temp.pkey_scans() - :scans_before AS scans_for_a_batch_seen,
       pg_temp.insertions() - :insertions_before AS insertions_taken_back;
COMMIT;
-- Inserting first into a key this transaction wrote: the row is taken back, the key
-- found (false), and the next key looked at first.
BEGIN;
SELECT idem_once_many('cost-own', ARRAY['k1', 'k2']::idem_key[]) AS first;
SELECT pg_temp.insertions() AS insertions_before \gset
SELECT idem_once_many('cost-own', ARRAY['k3', 'k0', 'k2']::idem_key[]) AS second;
SELECT pg_temp.insertions() - :insertions_before AS insertions_with_one_taken_back;
COMMIT;
