\echo Use "CREATE EXTENSION idempotency" to load this file. \quit
-- idempotency 1.0: the key type, the key store and the claim/finish functions.
-- CREATE EXTENSION runs this with search_path set to the target schema, so the
-- unqualified objects below land there.

-- The store's schema must belong to the extension: refuse one that already exists
-- (this also refuses CREATE EXTENSION ... SCHEMA idempotency).
DO $$
BEGIN
  IF EXISTS (SELECT FROM pg_catalog.pg_namespace WHERE nspname = 'idempotency') THEN
    RAISE EXCEPTION 'schema "idempotency" already exists'
      USING ERRCODE = 'duplicate_schema',
            DETAIL = 'The extension keeps its key store in a schema "idempotency" that it creates and owns.',
            HINT = 'Rename or drop the existing schema, and install the extension''s functions in another schema.';
  END IF;
END
$$;

------------------------------------------------------------------------------
-- idem_key: 1 to 255 visible ASCII bytes, compared bytewise. A canonical UUID (the
-- lowercase hyphenated form) is stored in 17 bytes instead of 37.
------------------------------------------------------------------------------
CREATE TYPE idem_key;

CREATE FUNCTION idem_key_in(cstring) RETURNS idem_key
  AS 'MODULE_PATHNAME' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
CREATE FUNCTION idem_key_out(idem_key) RETURNS cstring
  AS 'MODULE_PATHNAME' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
CREATE FUNCTION idem_key_recv(internal) RETURNS idem_key
  AS 'MODULE_PATHNAME' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
CREATE FUNCTION idem_key_send(idem_key) RETURNS bytea
  AS 'MODULE_PATHNAME' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;

CREATE TYPE idem_key (
  INPUT = idem_key_in,
  OUTPUT = idem_key_out,
  RECEIVE = idem_key_recv,
  SEND = idem_key_send,
  INTERNALLENGTH = VARIABLE,
  STORAGE = main,
  CATEGORY = 'S'
);

CREATE FUNCTION idem_key_eq(idem_key, idem_key) RETURNS boolean
  AS 'MODULE_PATHNAME' LANGUAGE C IMMUTABLE STRICT LEAKPROOF PARALLEL SAFE;
CREATE FUNCTION idem_key_ne(idem_key, idem_key) RETURNS boolean
  AS 'MODULE_PATHNAME' LANGUAGE C IMMUTABLE STRICT LEAKPROOF PARALLEL SAFE;
CREATE FUNCTION idem_key_lt(idem_key, idem_key) RETURNS boolean
  AS 'MODULE_PATHNAME' LANGUAGE C IMMUTABLE STRICT LEAKPROOF PARALLEL SAFE;
CREATE FUNCTION idem_key_le(idem_key, idem_key) RETURNS boolean
  AS 'MODULE_PATHNAME' LANGUAGE C IMMUTABLE STRICT LEAKPROOF PARALLEL SAFE;
CREATE FUNCTION idem_key_gt(idem_key, idem_key) RETURNS boolean
  AS 'MODULE_PATHNAME' LANGUAGE C IMMUTABLE STRICT LEAKPROOF PARALLEL SAFE;
CREATE FUNCTION idem_key_ge(idem_key, idem_key) RETURNS boolean
  AS 'MODULE_PATHNAME' LANGUAGE C IMMUTABLE STRICT LEAKPROOF PARALLEL SAFE;
CREATE FUNCTION idem_key_cmp(idem_key, idem_key) RETURNS integer
  AS 'MODULE_PATHNAME' LANGUAGE C IMMUTABLE STRICT LEAKPROOF PARALLEL SAFE;
CREATE FUNCTION idem_key_hash(idem_key) RETURNS integer
  AS 'MODULE_PATHNAME' LANGUAGE C IMMUTABLE STRICT LEAKPROOF PARALLEL SAFE;
CREATE FUNCTION idem_key_hash_extended(idem_key, bigint) RETURNS bigint
  AS 'MODULE_PATHNAME' LANGUAGE C IMMUTABLE STRICT LEAKPROOF PARALLEL SAFE;

CREATE OPERATOR = (
  LEFTARG = idem_key, RIGHTARG = idem_key,
  FUNCTION = idem_key_eq, COMMUTATOR = OPERATOR(=),
  NEGATOR = OPERATOR(<>), RESTRICT = eqsel, JOIN = eqjoinsel, HASHES, MERGES);
CREATE OPERATOR <> (
  LEFTARG = idem_key, RIGHTARG = idem_key,
  FUNCTION = idem_key_ne, COMMUTATOR = OPERATOR(<>),
  NEGATOR = OPERATOR(=), RESTRICT = neqsel, JOIN = neqjoinsel);
CREATE OPERATOR < (
  LEFTARG = idem_key, RIGHTARG = idem_key,
  FUNCTION = idem_key_lt, COMMUTATOR = OPERATOR(>),
  NEGATOR = OPERATOR(>=), RESTRICT = scalarltsel, JOIN = scalarltjoinsel);
