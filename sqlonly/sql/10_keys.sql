-- The SQL-only edition, part 2: claiming, finishing, reading, fingerprints.
--
-- The rules are the SPEC's (Claiming, Finishing), checked in the order 7, 4, 1, 2, 3,
-- 5, 6. A key function looks at the key's row first (a plain read: a replay writes
-- nothing and takes no transaction id), and writes only for a claim, a takeover or
-- a finish. Its only subtransaction is the one that waits (idempotency._probe_*,
-- _wait_for_row, and the new key's insert in _insert_claim): a wait for another
-- transaction must end in an answer, not in the caller's abort.
--
-- Functions that read the store by key SET enable_seqscan = off: PL/pgSQL keeps a
-- generic plan per session, and one made while the store was nearly empty would scan
-- the whole table on every call as it grows (30,000 keys claimed in one transaction
-- took 75 s so, 4 s by the index).

------------------------------------------------------------------------------
-- IK002: a claim made in a transaction must be finished before it commits. A
-- deferred constraint trigger fires at COMMIT and PREPARE TRANSACTION for every row
-- an in-transaction claim wrote, and looks at the row as it is then.
------------------------------------------------------------------------------

-- Whether this firing of keys_claim_finished for the row version `version` of an
-- unfinished claim is COMMIT's or PREPARE's. SET CONSTRAINTS ... IMMEDIATE fires it
-- too, and so does the end of a claim's statement while it is immediate (frameworks set
-- it: Django's check_constraints() runs SET CONSTRAINTS ALL IMMEDIATE, then ALL
-- DEFERRED); natively IK002 comes from COMMIT and PREPARE only. PostgreSQL does not
-- say why a trigger fires, so the row is touched: the event that queues fires at once
-- if and only if the constraint is immediate now, which it never is for an event still
-- queued at COMMIT. Then the constraint is made deferred again (ahead of SET
-- CONSTRAINTS ALL, until the next one) and the row touched once more, for COMMIT. The
-- other events that SET CONSTRAINTS fires with it then find it deferred, but were
-- queued before that (SET CONSTRAINTS ... IMMEDIATE fires every event queued, so none
-- so old is left for COMMIT): their touch has queued them for COMMIT.
CREATE FUNCTION idempotency._fired_at_commit(version tid) RETURNS boolean
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  written bigint;  -- command ids in this transaction
  touched bigint;
  moved tid;
BEGIN
  IF current_setting('idempotency.ik002_touch', true) = 'queued' THEN
    PERFORM set_config('idempotency.ik002_touch', 'fired', true);  -- the touch below, at once
    RETURN false;
  END IF;
  SELECT k.cmin::text::bigint INTO written FROM idempotency.keys k WHERE k.ctid = version;
  PERFORM set_config('idempotency.ik002_touch', 'queued', true);
  UPDATE idempotency.keys k SET attempt = k.attempt WHERE k.ctid = version
    RETURNING k.ctid, k.cmin::text::bigint INTO moved, touched;
  IF current_setting('idempotency.ik002_touch') = 'queued' THEN
    PERFORM set_config('idempotency.ik002_touch', '', true);
    RETURN written >= coalesce(nullif(current_setting('idempotency.ik002_deferred_at', true), '')::bigint, 0);
  END IF;
  PERFORM set_config('idempotency.ik002_touch', '', true);
  SET CONSTRAINTS idempotency.keys_claim_finished DEFERRED;
  PERFORM set_config('idempotency.ik002_deferred_at', touched::text, true);
  UPDATE idempotency.keys k SET attempt = k.attempt WHERE k.ctid = moved;
  RETURN false;
END $$;
REVOKE ALL ON FUNCTION idempotency._fired_at_commit(tid) FROM PUBLIC;

CREATE FUNCTION idempotency._check_claim_finished() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER AS $$
-- Fired for each pending row version an in-transaction claim (or takeover, or a
-- checkpoint of one) wrote: if that version is still the key's current one, the claim
-- is unfinished. A completion, failure, release or later checkpoint replaced it (the
-- version is then dead to this transaction), unless that happened in a subtransaction
-- that rolled back. SECURITY DEFINER: found whichever role commits (row-level security
-- would hide it from another); schema-qualified throughout, so no search_path needed.
BEGIN
  PERFORM FROM idempotency.keys k WHERE k.ctid OPERATOR(pg_catalog.=) NEW.ctid;
  IF FOUND THEN
    IF idempotency._fired_at_commit(NEW.ctid) THEN
      RAISE EXCEPTION 'idempotency key "%" in scope "%" was claimed but not finished', NEW.key, NEW.scope
        USING ERRCODE = 'IK002',
              DETAIL = 'A transaction that claims a key must complete, fail or release it before it commits, so the key is never stored without its work.',
              HINT = 'Call idem_complete, idem_fail or idem_release before COMMIT, or claim with a lease for work that must commit before it finishes.';
    END IF;
  END IF;
  RETURN NULL;
END $$;
REVOKE ALL ON FUNCTION idempotency._check_claim_finished() FROM PUBLIC;

-- Queued by every insert of a pending claim, and by the updates that write a claim's
-- new version (a takeover sets attempt, a checkpoint sets checkpoint); not by a
-- completion or failure (their rows are no longer pending): an UPDATE that sets none of
-- those columns does not even evaluate the WHEN clause, which PostgreSQL reads from the
-- catalog again for every statement.
CREATE CONSTRAINT TRIGGER keys_claim_finished
  AFTER INSERT OR UPDATE OF attempt, checkpoint ON idempotency.keys
  DEFERRABLE INITIALLY DEFERRED
  FOR EACH ROW WHEN (NEW.state = 'p' AND NEW.lease IS NULL)
  EXECUTE FUNCTION idempotency._check_claim_finished();

------------------------------------------------------------------------------
-- idem_claim
------------------------------------------------------------------------------

-- Inserts a new key's row (pending, or completed at once for idem_once), waiting
-- (bounded) for another transaction that inserts the same key. Returns the row, or
-- NULL when a row of the key exists (committed meanwhile: look again); timed_out
-- when the wait ran out.
CREATE FUNCTION idempotency._insert_claim(me regrole, scope text, key text,
    fingerprint bytea, expires_at timestamptz, lease interval, lease_expires_at timestamptz,
    state "char", now timestamptz, remaining_ms bigint, OUT inserted idempotency.keys,
    OUT timed_out boolean)
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp SET enable_seqscan = off AS $$
DECLARE
  timeout text := idempotency._lock_timeout(remaining_ms);
  own text;
BEGIN
  timed_out := false;
  IF NOT idempotency._take_subtransaction() THEN
    -- Past the cap: the wait in a probe that is rolled back, then the insert here.
    CASE idempotency._probe_absent(me, scope, key, remaining_ms)
      WHEN 'timeout' THEN
        timed_out := true;
        RETURN;
      WHEN 'present' THEN
        RETURN;
      ELSE
        NULL;
    END CASE;
    INSERT INTO idempotency.keys AS k (role, attempt, first_claimed_at, expires_at, xact, scope,
                                       key, fingerprint, lease, lease_expires_at, state)
      VALUES (me, 1, now, expires_at, pg_current_xact_id(), scope, key, fingerprint, lease,
              lease_expires_at, state)
      ON CONFLICT ON CONSTRAINT keys_pkey DO NOTHING
      RETURNING k.* INTO inserted;
    RETURN;
  END IF;
  BEGIN
    IF timeout IS NOT NULL THEN
      own := current_setting('lock_timeout');
      PERFORM set_config('lock_timeout', timeout, true);
    END IF;
    INSERT INTO idempotency.keys AS k (role, attempt, first_claimed_at, expires_at, xact, scope,
                                       key, fingerprint, lease, lease_expires_at, state)
      VALUES (me, 1, now, expires_at, pg_current_xact_id(), scope, key, fingerprint, lease,
              lease_expires_at, state)
      ON CONFLICT ON CONSTRAINT keys_pkey DO NOTHING
      RETURNING k.* INTO inserted;
    IF timeout IS NOT NULL THEN
      PERFORM set_config('lock_timeout', own, true);
    END IF;
  EXCEPTION WHEN lock_not_available THEN
    IF timeout IS NULL THEN
      RAISE;
    END IF;
    timed_out := true;
  END;
END $$;

-- The takeover's update of the row `r` as seen (see idempotency._take_over).
CREATE FUNCTION idempotency._take_over_row(r idempotency.keys, fresh boolean,
    fingerprint bytea, ttl interval, lease interval, now timestamptz, complete_now boolean)
RETURNS idempotency.keys
LANGUAGE sql VOLATILE SET search_path = pg_catalog, pg_temp SET enable_seqscan = off AS $$
  UPDATE idempotency.keys k SET
      attempt = CASE WHEN fresh THEN 1 ELSE k.attempt + 1 END,
      first_claimed_at = CASE WHEN fresh THEN now ELSE k.first_claimed_at END,
      expires_at = CASE WHEN fresh THEN greatest(now + ttl, now + _take_over_row.lease)
                        ELSE greatest(k.expires_at, now + _take_over_row.lease) END,
      xact = pg_current_xact_id(),
      fingerprint = CASE WHEN fresh THEN _take_over_row.fingerprint
                         ELSE coalesce(k.fingerprint, _take_over_row.fingerprint) END,
      lease = CASE WHEN complete_now THEN NULL ELSE _take_over_row.lease END,
      checkpoint = CASE WHEN fresh THEN NULL ELSE k.checkpoint END,
      checkpoint_data = CASE WHEN fresh THEN NULL ELSE k.checkpoint_data END,
      lease_expires_at = CASE WHEN complete_now THEN NULL ELSE now + _take_over_row.lease END,
      state = CASE WHEN complete_now THEN 'c' ELSE 'p' END,
      response = NULL
    WHERE k.role = r.role AND k.scope = r.scope AND k.key = r.key
      AND k.attempt = r.attempt AND k.state = r.state
      AND k.expires_at = r.expires_at
      AND k.lease_expires_at IS NOT DISTINCT FROM r.lease_expires_at
    RETURNING k.*
