-- In-transaction claims of new keys: no row until they finish, the identity lock
-- meanwhile (an advisory lock with objsubid 3), at most 32 of them at a time.
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idempotency;
RESET client_min_messages;

CREATE VIEW identity_locks AS
  SELECT count(*) AS held FROM pg_locks
  WHERE locktype = 'advisory' AND objsubid = 3 AND pid = pg_backend_pid();
CREATE VIEW rows_of AS
  SELECT key::text, state FROM idempotency.keys WHERE scope = 'u' ORDER BY key;

-- A claim writes nothing and holds the lock; the transaction sees it as pending.
BEGIN;
SELECT outcome, state, attempt, first_claimed_at IS NOT NULL AS claimed_at
  FROM idem_claim('u', 'k1');
SELECT * FROM identity_locks;
SELECT * FROM rows_of;
SELECT state, attempt FROM idem_lookup('u', 'k1');
SELECT outcome, state FROM idem_claim('u', 'k1');  -- rule 7, as for a written claim
-- Completing writes the finished row once and lets the lock go.
SELECT idem_complete('u', 'k1', '{"n": 1}');
SELECT * FROM identity_locks;
SELECT * FROM rows_of;
COMMIT;
SELECT state, response, attempt FROM idem_lookup('u', 'k1');

-- Failing and releasing: a failed row, or nothing at all.
BEGIN;
SELECT outcome FROM idem_claim('u', 'k2');
SELECT idem_fail('u', 'k2', '{"error": "declined"}');
SELECT outcome FROM idem_claim('u', 'k3');
SELECT idem_release('u', 'k3');
SELECT * FROM identity_locks;
COMMIT;
SELECT * FROM rows_of;

-- A checkpoint writes the claim's row, pending; completing updates it.
BEGIN;
SELECT outcome FROM idem_claim('u', 'k4');
SELECT idem_checkpoint('u', 'k4', 'step-1', '{"at": 1}');
SELECT * FROM identity_locks;
SELECT state, checkpoint FROM idem_lookup('u', 'k4');
SELECT idem_complete('u', 'k4', '"done"');
COMMIT;
SELECT state, response, checkpoint FROM idem_lookup('u', 'k4');

-- idem_forget drops an unwritten claim: nothing to finish at COMMIT.
BEGIN;
SELECT outcome FROM idem_claim('u', 'k5');
SELECT idem_forget('u', 'k5') AS was_live;
SELECT * FROM identity_locks;
COMMIT;
SELECT count(*) AS stored FROM idem_lookup('u', 'k5');

-- An unwritten claim left open fails the COMMIT (IK002) and stores nothing.
BEGIN;
SELECT outcome FROM idem_claim('u', 'k6');
COMMIT;
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) AS stored FROM idem_lookup('u', 'k6');

-- Savepoints. A claim rolled back with its savepoint takes its lock along.
BEGIN;
SAVEPOINT a;
SELECT outcome FROM idem_claim('u', 'k7');
ROLLBACK TO a;
SELECT * FROM identity_locks;
COMMIT;
-- A completion inside a savepoint keeps the lock, as its rollback would make the
-- claim unwritten again; finished again, it commits.
BEGIN;
SELECT outcome FROM idem_claim('u', 'k8');
SAVEPOINT a;
SELECT idem_complete('u', 'k8', '"first"');
SELECT * FROM identity_locks;
ROLLBACK TO a;
SELECT state FROM idem_lookup('u', 'k8');
SELECT idem_complete('u', 'k8', '"second"');
SELECT * FROM identity_locks;
COMMIT;
SELECT state, response FROM idem_lookup('u', 'k8');
-- A completion in a released savepoint stays written: the release hands it to the
-- claim's level, so the lock goes at once, not at COMMIT.
BEGIN;
SELECT outcome FROM idem_claim('u', 'k9');
SAVEPOINT a;
SELECT idem_complete('u', 'k9', '"kept"');
RELEASE a;
SELECT * FROM identity_locks;
COMMIT;
SELECT * FROM identity_locks;
SELECT state, response FROM idem_lookup('u', 'k9');

-- Beyond 32 open claims, claims are written when made (and hold no lock), so a
-- batch cannot exhaust the lock table; every kind finishes the same way.
BEGIN;
SELECT count(*) FROM generate_series(1, 40) g,
       LATERAL idem_claim('u', ('batch-' || g)::idem_key) c WHERE c.outcome = 'claimed';
SELECT * FROM identity_locks;
SELECT count(*) AS written_pending FROM idempotency.keys WHERE scope = 'u' AND state = 'p';
SELECT count(*) FROM generate_series(1, 40) g,
       LATERAL idem_complete('u', ('batch-' || g)::idem_key, to_jsonb(g));