CREATE OPERATOR <= (
  LEFTARG = idem_key, RIGHTARG = idem_key,
  FUNCTION = idem_key_le, COMMUTATOR = OPERATOR(>=),
  NEGATOR = OPERATOR(>), RESTRICT = scalarlesel, JOIN = scalarlejoinsel);
CREATE OPERATOR > (
  LEFTARG = idem_key, RIGHTARG = idem_key,
  FUNCTION = idem_key_gt, COMMUTATOR = OPERATOR(<),
  NEGATOR = OPERATOR(<=), RESTRICT = scalargtsel, JOIN = scalargtjoinsel);
CREATE OPERATOR >= (
  LEFTARG = idem_key, RIGHTARG = idem_key,
  FUNCTION = idem_key_ge, COMMUTATOR = OPERATOR(<=),
  NEGATOR = OPERATOR(<), RESTRICT = scalargesel, JOIN = scalargejoinsel);

CREATE OPERATOR CLASS idem_key_ops
  DEFAULT FOR TYPE idem_key USING btree AS
    OPERATOR 1 <,
    OPERATOR 2 <=,
    OPERATOR 3 =,
    OPERATOR 4 >=,
    OPERATOR 5 >,
    FUNCTION 1 idem_key_cmp(idem_key, idem_key),
    -- Bytewise equality is image equality: lets btree deduplicate entries.
    FUNCTION 4 pg_catalog.btequalimage(oid);

CREATE OPERATOR CLASS idem_key_hash_ops
  DEFAULT FOR TYPE idem_key USING hash AS
    OPERATOR 1 =,
    FUNCTION 1 idem_key_hash(idem_key),
    FUNCTION 2 idem_key_hash_extended(idem_key, bigint);

CREATE FUNCTION idem_key(text) RETURNS idem_key
  AS 'MODULE_PATHNAME', 'idem_key_from_text' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
CREATE FUNCTION idem_key(uuid) RETURNS idem_key
  AS 'MODULE_PATHNAME', 'idem_key_from_uuid' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;

CREATE CAST (text AS idem_key)
  WITH FUNCTION idem_key(text) AS ASSIGNMENT;
CREATE CAST (varchar AS idem_key)
  WITH FUNCTION idem_key(text) AS ASSIGNMENT;
CREATE CAST (uuid AS idem_key)
  WITH FUNCTION idem_key(uuid) AS ASSIGNMENT;
CREATE FUNCTION idem_key_text(idem_key) RETURNS text
  AS 'MODULE_PATHNAME', 'idem_key_to_text' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
-- Implicit like citext's, so text functions accept a key.
CREATE CAST (idem_key AS text) WITH FUNCTION idem_key_text(idem_key) AS IMPLICIT;

------------------------------------------------------------------------------
-- The key store. Ordinary roles have no rights on it: the C functions read and
-- write it directly, with the caller's role as part of every key's identity.
------------------------------------------------------------------------------
CREATE SCHEMA idempotency;
REVOKE ALL ON SCHEMA idempotency FROM PUBLIC;

CREATE TABLE idempotency.keys (
  -- Fixed-width columns first, for alignment. The columns a completion changes come
  -- last, so its update's WAL record holds little more than the response: PostgreSQL
  -- logs only what lies between the unchanged prefix and suffix of the row.
  role             regrole     NOT NULL,
  attempt          integer     NOT NULL,
  first_claimed_at timestamptz NOT NULL,
  expires_at       timestamptz NOT NULL,
  reap_slot        smallint    NOT NULL,  -- a hash of the key, 0 to 15: see below
  scope            text        COLLATE "C" NOT NULL,
  key              idem_key NOT NULL,
  fingerprint      bytea,
  lease            interval,
  checkpoint       text,
  checkpoint_data  jsonb,
  lease_expires_at timestamptz,
  -- p = pending, c = completed, f = failed, a = abandoned
  state            "char"      NOT NULL CHECK (state IN ('p', 'c', 'f', 'a')),
  response         jsonb,
  CONSTRAINT keys_pkey PRIMARY KEY (role, scope, key)
) WITH (fillfactor = 90);  -- room for HOT updates of rows written before they finish

-- The reaper's way to expired rows. New keys expire last, so an index on expires_at
-- alone would take every insert on its rightmost page, where concurrent claims queue
-- for the page lock; reap_slot spreads them over sixteen insertion points. Completion
-- changes neither column, so it stays a HOT update.
CREATE INDEX keys_expires_at_idx ON idempotency.keys (reap_slot, expires_at);
-- The reaper's way to stale leases. In-transaction claims never enter it (their
-- lease_expires_at stays NULL), so it costs the common path nothing.
CREATE INDEX keys_lease_expires_at_idx ON idempotency.keys (lease_expires_at)
  WHERE lease_expires_at IS NOT NULL;

