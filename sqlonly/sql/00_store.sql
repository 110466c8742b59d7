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
