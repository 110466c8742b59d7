-- ---- sqlonly/sql/00_store.sql ----
-- The SQL-only edition, part 1: the key type, the key store and shared helpers.
--
-- Run with the target schema first on the search_path (the plain script: the schema
-- psql's session creates objects in, usually public; pg_tle: CREATE EXTENSION's
-- schema). Public objects are created unqualified there; the store and every internal
-- helper live in the schema `idempotency`, which this script creates and owns.
--
-- Function bodies refer to objects of the target schema only through their
-- signatures (resolved once, at CREATE), and to everything else schema-qualified, so
-- that nothing depends on the caller's search_path. Key functions are SECURITY
-- INVOKER: current_user is then exactly the role the SPEC's identity means, and the
-- store's row-level security keeps each role to its own rows.

DO $$
BEGIN
  IF EXISTS (SELECT FROM pg_catalog.pg_namespace WHERE nspname = 'idempotency') THEN
    RAISE EXCEPTION 'schema "idempotency" already exists'
      USING ERRCODE = 'duplicate_schema',
            DETAIL = 'The SQL-only edition keeps its key store in a schema "idempotency" that it creates and owns.',
            HINT = 'Rename or drop the existing schema (an earlier install: see sqlonly/README.md), '
                   'and install the functions in another schema.';
  END IF;
  IF pg_catalog.current_schema() IS NULL THEN
    RAISE EXCEPTION 'no schema has been selected to create in'
      USING ERRCODE = 'invalid_schema_name',
            HINT = 'Set search_path to the schema the functions should go into (usually public).';
  END IF;
END
$$;

CREATE SCHEMA idempotency;
REVOKE ALL ON SCHEMA idempotency FROM PUBLIC;
-- Key functions run as their caller, who reaches its own rows through row-level
-- security (below).
GRANT USAGE ON SCHEMA idempotency TO PUBLIC;

------------------------------------------------------------------------------
-- idem_key: a domain over text COLLATE "C" (bytewise comparison, text's btree and
-- hash operator classes). Its check raises the native type's 22P02 and message.
------------------------------------------------------------------------------

-- Raises the native 22P02 for an invalid key; never returns false (the domain's check
-- calls it only for a value that failed the quick test).
CREATE FUNCTION idempotency._key_invalid(value text) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  raw bytea := textsend(value);
  n integer := octet_length(raw);
  b integer;
BEGIN
  IF n = 0 THEN
    RAISE EXCEPTION 'idem_key must not be empty' USING ERRCODE = 'invalid_text_representation';
  END IF;
  IF n > 255 THEN
    RAISE EXCEPTION 'idem_key is % bytes long, at most 255 are allowed', n
      USING ERRCODE = 'invalid_text_representation';
  END IF;
  FOR i IN 0 .. n - 1 LOOP
    b := get_byte(raw, i);
    IF b < 33 OR b > 126 THEN
      RAISE EXCEPTION 'idem_key has byte 0x% at position %, only visible ASCII characters (0x21 to 0x7E) are allowed',
        upper(lpad(to_hex(b), 2, '0')), i + 1
        USING ERRCODE = 'invalid_text_representation';
    END IF;
  END LOOP;
  RETURN true;
END $$;

CREATE DOMAIN idem_key AS text COLLATE "C"
  -- (The quick test as a negated class: far cheaper than an anchored, bounded one.)
  CHECK (VALUE IS NULL
         OR (pg_catalog.octet_length(VALUE) BETWEEN 1 AND 255
             AND VALUE OPERATOR(pg_catalog.!~) '[^!-~]')
         OR idempotency._key_invalid(VALUE));
COMMENT ON DOMAIN idem_key IS 'an idempotency key: 1 to 255 visible ASCII bytes, compared bytewise';

-- The key's bytes, as the native type sends them (its text: no 17-byte UUID form here).
CREATE FUNCTION idem_key_send(idem_key) RETURNS bytea
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
RETURN pg_catalog.textsend($1);

-- The native type's cast functions, for statements that call them by name.
CREATE FUNCTION idem_key(text) RETURNS idem_key
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
RETURN $1;
CREATE FUNCTION idem_key(uuid) RETURNS idem_key
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
RETURN $1::pg_catalog.text;

------------------------------------------------------------------------------
-- The key store. The columns are the native store's (docs/design.md), plus `xact`:
-- the transaction that claimed or finished the row (the native edition asks the
-- row's xmin; a claim made in a subtransaction has the subtransaction's xmin, so
-- the top-level id is kept instead).
------------------------------------------------------------------------------
-- A key's state: p = pending, c = completed, f = failed, a = abandoned. A domain, not a
-- CHECK on the table: a table's CHECK is read from the catalog and planned again for
-- every INSERT and UPDATE statement (about 7% of a claim's CPU), a domain's check once
-- per session (its type cache).
CREATE DOMAIN idempotency.key_state AS "char" CHECK (VALUE IN ('p', 'c', 'f', 'a'));

CREATE TABLE idempotency.keys (
  role             regrole     NOT NULL,
  attempt          integer     NOT NULL,
  first_claimed_at timestamptz NOT NULL,
  expires_at       timestamptz NOT NULL,
  xact             xid8,
  scope            text        COLLATE "C" NOT NULL,
  key              text        COLLATE "C" NOT NULL,
  fingerprint      bytea,
  lease            interval,
  checkpoint       text,
  checkpoint_data  jsonb,
  lease_expires_at timestamptz,
  state            idempotency.key_state NOT NULL,
  response         jsonb,
  CONSTRAINT keys_pkey PRIMARY KEY (role, scope, key)
) WITH (fillfactor = 90);  -- room for the completion's HOT update
-- idem_reap's way to expired rows.
CREATE INDEX keys_expires_at_idx ON idempotency.keys (expires_at);
-- idem_reap's way to stale leases; in-transaction claims never enter it.
CREATE INDEX keys_lease_expires_at_idx ON idempotency.keys (lease_expires_at)
  WHERE lease_expires_at IS NOT NULL;
-- idem_abandoned's way to a role's lease claims, oldest first.
CREATE INDEX keys_leased_idx ON idempotency.keys (role, first_claimed_at)
  WHERE lease IS NOT NULL;

-- The calling role (current_user) as stored. quote_ident: regrole's input parses a
-- name as an identifier.
CREATE FUNCTION idempotency._me() RETURNS regrole
LANGUAGE sql STABLE PARALLEL SAFE
RETURN pg_catalog.quote_ident(CURRENT_USER)::pg_catalog.regrole;

-- Row-level security: every role sees and writes its own rows only, through the
-- functions or directly; the unique key leads with the role, so another role's row
-- never conflicts with, waits for or shows to it. The owner (the installing role)
-- is not subject to it, as a table owner is not; superusers neither.
ALTER TABLE idempotency.keys ENABLE ROW LEVEL SECURITY;
CREATE POLICY keys_own_rows ON idempotency.keys
  USING (role OPERATOR(pg_catalog.=) idempotency._me())
  WITH CHECK (role OPERATOR(pg_catalog.=) idempotency._me());
REVOKE ALL ON TABLE idempotency.keys FROM PUBLIC;
GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE idempotency.keys TO PUBLIC;

-- Installed as an extension (pg_tle), the store's rows go into pg_dump output as the
-- native edition's do; installed as plain SQL, the table is dumped like any other.
DO $$
BEGIN
  PERFORM pg_catalog.pg_extension_config_dump('idempotency.keys', '');
EXCEPTION WHEN feature_not_supported THEN
  NULL;  -- not run by CREATE EXTENSION
END $$;

------------------------------------------------------------------------------
-- The claim result, as native.
------------------------------------------------------------------------------
CREATE TYPE idem_claim_result AS (
  outcome          text,
  state            text,
  response         jsonb,
  attempt          integer,
  checkpoint       text,
  checkpoint_data  jsonb,
  retry_after      interval,
  first_claimed_at timestamptz,
  expires_at       timestamptz
);

------------------------------------------------------------------------------
-- Settings: the idempotency.* names are placeholders here (no library defines
-- them); read with their native default when unset, validated when read.
------------------------------------------------------------------------------

-- A setting's value in its base unit ('ms', 's' or 'B'), as the native GUC would
-- take it: a plain number is in the base unit; units as PostgreSQL's.
CREATE FUNCTION idempotency._setting(name text, base text, fallback bigint,
                                     minimum bigint DEFAULT 0)
RETURNS bigint
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  raw text := current_setting(name, true);
  parts text[];
  number numeric;
  factor numeric;
  result numeric;
BEGIN
  IF raw IS NULL OR raw = '' THEN
    RETURN fallback;
  END IF;
  parts := regexp_match(raw, '^\s*([-+]?[0-9]+(?:\.[0-9]*)?|[-+]?\.[0-9]+)\s*([A-Za-z]*)\s*$');
  IF parts IS NOT NULL THEN
    number := parts[1]::numeric;
    IF base = 'B' THEN
      factor := CASE parts[2] WHEN '' THEN 1 WHEN 'B' THEN 1 WHEN 'kB' THEN 1024
                  WHEN 'MB' THEN 1024 ^ 2 WHEN 'GB' THEN 1024 ^ 3 WHEN 'TB' THEN 1024 ^ 4 END;
    ELSE
      factor := CASE parts[2] WHEN 'us' THEN 0.001 WHEN 'ms' THEN 1 WHEN 's' THEN 1000
                  WHEN 'min' THEN 60000 WHEN 'h' THEN 3600000 WHEN 'd' THEN 86400000
                  WHEN '' THEN CASE base WHEN 'ms' THEN 1 ELSE 1000 END END;
      IF factor IS NOT NULL AND base = 's' THEN
        factor := factor / 1000;
      END IF;
    END IF;
    IF factor IS NOT NULL THEN
      result := round(number * factor);
      IF result >= minimum AND result <= 2147483647 THEN
        RETURN result;
      END IF;
    END IF;
  END IF;
  RAISE EXCEPTION 'invalid value for parameter "%": "%"', name, raw
    USING ERRCODE = 'invalid_parameter_value',
          HINT = CASE WHEN base = 'B'
                      THEN 'Valid units for this parameter are "B", "kB", "MB", "GB", and "TB".'
                      ELSE 'Valid units for this parameter are "us", "ms", "s", "min", "h", and "d".' END;
END $$;

-- idempotency.default_ttl as an interval (24h by default).
CREATE FUNCTION idempotency._default_ttl() RETURNS interval
LANGUAGE sql STABLE
RETURN pg_catalog.make_interval(secs => idempotency._setting('idempotency.default_ttl', 's', 86400, 1));

------------------------------------------------------------------------------
-- Argument checks (SPEC "Bad input and limits"), in the native order.
------------------------------------------------------------------------------

-- A required name-like argument (scope, topic, ...): not null, 1 to 255 bytes.
CREATE FUNCTION idempotency._check_name(value text, what text) RETURNS void
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  n integer;
BEGIN
  IF value IS NULL THEN
    RAISE EXCEPTION '% must not be null', what USING ERRCODE = 'null_value_not_allowed';
  END IF;
  n := octet_length(value);
  IF n = 0 THEN
    RAISE EXCEPTION '% must not be empty', what USING ERRCODE = 'invalid_parameter_value';
  ELSIF n > 255 THEN
    RAISE EXCEPTION '% is % bytes long, at most 255 are allowed', what, n
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
END $$;

-- scope and key of a key function.
CREATE FUNCTION idempotency._check_identity(scope text, key text) RETURNS void
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  IF scope IS NULL THEN
    RAISE EXCEPTION 'scope must not be null' USING ERRCODE = 'null_value_not_allowed';
  END IF;
  IF key IS NULL THEN
    RAISE EXCEPTION 'key must not be null' USING ERRCODE = 'null_value_not_allowed';
  END IF;
  PERFORM idempotency._check_name(scope, 'scope');
END $$;

-- 25006 in a read-only transaction (and on a standby), before anything is read.
CREATE FUNCTION idempotency._check_writable(function_name text) RETURNS void
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  IF current_setting('transaction_read_only') = 'on' THEN
    RAISE EXCEPTION 'cannot execute %() in a read-only transaction', function_name
      USING ERRCODE = 'read_only_sql_transaction';
  END IF;
END $$;

-- A response, error or checkpoint data over idempotency.max_response_size: 54000.
-- `size`: the value's bytes (a jsonb's binary form, a text's bytes), as native counts.
CREATE FUNCTION idempotency._check_size(size bigint, what text) RETURNS void
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  max_size bigint;
BEGIN
  max_size := idempotency._setting('idempotency.max_response_size', 'B', 1048576);
  IF size > max_size THEN
    RAISE EXCEPTION '% is too large', what
      USING ERRCODE = 'program_limit_exceeded',
            DETAIL = format('It is %s bytes; idempotency.max_response_size is %s bytes.', size, max_size);
  END IF;
END $$;

------------------------------------------------------------------------------
-- Waits. A wait for another transaction is a row-lock wait (INSERT ... ON CONFLICT,
-- UPDATE, SELECT ... FOR SHARE), which PostgreSQL's deadlock detector sees and
-- lock_timeout ends. Bounded by `wait` (NULL: idempotency.wait_timeout) by setting
-- lock_timeout to the smaller of the bound and the caller's own lock_timeout inside
-- the one subtransaction that waits; a 55P03 there is ours when our bound was the
-- smaller, else the caller's, and then raised on.
------------------------------------------------------------------------------

-- Subtransactions: a write that may wait runs in one, so that a wait running out is an
-- answer, not the caller's abort. Each one that writes takes a subtransaction id, and a
-- transaction with more than 64 of them overflows PostgreSQL's cache of them (every
-- snapshot on the server gets slower, and each further one costs more). So a
-- transaction takes at most 48 for the store's writes (counted in a transaction-local
-- setting); after that, a write first waits (bounded) in a subtransaction that is
-- rolled back, whose id leaves the cache with it (idempotency._probe_absent, or the
-- write itself taken back), then runs in the transaction directly. Only another
-- transaction writing the key in between those two is waited for without the bound.
CREATE FUNCTION idempotency._take_subtransaction() RETURNS boolean
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  taken integer := coalesce(nullif(current_setting('idempotency.subtransactions', true), ''), '0')::integer;
BEGIN
  IF taken >= 48 THEN
    RETURN false;
  END IF;
  PERFORM set_config('idempotency.subtransactions', (taken + 1)::text, true);
  RETURN true;