$$;

-- Takes over (or replaces, when expired) the row `r` as this call's claim: with
-- `complete_now`, completed at once (idem_once). NULL when the row changed meanwhile
-- (look again); timed_out when the wait for its writer ran out.
CREATE FUNCTION idempotency._take_over(r idempotency.keys, fresh boolean,
    fingerprint bytea, ttl interval, lease interval, now timestamptz, complete_now boolean,
    remaining_ms bigint, OUT taken idempotency.keys, OUT timed_out boolean)
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp SET enable_seqscan = off AS $$
DECLARE
  timeout text := idempotency._lock_timeout(remaining_ms);
  own text;
  keep boolean;
BEGIN
  timed_out := false;
  -- In a subtransaction, so that a wait running out is an answer. Rolled back when the
  -- row changed meanwhile (the update then locked its newest version, which others
  -- would wait for until this transaction ends), and past the cap
  -- (idempotency._take_subtransaction, counted inside it), where it only waits: the
  -- update is then made again in the transaction itself.
  BEGIN
    keep := idempotency._take_subtransaction();
    IF timeout IS NOT NULL THEN
      own := current_setting('lock_timeout');
      PERFORM set_config('lock_timeout', timeout, true);
    END IF;
    taken := idempotency._take_over_row(r, fresh, fingerprint, ttl, lease, now, complete_now);
    IF timeout IS NOT NULL THEN
      PERFORM set_config('lock_timeout', own, true);
    END IF;
    IF taken.key IS NULL OR NOT keep THEN
      RAISE EXCEPTION USING ERRCODE = 'IK999';
    END IF;
  EXCEPTION
    WHEN lock_not_available THEN
      IF timeout IS NULL THEN
        RAISE;
      END IF;
      taken := NULL;
      timed_out := true;
    WHEN SQLSTATE 'IK999' THEN
      IF taken.key IS NOT NULL THEN
        taken := idempotency._take_over_row(r, fresh, fingerprint, ttl, lease, now, complete_now);
      END IF;
  END;
END $$;