SELECT * FROM identity_locks;
COMMIT;
SELECT state, count(*) FROM idempotency.keys WHERE key::text LIKE 'batch-%' GROUP BY state;
-- The same batch with one claim left open fails at COMMIT, whichever kind it is.
BEGIN;
SELECT count(*) FROM generate_series(1, 40) g,
       LATERAL idem_claim('u', ('open-' || g)::idem_key) c WHERE c.outcome = 'claimed';
SELECT count(*) FROM generate_series(2, 40) g,
       LATERAL idem_complete('u', ('open-' || g)::idem_key, to_jsonb(g));
COMMIT;
\echo :LAST_ERROR_SQLSTATE
BEGIN;
SELECT count(*) FROM generate_series(1, 40) g,
       LATERAL idem_claim('u', ('open-' || g)::idem_key) c WHERE c.outcome = 'claimed';
SELECT count(*) FROM generate_series(1, 39) g,
       LATERAL idem_complete('u', ('open-' || g)::idem_key, to_jsonb(g));
COMMIT;
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) AS stored FROM idempotency.keys WHERE key::text LIKE 'open-%';

-- An error between taking the identity lock and recording the claim, caught by a
-- savepoint, leaves no lock behind: the lock is recorded as it is taken and released
-- with the subtransaction. The error is injected by an index expression that fails for
-- one key, evaluated while a lease claim inserts its row under the lock.
CREATE FUNCTION boom(k idem_key) RETURNS int LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
  IF k::text = 'boom' THEN RAISE EXCEPTION 'injected failure' USING ERRCODE = 'XX999'; END IF;
  RETURN 0;
END $$;
CREATE INDEX keys_boom_idx ON idempotency.keys (boom(key));
BEGIN;
SAVEPOINT s;
SELECT outcome FROM idem_claim('u', 'boom', lease => '1 hour');
ROLLBACK TO SAVEPOINT s;
SELECT * FROM identity_locks;
-- The same with PL/pgSQL's EXCEPTION block.
DO $$
BEGIN
  PERFORM idem_claim('u', 'boom', lease => '1 hour');
EXCEPTION WHEN SQLSTATE 'XX999' THEN
  RAISE NOTICE 'caught: %', SQLERRM;
END $$;
SELECT * FROM identity_locks;
COMMIT;
DROP INDEX idempotency.keys_boom_idx;
DROP FUNCTION boom(idem_key);

-- 1,000 messages, each in its own EXCEPTION block (a subtransaction, as JDBC's
-- autosave and psql's ON_ERROR_ROLLBACK make too): every claim keeps the one-write
-- path, because a completion released into its claim's level lets the lock go at
-- once instead of keeping one of the 32 places until COMMIT.
BEGIN;
DO $$
DECLARE
  k idem_key;
BEGIN
  FOR i IN 1..1000 LOOP
    BEGIN
      k := ('sp-' || i)::idem_key;
      PERFORM idem_claim('u', k);
      IF EXISTS (SELECT FROM idempotency.keys WHERE scope = 'u' AND key = k) THEN
        RAISE EXCEPTION 'claim % was written when made', i;
      END IF;
      PERFORM idem_complete('u', k, to_jsonb(i));
    EXCEPTION WHEN division_by_zero THEN
      NULL;  -- never raised: the handler only makes the block a subtransaction
    END;
  END LOOP;
END $$;
SELECT * FROM identity_locks;
COMMIT;
SELECT state, count(*) FROM idempotency.keys WHERE key::text LIKE 'sp-%' GROUP BY state;

-- A row written outside the functions (a superuser's INSERT) while an unwritten claim
-- holds its key: the completion finds it through the primary key and fails with
-- IK003 (claim lost), never 23505, and the transaction cannot commit either row.
BEGIN;
SELECT outcome FROM idem_claim('u', 'intruder');
INSERT INTO idempotency.keys (role, attempt, first_claimed_at, expires_at, reap_slot, scope,
                              key, state)
  VALUES (current_user::regrole, 1, now(), now() + interval '1 hour', 0, 'u', 'intruder', 'c');
\set VERBOSITY terse
SELECT idem_complete('u', 'intruder', '"mine"');
\echo :LAST_ERROR_SQLSTATE
\set VERBOSITY default
ROLLBACK;
SELECT count(*) AS intruder_rows FROM idempotency.keys WHERE key = 'intruder';

DROP VIEW identity_locks, rows_of;
DELETE FROM idempotency.keys WHERE scope = 'u';