END $$;

-- The wait's bound in ms for `wait` (checked: not negative).
CREATE FUNCTION idempotency._wait_ms(wait interval) RETURNS bigint
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  ms numeric;
BEGIN
  IF wait IS NULL THEN
    RETURN idempotency._setting('idempotency.wait_timeout', 'ms', 5000);
  END IF;
  ms := extract(epoch FROM wait) * 1000;
  IF ms < 0 THEN
    RAISE EXCEPTION 'wait must not be negative' USING ERRCODE = 'invalid_parameter_value';
  END IF;
  RETURN least(ceil(ms), 2147483647);
END $$;

-- The lock_timeout a wait of `remaining_ms` sets, or NULL when the caller's own
-- lock_timeout is shorter (then it is left as it is, and its 55P03 is the caller's).
-- 0 ms (do not wait) waits 1 ms: lock_timeout has no "do not wait".
CREATE FUNCTION idempotency._lock_timeout(remaining_ms bigint) RETURNS text
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  own bigint := idempotency._setting('lock_timeout', 'ms', 0);
  ours bigint := greatest(remaining_ms, 1);
BEGIN
  IF own > 0 AND own <= ours THEN
    RETURN NULL;
  END IF;
  RETURN ours::text;
END $$;

-- Whether a row version's xmax is a transaction in progress other than this one (an
-- update, delete or lock not yet committed): rule 4 waits for it. xmax is 32 bits;
-- its epoch is the one that puts it within 2^31 of the next transaction id. One from
-- the snapshot's xmax on (begun meanwhile, or a multixact's id, which names no
-- transaction: pg_xact_status fails on one past the next id) counts as busy, and
-- idempotency._wait_for_row tells what it is.
CREATE FUNCTION idempotency._busy(xmax xid) RETURNS boolean
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  x bigint := xmax::text::bigint;
  next bigint;
  full_xid bigint;
BEGIN
  IF x = 0 THEN
    RETURN false;
  END IF;
  next := pg_snapshot_xmax(pg_current_snapshot())::text::bigint;
  full_xid := (next & ~4294967295::bigint) | x;
  IF full_xid > next + 2147483648 THEN
    full_xid := full_xid - 4294967296;
  ELSIF full_xid < next - 2147483648 THEN
    full_xid := full_xid + 4294967296;
  END IF;
  IF full_xid >= next THEN
    RETURN true;
  END IF;
  IF full_xid::text::xid8 = pg_current_xact_id_if_assigned() THEN
    RETURN false;
  END IF;
  RETURN pg_xact_status(full_xid::text::xid8) = 'in progress';
END $$;