-- The general path of idem_claim: every argument check, leases, waits, takeovers.
-- (idem_claim_result in its signature is resolved when it is created, as the public
-- functions' types are; the body names nothing of the target schema.)
CREATE FUNCTION idempotency._claim(scope text, key text, fingerprint bytea, ttl interval,
    lease interval, wait interval)
RETURNS idem_claim_result
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp SET enable_seqscan = off AS $$
DECLARE
  started timestamptz := pg_catalog.clock_timestamp();
  now timestamptz;
  me regrole;
  wait_ms bigint;
  r idempotency.keys;
  row_xmax xid;
  seen record;
  cur xid8;
  live boolean;
  attempt_result record;
  probe text;
BEGIN
  -- Arguments, in the native order; then 25006, before anything is read.
  IF scope IS NULL OR key IS NULL OR pg_catalog.octet_length(scope) NOT BETWEEN 1 AND 255 THEN
    PERFORM idempotency._check_identity(scope, key);
  END IF;
  IF pg_catalog.octet_length(fingerprint) > 64 THEN
    RAISE EXCEPTION 'fingerprint is % bytes long, at most 64 are allowed', pg_catalog.octet_length(fingerprint)
      USING ERRCODE = 'invalid_parameter_value',
            HINT = 'Pass a digest of the request, such as idem_fingerprint(...).';
  END IF;
  IF ttl IS NULL THEN
    ttl := idempotency._default_ttl();
  ELSIF started + ttl <= started THEN
    RAISE EXCEPTION 'ttl must be positive' USING ERRCODE = 'invalid_parameter_value';
  END IF;
  IF lease IS NOT NULL THEN
    IF started + lease <= started THEN
      RAISE EXCEPTION 'lease must be positive' USING ERRCODE = 'invalid_parameter_value';
    ELSIF started + lease > started + ttl THEN
      RAISE EXCEPTION 'lease must not be longer than ttl' USING ERRCODE = 'invalid_parameter_value',
        DETAIL = 'A key''s dedup window must cover its lease.';
    END IF;
  END IF;
  wait_ms := idempotency._wait_ms(wait);
  IF pg_catalog.current_setting('transaction_read_only') = 'on' THEN
    PERFORM idempotency._check_writable('idem_claim');
  END IF;

  me := idempotency._me();
  FOR round IN 1 .. 1000 LOOP
    SELECT k AS r, k.xmax AS x, k.ctid AS c INTO seen FROM idempotency.keys k
      WHERE k.role = me AND k.scope = _claim.scope AND k.key = _claim.key;
    now := pg_catalog.clock_timestamp();
    IF seen.r IS NULL THEN
      -- Rule 1: a new key.
      SELECT * INTO attempt_result FROM idempotency._insert_claim(me, scope, key, fingerprint,
          CASE WHEN lease IS NULL THEN now + ttl ELSE greatest(now + ttl, now + lease) END,
          lease, now + lease, 'p', now,
          wait_ms - (extract(epoch FROM now - started) * 1000)::bigint);
      IF attempt_result.timed_out THEN
        RETURN ROW('in_progress'::text, 'pending'::text, NULL::jsonb, 1::integer, NULL::text, NULL::jsonb, greatest(pg_catalog.clock_timestamp() - started, interval '100 ms'), NULL::timestamptz, NULL::timestamptz);
      END IF;
      r := attempt_result.inserted;
      IF r.key IS NOT NULL THEN
        RETURN ROW('claimed'::text, 'pending'::text, NULL::jsonb, 1::integer, NULL::text, NULL::jsonb, NULL::interval, r.first_claimed_at, r.expires_at);
      END IF;
      CONTINUE;  -- committed meanwhile: look again
    END IF;
    r := seen.r;
    row_xmax := seen.x;

    cur := pg_catalog.pg_current_xact_id_if_assigned();
    -- Rule 7: this transaction's own claim.
    IF r.state = 'p' AND r.xact = cur THEN
      RETURN ROW('duplicate'::text, 'pending'::text, NULL::jsonb, r.attempt, r.checkpoint, r.checkpoint_data, NULL::interval, r.first_claimed_at, r.expires_at);
    END IF;
    -- Rule 4: another transaction writes the row now: wait for it, then look again
    -- (or, when no other transaction writes it after all, go on with it).
    IF row_xmax <> '0'::xid AND idempotency._busy(row_xmax) THEN
      CASE idempotency._wait_for_row(me, scope, key,
             wait_ms - (extract(epoch FROM now - started) * 1000)::bigint, seen.c)
        WHEN 'timeout' THEN
          -- The attempt that holds it: a writer of an abandoned or stale claim is taking
          -- it over (the uncommitted row itself cannot be read here).
          RETURN ROW('in_progress'::text, 'pending'::text, NULL::jsonb,
                     r.attempt + CASE WHEN r.state = 'a' OR (r.state = 'p' AND r.lease_expires_at <= now)
                                      THEN 1 ELSE 0 END, NULL::text, NULL::jsonb, greatest(pg_catalog.clock_timestamp() - started, interval '100 ms'), r.first_claimed_at, r.expires_at);
        WHEN 'changed' THEN
          CONTINUE;
        ELSE
          NULL;
      END CASE;
    END IF;
    live := coalesce(r.expires_at > now OR (r.state = 'p' AND r.lease_expires_at > now)
                     OR r.xact = cur, false);
    IF live THEN
      -- Rule 2.
      IF r.fingerprint IS NOT NULL AND fingerprint IS NOT NULL AND r.fingerprint <> fingerprint THEN
        PERFORM idempotency._raise_mismatch(scope, key);
      END IF;
      -- Rule 3.
      IF r.state IN ('c', 'f') THEN
        RETURN ROW('replay'::text, CASE r.state WHEN 'c' THEN 'completed' ELSE 'failed' END, r.response, r.attempt, r.checkpoint, r.checkpoint_data, NULL::interval, r.first_claimed_at, r.expires_at);
      END IF;
      -- Rule 5.
      IF r.state = 'p' AND r.lease_expires_at > now THEN
        RETURN ROW('in_progress'::text, 'pending'::text, NULL::jsonb, r.attempt, NULL::text, NULL::jsonb, r.lease_expires_at - now, r.first_claimed_at, r.expires_at);
      END IF;
    END IF;
    -- Rule 6 (abandoned or stale), or rule 1 for an expired row.
    SELECT * INTO attempt_result FROM idempotency._take_over(r, NOT live, fingerprint, ttl, lease,
        now, false, wait_ms - (extract(epoch FROM now - started) * 1000)::bigint);
    IF attempt_result.timed_out THEN
      RETURN ROW('in_progress'::text, 'pending'::text, NULL::jsonb, CASE WHEN live THEN r.attempt + 1 ELSE 1 END, NULL::text, NULL::jsonb, greatest(pg_catalog.clock_timestamp() - started, interval '100 ms'), r.first_claimed_at, r.expires_at);
    END IF;
    r := attempt_result.taken;
    IF r.key IS NOT NULL THEN
      RETURN ROW('claimed'::text, 'pending'::text, NULL::jsonb, r.attempt, r.checkpoint, r.checkpoint_data, NULL::interval, r.first_claimed_at, r.expires_at);
    END IF;
  END LOOP;
  -- Other transactions rewrote the key at every look: as busy as a wait running out.
  RETURN ROW('in_progress'::text, 'pending'::text, NULL::jsonb, coalesce((seen.r).attempt, 1), NULL::text, NULL::jsonb, greatest(pg_catalog.clock_timestamp() - started, interval '100 ms'), (seen.r).first_claimed_at, (seen.r).expires_at);
END $$;

-- idem_claim. Its fast path (no lease, no wait given, valid arguments, the default
-- settings; a new key, a replay or this transaction's own claim) is one look and, for
-- a new key, one insert; everything else goes to idempotency._claim. Every operator
-- and function here is schema-qualified: the caller's search_path may hold others of
-- the same names (a SET search_path clause would cost more than the claim itself).
--
-- In a VOLATILE function every expression that calls a function that is not IMMUTABLE
-- takes a new snapshot first (a command counter increment and GetSnapshotData, which
-- contends with every other session's commits), and each expression is initialised
-- again in every transaction. So the role is read inside the statements that need it,
-- a new key reads what its insert needs of the session in one expression (`n`) and
-- sets its two settings in another, and its answer calls only immutable functions.
CREATE TYPE idempotency._claim_insert AS (
  expires_at timestamptz,  -- the new key's
  subtransactions int4,    -- this transaction's so far (idempotency._take_subtransaction)
  lock_timeout text,       -- the caller's
  bounds_wait boolean      -- the caller's lock_timeout is 0 or longer than 5 s
);

CREATE FUNCTION idem_claim(scope text, key idem_key,
    fingerprint bytea DEFAULT NULL, ttl interval DEFAULT NULL,
    lease interval DEFAULT NULL, wait interval DEFAULT NULL)
RETURNS idem_claim_result
LANGUAGE plpgsql VOLATILE
SET enable_seqscan = off AS $$
DECLARE
  now pg_catalog.timestamptz := pg_catalog.clock_timestamp();
  n idempotency._claim_insert;
  seen record;
  r idempotency.keys;
  ignored pg_catalog.text;  -- set_config's result: an assignment is a simple expression, a PERFORM a query
BEGIN
  IF lease IS NULL AND wait IS NULL AND scope IS NOT NULL AND key IS NOT NULL
     AND pg_catalog.octet_length(scope) OPERATOR(pg_catalog.>) 0
     AND pg_catalog.octet_length(scope) OPERATOR(pg_catalog.<=) 255
     AND (fingerprint IS NULL OR pg_catalog.octet_length(fingerprint) OPERATOR(pg_catalog.<=) 64)
     AND (ttl IS NULL OR now OPERATOR(pg_catalog.+) ttl OPERATOR(pg_catalog.>) now)
     AND (ttl IS NOT NULL
          OR coalesce(pg_catalog.current_setting('idempotency.default_ttl', true), '')
             OPERATOR(pg_catalog.=) '')
     AND coalesce(pg_catalog.current_setting('idempotency.wait_timeout', true), '')
         OPERATOR(pg_catalog.=) ''
     AND pg_catalog.current_setting('transaction_read_only') OPERATOR(pg_catalog.=) 'off' THEN
    SELECT k AS r, k.xmax AS x INTO seen FROM idempotency.keys k
      WHERE k.role OPERATOR(pg_catalog.=) idempotency._me()
        AND k.scope OPERATOR(pg_catalog.=) idem_claim.scope AND k.key OPERATOR(pg_catalog.=) idem_claim.key;
    IF seen.r IS NULL THEN
      -- Rule 1. The insert waits for another transaction inserting the key, at most
      -- idempotency.wait_timeout (5 s): in a subtransaction, so that running out is
      -- an answer (in_progress), not the caller's abort.
      -- (No NULLIF: it compares with the caller's `=`.)
      n := ROW(now OPERATOR(pg_catalog.+) coalesce(ttl, '24 hours'::pg_catalog.interval),
               CASE WHEN pg_catalog.current_setting('idempotency.subtransactions', true)
                         OPERATOR(pg_catalog.=) '' THEN 0
                    ELSE coalesce(pg_catalog.current_setting('idempotency.subtransactions', true),
                                  '0')::pg_catalog.int4 END,
               pg_catalog.current_setting('lock_timeout'),
               pg_catalog.current_setting('lock_timeout') OPERATOR(pg_catalog.=) '0'
               OR pg_catalog.current_setting('lock_timeout')::pg_catalog.interval
                  OPERATOR(pg_catalog.>) '5 s'::pg_catalog.interval);
      -- Past idempotency._take_subtransaction's cap, the general path (its wait stays
      -- bounded); FOUND is then still the look's, false.
      IF n.subtransactions OPERATOR(pg_catalog.<) 48 THEN
        BEGIN
          -- Counted inside the subtransaction: one that rolls back leaves PostgreSQL's
          -- cache of this transaction's subtransactions as it was. The bound: 5 s, or
          -- the caller's own lock_timeout when shorter (its 55P03 is then the
          -- caller's, raised on).
          ignored := pg_catalog.set_config('idempotency.subtransactions',
                         (n.subtransactions OPERATOR(pg_catalog.+) 1)::pg_catalog.text, true)
                     OPERATOR(pg_catalog.||)
                     CASE WHEN n.bounds_wait THEN pg_catalog.set_config('lock_timeout', '5000', true)
                          ELSE '' END;
          -- A plain INSERT: a key inserted meanwhile is a unique violation, caught below
          -- (no speculative insertion to confirm, no probe of the key before it).
          INSERT INTO idempotency.keys AS k (role, attempt, first_claimed_at, expires_at, xact,
                                             scope, key, fingerprint, state)
            VALUES (idempotency._me(), 1, now, n.expires_at, pg_catalog.pg_current_xact_id(),
                    scope, key, fingerprint, 'p');
          IF n.bounds_wait THEN
            ignored := pg_catalog.set_config('lock_timeout', n.lock_timeout, true);
          END IF;
        EXCEPTION WHEN unique_violation THEN
          -- Committed meanwhile: FOUND stays the look's (false), the general path looks
          -- again.
          NULL;
        WHEN lock_not_available THEN
          IF NOT n.bounds_wait THEN
            RAISE;
          END IF;
          RETURN ROW('in_progress'::pg_catalog.text, 'pending'::pg_catalog.text, NULL::pg_catalog.jsonb,
                     1, NULL::pg_catalog.text, NULL::pg_catalog.jsonb,
                     greatest(pg_catalog.clock_timestamp() OPERATOR(pg_catalog.-) now,
                                         '100 ms'::pg_catalog.interval),
                     NULL::pg_catalog.timestamptz, NULL::pg_catalog.timestamptz);
        END;
      END IF;
      IF FOUND THEN
        -- The values just inserted (no RETURNING: its projection and row-level security
        -- check cost more than computing them again).
        RETURN ROW('claimed'::pg_catalog.text, 'pending'::pg_catalog.text, NULL::pg_catalog.jsonb,
                   1, NULL::pg_catalog.text, NULL::pg_catalog.jsonb, NULL::pg_catalog.interval,
                   now, n.expires_at);
      END IF;
    ELSE
      r := seen.r;
      IF r.state OPERATOR(pg_catalog.=) 'p'
         AND r.xact OPERATOR(pg_catalog.=) pg_catalog.pg_current_xact_id_if_assigned() THEN
        -- Rule 7.
        RETURN ROW('duplicate'::pg_catalog.text, 'pending'::pg_catalog.text, NULL::pg_catalog.jsonb,
                   r.attempt, r.checkpoint, r.checkpoint_data, NULL::pg_catalog.interval,
                   r.first_claimed_at, r.expires_at);
      END IF;
      IF (r.state OPERATOR(pg_catalog.=) 'c' OR r.state OPERATOR(pg_catalog.=) 'f')
         AND seen.x OPERATOR(pg_catalog.=) '0'::pg_catalog.xid
         AND r.expires_at OPERATOR(pg_catalog.>) now
         AND (r.fingerprint IS NULL OR fingerprint IS NULL
              OR r.fingerprint OPERATOR(pg_catalog.=) fingerprint) THEN
        -- Rule 3: nothing written, no transaction id taken.
        RETURN ROW('replay'::pg_catalog.text,
                   CASE WHEN r.state OPERATOR(pg_catalog.=) 'c' THEN 'completed'::pg_catalog.text
                        ELSE 'failed'::pg_catalog.text END,
                   r.response, r.attempt, r.checkpoint, r.checkpoint_data, NULL::pg_catalog.interval,
                   r.first_claimed_at, r.expires_at);
      END IF;
    END IF;
  END IF;
  RETURN idempotency._claim(scope, key, fingerprint, ttl, lease, wait);
END $$;

------------------------------------------------------------------------------
-- Finishing: idem_complete, idem_fail, idem_release, idem_checkpoint.
------------------------------------------------------------------------------

-- The general path of a finish (a committed lease claim, or an error): `kind` is
-- 'c', 'f', 'r' (release) or 'k' (checkpoint).
CREATE FUNCTION idempotency._finish(scope text, key text, kind "char", data jsonb,
                                    point text, attempt integer)
RETURNS void
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp SET enable_seqscan = off AS $$
DECLARE
  started timestamptz := clock_timestamp();
  now timestamptz;
  me regrole := idempotency._me();
  wait_ms bigint := idempotency._wait_ms(NULL);
  r idempotency.keys;
  row_xmax xid;
  seen record;
  cur xid8;
  live boolean;
  own_claim boolean;
  changed boolean;
BEGIN
  FOR round IN 1 .. 1000 LOOP
    SELECT k AS r, k.xmax AS x, k.ctid AS c INTO seen FROM idempotency.keys k
      WHERE k.role = me AND k.scope = _finish.scope AND k.key = _finish.key;
    now := clock_timestamp();
    cur := pg_current_xact_id_if_assigned();
    IF seen.r IS NULL THEN
      -- Another transaction's claim not committed yet: wait for it, then look again.
      CASE idempotency._probe_absent(me, scope, key,
                                     wait_ms - (extract(epoch FROM now - started) * 1000)::bigint)
        WHEN 'timeout' THEN PERFORM idempotency._raise_in_progress(scope, key);
        WHEN 'present' THEN CONTINUE;
        ELSE NULL;
      END CASE;
      IF attempt IS NOT NULL THEN
        PERFORM idempotency._raise_claim_lost(scope, key, false, NULL, NULL, false, false, attempt);
      END IF;
      PERFORM idempotency._raise_not_claimed(scope, key);
    END IF;
    r := seen.r;
    row_xmax := seen.x;
    own_claim := coalesce(r.state = 'p' AND r.xact = cur, false);
    IF NOT own_claim AND row_xmax <> '0'::xid AND idempotency._busy(row_xmax) THEN
      CASE idempotency._wait_for_row(me, scope, key,
             wait_ms - (extract(epoch FROM now - started) * 1000)::bigint, seen.c)
        WHEN 'timeout' THEN PERFORM idempotency._raise_in_progress(scope, key);
        WHEN 'changed' THEN CONTINUE;
        ELSE NULL;  -- no other transaction writes it: go on with it
      END CASE;
    END IF;
    live := coalesce(r.expires_at > now OR (r.state = 'p' AND r.lease_expires_at > now)
                     OR r.xact = cur, false);
    IF own_claim THEN
      IF attempt IS NOT NULL AND attempt <> r.attempt THEN
        PERFORM idempotency._raise_claim_lost(scope, key, true, r.state, r.attempt,
                                              r.xact = cur, live, attempt);
      END IF;
    ELSIF NOT live THEN
      IF attempt IS NOT NULL THEN
        PERFORM idempotency._raise_claim_lost(scope, key, true, r.state, r.attempt,
                                              r.xact IS NOT DISTINCT FROM cur, live, attempt);
      END IF;
      PERFORM idempotency._raise_not_claimed(scope, key);
    ELSIF r.state <> 'p' OR attempt IS NULL OR attempt <> r.attempt THEN
      PERFORM idempotency._raise_claim_lost(scope, key, true, r.state, r.attempt,
                                            r.xact IS NOT DISTINCT FROM cur, live, attempt);
    END IF;

    -- Apply, to the row as seen (a concurrent change makes it look again).
    IF kind = 'r' THEN
      DELETE FROM idempotency.keys k
        WHERE k.role = me AND k.scope = _finish.scope AND k.key = _finish.key
          AND k.attempt = r.attempt AND k.state = 'p'
          AND k.lease_expires_at IS NOT DISTINCT FROM r.lease_expires_at;
    ELSIF kind = 'k' THEN
      UPDATE idempotency.keys k SET
          checkpoint = point, checkpoint_data = data,
          lease_expires_at = CASE WHEN k.lease IS NULL THEN NULL ELSE now + k.lease END,
          expires_at = CASE WHEN k.lease IS NULL THEN k.expires_at
                            ELSE greatest(k.expires_at, now + k.lease) END
        WHERE k.role = me AND k.scope = _finish.scope AND k.key = _finish.key
          AND k.attempt = r.attempt AND k.state = 'p'
          AND k.lease_expires_at IS NOT DISTINCT FROM r.lease_expires_at;
    ELSE
      UPDATE idempotency.keys k SET
          xact = pg_current_xact_id(), lease = NULL, lease_expires_at = NULL,
          state = kind, response = data
        WHERE k.role = me AND k.scope = _finish.scope AND k.key = _finish.key
          AND k.attempt = r.attempt AND k.state = 'p'
          AND k.lease_expires_at IS NOT DISTINCT FROM r.lease_expires_at;
    END IF;
    GET DIAGNOSTICS changed = ROW_COUNT;
    IF changed THEN
      RETURN;
    END IF;
  END LOOP;
  -- Other transactions rewrote the key at every look: as busy as a wait running out.
  PERFORM idempotency._raise_in_progress(scope, key);
END $$;

-- The size and read-only checks of idem_complete and idem_fail, in the native order.
CREATE FUNCTION idempotency._check_finish(size bigint, what text, function_name text)
RETURNS void
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  IF size IS NOT NULL THEN
    PERFORM idempotency._check_size(size, what);
  END IF;
  PERFORM idempotency._check_writable(function_name);
END $$;

CREATE FUNCTION idem_complete(scope text, key idem_key,
    response jsonb DEFAULT NULL, attempt integer DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET enable_seqscan = off AS $$
BEGIN
  IF scope IS NULL OR key IS NULL OR pg_catalog.octet_length(scope) OPERATOR(pg_catalog.<) 1
     OR pg_catalog.octet_length(scope) OPERATOR(pg_catalog.>) 255 THEN
    PERFORM idempotency._check_identity(scope, key);
  END IF;
  -- (One expression that reads the settings: see idem_claim.)
  IF (response IS NOT NULL
      AND (pg_catalog.pg_column_size(response) OPERATOR(pg_catalog.>) 1048580
           OR coalesce(pg_catalog.current_setting('idempotency.max_response_size', true), '')
              OPERATOR(pg_catalog.<>) ''))
     OR pg_catalog.current_setting('transaction_read_only') OPERATOR(pg_catalog.=) 'on' THEN
    PERFORM idempotency._check_finish(pg_catalog.pg_column_size(response) OPERATOR(pg_catalog.-) 4, 'response', 'idem_complete');
  END IF;
  -- This transaction's own claim: no other transaction can see it or wait for it.
  UPDATE idempotency.keys k SET xact = pg_catalog.pg_current_xact_id(), state = 'c',
      response = idem_complete.response, lease = NULL, lease_expires_at = NULL
    WHERE k.role OPERATOR(pg_catalog.=) idempotency._me() AND k.scope OPERATOR(pg_catalog.=) idem_complete.scope
      AND k.key OPERATOR(pg_catalog.=) idem_complete.key AND k.state OPERATOR(pg_catalog.=) 'p'
      AND k.xact OPERATOR(pg_catalog.=) pg_catalog.pg_current_xact_id_if_assigned()
      AND (idem_complete.attempt IS NULL OR k.attempt OPERATOR(pg_catalog.=) idem_complete.attempt);
  IF NOT FOUND THEN
    PERFORM idempotency._finish(scope, key, 'c', response, NULL, attempt);
  END IF;
END $$;

CREATE FUNCTION idem_fail(scope text, key idem_key,
    error jsonb DEFAULT NULL, attempt integer DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET enable_seqscan = off AS $$
BEGIN
  IF scope IS NULL OR key IS NULL OR pg_catalog.octet_length(scope) OPERATOR(pg_catalog.<) 1
     OR pg_catalog.octet_length(scope) OPERATOR(pg_catalog.>) 255 THEN
    PERFORM idempotency._check_identity(scope, key);
  END IF;
  -- (One expression that reads the settings: see idem_claim.)
  IF (error IS NOT NULL
      AND (pg_catalog.pg_column_size(error) OPERATOR(pg_catalog.>) 1048580
           OR coalesce(pg_catalog.current_setting('idempotency.max_response_size', true), '')
              OPERATOR(pg_catalog.<>) ''))
     OR pg_catalog.current_setting('transaction_read_only') OPERATOR(pg_catalog.=) 'on' THEN
    PERFORM idempotency._check_finish(pg_catalog.pg_column_size(error) OPERATOR(pg_catalog.-) 4, 'error', 'idem_fail');
  END IF;
  -- This transaction's own claim: no other transaction can see it or wait for it.
  UPDATE idempotency.keys k SET xact = pg_catalog.pg_current_xact_id(), state = 'f',
      response = idem_fail.error, lease = NULL, lease_expires_at = NULL
    WHERE k.role OPERATOR(pg_catalog.=) idempotency._me() AND k.scope OPERATOR(pg_catalog.=) idem_fail.scope
      AND k.key OPERATOR(pg_catalog.=) idem_fail.key AND k.state OPERATOR(pg_catalog.=) 'p'
      AND k.xact OPERATOR(pg_catalog.=) pg_catalog.pg_current_xact_id_if_assigned()
      AND (idem_fail.attempt IS NULL OR k.attempt OPERATOR(pg_catalog.=) idem_fail.attempt);
  IF NOT FOUND THEN
    PERFORM idempotency._finish(scope, key, 'f', error, NULL, attempt);
  END IF;
END $$;

CREATE FUNCTION idem_release(scope text, key idem_key, attempt integer DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET enable_seqscan = off AS $$
BEGIN
  IF scope IS NULL OR key IS NULL OR pg_catalog.octet_length(scope) OPERATOR(pg_catalog.<) 1
     OR pg_catalog.octet_length(scope) OPERATOR(pg_catalog.>) 255 THEN
    PERFORM idempotency._check_identity(scope, key);
  END IF;
  IF pg_catalog.current_setting('transaction_read_only') OPERATOR(pg_catalog.=) 'on' THEN
    PERFORM idempotency._check_writable('idem_release');
  END IF;
  -- This transaction's own claim: no other transaction can see it or wait for it.
  DELETE FROM idempotency.keys k
    WHERE k.role OPERATOR(pg_catalog.=) idempotency._me() AND k.scope OPERATOR(pg_catalog.=) idem_release.scope
      AND k.key OPERATOR(pg_catalog.=) idem_release.key AND k.state OPERATOR(pg_catalog.=) 'p'
      AND k.xact OPERATOR(pg_catalog.=) pg_catalog.pg_current_xact_id_if_assigned()
      AND (idem_release.attempt IS NULL OR k.attempt OPERATOR(pg_catalog.=) idem_release.attempt);
  IF NOT FOUND THEN
    PERFORM idempotency._finish(scope, key, 'r', NULL, NULL, attempt);
  END IF;
END $$;

CREATE FUNCTION idem_checkpoint(scope text, key idem_key,
    point text, data jsonb DEFAULT NULL, attempt integer DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp SET enable_seqscan = off AS $$
BEGIN
  PERFORM idempotency._check_identity(scope, key);
  IF point IS NULL THEN
    RAISE EXCEPTION 'point must not be null' USING ERRCODE = 'null_value_not_allowed';
  END IF;
  PERFORM idempotency._check_size(pg_catalog.octet_length(point), 'checkpoint');
  IF data IS NOT NULL THEN
    PERFORM idempotency._check_size(pg_catalog.pg_column_size(data) - 4, 'checkpoint data');
  END IF;
  IF pg_catalog.current_setting('transaction_read_only') = 'on' THEN
    PERFORM idempotency._check_writable('idem_checkpoint');
  END IF;
  PERFORM idempotency._finish(scope, key, 'k', data, point, attempt);
END $$;

------------------------------------------------------------------------------
-- idem_once and idem_once_many: the inbox, a key claimed and completed at once.
------------------------------------------------------------------------------
-- The general path of idem_once.
CREATE FUNCTION idempotency._once(scope text, key text, ttl interval, wait interval)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp SET enable_seqscan = off AS $$
DECLARE
  started timestamptz := pg_catalog.clock_timestamp();
  now timestamptz;
  me regrole;
  wait_ms bigint;
  seen record;
  r idempotency.keys;
  cur xid8;
  live boolean;
  attempt_result record;
BEGIN
  IF scope IS NULL OR key IS NULL OR pg_catalog.octet_length(scope) NOT BETWEEN 1 AND 255 THEN
    PERFORM idempotency._check_identity(scope, key);
  END IF;
  IF ttl IS NULL THEN
    ttl := idempotency._default_ttl();
  ELSIF started + ttl <= started THEN
    RAISE EXCEPTION 'ttl must be positive' USING ERRCODE = 'invalid_parameter_value';
  END IF;
  wait_ms := idempotency._wait_ms(wait);
  IF pg_catalog.current_setting('transaction_read_only') = 'on' THEN
    PERFORM idempotency._check_writable('idem_once');
  END IF;

  me := idempotency._me();
  FOR round IN 1 .. 1000 LOOP
    SELECT k AS r, k.xmax AS x, k.ctid AS c INTO seen FROM idempotency.keys k
      WHERE k.role = me AND k.scope = _once.scope AND k.key = _once.key;
    now := pg_catalog.clock_timestamp();
    IF seen.r IS NULL THEN
      SELECT * INTO attempt_result FROM idempotency._insert_claim(me, scope, key, NULL, now + ttl,
          NULL, NULL, 'c', now, wait_ms - (extract(epoch FROM now - started) * 1000)::bigint);
      IF attempt_result.timed_out THEN
        PERFORM idempotency._raise_in_progress(scope, key);
      END IF;
      IF (attempt_result.inserted).key IS NOT NULL THEN
        RETURN true;
      END IF;
      CONTINUE;
    END IF;
    r := seen.r;
    cur := pg_catalog.pg_current_xact_id_if_assigned();
    IF r.state = 'p' AND r.xact = cur THEN
      RETURN false;  -- held by this same transaction
    END IF;
    IF seen.x <> '0'::xid AND idempotency._busy(seen.x) THEN
      CASE idempotency._wait_for_row(me, scope, key,
             wait_ms - (extract(epoch FROM now - started) * 1000)::bigint, seen.c)
        WHEN 'timeout' THEN PERFORM idempotency._raise_in_progress(scope, key);
        WHEN 'changed' THEN CONTINUE;
        ELSE NULL;  -- no other transaction writes it: go on with it
      END CASE;
    END IF;
    live := coalesce(r.expires_at > now OR (r.state = 'p' AND r.lease_expires_at > now)
                     OR r.xact = cur, false);
    IF live THEN
      IF r.state IN ('c', 'f') THEN
        RETURN false;
      END IF;
      IF r.state = 'p' AND r.lease_expires_at > now THEN
        PERFORM idempotency._raise_in_progress(scope, key);  -- a live lease, at once
      END IF;
    END IF;
    SELECT * INTO attempt_result FROM idempotency._take_over(r, NOT live, NULL, ttl, NULL,
        now, true, wait_ms - (extract(epoch FROM now - started) * 1000)::bigint);
    IF attempt_result.timed_out THEN
      PERFORM idempotency._raise_in_progress(scope, key);
    END IF;
    IF (attempt_result.taken).key IS NOT NULL THEN
      RETURN true;
    END IF;
  END LOOP;
  -- Other transactions rewrote the key at every look: as busy as a wait running out.
  PERFORM idempotency._raise_in_progress(scope, key);
  RETURN NULL;
END $$;

-- idem_once: its fast path as idem_claim's (a new key inserted completed, or a key
-- already completed or failed, or this transaction's own); the rest in idempotency._once.
CREATE FUNCTION idem_once(scope text, key idem_key,
    ttl interval DEFAULT NULL, wait interval DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET enable_seqscan = off AS $$
DECLARE
  now pg_catalog.timestamptz := pg_catalog.clock_timestamp();
  me pg_catalog.regrole;
  seen record;
  r idempotency.keys;
  written pg_catalog.int8;
  taken pg_catalog.int4;
  own_timeout pg_catalog.text;
  ours boolean;
  ignored pg_catalog.text;  -- set_config's result: an assignment is a simple expression, a PERFORM a query
BEGIN
  IF wait IS NULL AND scope IS NOT NULL AND key IS NOT NULL
     AND pg_catalog.octet_length(scope) OPERATOR(pg_catalog.>) 0
     AND pg_catalog.octet_length(scope) OPERATOR(pg_catalog.<=) 255
     AND (ttl IS NULL OR now OPERATOR(pg_catalog.+) ttl OPERATOR(pg_catalog.>) now)
     AND (ttl IS NOT NULL
          OR coalesce(pg_catalog.current_setting('idempotency.default_ttl', true), '')
             OPERATOR(pg_catalog.=) '')
     AND coalesce(pg_catalog.current_setting('idempotency.wait_timeout', true), '')
         OPERATOR(pg_catalog.=) ''
     AND pg_catalog.current_setting('transaction_read_only') OPERATOR(pg_catalog.=) 'off' THEN
    me := idempotency._me();
    SELECT k AS r, k.xmax AS x INTO seen FROM idempotency.keys k
      WHERE k.role OPERATOR(pg_catalog.=) me AND k.scope OPERATOR(pg_catalog.=) idem_once.scope
        AND k.key OPERATOR(pg_catalog.=) idem_once.key;
    IF seen.r IS NULL THEN
      -- (No NULLIF: it compares with the caller's `=`.)
      taken := CASE WHEN pg_catalog.current_setting('idempotency.subtransactions', true)
                         OPERATOR(pg_catalog.=) '' THEN 0
                    ELSE coalesce(pg_catalog.current_setting('idempotency.subtransactions', true),
                                  '0')::pg_catalog.int4 END;
      -- Past idempotency._take_subtransaction's cap, the general path (its wait stays
      -- bounded).
      IF taken OPERATOR(pg_catalog.<) 48 THEN
        ignored := pg_catalog.set_config('idempotency.subtransactions',
                                      (taken OPERATOR(pg_catalog.+) 1)::pg_catalog.text, true);
        BEGIN
          -- The bound: 5 s, or the caller's own lock_timeout when shorter (its 55P03
          -- is then the caller's, raised on).
          own_timeout := pg_catalog.current_setting('lock_timeout');
          ours := own_timeout OPERATOR(pg_catalog.=) '0'
                  OR own_timeout::pg_catalog.interval OPERATOR(pg_catalog.>) '5 s'::pg_catalog.interval;
          IF ours THEN
            ignored := pg_catalog.set_config('lock_timeout', '5000', true);
          END IF;
          INSERT INTO idempotency.keys (role, attempt, first_claimed_at, expires_at, xact, scope,
                                        key, state)
            VALUES (me, 1, now, now OPERATOR(pg_catalog.+)
                                coalesce(ttl, '24 hours'::pg_catalog.interval),
                    pg_catalog.pg_current_xact_id(), scope, key, 'c')
            ON CONFLICT ON CONSTRAINT keys_pkey DO NOTHING;
          GET DIAGNOSTICS written = ROW_COUNT;
          IF ours THEN
            ignored := pg_catalog.set_config('lock_timeout', own_timeout, true);
          END IF;
        EXCEPTION WHEN lock_not_available THEN
          IF NOT ours THEN
            RAISE;
          END IF;
          PERFORM idempotency._raise_in_progress(scope, key);
        END;
      END IF;
      IF written OPERATOR(pg_catalog.=) 1 THEN
        RETURN true;
      END IF;
    ELSE
      r := seen.r;
      IF r.state OPERATOR(pg_catalog.=) 'p'
         AND r.xact OPERATOR(pg_catalog.=) pg_catalog.pg_current_xact_id_if_assigned() THEN
        RETURN false;  -- held by this same transaction
      END IF;
      IF (r.state OPERATOR(pg_catalog.=) 'c' OR r.state OPERATOR(pg_catalog.=) 'f')
         AND seen.x OPERATOR(pg_catalog.=) '0'::pg_catalog.xid
         AND r.expires_at OPERATOR(pg_catalog.>) now THEN
        RETURN false;
      END IF;
    END IF;
  END IF;
  RETURN idempotency._once(scope, key, ttl, wait);
END $$;

-- The rows of a batch's keys, by the whole primary key. `key = ANY(keys)` is one index
-- scan; PostgreSQL 15 and 16 may plan it, for a scope their statistics do not know yet
-- (filled since the last ANALYZE), as a scan of all the scope's rows with the keys as a
-- filter: 20,000 rows read for a batch of 100. There, each key is looked up by itself
-- (OFFSET 0 keeps the subquery a subquery, run once per key); 17 and later always keep
-- the array in the index condition. A SQL function with one query, inlined into its
-- caller's.
DO $$
BEGIN
  EXECUTE pg_catalog.format($f$
    CREATE FUNCTION idempotency._batch_rows(me regrole, scope text, keys text[])
    RETURNS TABLE (key text, state "char", xact xid8, xmax xid, expires_at timestamptz,
                   lease_expires_at timestamptz)
    LANGUAGE sql STABLE AS $b$ %s $b$ $f$,
    CASE WHEN pg_catalog.current_setting('server_version_num')::integer
              OPERATOR(pg_catalog.>=) 170000 THEN $q$
      SELECT k.key, k.state, k.xact, k.xmax, k.expires_at, k.lease_expires_at
      FROM idempotency.keys k
      WHERE k.role OPERATOR(pg_catalog.=) _batch_rows.me
        AND k.scope OPERATOR(pg_catalog.=) _batch_rows.scope
        AND k.key OPERATOR(pg_catalog.=) ANY (_batch_rows.keys) $q$
    ELSE $q$
      SELECT k.key, k.state, k.xact, k.xmax, k.expires_at, k.lease_expires_at
      FROM pg_catalog.unnest(_batch_rows.keys) AS b(key)
      CROSS JOIN LATERAL (
        SELECT k.key, k.state, k.xact, k.xmax, k.expires_at, k.lease_expires_at
        FROM idempotency.keys k
        WHERE k.role OPERATOR(pg_catalog.=) _batch_rows.me
          AND k.scope OPERATOR(pg_catalog.=) _batch_rows.scope
          AND k.key OPERATOR(pg_catalog.=) b.key
        OFFSET 0) k $q$ END);
END $$;

-- The batch's writes: the absent keys inserted completed (in key order, so that batches
-- sharing keys lock them in one order), and the expired, abandoned and stale ones taken
-- over completed, one by one by their key. Returns the keys applied.
CREATE FUNCTION idempotency._once_many_apply(me regrole, scope text, absent text[],
    takeable text[], ttl interval, now timestamptz)
RETURNS text[]
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp SET enable_seqscan = off AS $$
DECLARE
  cur xid8 := pg_current_xact_id();
  applied text[];
  one text;
  taken text;
BEGIN
  IF cardinality(absent) > 0 THEN
    WITH ins AS (
      INSERT INTO idempotency.keys AS k (role, attempt, first_claimed_at, expires_at, xact,
                                         scope, key, state)
        SELECT me, 1, now, now + ttl, cur, _once_many_apply.scope, a.key, 'c'
          FROM unnest(absent) AS a(key) ORDER BY a.key COLLATE "C"
        ON CONFLICT ON CONSTRAINT keys_pkey DO NOTHING
        RETURNING k.key)
    SELECT array_agg(ins.key) INTO applied FROM ins;
  END IF;
  applied := coalesce(applied, '{}');
  FOREACH one IN ARRAY takeable LOOP
    UPDATE idempotency.keys k SET
        attempt = CASE WHEN k.expires_at <= now THEN 1 ELSE k.attempt + 1 END,
        first_claimed_at = CASE WHEN k.expires_at <= now THEN now ELSE k.first_claimed_at END,
        expires_at = CASE WHEN k.expires_at <= now THEN now + ttl ELSE k.expires_at END,
        fingerprint = CASE WHEN k.expires_at <= now THEN NULL ELSE k.fingerprint END,
        checkpoint = CASE WHEN k.expires_at <= now THEN NULL ELSE k.checkpoint END,
        checkpoint_data = CASE WHEN k.expires_at <= now THEN NULL ELSE k.checkpoint_data END,
        xact = cur, lease = NULL, lease_expires_at = NULL, state = 'c', response = NULL
      WHERE k.role = me AND k.scope = _once_many_apply.scope AND k.key = one
        AND k.xact IS DISTINCT FROM cur
        AND NOT (k.state = 'p' AND k.lease_expires_at > now)
        AND (k.state IN ('a', 'p') OR k.expires_at <= now)
      RETURNING k.key INTO taken;
    IF FOUND THEN
      applied := applied || taken;
    END IF;
  END LOOP;
  RETURN applied;
END $$;

-- idempotency._once_many_apply in one subtransaction that waits (bounded) for another
-- transaction writing one of the keys. Returns the keys applied; timed_out when the
-- wait ran out.
CREATE FUNCTION idempotency._once_many_write(me regrole, scope text, absent text[],
    takeable text[], ttl interval, now timestamptz, remaining_ms bigint,
    OUT applied text[], OUT timed_out boolean)
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  timeout text := idempotency._lock_timeout(remaining_ms);
  own text;
  keep boolean;
BEGIN
  timed_out := false;
  -- Rolled back when nothing was applied (an update of a row that changed meanwhile
  -- locked its newest version, which others would wait for until this transaction
  -- ends), and past the cap (idempotency._take_subtransaction, counted inside it),
  -- where it only waits: the keys are then applied again in the transaction itself.
  BEGIN
    keep := idempotency._take_subtransaction();
    IF timeout IS NOT NULL THEN
      own := current_setting('lock_timeout');
      PERFORM set_config('lock_timeout', timeout, true);
    END IF;
    applied := idempotency._once_many_apply(me, scope, absent, takeable, ttl, now);
    IF timeout IS NOT NULL THEN
      PERFORM set_config('lock_timeout', own, true);
    END IF;
    IF cardinality(applied) = 0 OR NOT keep THEN
      RAISE EXCEPTION USING ERRCODE = 'IK999';
    END IF;
  EXCEPTION
    WHEN lock_not_available THEN
      IF timeout IS NULL THEN
        RAISE;
      END IF;
      timed_out := true;
    WHEN SQLSTATE 'IK999' THEN
      IF cardinality(applied) > 0 THEN
        applied := idempotency._once_many_apply(me, scope, absent, takeable, ttl, now);
      END IF;
  END;
END $$;

CREATE FUNCTION idem_once_many(scope text, keys idem_key[],
    ttl interval DEFAULT NULL, wait interval DEFAULT NULL)
RETURNS boolean[]
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp SET enable_seqscan = off AS $$
DECLARE
  started timestamptz := pg_catalog.clock_timestamp();
  now timestamptz;
  me regrole;
  wait_ms bigint;
  cur xid8;
  null_at integer;
  pending text[];
  applied text[] := '{}';
  looked record;
  absent text[];
  written record;
  result boolean[];
  passed text[] := '{}';  -- 'key xmax' of rows a wait found no other transaction writing
BEGIN
  -- Arguments: the array first, then as idem_once; 25006; an empty array last.
  IF keys IS NULL THEN
    RAISE EXCEPTION 'keys must not be null' USING ERRCODE = 'null_value_not_allowed';
  END IF;
  IF pg_catalog.array_ndims(keys) > 1 THEN
    IF EXISTS (SELECT FROM pg_catalog.unnest(keys) e WHERE e IS NULL) THEN
      RAISE EXCEPTION 'keys must not contain nulls' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    RAISE EXCEPTION 'keys must be a one-dimensional array' USING ERRCODE = 'invalid_parameter_value',
      DETAIL = pg_catalog.format('It has %s dimensions.', pg_catalog.array_ndims(keys));
  END IF;
  null_at := pg_catalog.array_position(keys, NULL);
  IF null_at IS NOT NULL THEN
    RAISE EXCEPTION 'keys must not contain nulls' USING ERRCODE = 'null_value_not_allowed',
      DETAIL = pg_catalog.format('keys[%s] is null.', null_at);
  END IF;
  PERFORM idempotency._check_name(scope, 'scope');
  IF ttl IS NULL THEN
    ttl := idempotency._default_ttl();
  ELSIF started + ttl <= started THEN
    RAISE EXCEPTION 'ttl must be positive' USING ERRCODE = 'invalid_parameter_value';
  END IF;
  wait_ms := idempotency._wait_ms(wait);
  IF pg_catalog.current_setting('transaction_read_only') = 'on' THEN
    PERFORM idempotency._check_writable('idem_once_many');
  END IF;
  IF pg_catalog.cardinality(keys) = 0 THEN
    RETURN '{}';
  END IF;

  me := idempotency._me();
  pending := ARRAY(SELECT DISTINCT e::text COLLATE "C" FROM pg_catalog.unnest(keys) e ORDER BY 1);
  FOR round IN 1 .. 1000 LOOP
    now := pg_catalog.clock_timestamp();
    cur := pg_catalog.pg_current_xact_id_if_assigned();
    -- What each pending key's row says, by the rules in their order (7, 4, 1, 3, 5, 6).
    SELECT coalesce(pg_catalog.array_agg(c.key) FILTER (WHERE c.verdict = 'done'), '{}') AS done,
           pg_catalog.min(c.key) FILTER (WHERE c.verdict = 'busy') AS busy,
           (pg_catalog.array_agg(c.xmax ORDER BY c.key) FILTER (WHERE c.verdict = 'busy'))[1] AS busy_xmax,
           pg_catalog.min(c.key) FILTER (WHERE c.verdict = 'leased') AS leased,
           coalesce(pg_catalog.array_agg(c.key) FILTER (WHERE c.verdict = 'take'), '{}') AS take,
           coalesce(pg_catalog.array_agg(c.key), '{}') AS found
      INTO looked
      FROM (SELECT k.key, k.xmax,
                   CASE WHEN k.state = 'p' AND k.xact = cur THEN 'done'
                        WHEN k.xmax <> '0'::xid AND k.key || ' ' || k.xmax <> ALL (passed)
                             AND idempotency._busy(k.xmax) THEN 'busy'
                        WHEN k.expires_at <= now AND NOT (k.state = 'p' AND k.lease_expires_at > now)
                             AND k.xact IS DISTINCT FROM cur THEN 'take'
                        WHEN k.state IN ('c', 'f') THEN 'done'
                        WHEN k.state = 'p' AND k.lease_expires_at > now THEN 'leased'
                        ELSE 'take' END AS verdict
              FROM idempotency._batch_rows(me, scope, pending) k) c;
    IF looked.leased IS NOT NULL THEN
      PERFORM idempotency._raise_in_progress(scope, looked.leased);
    END IF;
    absent := ARRAY(SELECT u.k FROM pg_catalog.unnest(pending) u(k)
                    WHERE u.k <> ALL(looked.found));
    IF pg_catalog.cardinality(absent) > 0 OR pg_catalog.cardinality(looked.take) > 0 THEN
      SELECT * INTO written FROM idempotency._once_many_write(me, scope, absent, looked.take, ttl,
          now, wait_ms - (extract(epoch FROM pg_catalog.clock_timestamp() - started) * 1000)::bigint);
      IF written.timed_out THEN
        -- Name the key another transaction holds: the first that does not answer at once.
        FOR i IN 1 .. pg_catalog.cardinality(absent) LOOP
          IF idempotency._probe_absent(me, scope, absent[i], 0) = 'timeout' THEN
            PERFORM idempotency._raise_in_progress(scope, absent[i]);
          END IF;
        END LOOP;
        PERFORM idempotency._raise_in_progress(scope, coalesce(absent[1], looked.take[1]));
      END IF;
      applied := applied || written.applied;
    END IF;
    IF looked.busy IS NOT NULL THEN
      IF idempotency._wait_for_row(me, scope, looked.busy,
             wait_ms - (extract(epoch FROM pg_catalog.clock_timestamp() - started) * 1000)::bigint)
         = 'timeout' THEN
        PERFORM idempotency._raise_in_progress(scope, looked.busy);
      END IF;
      -- Not waited for again while its xmax stays (a lock that lets ours be, or this
      -- transaction's own: looking again would see it again).
      passed := passed || (looked.busy || ' ' || looked.busy_xmax);
    END IF;
    -- Still to decide: what was neither done nor applied now (a row committed, changed
    -- or being written meanwhile).
    pending := ARRAY(SELECT u.k FROM pg_catalog.unnest(pending) u(k)
                     WHERE u.k <> ALL(looked.done) AND u.k <> ALL(applied));
    EXIT WHEN pg_catalog.cardinality(pending) = 0;
  END LOOP;
  IF pg_catalog.cardinality(pending) > 0 THEN
    -- Other transactions rewrote a key at every look: as busy as a wait running out.
    PERFORM idempotency._raise_in_progress(scope, pending[1]);
  END IF;

  -- Element i: applied now, at the key's first position in the array.
  SELECT pg_catalog.array_agg(a.first AND a.k = ANY(applied) ORDER BY a.i) INTO result
    FROM (SELECT e::text AS k, i, pg_catalog.row_number() OVER (PARTITION BY e::text ORDER BY i) = 1 AS first
            FROM pg_catalog.unnest(keys) WITH ORDINALITY AS u(e, i)) a;
  IF pg_catalog.array_lower(keys, 1) <> 1 THEN
    result := pg_catalog.format('[%s:%s]=%s', pg_catalog.array_lower(keys, 1),
                                pg_catalog.array_upper(keys, 1), result)::boolean[];
  END IF;
  RETURN result;
END $$;

------------------------------------------------------------------------------
-- idem_forget: removes the calling role's key whatever its state.
------------------------------------------------------------------------------
CREATE FUNCTION idem_forget(scope text, key idem_key)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp SET enable_seqscan = off AS $$
DECLARE
  started timestamptz := pg_catalog.clock_timestamp();
  now timestamptz;
  me regrole;
  wait_ms bigint;
  seen record;
  r idempotency.keys;
  cur xid8;
BEGIN
  PERFORM idempotency._check_identity(scope, key);
  IF pg_catalog.current_setting('transaction_read_only') = 'on' THEN
    PERFORM idempotency._check_writable('idem_forget');
  END IF;
  me := idempotency._me();
  wait_ms := idempotency._wait_ms(NULL);
  FOR round IN 1 .. 1000 LOOP
    SELECT k AS r, k.xmax AS x, k.ctid AS c INTO seen FROM idempotency.keys k
      WHERE k.role = me AND k.scope = idem_forget.scope AND k.key = idem_forget.key;
    now := pg_catalog.clock_timestamp();
    IF seen.r IS NULL THEN
      CASE idempotency._probe_absent(me, scope, key,
                                     wait_ms - (extract(epoch FROM now - started) * 1000)::bigint)
        WHEN 'timeout' THEN PERFORM idempotency._raise_in_progress(scope, key);
        WHEN 'present' THEN CONTINUE;
        ELSE RETURN false;
      END CASE;
    END IF;
    r := seen.r;
    cur := pg_catalog.pg_current_xact_id_if_assigned();
    IF seen.x <> '0'::xid AND idempotency._busy(seen.x) THEN
      CASE idempotency._wait_for_row(me, scope, key,
             wait_ms - (extract(epoch FROM now - started) * 1000)::bigint, seen.c)
        WHEN 'timeout' THEN PERFORM idempotency._raise_in_progress(scope, key);
        WHEN 'changed' THEN CONTINUE;
        ELSE NULL;  -- no other transaction writes it: go on with it
      END CASE;
    END IF;
    DELETE FROM idempotency.keys k
      WHERE k.role = me AND k.scope = idem_forget.scope AND k.key = idem_forget.key
        AND k.attempt = r.attempt AND k.state = r.state AND k.expires_at = r.expires_at;
    IF FOUND THEN
      RETURN coalesce(r.expires_at > now OR (r.state = 'p' AND r.lease_expires_at > now)
                      OR r.xact = cur, false);
    END IF;
  END LOOP;
  -- Other transactions rewrote the key at every look: as busy as a wait running out.
  PERFORM idempotency._raise_in_progress(scope, key);
  RETURN NULL;
END $$;

------------------------------------------------------------------------------
-- Reading: plain MVCC reads, so both work in a read-only transaction and on a hot
-- standby.
------------------------------------------------------------------------------
CREATE FUNCTION idem_lookup(scope text, key idem_key)
RETURNS TABLE(state text, response jsonb, attempt integer, checkpoint text,
              checkpoint_data jsonb, first_claimed_at timestamptz,
              expires_at timestamptz, lease_expires_at timestamptz)
LANGUAGE plpgsql STABLE ROWS 1
SET enable_seqscan = off AS $$
DECLARE
  now pg_catalog.timestamptz := pg_catalog.clock_timestamp();
BEGIN
  IF scope IS NULL OR key IS NULL OR pg_catalog.octet_length(scope) OPERATOR(pg_catalog.<) 1
     OR pg_catalog.octet_length(scope) OPERATOR(pg_catalog.>) 255 THEN
    PERFORM idempotency._check_identity(scope, key);
  END IF;
  RETURN QUERY
    SELECT CASE WHEN k.state OPERATOR(pg_catalog.=) 'p' THEN 'pending'::pg_catalog.text
                WHEN k.state OPERATOR(pg_catalog.=) 'c' THEN 'completed'::pg_catalog.text
                WHEN k.state OPERATOR(pg_catalog.=) 'f' THEN 'failed'::pg_catalog.text
                ELSE 'abandoned'::pg_catalog.text END,
           k.response, k.attempt, k.checkpoint, k.checkpoint_data, k.first_claimed_at,
           k.expires_at, k.lease_expires_at
      FROM idempotency.keys k
      WHERE k.role OPERATOR(pg_catalog.=) idempotency._me()
        AND k.scope OPERATOR(pg_catalog.=) idem_lookup.scope
        AND k.key OPERATOR(pg_catalog.=) idem_lookup.key
        AND (k.expires_at OPERATOR(pg_catalog.>) now
             OR (k.state OPERATOR(pg_catalog.=) 'p' AND k.lease_expires_at OPERATOR(pg_catalog.>) now)
             OR k.xact OPERATOR(pg_catalog.=) pg_catalog.pg_current_xact_id_if_assigned());
END $$;

-- node_only: as native (a Citus cluster's nodes); this edition has one node. (SQL, not
-- PL/pgSQL: a result column has a parameter's name.)
CREATE FUNCTION idempotency._check_max_rows(max_rows bigint) RETURNS void
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp SET enable_seqscan = off AS $$
BEGIN
  IF max_rows IS NULL THEN
    RAISE EXCEPTION 'max_rows must not be null' USING ERRCODE = 'null_value_not_allowed';
  ELSIF max_rows < 0 THEN
    RAISE EXCEPTION 'max_rows must not be negative' USING ERRCODE = 'invalid_parameter_value';
  END IF;
END $$;

CREATE FUNCTION idem_abandoned(scope text DEFAULT NULL, max_rows integer DEFAULT 100,
                               node_only boolean DEFAULT false)
RETURNS TABLE(scope text, key idem_key, attempt integer, checkpoint text,
              checkpoint_data jsonb, first_claimed_at timestamptz)
LANGUAGE sql STABLE AS $$
  SELECT idempotency._check_max_rows($2);
  SELECT k.scope, k.key, k.attempt, k.checkpoint, k.checkpoint_data, k.first_claimed_at
    FROM idempotency.keys k
    WHERE k.role OPERATOR(pg_catalog.=) idempotency._me() AND k.lease IS NOT NULL
      AND ($1 IS NULL OR k.scope OPERATOR(pg_catalog.=) $1)
      AND (k.state OPERATOR(pg_catalog.=) 'a'
           OR (k.state OPERATOR(pg_catalog.=) 'p'
               AND k.lease_expires_at OPERATOR(pg_catalog.<=) pg_catalog.clock_timestamp()))
      AND (k.expires_at OPERATOR(pg_catalog.>) pg_catalog.clock_timestamp()
           OR k.xact OPERATOR(pg_catalog.=) pg_catalog.pg_current_xact_id_if_assigned())
    ORDER BY k.first_claimed_at
    LIMIT $2;
$$;

------------------------------------------------------------------------------
-- Fingerprints and derived keys, as native (docs/fingerprint.md): SHA-256 of the
-- canonical text of a jsonb, of text as UTF-8, of bytes.
------------------------------------------------------------------------------

-- The canonical text: no whitespace; members sorted by the bytes of their keys;
-- strings escaped as JSON text output escapes them (\" \\ \b \t \n \f \r, other
-- characters below U+0020 as \u00xx); numbers in plain decimal without trailing
-- fractional zeros (numeric's output has no exponent; -0 is 0).
CREATE FUNCTION idempotency._canonical_json(value jsonb) RETURNS text
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
-- (Schema-qualified throughout instead of a SET search_path clause, which would cost
-- more than the work.) Scalars inside containers are written in place; only nested
-- containers recurse.
DECLARE
  kind pg_catalog.text := pg_catalog.jsonb_typeof(value);
BEGIN
  IF kind OPERATOR(pg_catalog.=) 'object' THEN
    RETURN pg_catalog.concat('{',
      (SELECT pg_catalog.string_agg(pg_catalog.concat(pg_catalog.to_json(e.key)::pg_catalog.text, ':',
                CASE WHEN pg_catalog.jsonb_typeof(e.value) OPERATOR(pg_catalog.=) 'number'
                       THEN pg_catalog.trim_scale(e.value::pg_catalog.numeric)::pg_catalog.text
                     WHEN pg_catalog.jsonb_typeof(e.value) OPERATOR(pg_catalog.=) 'object'
                          OR pg_catalog.jsonb_typeof(e.value) OPERATOR(pg_catalog.=) 'array'
                       THEN idempotency._canonical_json(e.value)
                     ELSE e.value::pg_catalog.text END),
              ',' ORDER BY e.key COLLATE pg_catalog."C")
         FROM pg_catalog.jsonb_each(value) e),
      '}');
  ELSIF kind OPERATOR(pg_catalog.=) 'array' THEN
    RETURN pg_catalog.concat('[',
      (SELECT pg_catalog.string_agg(
                CASE WHEN pg_catalog.jsonb_typeof(e.value) OPERATOR(pg_catalog.=) 'number'
                       THEN pg_catalog.trim_scale(e.value::pg_catalog.numeric)::pg_catalog.text
                     WHEN pg_catalog.jsonb_typeof(e.value) OPERATOR(pg_catalog.=) 'object'
                          OR pg_catalog.jsonb_typeof(e.value) OPERATOR(pg_catalog.=) 'array'
                       THEN idempotency._canonical_json(e.value)
                     ELSE e.value::pg_catalog.text END,
              ',' ORDER BY e.i)
         FROM pg_catalog.jsonb_array_elements(value) WITH ORDINALITY AS e(value, i)),
      ']');
  ELSIF kind OPERATOR(pg_catalog.=) 'number' THEN
    RETURN pg_catalog.trim_scale(value::pg_catalog.numeric)::pg_catalog.text;
  END IF;
  RETURN value::pg_catalog.text;
END $$;

-- A flat object (the usual request) needs no query: jsonb's own text of it,
-- `{"k": v, "k2": v2}`, is the canonical text but for the blanks in the separators
-- `": ` and `, "`, the order of the members (jsonb's is by length first) and trailing
-- fractional zeros. The text is used when it has no backslash (so no quote inside a
-- string), no nested container, no string that begins with `: ` or ends with `, ` (then
-- the separators occur nowhere else), no fraction ending in 0 (nor a '.' before a value
-- ending in 0) and fits a tsvector: the members are cut at the separators and sorted by
-- array_to_tsvector, which orders by bytes (memcmp, then length). A member is key, 0x01,
-- value: 0x01 sorts before every byte such a key holds, so a key that is a prefix of
-- another comes first. Any other value is written by idempotency._canonical_json.
CREATE FUNCTION idem_fingerprint(jsonb) RETURNS bytea
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
  t pg_catalog.text := $1::pg_catalog.text;
BEGIN
  IF pg_catalog.octet_length(t) OPERATOR(pg_catalog.<=) 2048
     AND t OPERATOR(pg_catalog.~~) '{"%'
     AND t OPERATOR(pg_catalog.!~~) ALL (ARRAY[E'%\\\\%', '%": [%', '%": {%', '%, ": %', '%: ": %',
                                              '%, ", "%', '%, "}', '%.%0, "%', '%.%0}']) THEN
    RETURN pg_catalog.sha256(pg_catalog.convert_to(pg_catalog.concat('{"', pg_catalog.replace(
             pg_catalog.array_to_string(pg_catalog.tsvector_to_array(pg_catalog.array_to_tsvector(
               pg_catalog.string_to_array(pg_catalog.replace(pg_catalog.rtrim(pg_catalog.substr(t, 3), '}'),
                                                             '": ', E'\x01'), ', "'))), ',"'),
             E'\x01', '":'), '}'), 'UTF8'));
  END IF;
  IF $1 IS NULL THEN
    RAISE EXCEPTION 'the value to fingerprint must not be null' USING ERRCODE = 'null_value_not_allowed';
  END IF;
  RETURN pg_catalog.sha256(pg_catalog.convert_to(idempotency._canonical_json($1), 'UTF8'));
END $$;

CREATE FUNCTION idem_fingerprint(text) RETURNS bytea
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
BEGIN
  IF $1 IS NULL THEN
    RAISE EXCEPTION 'the value to fingerprint must not be null' USING ERRCODE = 'null_value_not_allowed';
  END IF;
  RETURN pg_catalog.sha256(pg_catalog.convert_to($1, 'UTF8'));
END $$;

CREATE FUNCTION idem_fingerprint(bytea) RETURNS bytea
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
BEGIN
  IF $1 IS NULL THEN
    RAISE EXCEPTION 'the value to fingerprint must not be null' USING ERRCODE = 'null_value_not_allowed';
  END IF;
  RETURN pg_catalog.sha256($1);
END $$;

-- Lowercase hex of the first 16 bytes of SHA-256(root || 0x00 || step as UTF-8).
CREATE FUNCTION idem_derive(root idem_key, step text)
RETURNS idem_key
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
BEGIN
  IF root IS NULL THEN
    RAISE EXCEPTION 'root must not be null' USING ERRCODE = 'null_value_not_allowed';
  END IF;
  IF step IS NULL THEN
    RAISE EXCEPTION 'step must not be null' USING ERRCODE = 'null_value_not_allowed';
  END IF;
  RETURN pg_catalog.left(pg_catalog.encode(pg_catalog.sha256(
           pg_catalog.textsend(root) OPERATOR(pg_catalog.||) '\x00'::pg_catalog.bytea
           OPERATOR(pg_catalog.||) pg_catalog.convert_to(step, 'UTF8')), 'hex'), 32);
END $$;

------------------------------------------------------------------------------
-- Who may add keys is a matter of EXECUTE grants on idem_claim, idem_once and
-- idem_once_many (SPEC Security), here too: a role reaches the store directly (its own
-- rows, through row-level security), so a restrictive policy refuses a new row from a
-- role that may execute none of the three, however it tries (the functions, the
-- internal helpers, or an INSERT of its own). The functions are named by OID, fixed
-- when the policy is made.
------------------------------------------------------------------------------
CREATE POLICY keys_added_by_claimers ON idempotency.keys AS RESTRICTIVE FOR INSERT
  WITH CHECK (
    pg_catalog.has_function_privilege(
      'idem_claim(text, idem_key, bytea, interval, interval, interval)'::pg_catalog.regprocedure, 'EXECUTE')
    OR pg_catalog.has_function_privilege(
      'idem_once(text, idem_key, interval, interval)'::pg_catalog.regprocedure, 'EXECUTE')
    OR pg_catalog.has_function_privilege(
      'idem_once_many(text, idem_key[], interval, interval)'::pg_catalog.regprocedure, 'EXECUTE'));