REVOKE ALL ON TABLE idempotency.keys FROM PUBLIC;

-- Committed rows go into pg_dump output; roles are dumped by name (regrole).
SELECT pg_catalog.pg_extension_config_dump('idempotency.keys', '');

------------------------------------------------------------------------------
-- Claiming and finishing. Not STRICT: a NULL argument is an error, never a
-- silently skipped claim.
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

CREATE FUNCTION idem_claim(scope text, key idem_key,
    fingerprint bytea DEFAULT NULL, ttl interval DEFAULT NULL,
    lease interval DEFAULT NULL, wait interval DEFAULT NULL)
  RETURNS idem_claim_result
  AS 'MODULE_PATHNAME' LANGUAGE C VOLATILE;

CREATE FUNCTION idem_complete(scope text, key idem_key,
    response jsonb DEFAULT NULL, attempt integer DEFAULT NULL)
  RETURNS void AS 'MODULE_PATHNAME' LANGUAGE C VOLATILE;

CREATE FUNCTION idem_fail(scope text, key idem_key,
    error jsonb DEFAULT NULL, attempt integer DEFAULT NULL)
  RETURNS void AS 'MODULE_PATHNAME' LANGUAGE C VOLATILE;

CREATE FUNCTION idem_release(scope text, key idem_key,
    attempt integer DEFAULT NULL)
  RETURNS void AS 'MODULE_PATHNAME' LANGUAGE C VOLATILE;

CREATE FUNCTION idem_checkpoint(scope text, key idem_key,
    point text, data jsonb DEFAULT NULL, attempt integer DEFAULT NULL)
  RETURNS void AS 'MODULE_PATHNAME' LANGUAGE C VOLATILE;

CREATE FUNCTION idem_once(scope text, key idem_key,
    ttl interval DEFAULT NULL, wait interval DEFAULT NULL)
  RETURNS boolean AS 'MODULE_PATHNAME' LANGUAGE C VOLATILE;

CREATE FUNCTION idem_forget(scope text, key idem_key)
  RETURNS boolean AS 'MODULE_PATHNAME' LANGUAGE C VOLATILE;

------------------------------------------------------------------------------
-- Reading, deriving, fingerprints.
------------------------------------------------------------------------------
CREATE FUNCTION idem_lookup(scope text, key idem_key)
  RETURNS TABLE(state text, response jsonb, attempt integer, checkpoint text,
                checkpoint_data jsonb, first_claimed_at timestamptz,
                expires_at timestamptz, lease_expires_at timestamptz)
  AS 'MODULE_PATHNAME' LANGUAGE C STABLE ROWS 1;

CREATE FUNCTION idem_fingerprint(jsonb) RETURNS bytea
  AS 'MODULE_PATHNAME', 'idem_fingerprint_jsonb' LANGUAGE C IMMUTABLE PARALLEL SAFE;
CREATE FUNCTION idem_fingerprint(text) RETURNS bytea
  AS 'MODULE_PATHNAME', 'idem_fingerprint_text' LANGUAGE C IMMUTABLE PARALLEL SAFE;
CREATE FUNCTION idem_fingerprint(bytea) RETURNS bytea
  AS 'MODULE_PATHNAME', 'idem_fingerprint_bytea' LANGUAGE C IMMUTABLE PARALLEL SAFE;

CREATE FUNCTION idem_derive(root idem_key, step text)
  RETURNS idem_key
  AS 'MODULE_PATHNAME' LANGUAGE C IMMUTABLE PARALLEL SAFE;

CREATE FUNCTION idem_abandoned(scope text DEFAULT NULL, max_rows integer DEFAULT 100)
  RETURNS TABLE(scope text, key idem_key, attempt integer, checkpoint text,
                checkpoint_data jsonb, first_claimed_at timestamptz)
  AS 'MODULE_PATHNAME' LANGUAGE C STABLE;

------------------------------------------------------------------------------
-- Expiry and monitoring. Both see every role's keys, so neither is PUBLIC.
------------------------------------------------------------------------------
CREATE FUNCTION idem_reap(max_rows bigint DEFAULT NULL) RETURNS bigint
  AS 'MODULE_PATHNAME' LANGUAGE C VOLATILE;
REVOKE ALL ON FUNCTION idem_reap(bigint) FROM PUBLIC;

CREATE FUNCTION idem_stats()
  RETURNS TABLE(keys_total bigint, pending bigint, completed bigint, failed bigint,
                abandoned bigint, expired_awaiting_reap bigint, reaped_total bigint,
                reclaimed_total bigint, last_reap_at timestamptz, last_reap_ms bigint,
                worker_pid integer, stale_leases bigint)
  AS 'MODULE_PATHNAME' LANGUAGE C VOLATILE;
REVOKE ALL ON FUNCTION idem_stats() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION idem_stats() TO pg_monitor;
