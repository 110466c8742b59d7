-- The SQL-only edition, part 2: claiming, finishing, reading, fingerprints.
--
-- The rules are the SPEC's (Claiming, Finishing), checked in the order 7, 4, 1, 2, 3,
-- 5, 6. A key function looks at the key's row first (a plain read: a replay writes
-- nothing and takes no transaction id), and writes only for a claim, a takeover or
-- a finish. Its only subtransaction is the one that waits (idempotency._probe_*,
-- _wait_for_row, and the new key's insert in _insert_claim): a wait for another
-- transaction must end in an answer, not in the caller's abort.

------------------------------------------------------------------------------
-- IK002: a claim made in a transaction must be finished before it commits. A
-- deferred constraint trigger fires at COMMIT and PREPARE TRANSACTION for every row
-- an in-transaction claim wrote, and looks at the row as it is then.
------------------------------------------------------------------------------
CREATE FUNCTION idempotency._check_claim_finished() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  IF EXISTS (SELECT FROM idempotency.keys k
             WHERE k.role = NEW.role AND k.scope = NEW.scope AND k.key = NEW.key
               AND k.state = 'p' AND k.lease IS NULL
               AND k.xact = pg_current_xact_id_if_assigned()) THEN
    RAISE EXCEPTION 'idempotency key "%" in scope "%" was claimed but not finished', NEW.key, NEW.scope
      USING ERRCODE = 'IK002',
            DETAIL = 'A transaction that claims a key must complete, fail or release it before it commits, so the key is never stored without its work.',
            HINT = 'Call idem_complete, idem_fail or idem_release before COMMIT, or claim with a lease for work that must commit before it finishes.';
  END IF;
  RETURN NULL;
END $$;
REVOKE ALL ON FUNCTION idempotency._check_claim_finished() FROM PUBLIC;

CREATE CONSTRAINT TRIGGER keys_claim_finished
  AFTER INSERT OR UPDATE ON idempotency.keys
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
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  timeout text := idempotency._lock_timeout(remaining_ms);
  own text;
BEGIN
  timed_out := false;
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

-- Takes over (or replaces, when expired) the row `r` as this call's claim: with
-- `complete_now`, completed at once (idem_once). NULL when the row changed meanwhile
-- (look again); timed_out when the wait for its writer ran out.
CREATE FUNCTION idempotency._take_over(r idempotency.keys, fresh boolean,
    fingerprint bytea, ttl interval, lease interval, now timestamptz, complete_now boolean,
    remaining_ms bigint, OUT taken idempotency.keys, OUT timed_out boolean)
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  timeout text := idempotency._lock_timeout(remaining_ms);
  own text;
  lease_end timestamptz := now + lease;
BEGIN
  timed_out := false;
  BEGIN
    IF timeout IS NOT NULL THEN
      own := current_setting('lock_timeout');
      PERFORM set_config('lock_timeout', timeout, true);
    END IF;
    UPDATE idempotency.keys k SET
        attempt = CASE WHEN fresh THEN 1 ELSE k.attempt + 1 END,
        first_claimed_at = CASE WHEN fresh THEN now ELSE k.first_claimed_at END,
        expires_at = CASE WHEN fresh THEN greatest(now + ttl, lease_end)
                          ELSE greatest(k.expires_at, lease_end) END,
        xact = pg_current_xact_id(),
        fingerprint = CASE WHEN fresh THEN _take_over.fingerprint
                           ELSE coalesce(k.fingerprint, _take_over.fingerprint) END,
        lease = CASE WHEN complete_now THEN NULL ELSE _take_over.lease END,
        checkpoint = CASE WHEN fresh THEN NULL ELSE k.checkpoint END,
        checkpoint_data = CASE WHEN fresh THEN NULL ELSE k.checkpoint_data END,
        lease_expires_at = CASE WHEN complete_now THEN NULL ELSE lease_end END,
        state = CASE WHEN complete_now THEN 'c' ELSE 'p' END,
        response = NULL
      WHERE k.role = r.role AND k.scope = r.scope AND k.key = r.key
        AND k.attempt = r.attempt AND k.state = r.state
        AND k.expires_at = r.expires_at
        AND k.lease_expires_at IS NOT DISTINCT FROM r.lease_expires_at
      RETURNING k.* INTO taken;
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

CREATE FUNCTION idem_claim(scope text, key idem_key,
    fingerprint bytea DEFAULT NULL, ttl interval DEFAULT NULL,
    lease interval DEFAULT NULL, wait interval DEFAULT NULL)
RETURNS idem_claim_result
LANGUAGE plpgsql VOLATILE AS $$
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
    SELECT k AS r, k.xmax AS x INTO seen FROM idempotency.keys k
      WHERE k.role = me AND k.scope = idem_claim.scope AND k.key = idem_claim.key;
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
    -- Rule 4: another transaction writes the row now: wait for it, then look again.
    IF row_xmax <> '0'::xid AND idempotency._busy(row_xmax) THEN
      IF idempotency._wait_for_row(me, scope, key,
             wait_ms - (extract(epoch FROM now - started) * 1000)::bigint) THEN
        RETURN ROW('in_progress'::text, 'pending'::text, NULL::jsonb, r.attempt, NULL::text, NULL::jsonb, greatest(pg_catalog.clock_timestamp() - started, interval '100 ms'), r.first_claimed_at, r.expires_at);
      END IF;
      CONTINUE;
    END IF;
    live := r.expires_at > now OR (r.state = 'p' AND r.lease_expires_at > now)
            OR r.xact = cur;
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
      RETURN ROW('in_progress'::text, 'pending'::text, NULL::jsonb, r.attempt, NULL::text, NULL::jsonb, greatest(pg_catalog.clock_timestamp() - started, interval '100 ms'), r.first_claimed_at, r.expires_at);
    END IF;
    r := attempt_result.taken;
    IF r.key IS NOT NULL THEN
      RETURN ROW('claimed'::text, 'pending'::text, NULL::jsonb, r.attempt, r.checkpoint, r.checkpoint_data, NULL::interval, r.first_claimed_at, r.expires_at);
    END IF;
  END LOOP;
  RAISE EXCEPTION 'idem_claim could not settle on the state of key "%" in scope "%"', key, scope
    USING ERRCODE = 'internal_error';
END $$;

------------------------------------------------------------------------------
-- Finishing: idem_complete, idem_fail, idem_release, idem_checkpoint.
------------------------------------------------------------------------------

-- The general path of a finish (a committed lease claim, or an error): `kind` is
-- 'c', 'f', 'r' (release) or 'k' (checkpoint).
CREATE FUNCTION idempotency._finish(scope text, key text, kind "char", data jsonb,
                                    point text, attempt integer)
RETURNS void
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
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
    SELECT k AS r, k.xmax AS x INTO seen FROM idempotency.keys k
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
    own_claim := r.state = 'p' AND r.xact IS NOT DISTINCT FROM cur AND cur IS NOT NULL;
    IF NOT own_claim AND row_xmax <> '0'::xid AND idempotency._busy(row_xmax) THEN
      IF idempotency._wait_for_row(me, scope, key,
             wait_ms - (extract(epoch FROM now - started) * 1000)::bigint) THEN
        PERFORM idempotency._raise_in_progress(scope, key);
      END IF;
      CONTINUE;
    END IF;
    live := r.expires_at > now OR (r.state = 'p' AND r.lease_expires_at > now) OR r.xact = cur;
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
  RAISE EXCEPTION 'could not settle on the state of key "%" in scope "%"', key, scope
    USING ERRCODE = 'internal_error';
END $$;

CREATE FUNCTION idem_complete(scope text, key idem_key,
    response jsonb DEFAULT NULL, attempt integer DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
  IF scope IS NULL OR key IS NULL OR pg_catalog.octet_length(scope) NOT BETWEEN 1 AND 255 THEN
    PERFORM idempotency._check_identity(scope, key);
  END IF;
  IF response IS NOT NULL THEN
    PERFORM idempotency._check_size(pg_catalog.pg_column_size(response) - 4, 'response');
  END IF;
  IF pg_catalog.current_setting('transaction_read_only') = 'on' THEN
    PERFORM idempotency._check_writable('idem_complete');
  END IF;
  -- This transaction's own claim: no one else can see or wait for it.
  UPDATE idempotency.keys k SET xact = pg_catalog.pg_current_xact_id(), state = 'c',
      response = idem_complete.response, lease = NULL, lease_expires_at = NULL
    WHERE k.role = idempotency._me() AND k.scope = idem_complete.scope
      AND k.key = idem_complete.key AND k.state = 'p'
      AND k.xact = pg_catalog.pg_current_xact_id_if_assigned()
      AND (idem_complete.attempt IS NULL OR k.attempt = idem_complete.attempt);
  IF NOT FOUND THEN
    PERFORM idempotency._finish(scope, key, 'c', response, NULL, attempt);
  END IF;
END $$;

CREATE FUNCTION idem_fail(scope text, key idem_key,
    error jsonb DEFAULT NULL, attempt integer DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
  IF scope IS NULL OR key IS NULL OR pg_catalog.octet_length(scope) NOT BETWEEN 1 AND 255 THEN
    PERFORM idempotency._check_identity(scope, key);
  END IF;
  IF error IS NOT NULL THEN
    PERFORM idempotency._check_size(pg_catalog.pg_column_size(error) - 4, 'error');
  END IF;
  IF pg_catalog.current_setting('transaction_read_only') = 'on' THEN
    PERFORM idempotency._check_writable('idem_fail');
  END IF;
  UPDATE idempotency.keys k SET xact = pg_catalog.pg_current_xact_id(), state = 'f',
      response = idem_fail.error, lease = NULL, lease_expires_at = NULL
    WHERE k.role = idempotency._me() AND k.scope = idem_fail.scope
      AND k.key = idem_fail.key AND k.state = 'p'
      AND k.xact = pg_catalog.pg_current_xact_id_if_assigned()
      AND (idem_fail.attempt IS NULL OR k.attempt = idem_fail.attempt);
  IF NOT FOUND THEN
    PERFORM idempotency._finish(scope, key, 'f', error, NULL, attempt);
  END IF;
END $$;

CREATE FUNCTION idem_release(scope text, key idem_key, attempt integer DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
  IF scope IS NULL OR key IS NULL OR pg_catalog.octet_length(scope) NOT BETWEEN 1 AND 255 THEN
    PERFORM idempotency._check_identity(scope, key);
  END IF;
  IF pg_catalog.current_setting('transaction_read_only') = 'on' THEN
    PERFORM idempotency._check_writable('idem_release');
  END IF;
  DELETE FROM idempotency.keys k
    WHERE k.role = idempotency._me() AND k.scope = idem_release.scope
      AND k.key = idem_release.key AND k.state = 'p'
      AND k.xact = pg_catalog.pg_current_xact_id_if_assigned()
      AND (idem_release.attempt IS NULL OR k.attempt = idem_release.attempt);
  IF NOT FOUND THEN
    PERFORM idempotency._finish(scope, key, 'r', NULL, NULL, attempt);
  END IF;
END $$;

CREATE FUNCTION idem_checkpoint(scope text, key idem_key,
    point text, data jsonb DEFAULT NULL, attempt integer DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
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