-- Waits (bounded) for whoever writes the key's row now, taking nothing: a share lock
-- waited for in a subtransaction that is then rolled back. 'timeout' when the wait ran
-- out within our bound (the caller's own lock_timeout and cycles, 40P01, raise);
-- 'same' when the version locked is `seen`: no other transaction writes it (its xmax
-- is a lock that lets ours be, or this transaction's own, of a subtransaction too), so
-- the caller decides on what it saw, where looking again would see the same xmax
-- again; else 'changed' (look again).
CREATE FUNCTION idempotency._wait_for_row(me regrole, scope text, key text,
                                          remaining_ms bigint, seen tid DEFAULT NULL)
RETURNS text
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp SET enable_seqscan = off AS $$
DECLARE
  timeout text := idempotency._lock_timeout(remaining_ms);
  locked tid;
BEGIN
  BEGIN
    IF timeout IS NOT NULL THEN
      PERFORM set_config('lock_timeout', timeout, true);
    END IF;
    IF remaining_ms <= 0 THEN  -- do not wait at all
      SELECT k.ctid INTO locked FROM idempotency.keys k
        WHERE k.role = me AND k.scope = _wait_for_row.scope AND k.key = _wait_for_row.key
        FOR SHARE NOWAIT;
    ELSE
      SELECT k.ctid INTO locked FROM idempotency.keys k
        WHERE k.role = me AND k.scope = _wait_for_row.scope AND k.key = _wait_for_row.key
        FOR SHARE;
    END IF;
    RAISE EXCEPTION USING ERRCODE = 'IK999';  -- takes the lock back
  EXCEPTION
    WHEN lock_not_available THEN
      IF timeout IS NULL AND remaining_ms > 0 THEN
        RAISE;
      END IF;
      RETURN 'timeout';
    WHEN SQLSTATE 'IK999' THEN
      RETURN CASE WHEN locked = seen THEN 'same' ELSE 'changed' END;
  END;
END $$;

-- Waits (bounded) for another transaction's claim of a key whose row this one cannot
-- see (an insert not yet committed), writing nothing: a probe row inserted with ON
-- CONFLICT DO NOTHING in a subtransaction that is then rolled back. Returns 'absent'
-- (no other transaction holds the key), 'present' (a row committed meanwhile: look
-- again) or 'timeout' (our bound ran out).
CREATE FUNCTION idempotency._probe_absent(me regrole, scope text, key text,
                                          remaining_ms bigint) RETURNS text
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp SET enable_seqscan = off AS $$
DECLARE
  timeout text := idempotency._lock_timeout(remaining_ms);
  inserted boolean;
BEGIN
  BEGIN
    IF timeout IS NOT NULL THEN
      PERFORM set_config('lock_timeout', timeout, true);
    END IF;
    INSERT INTO idempotency.keys AS k (role, attempt, first_claimed_at, expires_at, scope, key, state)
      VALUES (me, 0, '-infinity', '-infinity', _probe_absent.scope, _probe_absent.key, 'a')
      ON CONFLICT ON CONSTRAINT keys_pkey DO NOTHING
      RETURNING true INTO inserted;
    RAISE EXCEPTION USING ERRCODE = 'IK999', MESSAGE = coalesce(inserted, false)::text;
  EXCEPTION
    WHEN insufficient_privilege THEN
      -- A role that may not add keys (keys_added_by_claimers) cannot probe: it learns
      -- nothing of others' claims, and has no claim of its own to wait for.
      RETURN 'absent';
    WHEN lock_not_available THEN
      IF timeout IS NULL THEN
        RAISE;
      END IF;
      RETURN 'timeout';
    WHEN SQLSTATE 'IK999' THEN
      RETURN CASE WHEN SQLERRM = 'true' THEN 'absent' ELSE 'present' END;
  END;
END $$;

------------------------------------------------------------------------------
-- Errors shared by the key functions.
------------------------------------------------------------------------------
CREATE FUNCTION idempotency._raise_in_progress(scope text, key text) RETURNS void
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  RAISE EXCEPTION 'idempotency key "%" in scope "%" is in progress', key, scope
    USING ERRCODE = 'IK005', DETAIL = 'Another transaction or a live lease holds it.',
          HINT = 'Retry later.';
END $$;

CREATE FUNCTION idempotency._raise_mismatch(scope text, key text) RETURNS void
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  RAISE EXCEPTION 'idempotency key "%" in scope "%" was used for a different request', key, scope
    USING ERRCODE = 'IK001',
          DETAIL = 'The request''s fingerprint differs from the one stored with the key.',
          HINT = 'Use a new idempotency key for a different request.';
END $$;

CREATE FUNCTION idempotency._raise_not_claimed(scope text, key text) RETURNS void
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  RAISE EXCEPTION 'idempotency key "%" in scope "%" is not claimed', key, scope
    USING ERRCODE = 'IK004', HINT = 'Call idem_claim before finishing a key.';
END $$;

-- IK003, with the native message for what this call saw (`row_found`, the row's state,
-- attempt, whether this transaction wrote it, whether it is live).
CREATE FUNCTION idempotency._raise_claim_lost(scope text, key text, row_found boolean,
    state "char", stored_attempt integer, written_here boolean, live boolean,
    attempt integer) RETURNS void
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  state_name text := CASE state WHEN 'p' THEN 'pending' WHEN 'c' THEN 'completed'
                                WHEN 'f' THEN 'failed' WHEN 'a' THEN 'abandoned' END;
  detail text;
BEGIN
  IF row_found AND written_here AND state <> 'p' THEN
    RAISE EXCEPTION 'idempotency key "%" in scope "%" was already % in this transaction',
        key, scope, state_name
      USING ERRCODE = 'IK003',
            DETAIL = 'A claim is finished once; its stored result is kept as it is.',
            HINT = 'Call idem_complete or idem_fail once per claim, after the business write.';
  END IF;
  IF NOT row_found OR NOT live THEN
    detail := 'The key no longer exists or has expired.';
  ELSIF state <> 'p' THEN
    detail := format('The key is %s.', state_name);
  ELSIF attempt IS NULL THEN
    detail := format('A committed lease claim is finished only by passing its attempt (%s).',
                     stored_attempt);
  ELSE
    detail := format('Attempt %s holds the key, not attempt %s.', stored_attempt, attempt);
  END IF;
  RAISE EXCEPTION 'claim on idempotency key "%" in scope "%" was lost', key, scope
    USING ERRCODE = 'IK003', DETAIL = detail;
END $$;

-- ---- sqlonly/sql/10_keys.sql ----
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

-- ---- sqlonly/sql/20_messaging.sql ----
-- The SQL-only edition, part 3: messaging. The transactional outbox (idem_emit), its
-- relay (idem_outbox_claim, _ack, _dead, _retry, _dead_letters) and ordered apply
-- (idem_apply_version), as the native edition's (SPEC "Messaging"), plus the internal
-- functions idem_stats and idem_reap call for them (30_operations.sql).
--
-- Events belong to the database, not to a role: idem_emit and the relay's functions
-- are SECURITY DEFINER (run as the installing role, which owns the outbox) and are not
-- granted to PUBLIC. idem_apply_version's records belong to a role, as keys do: it runs
-- as its caller (SECURITY INVOKER), and row-level security keeps each role to its own
-- records.
--
-- Waits. A wait for another transaction is a row-lock wait (INSERT ... ON CONFLICT,
-- UPDATE), which PostgreSQL's deadlock detector sees and lock_timeout ends, bounded by
-- idempotency.wait_timeout in the subtransaction that may wait (see
-- idempotency._lock_timeout). Where a call can tell without waiting that no one else
-- holds what it writes, it takes no subtransaction: an emit without event id for an
-- aggregate whose counter it locks at once (or for none), a relay's claim, an ack,
-- dead or retry of events no one else is writing, a duplicate idem_apply_version. An
-- emit for an aggregate waits for another emitter of its id holding nothing, as
-- native: it takes back what it wrote (its subtransaction) and waits in a probe that is
-- rolled back. Past the 48-subtransaction cap (idempotency._take_subtransaction) each
-- of these waits runs the same, bounded, in a subtransaction that is then rolled back,
-- and the write is made again in the transaction itself.

------------------------------------------------------------------------------
-- Tables: the native edition's, plus `xact` (the transaction that wrote the row's
-- version; the native edition asks the row's xmin, which in a subtransaction is the
-- subtransaction's).
------------------------------------------------------------------------------

-- Emission order. An event takes its position after its aggregate's counter, so
-- within an aggregate position order is seq order, and a relay that reads pending
-- events by position meets each aggregate's events in seq order.
CREATE SEQUENCE idempotency.outbox_position;

CREATE TABLE idempotency.outbox (
  event_id         idem_key    NOT NULL,
  position         bigint      NOT NULL,
  topic            text        COLLATE "C" NOT NULL,
  aggregate        text        COLLATE "C",
  seq              bigint,
  payload          jsonb       NOT NULL,
  headers          jsonb,
  emitted_at       timestamptz NOT NULL,
  -- p = pending (ready, or leased while lease_expires_at lies ahead), d = delivered,
  -- x = dead (a dead letter)
  state            "char"      NOT NULL CHECK (state IN ('p', 'd', 'x')),
  attempt          integer     NOT NULL,
  relay            text,
  lease_expires_at timestamptz,
  delivered_at     timestamptz,
  reason           text,
  xact             xid8        NOT NULL,
  CONSTRAINT outbox_pkey PRIMARY KEY (event_id)
) WITH (fillfactor = 80);  -- room for the lease's HOT update
-- The relay's queue: pending events in emission order.
CREATE INDEX outbox_pending_idx ON idempotency.outbox (position) WHERE state = 'p';
-- The dead letters, oldest first.
CREATE INDEX outbox_dead_idx ON idempotency.outbox (position) WHERE state = 'x';
-- idem_reap's way to delivered events past idempotency.outbox_retention.
CREATE INDEX outbox_delivered_idx ON idempotency.outbox (delivered_at) WHERE state = 'd';

-- The last seq given per (topic, aggregate). Kept when the events are removed: a new
-- event continues the sequence its consumers have seen. Its row, updated in place by
-- an emit, is what the next emitter for the aggregate waits for.
CREATE TABLE idempotency.outbox_aggregates (
  topic     text   COLLATE "C" NOT NULL,
  aggregate text   COLLATE "C" NOT NULL,
  last_seq  bigint NOT NULL,
  CONSTRAINT outbox_aggregates_pkey PRIMARY KEY (topic, aggregate)
);

-- idem_apply_version's record: the last version applied per (role, scope, entity).
CREATE TABLE idempotency.applied_versions (
  role       regrole     NOT NULL,
  expires_at timestamptz NOT NULL,
  version    bigint      NOT NULL,
  scope      text        COLLATE "C" NOT NULL,
  entity     text        COLLATE "C" NOT NULL,
  xact       xid8        NOT NULL,
  CONSTRAINT applied_versions_pkey PRIMARY KEY (role, scope, entity)
);
CREATE INDEX applied_versions_expires_at_idx ON idempotency.applied_versions (expires_at);

-- The outbox is the database's, reached through the functions only. A role's applied
-- versions are its own, as its keys are (00_store.sql): it may read and write them
-- directly too, never another role's.
REVOKE ALL ON TABLE idempotency.outbox, idempotency.outbox_aggregates,
  idempotency.applied_versions FROM PUBLIC;
REVOKE ALL ON SEQUENCE idempotency.outbox_position FROM PUBLIC;
ALTER TABLE idempotency.applied_versions ENABLE ROW LEVEL SECURITY;
CREATE POLICY applied_versions_own_rows ON idempotency.applied_versions
  USING (role OPERATOR(pg_catalog.=) idempotency._me())
  WITH CHECK (role OPERATOR(pg_catalog.=) idempotency._me());
GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE idempotency.applied_versions TO PUBLIC;

-- Installed as an extension (pg_tle), the rows go into pg_dump output as the native
-- edition's do; installed as plain SQL, the tables are dumped like any other.
DO $$
BEGIN
  PERFORM pg_catalog.pg_extension_config_dump('idempotency.outbox', '');
  PERFORM pg_catalog.pg_extension_config_dump('idempotency.outbox_aggregates', '');
  PERFORM pg_catalog.pg_extension_config_dump('idempotency.applied_versions', '');
  PERFORM pg_catalog.pg_extension_config_dump('idempotency.outbox_position', '');
EXCEPTION WHEN feature_not_supported THEN
  NULL;  -- not run by CREATE EXTENSION
END $$;

------------------------------------------------------------------------------
-- Shared by the functions below.
------------------------------------------------------------------------------

-- A jsonb argument's bytes as native counts them (its binary form without header):
-- recomputed for a value that may be compressed (read from a table) or small (a short
-- header, as in a tuple).
CREATE FUNCTION idempotency._jsonb_bytes(value jsonb) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN CASE WHEN pg_catalog.pg_column_size(value) OPERATOR(pg_catalog.<) 130
                 OR pg_catalog.pg_column_compression(value) IS NOT NULL
            THEN pg_catalog.pg_column_size(value::pg_catalog.text::pg_catalog.jsonb)
                 OPERATOR(pg_catalog.-) 4
            ELSE pg_catalog.pg_column_size(value) OPERATOR(pg_catalog.-) 4 END;

-- An event's headers against idempotency.max_response_size, then its payload and
-- headers together (54000); the payload alone is checked before.
CREATE FUNCTION idempotency._check_headers_size(payload_bytes bigint, headers jsonb)
RETURNS void
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  headers_bytes bigint := idempotency._jsonb_bytes(headers);
  max_size bigint;
BEGIN
  PERFORM idempotency._check_size(headers_bytes, 'headers');
  max_size := idempotency._setting('idempotency.max_response_size', 'B', 1048576);
  IF payload_bytes + headers_bytes > max_size THEN
    RAISE EXCEPTION 'payload and headers are too large'
      USING ERRCODE = 'program_limit_exceeded',
            DETAIL = format('They are %s bytes together; idempotency.max_response_size is %s bytes.',
                            payload_bytes + headers_bytes, max_size);
  END IF;
END $$;

CREATE FUNCTION idempotency._raise_emit_in_progress(what text) RETURNS void
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  RAISE EXCEPTION 'another transaction in progress is emitting for the same %', what
    USING ERRCODE = 'IK005', DETAIL = 'It did not end within idempotency.wait_timeout.',
          HINT = 'Retry later.';
END $$;

-- Waits for another transaction in progress that emits `event_id`, taking nothing: a
-- probe row inserted in a subtransaction that is then rolled back. 'busy' (the wait
-- ran out: `timeout`, in ms), 'stored' (an event with the id is committed) or 'free'
-- (no other transaction emits it). `timeout` NULL: the caller's own lock_timeout
-- bounds the wait, and its 55P03 is raised.
CREATE FUNCTION idempotency._event_id_probe(event_id text, timeout text) RETURNS text
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  inserted boolean;
BEGIN
  BEGIN
    IF timeout IS NOT NULL THEN
      PERFORM set_config('lock_timeout', timeout, true);
    END IF;
    INSERT INTO idempotency.outbox AS o (event_id, position, topic, payload, emitted_at, state,
                                         attempt, xact)
      VALUES (_event_id_probe.event_id, 0, '-', '{}', '-infinity', 'x', 0, '0')
      ON CONFLICT ON CONSTRAINT outbox_pkey DO NOTHING
      RETURNING true INTO inserted;
    RAISE EXCEPTION USING ERRCODE = 'IK999', MESSAGE = coalesce(inserted, false)::text;
  EXCEPTION
    WHEN lock_not_available THEN
      IF timeout IS NULL THEN
        RAISE;
      END IF;
      RETURN 'busy';
    WHEN SQLSTATE 'IK999' THEN
      RETURN CASE WHEN SQLERRM = 'true' THEN 'free' ELSE 'stored' END;
  END;
END $$;
REVOKE ALL ON FUNCTION idempotency._event_id_probe(text, text) FROM PUBLIC;

-- idem_apply_version's scope, entity and version: raises the first one wrong, in the
-- native order (22004, then 22023).
CREATE FUNCTION idempotency._check_apply_arguments(scope text, entity text, version bigint)
RETURNS void
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  IF scope IS NULL THEN
    RAISE EXCEPTION 'scope must not be null' USING ERRCODE = 'null_value_not_allowed';
  END IF;
  IF entity IS NULL THEN
    RAISE EXCEPTION 'entity must not be null' USING ERRCODE = 'null_value_not_allowed';
  END IF;
  IF version IS NULL THEN
    RAISE EXCEPTION 'version must not be null' USING ERRCODE = 'null_value_not_allowed';
  END IF;
  PERFORM idempotency._check_name(scope, 'scope');
  PERFORM idempotency._check_name(entity, 'entity');
END $$;

------------------------------------------------------------------------------
-- idem_emit
------------------------------------------------------------------------------
CREATE FUNCTION idem_emit(topic text, payload jsonb, aggregate text DEFAULT NULL,
                          headers jsonb DEFAULT NULL, event_id idem_key DEFAULT NULL)
RETURNS idem_key
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_topic text := topic;
  v_payload jsonb := payload;
  v_aggregate text := aggregate;
  v_headers jsonb := headers;
  given boolean := event_id IS NOT NULL;
  -- The id as an idem_key (the argument's own type, which the body cannot name): a
  -- given id is stored and returned as it came, without checking it again.
  v_id event_id%TYPE := event_id;
  v_seq bigint;
  payload_bytes bigint;
  max_size bigint;
  started timestamptz;
  wait_ms bigint;
  remaining bigint;
  timeout text;
  own text;
  waiting_for text;
  id_busy boolean;
  written boolean;
  taken integer;
  keep boolean;
BEGIN
  -- Arguments, in the native order; then 25006, before anything is read. (Checked
  -- here, and the helpers called only to raise: each call of a function with a SET
  -- clause costs about as much as the emit's insert.)
  IF v_topic IS NULL OR octet_length(v_topic) NOT BETWEEN 1 AND 255 THEN
    PERFORM idempotency._check_name(v_topic, 'topic');
  END IF;
  IF v_payload IS NULL THEN
    RAISE EXCEPTION 'payload must not be null' USING ERRCODE = 'null_value_not_allowed';
  END IF;
  max_size := CASE WHEN coalesce(current_setting('idempotency.max_response_size', true), '') = ''
                   THEN 1048576
                   ELSE idempotency._setting('idempotency.max_response_size', 'B', 1048576) END;
  payload_bytes := idempotency._jsonb_bytes(v_payload);
  IF payload_bytes > max_size THEN
    PERFORM idempotency._check_size(payload_bytes, 'payload');
  END IF;
  IF v_aggregate IS NOT NULL AND octet_length(v_aggregate) NOT BETWEEN 1 AND 255 THEN
    PERFORM idempotency._check_name(v_aggregate, 'aggregate');
  END IF;
  IF v_headers IS NOT NULL
     AND payload_bytes + idempotency._jsonb_bytes(v_headers) > max_size THEN
    PERFORM idempotency._check_headers_size(payload_bytes, v_headers);
  END IF;
  IF current_setting('transaction_read_only') = 'on' THEN
    PERFORM idempotency._check_writable('idem_emit');
  END IF;

  IF given THEN
    -- At most one event per id: one stored (committed, or by this transaction), in any
    -- state, is the one.
    PERFORM FROM idempotency.outbox o WHERE o.event_id = v_id;
    IF FOUND THEN
      RETURN v_id;
    END IF;
  ELSE
    v_id := gen_random_uuid()::text;
    IF v_aggregate IS NOT NULL THEN
      -- The aggregate's next seq, if its counter can be locked at once (no one else
      -- holds it, or this transaction does): the counter's row, updated in place, then
      -- makes the next emitter for the aggregate wait until this transaction ends.
      UPDATE idempotency.outbox_aggregates a SET last_seq = a.last_seq + 1
        WHERE a.ctid = (SELECT f.ctid FROM idempotency.outbox_aggregates f
                        WHERE f.topic = v_topic AND f.aggregate = v_aggregate
                        FOR UPDATE SKIP LOCKED)
        RETURNING a.last_seq INTO v_seq;
    END IF;
    IF v_aggregate IS NULL OR v_seq IS NOT NULL THEN
      -- Nothing to wait for.
      INSERT INTO idempotency.outbox (event_id, position, topic, aggregate, seq, payload,
                                      headers, emitted_at, state, attempt, xact)
        VALUES (v_id, nextval('idempotency.outbox_position'), v_topic, v_aggregate, v_seq,
                v_payload, v_headers, clock_timestamp(), 'p', 0, pg_current_xact_id());
      RETURN v_id;
    END IF;
  END IF;

  -- What may wait, at most idempotency.wait_timeout in all, as the native edition
  -- waits: for the aggregate's counter holding nothing (its holder may be about to emit
  -- this id); then the id: without an aggregate the insert waits for another
  -- transaction emitting it; with one it is inserted without waiting (1 ms): if another
  -- transaction is emitting it, everything is taken back (the subtransaction), that
  -- transaction is waited for holding nothing, and the emit looks again. Past the
  -- 48-subtransaction cap (idempotency._take_subtransaction) the same waits run in a
  -- subtransaction that is then rolled back (a rolled-back subtransaction takes no slot
  -- of PostgreSQL's cache of them), and the writes are made again in the transaction
  -- itself: only another transaction writing the counter or the id in between those
  -- two is waited for without the bound.
  -- (No NULLIF: it compares with the caller's `=`.)
  taken := CASE WHEN current_setting('idempotency.subtransactions', true) = '' THEN 0
                ELSE coalesce(current_setting('idempotency.subtransactions', true), '0')::integer END;
  keep := taken < 48;
  IF keep THEN
    PERFORM set_config('idempotency.subtransactions', (taken + 1)::text, true);
  END IF;
  started := clock_timestamp();
  own := current_setting('lock_timeout');
  IF own = '0' AND coalesce(current_setting('idempotency.wait_timeout', true), '') = '' THEN
    wait_ms := 5000;  -- the defaults
  ELSE
    wait_ms := idempotency._wait_ms(NULL);
  END IF;
  FOR round IN 1 .. 1000 LOOP
    remaining := wait_ms - (extract(epoch FROM clock_timestamp() - started) * 1000)::bigint;
    timeout := CASE WHEN own = '0' THEN greatest(remaining, 1)::text
                    ELSE idempotency._lock_timeout(remaining) END;
    id_busy := false;
    written := false;
    BEGIN
      IF timeout IS NOT NULL THEN
        PERFORM set_config('lock_timeout', timeout, true);
      END IF;
      IF v_aggregate IS NOT NULL THEN
        waiting_for := 'aggregate';
        v_seq := NULL;
        UPDATE idempotency.outbox_aggregates a SET last_seq = a.last_seq + 1
          WHERE a.ctid = (SELECT f.ctid FROM idempotency.outbox_aggregates f
                          WHERE f.topic = v_topic AND f.aggregate = v_aggregate
                          FOR UPDATE SKIP LOCKED)
          RETURNING a.last_seq INTO v_seq;
        IF v_seq IS NULL THEN
          INSERT INTO idempotency.outbox_aggregates AS a (topic, aggregate, last_seq)
            VALUES (v_topic, v_aggregate, 1)
            ON CONFLICT ON CONSTRAINT outbox_aggregates_pkey DO UPDATE SET last_seq = a.last_seq + 1
            RETURNING a.last_seq INTO v_seq;
        END IF;
      END IF;
      IF given THEN
        waiting_for := 'event id';
        IF v_aggregate IS NOT NULL THEN
          PERFORM set_config('lock_timeout', '1', true);  -- not holding the counter
        END IF;
      END IF;
      INSERT INTO idempotency.outbox AS o (event_id, position, topic, aggregate, seq, payload,
                                           headers, emitted_at, state, attempt, xact)
        VALUES (v_id, nextval('idempotency.outbox_position'), v_topic, v_aggregate, v_seq,
                v_payload, v_headers, clock_timestamp(), 'p', 0, pg_current_xact_id())
        ON CONFLICT ON CONSTRAINT outbox_pkey DO NOTHING;
      written := FOUND;
      IF NOT written AND v_seq IS NOT NULL THEN
        -- Another transaction stored the id meanwhile: that event is the one, and the
        -- seq taken goes back (the counter stays locked: no one took the next).
        UPDATE idempotency.outbox_aggregates a SET last_seq = a.last_seq - 1
          WHERE a.topic = v_topic AND a.aggregate = v_aggregate;
      END IF;
      PERFORM set_config('lock_timeout', own, true);
      IF NOT keep THEN
        RAISE EXCEPTION USING ERRCODE = 'IK999';  -- past the cap: it only waited
      END IF;
    EXCEPTION
      WHEN lock_not_available THEN
        IF waiting_for = 'event id' AND v_aggregate IS NOT NULL THEN
          id_busy := true;  -- another transaction emits the id: taken back, waited for below
        ELSIF timeout IS NULL THEN
          RAISE;  -- the caller's own lock_timeout
        ELSE
          -- The wait ran out. For the aggregate, the native edition looks at the id
          -- first: if another transaction is emitting it, that is what it waited for;
          -- if it is stored by now, it is the one.
          IF given AND waiting_for = 'aggregate' THEN
            CASE idempotency._event_id_probe(v_id, '1')
              WHEN 'busy' THEN waiting_for := 'event id';
              WHEN 'stored' THEN RETURN v_id;
              ELSE NULL;
            END CASE;
          END IF;
          PERFORM idempotency._raise_emit_in_progress(waiting_for);
        END IF;
      WHEN SQLSTATE 'IK999' THEN
        -- Past the cap, after the bounded wait: the writes in the transaction itself
        -- (none when the id was found stored).
        IF NOT written THEN
          RETURN v_id;
        END IF;
        IF v_aggregate IS NOT NULL THEN
          v_seq := NULL;
          UPDATE idempotency.outbox_aggregates a SET last_seq = a.last_seq + 1
            WHERE a.ctid = (SELECT f.ctid FROM idempotency.outbox_aggregates f
                            WHERE f.topic = v_topic AND f.aggregate = v_aggregate
                            FOR UPDATE SKIP LOCKED)
            RETURNING a.last_seq INTO v_seq;
          IF v_seq IS NULL THEN
            INSERT INTO idempotency.outbox_aggregates AS a (topic, aggregate, last_seq)
              VALUES (v_topic, v_aggregate, 1)
              ON CONFLICT ON CONSTRAINT outbox_aggregates_pkey DO UPDATE SET last_seq = a.last_seq + 1
              RETURNING a.last_seq INTO v_seq;
          END IF;
        END IF;
        INSERT INTO idempotency.outbox AS o (event_id, position, topic, aggregate, seq, payload,
                                             headers, emitted_at, state, attempt, xact)
          VALUES (v_id, nextval('idempotency.outbox_position'), v_topic, v_aggregate, v_seq,
                  v_payload, v_headers, clock_timestamp(), 'p', 0, pg_current_xact_id())
          ON CONFLICT ON CONSTRAINT outbox_pkey DO NOTHING;
        IF NOT FOUND AND v_seq IS NOT NULL THEN
          UPDATE idempotency.outbox_aggregates a SET last_seq = a.last_seq - 1
            WHERE a.topic = v_topic AND a.aggregate = v_aggregate;
        END IF;
        RETURN v_id;
    END;
    IF NOT id_busy THEN
      RETURN v_id;
    END IF;
    remaining := wait_ms - (extract(epoch FROM clock_timestamp() - started) * 1000)::bigint;
    timeout := CASE WHEN own = '0' THEN greatest(remaining, 1)::text
                    ELSE idempotency._lock_timeout(remaining) END;
    CASE idempotency._event_id_probe(v_id, timeout)
      WHEN 'busy' THEN PERFORM idempotency._raise_emit_in_progress('event id');
      WHEN 'stored' THEN RETURN v_id;
      ELSE
        -- Its emitter rolled back: look again, within the bound (other emitters of the
        -- id taking it at every look are as busy as a wait running out).
        IF remaining <= 0 THEN
          PERFORM idempotency._raise_emit_in_progress('event id');
        END IF;
    END CASE;
  END LOOP;
  -- Other transactions took the id at every look: as busy as a wait running out.
  PERFORM idempotency._raise_emit_in_progress('event id');
  RETURN NULL;
END $$;
-- Emitting is a privilege (SPEC v1.2): events belong to the database, so a role that
-- could emit could pre-empt another's event id or hold its aggregate.
REVOKE ALL ON FUNCTION idem_emit(text, jsonb, text, jsonb, idem_key) FROM PUBLIC;

------------------------------------------------------------------------------
-- The relay: idem_outbox_claim, _ack, _dead, _retry, _dead_letters. Not granted to
-- PUBLIC: they see every event (grant them to the relay's role).
------------------------------------------------------------------------------

-- Leases to `relay` up to `max_events` committed events, not delivered, not dead, not
-- held by a live lease, in emission order; per aggregate only while every earlier
-- event of it is delivered, dead or in this batch. Rows are locked without queueing
-- (SKIP LOCKED): an event another transaction is writing closes its aggregate for
-- this batch. It reads what is pending, not from a position it passed, so an event
-- committed late is handed out all the same.
CREATE FUNCTION idem_outbox_claim(relay text, max_events integer DEFAULT 100,
                                  lease interval DEFAULT '30s', topics text[] DEFAULT NULL)
RETURNS TABLE(event_id idem_key, topic text, aggregate text, seq bigint, payload jsonb,
              headers jsonb, emitted_at timestamptz, attempt integer)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER ROWS 100
SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
  v_relay text := relay;
  v_max integer := max_events;
  v_lease interval := lease;
  v_topics text[] := topics;
  v_now timestamptz := clock_timestamp();
  lease_end timestamptz;
  mine xid8 := pg_current_xact_id_if_assigned();
  -- At most this many pending events are examined per call, in emission order: behind
  -- a backlog held by other relays' leases a claim returns fewer, or none.
  window_size bigint;
  scan_limit bigint;
  scanned bigint;
  handed integer := 0;
  taken text[] := '{}';
  blocked text[] := '{}';  -- aggregates (topic, newline, aggregate) closed for this batch
  c record;
  r record;
BEGIN
  PERFORM idempotency._check_name(v_relay, 'relay');
  IF v_max IS NULL THEN
    RAISE EXCEPTION 'max_events must not be null' USING ERRCODE = 'null_value_not_allowed';
  END IF;
  IF v_lease IS NULL THEN
    RAISE EXCEPTION 'lease must not be null' USING ERRCODE = 'null_value_not_allowed';
  END IF;
  IF v_max <= 0 THEN
    RAISE EXCEPTION 'max_events must be positive' USING ERRCODE = 'invalid_parameter_value';
  END IF;
  lease_end := v_now + v_lease;
  IF lease_end <= v_now THEN
    RAISE EXCEPTION 'lease must be positive' USING ERRCODE = 'invalid_parameter_value';
  END IF;
  PERFORM idempotency._check_writable('idem_outbox_claim');

  window_size := greatest(v_max::bigint * 10, 10000);
  -- First the head of the queue; the whole window only if that fell short.
  scan_limit := least(window_size, v_max::bigint * 2 + 16);
  LOOP
    scanned := 0;
    -- Ready: not leased (or its lease ran out), and not emitted by this transaction
    -- (not committed: it may still roll back). The gate: every earlier pending event
    -- of the aggregate is ready or in this batch.
    FOR c IN
      SELECT q.event_id, q.topic, q.aggregate, q.ready, q.in_batch,
             coalesce(bool_and(q.ready OR q.in_batch) OVER (
               PARTITION BY q.topic, q.aggregate ORDER BY q.position
               ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), true) AS gate_open
      FROM (SELECT o.event_id, o.topic, o.aggregate, o.position,
                   (o.lease_expires_at IS NULL OR o.lease_expires_at <= v_now)
                     AND NOT (o.attempt = 0 AND coalesce(o.xact = mine, false)) AS ready,
                   o.event_id = ANY (taken) AS in_batch
            FROM idempotency.outbox o
            WHERE o.state = 'p' AND (v_topics IS NULL OR o.topic = ANY (v_topics))
            ORDER BY o.position
            LIMIT scan_limit) q
      ORDER BY q.position
    LOOP
      scanned := scanned + 1;
      CONTINUE WHEN NOT c.ready OR c.in_batch;
      CONTINUE WHEN c.aggregate IS NOT NULL
                    AND (NOT c.gate_open OR c.topic || E'\n' || c.aggregate = ANY (blocked));
      -- Leased if no one else holds its row, deciding on its newest version.
      UPDATE idempotency.outbox o
        SET attempt = o.attempt + 1, relay = v_relay, lease_expires_at = lease_end,
            xact = pg_current_xact_id()
        WHERE o.ctid = (SELECT f.ctid FROM idempotency.outbox f
                        -- (state as text: not the pending index's predicate,
                        -- which a generic plan made on a small outbox would scan)
                        WHERE f.event_id = c.event_id AND f.state::text = 'p'
                          AND (f.lease_expires_at IS NULL OR f.lease_expires_at <= v_now)
                          AND NOT (f.attempt = 0 AND coalesce(f.xact = mine, false))
                        FOR UPDATE SKIP LOCKED)
        RETURNING o.event_id, o.topic, o.aggregate, o.seq, o.payload, o.headers,
                  o.emitted_at, o.attempt INTO r;
      IF r.event_id IS NOT NULL THEN
        event_id := r.event_id;
        topic := r.topic;
        aggregate := r.aggregate;
        seq := r.seq;
        payload := r.payload;
        headers := r.headers;
        emitted_at := r.emitted_at;
        attempt := r.attempt;
        RETURN NEXT;
        handed := handed + 1;
        taken := taken || c.event_id::text;
        EXIT WHEN handed >= v_max;
      ELSIF c.aggregate IS NOT NULL THEN
        -- Another transaction holds it, or it changed since the scan: still pending,
        -- it closes its aggregate for this batch (delivered or dead, it does not).
        PERFORM FROM idempotency.outbox o WHERE o.event_id = c.event_id AND o.state::text = 'p';
        IF FOUND THEN
          blocked := blocked || (c.topic || E'\n' || c.aggregate);
        END IF;
      END IF;
    END LOOP;
    EXIT WHEN handed >= v_max OR scanned < scan_limit OR scan_limit >= window_size;
    scan_limit := window_size;
  END LOOP;
END $$;

-- The settling calls (ack, dead, retry): first, without waiting, every listed event no
-- other transaction is writing; then the others, waiting for their writers in the lock
-- queue (in one subtransaction, at most idempotency.wait_timeout: events still busy
-- then are left as they are, and a relay will have them again).
-- `how`: 'ack', 'dead' or 'retry'; `ids` NULL (retry only): every dead letter.
-- (enable_seqscan off: PL/pgSQL keeps a generic plan, and one made while the outbox was
-- small would read the whole outbox, not the listed rows, once it is large. The state
-- compared as text, as in idem_outbox_claim: `state = 'p'` is the pending index's
-- predicate, and a plan made while the statistics counted few pending events, before a
-- backlog, read all of them for every ack.)
CREATE FUNCTION idempotency._settle(how text, relay text, ids text[], reason text)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp SET enable_seqscan = off AS $$
DECLARE
  v_relay text := relay;
  v_reason text := reason;
  v_now timestamptz := clock_timestamp();
  settled bigint;
  more bigint := 0;
  busy text[];
  timeout text;
  own text;
  keep boolean;
BEGIN
  IF ids IS NULL THEN
    -- Every dead letter (retry), through the dead letters' index.
    SELECT array_agg(o.event_id::text) INTO ids FROM idempotency.outbox o WHERE o.state = 'x';
    IF ids IS NULL THEN
      RETURN 0;
    END IF;
  END IF;
  -- An ack or dead counts for events last handed out to this relay and neither
  -- delivered nor dead since (a late relay's ack, after another took the event, is
  -- ignored); a retry for dead letters.
  UPDATE idempotency.outbox o SET
      state = CASE how WHEN 'ack' THEN 'd' WHEN 'dead' THEN 'x' ELSE 'p' END,
      delivered_at = CASE WHEN how = 'ack' THEN v_now ELSE o.delivered_at END,
      lease_expires_at = NULL,
      relay = CASE WHEN how = 'retry' THEN NULL ELSE o.relay END,
      reason = CASE WHEN how = 'dead' THEN v_reason ELSE o.reason END,
      xact = pg_current_xact_id()
    WHERE o.ctid = ANY (ARRAY(
      SELECT f.ctid FROM idempotency.outbox f
      WHERE f.event_id = ANY (ids)
        AND CASE WHEN how = 'retry' THEN f.state::text = 'x'
                 ELSE f.state::text = 'p' AND f.relay = v_relay AND f.lease_expires_at IS NOT NULL END
      FOR UPDATE SKIP LOCKED));
  GET DIAGNOSTICS settled = ROW_COUNT;

  -- What is left qualifying is held by another transaction.
  SELECT array_agg(o.event_id::text ORDER BY o.event_id) INTO busy FROM idempotency.outbox o
    WHERE o.event_id = ANY (ids)
      AND CASE WHEN how = 'retry' THEN o.state::text = 'x'
               ELSE o.state::text = 'p' AND o.relay = v_relay AND o.lease_expires_at IS NOT NULL END;
  IF busy IS NULL THEN
    RETURN settled;
  END IF;
  -- In a subtransaction, so that a wait running out is an answer; past the cap
  -- (idempotency._take_subtransaction, counted inside it) it only waits, is rolled back
  -- (taking no slot of PostgreSQL's cache of subtransactions), and the events are
  -- written again in the transaction itself.
  BEGIN
    keep := idempotency._take_subtransaction();
    timeout := idempotency._lock_timeout(idempotency._wait_ms(NULL));
    IF timeout IS NOT NULL THEN
      own := current_setting('lock_timeout');
      PERFORM set_config('lock_timeout', timeout, true);
    END IF;
    UPDATE idempotency.outbox o SET
        state = CASE how WHEN 'ack' THEN 'd' WHEN 'dead' THEN 'x' ELSE 'p' END,
        delivered_at = CASE WHEN how = 'ack' THEN v_now ELSE o.delivered_at END,
        lease_expires_at = NULL,
        relay = CASE WHEN how = 'retry' THEN NULL ELSE o.relay END,
        reason = CASE WHEN how = 'dead' THEN v_reason ELSE o.reason END,
        xact = pg_current_xact_id()
      WHERE o.event_id = ANY (busy)
        AND CASE WHEN how = 'retry' THEN o.state::text = 'x'
                 ELSE o.state::text = 'p' AND o.relay = v_relay AND o.lease_expires_at IS NOT NULL END;
    GET DIAGNOSTICS more = ROW_COUNT;
    IF own IS NOT NULL THEN
      PERFORM set_config('lock_timeout', own, true);
    END IF;
    IF NOT keep THEN
      RAISE EXCEPTION USING ERRCODE = 'IK999';
    END IF;
  EXCEPTION
    WHEN lock_not_available THEN
      IF timeout IS NULL THEN
        RAISE;  -- the caller's own lock_timeout
      END IF;
      more := 0;  -- still busy: left as they are
    WHEN SQLSTATE 'IK999' THEN
      IF more > 0 THEN
        UPDATE idempotency.outbox o SET
            state = CASE how WHEN 'ack' THEN 'd' WHEN 'dead' THEN 'x' ELSE 'p' END,
            delivered_at = CASE WHEN how = 'ack' THEN v_now ELSE o.delivered_at END,
            lease_expires_at = NULL,
            relay = CASE WHEN how = 'retry' THEN NULL ELSE o.relay END,
            reason = CASE WHEN how = 'dead' THEN v_reason ELSE o.reason END,
            xact = pg_current_xact_id()
          WHERE o.event_id = ANY (busy)
            AND CASE WHEN how = 'retry' THEN o.state::text = 'x'
                     ELSE o.state::text = 'p' AND o.relay = v_relay AND o.lease_expires_at IS NOT NULL END;
        GET DIAGNOSTICS more = ROW_COUNT;
      END IF;
  END;
  RETURN settled + more;
END $$;
REVOKE ALL ON FUNCTION idempotency._settle(text, text, text[], text) FROM PUBLIC;

CREATE FUNCTION idem_outbox_ack(relay text, event_ids idem_key[]) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  PERFORM idempotency._check_name(relay, 'relay');
  IF event_ids IS NULL THEN
    RAISE EXCEPTION 'event_ids must not be null' USING ERRCODE = 'null_value_not_allowed';
  END IF;
  PERFORM idempotency._check_writable('idem_outbox_ack');
  RETURN idempotency._settle('ack', relay, event_ids::text[], NULL);
END $$;

CREATE FUNCTION idem_outbox_dead(relay text, event_ids idem_key[], reason text DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  PERFORM idempotency._check_name(relay, 'relay');
  IF event_ids IS NULL THEN
    RAISE EXCEPTION 'event_ids must not be null' USING ERRCODE = 'null_value_not_allowed';
  END IF;
  IF reason IS NOT NULL THEN
    PERFORM idempotency._check_size(octet_length(reason), 'reason');
  END IF;
  PERFORM idempotency._check_writable('idem_outbox_dead');
  RETURN idempotency._settle('dead', relay, event_ids::text[], reason);
END $$;

-- Dead letters back to pending (the given ones, or all), with their seq, position and
-- attempt count: their aggregates' later events wait for them again.
CREATE FUNCTION idem_outbox_retry(event_ids idem_key[] DEFAULT NULL) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  PERFORM idempotency._check_writable('idem_outbox_retry');
  RETURN idempotency._settle('retry', NULL, event_ids::text[], NULL);
END $$;

-- max_rows of idem_outbox_dead_letters: not null, not negative.
CREATE FUNCTION idempotency._check_max_rows(max_rows integer) RETURNS void
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  IF max_rows IS NULL THEN
    RAISE EXCEPTION 'max_rows must not be null' USING ERRCODE = 'null_value_not_allowed';
  END IF;
  IF max_rows < 0 THEN
    RAISE EXCEPTION 'max_rows must not be negative' USING ERRCODE = 'invalid_parameter_value';
  END IF;
END $$;

-- The dead letters, oldest first (by emission), of one topic or all. Writes nothing:
-- it also runs in a read-only transaction and on a standby. (SQL, not PL/pgSQL: its
-- argument `topic` has the name of a result column.)
CREATE FUNCTION idem_outbox_dead_letters(topic text DEFAULT NULL, max_rows integer DEFAULT 100)
RETURNS TABLE(event_id idem_key, topic text, aggregate text, seq bigint, payload jsonb,
              headers jsonb, emitted_at timestamptz, attempt integer, reason text)
LANGUAGE sql STABLE SECURITY DEFINER ROWS 100
SET search_path = pg_catalog, pg_temp AS $$
  SELECT idempotency._check_max_rows($2);
  SELECT o.event_id, o.topic, o.aggregate, o.seq, o.payload, o.headers, o.emitted_at,
         o.attempt, o.reason
  FROM idempotency.outbox o
  WHERE o.state = 'x' AND ($1 IS NULL OR o.topic = $1)
  ORDER BY o.position
  LIMIT $2;
$$;

REVOKE ALL ON FUNCTION idem_outbox_claim(text, integer, interval, text[]),
  idem_outbox_ack(text, idem_key[]), idem_outbox_dead(text, idem_key[], text),
  idem_outbox_retry(idem_key[]), idem_outbox_dead_letters(text, integer) FROM PUBLIC;

------------------------------------------------------------------------------
-- idem_apply_version
------------------------------------------------------------------------------
-- Runs as its caller: row-level security keeps it to the caller's records. No SET
-- clause (each call of a function with one costs about as much as the call's own
-- work): every type, operator and function is schema-qualified instead.
CREATE FUNCTION idem_apply_version(scope text, entity text, version bigint,
                                   ttl interval DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  v_scope pg_catalog.text := scope;
  v_entity pg_catalog.text := entity;
  v_version pg_catalog.int8 := version;
  v_ttl pg_catalog.interval := ttl;
  v_now pg_catalog.timestamptz := pg_catalog.clock_timestamp();
  me pg_catalog.regrole;
  mine pg_catalog.xid8;
  r record;
  applied pg_catalog.bool;
  timeout pg_catalog.text;
  own pg_catalog.text;
  taken pg_catalog.int4;
  keep pg_catalog.bool;
BEGIN
  -- Arguments, in the native order; then 25006, before anything is read.
  IF v_scope IS NULL OR v_entity IS NULL OR v_version IS NULL
     OR pg_catalog.octet_length(v_scope) OPERATOR(pg_catalog.<) 1
     OR pg_catalog.octet_length(v_scope) OPERATOR(pg_catalog.>) 255
     OR pg_catalog.octet_length(v_entity) OPERATOR(pg_catalog.<) 1
     OR pg_catalog.octet_length(v_entity) OPERATOR(pg_catalog.>) 255 THEN
    PERFORM idempotency._check_apply_arguments(v_scope, v_entity, v_version);
  END IF;
  IF v_ttl IS NULL THEN
    v_ttl := CASE WHEN coalesce(pg_catalog.current_setting('idempotency.default_ttl', true), '')
                       OPERATOR(pg_catalog.=) ''
                  THEN '24 hours'::pg_catalog.interval
                  ELSE idempotency._default_ttl() END;
  ELSIF v_now OPERATOR(pg_catalog.+) v_ttl OPERATOR(pg_catalog.<=) v_now THEN
    RAISE EXCEPTION 'ttl must be positive' USING ERRCODE = 'invalid_parameter_value';
  END IF;
  IF pg_catalog.current_setting('transaction_read_only') OPERATOR(pg_catalog.=) 'on' THEN
    PERFORM idempotency._check_writable('idem_apply_version');
  END IF;

  me := idempotency._me();
  -- A duplicate or older version of a live record is skipped without a write or a
  -- wait: whatever another transaction writing the record now leaves, it is not below
  -- what is seen here. A record is live until it expires, and whatever its expires_at
  -- while the transaction that wrote it, this one, is in progress.
  mine := pg_catalog.pg_current_xact_id_if_assigned();
  SELECT a.version, a.expires_at, a.xact INTO r FROM idempotency.applied_versions a
    WHERE a.role OPERATOR(pg_catalog.=) me AND a.scope OPERATOR(pg_catalog.=) v_scope
      AND a.entity OPERATOR(pg_catalog.=) v_entity;
  IF FOUND AND (r.expires_at OPERATOR(pg_catalog.>) v_now
                OR coalesce(r.xact OPERATOR(pg_catalog.=) mine, false))
     AND r.version OPERATOR(pg_catalog.>=) v_version THEN
    RETURN false;
  END IF;

  -- Record it, deciding on the newest version of the record: waits (bounded) for
  -- another transaction writing it, in the one subtransaction (at most 48 in a
  -- transaction: idempotency._take_subtransaction).
  -- (No NULLIF: it compares with the caller's `=`.)
  taken := CASE WHEN pg_catalog.current_setting('idempotency.subtransactions', true)
                     OPERATOR(pg_catalog.=) '' THEN 0
                ELSE coalesce(pg_catalog.current_setting('idempotency.subtransactions', true),
                              '0')::pg_catalog.int4 END;
  -- Past the cap, the same wait in a subtransaction that is then rolled back (taking no
  -- slot of PostgreSQL's cache of subtransactions), and the record written again in the
  -- transaction itself.
  keep := taken OPERATOR(pg_catalog.<) 48;
  BEGIN
    IF keep THEN
      PERFORM pg_catalog.set_config('idempotency.subtransactions',
                                    (taken OPERATOR(pg_catalog.+) 1)::pg_catalog.text, true);
    END IF;
    own := pg_catalog.current_setting('lock_timeout');
    IF own OPERATOR(pg_catalog.=) '0'
       AND coalesce(pg_catalog.current_setting('idempotency.wait_timeout', true), '')
           OPERATOR(pg_catalog.=) '' THEN
      timeout := '5000';  -- the defaults
    ELSE
      timeout := idempotency._lock_timeout(idempotency._wait_ms(NULL));
    END IF;
    IF timeout IS NOT NULL THEN
      PERFORM pg_catalog.set_config('lock_timeout', timeout, true);
    END IF;
    INSERT INTO idempotency.applied_versions AS a (role, expires_at, version, scope, entity, xact)
      VALUES (me, v_now OPERATOR(pg_catalog.+) v_ttl, v_version, v_scope, v_entity,
              pg_catalog.pg_current_xact_id())
      ON CONFLICT ON CONSTRAINT applied_versions_pkey DO UPDATE
        SET expires_at = excluded.expires_at, version = excluded.version, xact = excluded.xact
        WHERE NOT ((a.expires_at OPERATOR(pg_catalog.>) v_now
                    OR a.xact OPERATOR(pg_catalog.=) excluded.xact)
                   AND a.version OPERATOR(pg_catalog.>=) excluded.version)
      RETURNING true INTO applied;
    IF timeout IS NOT NULL THEN
      PERFORM pg_catalog.set_config('lock_timeout', own, true);
    END IF;
    IF NOT keep THEN
      RAISE EXCEPTION USING ERRCODE = 'IK999';  -- past the cap: it only waited
    END IF;
  EXCEPTION
    WHEN lock_not_available THEN
      IF timeout IS NULL THEN
        RAISE;  -- the caller's own lock_timeout
      END IF;
      RAISE EXCEPTION 'entity "%" in scope "%" is being applied by another transaction',
          v_entity, v_scope
        USING ERRCODE = 'IK005', DETAIL = 'It did not end within idempotency.wait_timeout.',
              HINT = 'Retry later.';
    WHEN SQLSTATE 'IK999' THEN
      IF applied THEN
        applied := NULL;
        INSERT INTO idempotency.applied_versions AS a (role, expires_at, version, scope, entity, xact)
          VALUES (me, v_now OPERATOR(pg_catalog.+) v_ttl, v_version, v_scope, v_entity,
                  pg_catalog.pg_current_xact_id())
          ON CONFLICT ON CONSTRAINT applied_versions_pkey DO UPDATE
            SET expires_at = excluded.expires_at, version = excluded.version, xact = excluded.xact
            WHERE NOT ((a.expires_at OPERATOR(pg_catalog.>) v_now
                        OR a.xact OPERATOR(pg_catalog.=) excluded.xact)
                       AND a.version OPERATOR(pg_catalog.>=) excluded.version)
          RETURNING true INTO applied;
      END IF;
  END;
  RETURN coalesce(applied, false);
END $$;
-- Granted to PUBLIC, like idem_claim: a role's records are its own. Who may record
-- versions is a matter of EXECUTE on it, however a role tries (the function or an
-- INSERT of its own, which row-level security lets it make): a restrictive policy,
-- as for keys (10_keys.sql).
CREATE POLICY applied_versions_added_by_appliers ON idempotency.applied_versions
  AS RESTRICTIVE FOR INSERT
  WITH CHECK (pg_catalog.has_function_privilege(
    'idem_apply_version(text, text, bigint, interval)'::pg_catalog.regprocedure, 'EXECUTE'));

------------------------------------------------------------------------------
-- For idem_stats and idem_reap (30_operations.sql). Not granted to PUBLIC.
------------------------------------------------------------------------------

-- The outbox's figures: undelivered (pending, leased or not) and dead events, each
-- exact up to 10,000 and beyond that at least that many (the index's size at the
-- last VACUUM or ANALYZE if larger), and the emission time of the first undelivered
-- event in emission order (NULL when none).
CREATE FUNCTION idempotency._outbox_stats(OUT outbox_undelivered bigint,
    OUT outbox_dead bigint, OUT outbox_oldest_undelivered_at timestamptz)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  SELECT count(*) INTO outbox_undelivered
    FROM (SELECT FROM idempotency.outbox o WHERE o.state = 'p' LIMIT 10000) s;
  IF outbox_undelivered >= 10000 THEN
    outbox_undelivered := greatest(outbox_undelivered,
      (SELECT c.reltuples::bigint FROM pg_class c
       WHERE c.oid = 'idempotency.outbox_pending_idx'::regclass));
  END IF;
  SELECT count(*) INTO outbox_dead
    FROM (SELECT FROM idempotency.outbox o WHERE o.state = 'x' LIMIT 10000) s;
  IF outbox_dead >= 10000 THEN
    outbox_dead := greatest(outbox_dead,
      (SELECT c.reltuples::bigint FROM pg_class c
       WHERE c.oid = 'idempotency.outbox_dead_idx'::regclass));
  END IF;
  SELECT o.emitted_at INTO outbox_oldest_undelivered_at FROM idempotency.outbox o
    WHERE o.state = 'p' ORDER BY o.position LIMIT 1;
END $$;
REVOKE ALL ON FUNCTION idempotency._outbox_stats() FROM PUBLIC;

-- Removes up to `max_rows` (NULL: no limit) delivered events delivered at least
-- idempotency.outbox_retention ago, and not by this transaction (a pass never removes
-- what a transaction in progress wrote); skips rows another transaction holds.
-- Returns how many it removed.
CREATE FUNCTION idempotency._reap_outbox(max_rows bigint) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off AS $$
DECLARE
  retention interval :=
    make_interval(secs => idempotency._setting('idempotency.outbox_retention', 's', 0));
  mine xid8 := pg_current_xact_id_if_assigned();
  removed bigint;
BEGIN
  WITH gone AS (
    SELECT o.ctid FROM idempotency.outbox o
    WHERE o.state = 'd' AND o.delivered_at <= clock_timestamp() - retention
      AND o.xact IS DISTINCT FROM mine
    ORDER BY o.delivered_at
    LIMIT max_rows
    FOR UPDATE SKIP LOCKED)
  DELETE FROM idempotency.outbox o WHERE o.ctid = ANY (ARRAY(SELECT gone.ctid FROM gone));
  GET DIAGNOSTICS removed = ROW_COUNT;
  RETURN removed;
END $$;
REVOKE ALL ON FUNCTION idempotency._reap_outbox(bigint) FROM PUBLIC;

-- Removes up to `max_rows` (NULL: no limit) applied-version records that expired and
-- were not written by this transaction, or whose role no longer exists; skips rows
-- another transaction holds. Returns how many it removed.
CREATE FUNCTION idempotency._reap_applied_versions(max_rows bigint) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off AS $$
DECLARE
  budget bigint := coalesce(max_rows, 9223372036854775807);
  mine xid8 := pg_current_xact_id_if_assigned();
  removed bigint;
  orphans bigint := 0;
BEGIN
  WITH gone AS (
    SELECT a.ctid FROM idempotency.applied_versions a
    WHERE a.expires_at <= clock_timestamp() AND a.xact IS DISTINCT FROM mine
    LIMIT budget
    FOR UPDATE SKIP LOCKED)
  DELETE FROM idempotency.applied_versions a WHERE a.ctid = ANY (ARRAY(SELECT gone.ctid FROM gone));
  GET DIAGNOSTICS removed = ROW_COUNT;
  IF removed < budget THEN
    -- The records of roles that no longer exist (DROP ROLE leaves them: regrole is an
    -- oid), as the keys' (idem_reap).
    WITH gone AS (
      SELECT a.ctid FROM idempotency.applied_versions a
      WHERE NOT EXISTS (SELECT FROM pg_roles r WHERE r.oid = a.role)
      LIMIT budget - removed
      FOR UPDATE OF a SKIP LOCKED)
    DELETE FROM idempotency.applied_versions a WHERE a.ctid = ANY (ARRAY(SELECT gone.ctid FROM gone));
    GET DIAGNOSTICS orphans = ROW_COUNT;
  END IF;
  RETURN removed + orphans;
END $$;
REVOKE ALL ON FUNCTION idempotency._reap_applied_versions(bigint) FROM PUBLIC;

-- ---- sqlonly/sql/30_operations.sql ----
-- The SQL-only edition, part 4: reaping, monitoring, scheduling, the install notice.
--
-- There is no background worker: idem_reap() makes the worker's pass when it is
-- called, by pg_cron (idem_schedule_reaping()) or by an application's job. Expiry
-- itself is by time, as in the native edition: a key past expires_at is free at once
-- whether or not it was reaped.

-- What idem_reap has done since the edition was installed (idem_stats shows it).
CREATE TABLE idempotency.reap_stats (
  reaped_total    bigint      NOT NULL,
  reclaimed_total bigint      NOT NULL,
  last_reap_at    timestamptz,
  last_reap_ms    bigint
);
CREATE UNIQUE INDEX reap_stats_one_row ON idempotency.reap_stats ((true));
INSERT INTO idempotency.reap_stats VALUES (0, 0, NULL, NULL);
REVOKE ALL ON TABLE idempotency.reap_stats FROM PUBLIC;

------------------------------------------------------------------------------
-- idem_reap(max_rows): one pass in the current database: (a) deletes expired rows that
-- are not live, skipping rows that live transactions are writing or locking, and the
-- rows of roles that no longer exist; (b) marks pending rows whose lease ran out
-- abandoned; and removes expired applied versions and delivered outbox events past
-- idempotency.outbox_retention. Returns the key rows deleted. It sees every role's
-- keys: SECURITY DEFINER (the owner is not subject to the store's row-level
-- security), and granted to no one (superusers, the owner, or roles granted it).
------------------------------------------------------------------------------
CREATE FUNCTION idem_reap(max_rows bigint DEFAULT NULL) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  started timestamptz := clock_timestamp();
  now timestamptz := started;
  budget bigint := coalesce(max_rows, 9223372036854775807);
  deleted bigint := 0;
  orphans bigint := 0;
  reclaimed bigint := 0;
BEGIN
  IF max_rows < 0 THEN
    RAISE EXCEPTION 'max_rows must not be negative' USING ERRCODE = 'invalid_parameter_value';
  END IF;
  PERFORM idempotency._check_writable('idem_reap');

  -- (a) Expired rows that are not live: past expires_at, and not pending under a live
  -- lease. Rows another transaction writes or locks now are skipped (SKIP LOCKED);
  -- rows it inserted are not visible yet.
  WITH gone AS (
    DELETE FROM idempotency.keys k
      WHERE k.ctid IN (SELECT e.ctid FROM idempotency.keys e
                       WHERE e.expires_at <= now
                         AND NOT (e.state = 'p' AND e.lease_expires_at > now)
                         AND e.xact IS DISTINCT FROM pg_current_xact_id_if_assigned()
                       ORDER BY e.expires_at
                       LIMIT budget
                       FOR UPDATE SKIP LOCKED)
        AND k.expires_at <= now AND NOT (k.state = 'p' AND k.lease_expires_at > now)
      RETURNING 1)
  SELECT count(*) INTO deleted FROM gone;
  -- The rows of roles that no longer exist (DROP ROLE leaves them: regrole is an oid).
  IF deleted < budget THEN
    WITH gone AS (
      DELETE FROM idempotency.keys k
        WHERE k.ctid IN (SELECT e.ctid FROM idempotency.keys e
                         WHERE NOT EXISTS (SELECT FROM pg_roles a WHERE a.oid = e.role)
                         LIMIT budget - deleted
                         FOR UPDATE SKIP LOCKED)
        RETURNING 1)
    SELECT count(*) INTO orphans FROM gone;
    deleted := deleted + orphans;
  END IF;

  -- (b) Pending rows whose lease ran out: abandoned (their late holder is fenced out
  -- with IK003; a retry takes over with the checkpoint). lease stays, so
  -- idem_abandoned finds them.
  WITH stale AS (
    UPDATE idempotency.keys k SET state = 'a', lease_expires_at = NULL
      WHERE k.ctid IN (SELECT e.ctid FROM idempotency.keys e
                       WHERE e.lease_expires_at <= now AND e.state = 'p'
                       ORDER BY e.lease_expires_at
                       LIMIT budget
                       FOR UPDATE SKIP LOCKED)
        AND k.state = 'p' AND k.lease_expires_at <= now
      RETURNING 1)
  SELECT count(*) INTO reclaimed FROM stale;

  -- Messaging's (sqlonly/sql/20_messaging.sql): expired applied versions, and delivered
  -- outbox events past idempotency.outbox_retention; counted with the keys' rows.
  IF deleted < budget THEN
    deleted := deleted + idempotency._reap_applied_versions(budget - deleted);
  END IF;
  IF deleted < budget THEN
    deleted := deleted + idempotency._reap_outbox(budget - deleted);
  END IF;

  UPDATE idempotency.reap_stats SET
      reaped_total = reaped_total + deleted, reclaimed_total = reclaimed_total + reclaimed,
      last_reap_at = started,
      last_reap_ms = (extract(epoch FROM clock_timestamp() - started) * 1000)::bigint;
  RETURN deleted;
END $$;
REVOKE ALL ON FUNCTION idem_reap(bigint) FROM PUBLIC;

------------------------------------------------------------------------------
-- idem_stats(): the native columns in the native order. Counts by state are exact up
-- to 1000 pages of the store, beyond from the planner's statistics (as fresh as the
-- last ANALYZE), so it answers quickly whatever the size. worker_pid is NULL (no
-- worker), the per-call counters of 1.5 are NULL (nothing is written per call), and
-- `edition` says 'sql'. node_only: as native; this edition has one node.
------------------------------------------------------------------------------
CREATE FUNCTION idem_stats(node_only boolean DEFAULT false)
RETURNS TABLE(keys_total bigint, pending bigint, completed bigint, failed bigint,
              abandoned bigint, expired_awaiting_reap bigint, reaped_total bigint,
              reclaimed_total bigint, last_reap_at timestamptz, last_reap_ms bigint,
              worker_pid integer, stale_leases bigint, outbox_undelivered bigint,
              outbox_dead bigint, outbox_oldest_undelivered_at timestamptz,
              claims_total bigint, replays_total bigint, fingerprint_mismatches_total bigint,
              in_progress_total bigint, edition text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  now timestamptz := clock_timestamp();
  store oid := 'idempotency.keys'::regclass;
  total double precision;
  state_stats record;
  bounds timestamptz[];
BEGIN
  IF (SELECT c.relpages FROM pg_class c WHERE c.oid = store) <= 1000 THEN
    SELECT count(*),
           count(*) FILTER (WHERE k.state = 'p' AND live),
           count(*) FILTER (WHERE k.state = 'c' AND live),
           count(*) FILTER (WHERE k.state = 'f' AND live),
           count(*) FILTER (WHERE k.state = 'a' AND live),
           count(*) FILTER (WHERE NOT live)
      INTO keys_total, pending, completed, failed, abandoned, expired_awaiting_reap
      FROM idempotency.keys k,
           LATERAL (SELECT k.expires_at > now OR (k.state = 'p' AND coalesce(k.lease_expires_at > now, false)) AS live) l;
  ELSE
    SELECT greatest(c.reltuples, 0) INTO total FROM pg_class c WHERE c.oid = store;
    keys_total := total::bigint;
    pending := 0; completed := 0; failed := 0; abandoned := 0; expired_awaiting_reap := 0;
    FOR state_stats IN
      SELECT v.value, f.freq
        FROM pg_stats s,
             unnest(s.most_common_vals::text::text[]) WITH ORDINALITY AS v(value, i)
             JOIN unnest(s.most_common_freqs) WITH ORDINALITY AS f(freq, i) USING (i)
        WHERE s.schemaname = 'idempotency' AND s.tablename = 'keys' AND s.attname = 'state'
    LOOP
      CASE state_stats.value
        WHEN 'p' THEN pending := (state_stats.freq * total)::bigint;
        WHEN 'c' THEN completed := (state_stats.freq * total)::bigint;
        WHEN 'f' THEN failed := (state_stats.freq * total)::bigint;
        WHEN 'a' THEN abandoned := (state_stats.freq * total)::bigint;
        ELSE NULL;
      END CASE;
    END LOOP;
    SELECT s.histogram_bounds::text::timestamptz[] INTO bounds
      FROM pg_stats s
      WHERE s.schemaname = 'idempotency' AND s.tablename = 'keys' AND s.attname = 'expires_at';
    IF cardinality(bounds) > 1 THEN
      expired_awaiting_reap := (total * (SELECT count(*) FROM unnest(bounds) b WHERE b <= now)
                                / cardinality(bounds))::bigint;
    END IF;
  END IF;
  SELECT r.reaped_total, r.reclaimed_total, r.last_reap_at, r.last_reap_ms
    INTO reaped_total, reclaimed_total, last_reap_at, last_reap_ms
    FROM idempotency.reap_stats r;
  worker_pid := NULL;
  -- Stale leases, exactly through their index, up to 10000.
  SELECT count(*) INTO stale_leases
    FROM (SELECT FROM idempotency.keys k
          WHERE k.lease_expires_at <= now AND k.lease_expires_at IS NOT NULL AND k.state = 'p'
          LIMIT 10000) s;
  SELECT o.outbox_undelivered, o.outbox_dead, o.outbox_oldest_undelivered_at
    INTO outbox_undelivered, outbox_dead, outbox_oldest_undelivered_at
    FROM idempotency._outbox_stats() o;
  claims_total := NULL;
  replays_total := NULL;
  fingerprint_mismatches_total := NULL;
  in_progress_total := NULL;
  edition := 'sql';
  RETURN NEXT;
END $$;
REVOKE ALL ON FUNCTION idem_stats(boolean) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION idem_stats(boolean) TO pg_monitor;

------------------------------------------------------------------------------
-- This install's idem_reap, written into idempotency._reap_function() when the install
-- runs (schema-qualified, with its exact signature), never found by name: a function
-- another role creates anywhere cannot stand in for it. By name rather than by OID, so
-- that a dump of the plain install restores it.
------------------------------------------------------------------------------
DO $$
BEGIN
  EXECUTE pg_catalog.format(
    'CREATE FUNCTION idempotency._reap_function() RETURNS pg_catalog.regprocedure '
    'LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp AS %L',
    pg_catalog.format('SELECT %L::pg_catalog.regprocedure',
                      pg_catalog.format('%I.idem_reap(bigint)', pg_catalog.current_schema())));
END $$;

-- The statement that reaps, as pg_cron or an application job runs it: qualified, and
-- typed so that no other idem_reap in the schema matches the call better.
CREATE FUNCTION idempotency._reap_command() RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
  SELECT format('SELECT %s(NULL::pg_catalog.int8)', idempotency._reap_function()::regproc)
$$;

-- pg_cron's schema in this database (the one its extension created: "cron"), or NULL
-- where pg_cron is not installed here. Found through the extension, so that a schema
-- of that name made by another role is never taken for it.
CREATE FUNCTION idempotency._cron_schema() RETURNS name
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
  SELECT n.nspname FROM pg_extension e
  JOIN pg_depend d ON d.refclassid = 'pg_extension'::regclass AND d.refobjid = e.oid
                  AND d.classid = 'pg_namespace'::regclass AND d.deptype = 'e'
  JOIN pg_namespace n ON n.oid = d.objid
  WHERE e.extname = 'pg_cron'
$$;

------------------------------------------------------------------------------
-- Reaping on a schedule. With pg_cron in this database, idem_schedule_reaping()
-- schedules idem_reap() (job 'idempotency-reap-<database>', every `every`, run as the
-- calling role, which must be allowed to execute idem_reap) and returns the job's id;
-- a second call replaces the schedule. Without pg_cron it fails with 55000 and says
-- what to run instead.
------------------------------------------------------------------------------
CREATE FUNCTION idem_schedule_reaping(every text DEFAULT '10 seconds') RETURNS bigint
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  job_name text := 'idempotency-reap-' || current_database();
  command text := idempotency._reap_command();
  cron_schema name := idempotency._cron_schema();
  -- Superuser-only settings, which pg_settings hides (no row) from a role without
  -- pg_read_all_settings. cron.database_name exists only where pg_cron is loaded.
  cron_database text := (SELECT s.setting FROM pg_settings s WHERE s.name = 'cron.database_name');
  preload_visible boolean := EXISTS (SELECT FROM pg_settings s WHERE s.name = 'shared_preload_libraries');
  elsewhere text;
  app_job text;
  job bigint;
BEGIN
  IF every IS NULL THEN
    RAISE EXCEPTION 'every must not be null' USING ERRCODE = 'null_value_not_allowed';
  END IF;
  IF cron_schema IS NULL THEN
    elsewhere := format('SELECT cron.schedule_in_database(%L, %L, %L, %L);',
                        job_name, every, command, current_database());
    app_job := format('have an application job run %s; every few seconds', command);
    IF cron_database IS NOT NULL AND cron_database <> current_database() THEN
      RAISE EXCEPTION 'pg_cron is not installed in this database'
        USING ERRCODE = 'object_not_in_prerequisite_state',
              DETAIL = format('pg_cron runs in database %s.', cron_database),
              HINT = format('In database %s run: %s', cron_database, elsewhere);
    ELSIF cron_database IS NOT NULL THEN
      RAISE EXCEPTION 'pg_cron is not installed in this database'
        USING ERRCODE = 'object_not_in_prerequisite_state',
              HINT = format('CREATE EXTENSION pg_cron here, or %s.', app_job);
    ELSIF preload_visible THEN
      RAISE EXCEPTION 'pg_cron is not installed in this database'
        USING ERRCODE = 'object_not_in_prerequisite_state',
              DETAIL = 'pg_cron is not loaded on this server.',
              HINT = format('Add pg_cron to shared_preload_libraries and CREATE EXTENSION pg_cron, or %s.', app_job);
    END IF;
    -- This role may not see whether or where pg_cron runs.
    RAISE EXCEPTION 'pg_cron is not installed in this database'
      USING ERRCODE = 'object_not_in_prerequisite_state',
            HINT = format('Where this server loads pg_cron, in the database its setting cron.database_name '
                          'names run: %s Otherwise %s.', elsewhere, app_job);
  END IF;
  EXECUTE format('SELECT %I.schedule_in_database($1, $2, $3, $4)', cron_schema)
    INTO job USING job_name, every, command, current_database();
  RETURN job;
END $$;
REVOKE ALL ON FUNCTION idem_schedule_reaping(text) FROM PUBLIC;

-- Says which serves this database: a pg_cron job of idem_reap, or nothing yet (then
-- what to run), as the native edition's NOTICE says when no worker serves it.
CREATE FUNCTION idempotency._install_notice() RETURNS void
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  cron_schema name := idempotency._cron_schema();
  job record;
BEGIN
  IF cron_schema IS NOT NULL THEN
    FOR job IN EXECUTE format('SELECT j.jobid, j.schedule FROM %I.job j
                               WHERE j.jobname = $1 AND j.active', cron_schema)
               USING 'idempotency-reap-' || current_database() LOOP
      RAISE NOTICE 'idempotency (SQL-only edition): pg_cron job % runs idem_reap() in this database (schedule "%")',
        job.jobid, job.schedule;
      RETURN;
    END LOOP;
    RAISE NOTICE 'idempotency (SQL-only edition): nothing reaps expired keys or reclaims stale leases in this database yet'
      USING HINT = 'pg_cron is installed: SELECT idem_schedule_reaping(); schedules idem_reap() every 10 seconds.';
  ELSE
    RAISE NOTICE 'idempotency (SQL-only edition): nothing reaps expired keys or reclaims stale leases in this database'
      USING HINT = format('Where pg_cron is available, CREATE EXTENSION pg_cron and SELECT idem_schedule_reaping();. '
                          'Otherwise have an application job run %s; every few seconds.',
                          idempotency._reap_command());
  END IF;
END $$;
REVOKE ALL ON FUNCTION idempotency._install_notice() FROM PUBLIC;

-- The notice waits for COMMIT, as the native edition's does: PostgreSQL runs an
-- extension script (pg_tle's CREATE EXTENSION, ALTER EXTENSION ... UPDATE) with
-- client_min_messages raised to WARNING, so a NOTICE raised there never reaches the
-- user; a deferred trigger fires after the script, with the user's settings, and not
-- at all if the install is rolled back.
CREATE TABLE idempotency.install_notice (requested_at timestamptz NOT NULL);
REVOKE ALL ON TABLE idempotency.install_notice FROM PUBLIC;
CREATE FUNCTION idempotency._send_install_notice() RETURNS trigger
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  -- Once, however many installs and updates the transaction ran.
  DELETE FROM idempotency.install_notice;
  IF FOUND THEN
    PERFORM idempotency._install_notice();
  END IF;
  RETURN NULL;
END $$;
REVOKE ALL ON FUNCTION idempotency._send_install_notice() FROM PUBLIC;
CREATE CONSTRAINT TRIGGER send_at_commit AFTER INSERT ON idempotency.install_notice
  DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION idempotency._send_install_notice();
INSERT INTO idempotency.install_notice VALUES (pg_catalog.now());

