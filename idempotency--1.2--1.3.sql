-- idempotency 1.2 -> 1.3
\echo Use "ALTER EXTENSION idempotency UPDATE TO '1.3'" to load this file. \quit

------------------------------------------------------------------------------
-- Scale-out with Citus (SPEC v1.2): a key store distributed and co-located with a
-- business table. idem_distribute creates idempotency.routed_keys, the columns of
-- idempotency.keys plus `route`, the business table's distribution value, and
-- distributes it by `route` in the business table's co-location group: the key of
-- account 42 then lives in the shard, on the node, of account 42's rows, and moves,
-- splits and the rebalancer carry it with them. It is a table of its own rather
-- than idempotency.keys altered, so that Citus creates it on every node, nodes added
-- later included, while each node's idempotency.keys stays the table its
-- CREATE EXTENSION made.
------------------------------------------------------------------------------

-- A role in the distributed store. regrole is an OID, which differs from node to
-- node, and Citus copies a shard between nodes in binary where every column's type
-- has binary I/O (commands/multi_copy.c CanUseBinaryCopyFormatForType; logical moves
-- too: replication/multi_logical_replication.c, binary=true), so a regrole column
-- arrives as another node's OID: a retry after the move would not find its key. This
-- type stores the same OID but has only text I/O (regrole's), so Citus moves it by
-- name. Its operators are the OID ones.
CREATE TYPE idem_role;
CREATE FUNCTION idem_role_in(cstring) RETURNS idem_role
  AS 'regrolein' LANGUAGE internal STABLE STRICT PARALLEL SAFE;
CREATE FUNCTION idem_role_out(idem_role) RETURNS cstring
  AS 'regroleout' LANGUAGE internal STABLE STRICT PARALLEL SAFE;
CREATE TYPE idem_role (INPUT = idem_role_in, OUTPUT = idem_role_out,
  INTERNALLENGTH = 4, PASSEDBYVALUE, ALIGNMENT = int4);
CREATE FUNCTION idem_role_eq(idem_role, idem_role) RETURNS boolean
  AS 'oideq' LANGUAGE internal IMMUTABLE STRICT PARALLEL SAFE;
CREATE FUNCTION idem_role_lt(idem_role, idem_role) RETURNS boolean
  AS 'oidlt' LANGUAGE internal IMMUTABLE STRICT PARALLEL SAFE;
CREATE FUNCTION idem_role_le(idem_role, idem_role) RETURNS boolean
  AS 'oidle' LANGUAGE internal IMMUTABLE STRICT PARALLEL SAFE;
CREATE FUNCTION idem_role_gt(idem_role, idem_role) RETURNS boolean
  AS 'oidgt' LANGUAGE internal IMMUTABLE STRICT PARALLEL SAFE;
CREATE FUNCTION idem_role_ge(idem_role, idem_role) RETURNS boolean
  AS 'oidge' LANGUAGE internal IMMUTABLE STRICT PARALLEL SAFE;
CREATE FUNCTION idem_role_cmp(idem_role, idem_role) RETURNS integer
  AS 'btoidcmp' LANGUAGE internal IMMUTABLE STRICT PARALLEL SAFE;
CREATE OPERATOR = (LEFTARG = idem_role, RIGHTARG = idem_role, PROCEDURE = idem_role_eq,
  COMMUTATOR = =, RESTRICT = eqsel, JOIN = eqjoinsel, MERGES);
CREATE OPERATOR < (LEFTARG = idem_role, RIGHTARG = idem_role, PROCEDURE = idem_role_lt,
  COMMUTATOR = >, RESTRICT = scalarltsel, JOIN = scalarltjoinsel);
CREATE OPERATOR <= (LEFTARG = idem_role, RIGHTARG = idem_role, PROCEDURE = idem_role_le,
  COMMUTATOR = >=, RESTRICT = scalarlesel, JOIN = scalarlejoinsel);
CREATE OPERATOR > (LEFTARG = idem_role, RIGHTARG = idem_role, PROCEDURE = idem_role_gt,
  COMMUTATOR = <, RESTRICT = scalargtsel, JOIN = scalargtjoinsel);
CREATE OPERATOR >= (LEFTARG = idem_role, RIGHTARG = idem_role, PROCEDURE = idem_role_ge,
  COMMUTATOR = <=, RESTRICT = scalargesel, JOIN = scalargejoinsel);
CREATE OPERATOR CLASS idem_role_ops DEFAULT FOR TYPE idem_role USING btree AS
  OPERATOR 1 <, OPERATOR 2 <=, OPERATOR 3 =, OPERATOR 4 >=, OPERATOR 5 >,
  FUNCTION 1 idem_role_cmp(idem_role, idem_role);
-- To read the store as regrole (idem_stats and queries by hand).
CREATE CAST (idem_role AS regrole) WITHOUT FUNCTION;

CREATE FUNCTION idem_distribute(business regclass) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  method "char";
  route_column text;
  route_type text;
  route_collation text;
BEGIN
  IF NOT EXISTS (SELECT FROM pg_extension WHERE extname = 'citus') THEN
    RAISE EXCEPTION 'Citus is not installed in this database'
      USING ERRCODE = 'object_not_in_prerequisite_state',
            HINT = 'Add citus before idempotency to shared_preload_libraries on every node, '
                   'then CREATE EXTENSION citus.';
  END IF;
  IF NOT citus_is_coordinator() THEN
    RAISE EXCEPTION 'idem_distribute runs on the Citus coordinator'
      USING ERRCODE = 'object_not_in_prerequisite_state';
  END IF;
  IF to_regclass('idempotency.routed_keys') IS NOT NULL THEN
    RAISE EXCEPTION 'the key store is already distributed, co-located with %',
        (SELECT string_agg(p.logicalrelid::text, ', ')
         FROM pg_dist_partition p, pg_dist_partition k
         WHERE k.logicalrelid = 'idempotency.routed_keys'::regclass
           AND p.colocationid = k.colocationid AND p.logicalrelid <> k.logicalrelid)
      USING ERRCODE = 'object_not_in_prerequisite_state',
            HINT = 'Distribute it once. To change the table it follows, call idem_undistribute() '
                   'while it holds no keys.';
  END IF;
  SELECT partmethod, column_to_column_name(logicalrelid, partkey)
    INTO method, route_column
    FROM pg_dist_partition WHERE logicalrelid = business;
  IF method IS DISTINCT FROM 'h' THEN
    RAISE EXCEPTION '% is not a hash-distributed Citus table', business
      USING ERRCODE = 'invalid_parameter_value',
            HINT = 'Distribute the business table first: create_distributed_table(table, column).';
  END IF;
  IF EXISTS (SELECT FROM idempotency.keys) THEN
    RAISE EXCEPTION 'the key store holds keys without a routing value'
      USING ERRCODE = 'object_not_in_prerequisite_state',
            DETAIL = 'A key stored before distributing has no routing value, so it has no shard.',
            HINT = 'Distribute before the first claim, or let the keys expire (idem_reap()) '
                   'or remove them (idem_forget) first.';
  END IF;
  SELECT format_type(a.atttypid, a.atttypmod),
         CASE WHEN a.attcollation <> 0 THEN format(' COLLATE %s', a.attcollation::regcollation) ELSE '' END
    INTO route_type, route_collation
    FROM pg_attribute a WHERE a.attrelid = business AND a.attname = route_column;

  -- The columns of idempotency.keys in its order (the C code reads both tables by the
  -- same attribute numbers), then the route. Citus wants the distribution column in
  -- every unique index: the primary key is (role, scope, key, route), whose prefix
  -- finds a key whatever its route.
  EXECUTE format($ddl$
    CREATE TABLE idempotency.routed_keys (
      role             @extschema@.idem_role NOT NULL,
      attempt          integer     NOT NULL,
      first_claimed_at timestamptz NOT NULL,
      expires_at       timestamptz NOT NULL,
      reap_slot        smallint    NOT NULL,
      scope            text        COLLATE "C" NOT NULL,
      key              @extschema@.idem_key NOT NULL,
      fingerprint      bytea,
      lease            interval,
      checkpoint       text,
      checkpoint_data  jsonb,
      lease_expires_at timestamptz,
      state            "char"      NOT NULL CHECK (state IN ('p', 'c', 'f', 'a')),
      response         jsonb,
      route            %s%s NOT NULL,
      CONSTRAINT routed_keys_pkey PRIMARY KEY (role, scope, key, route)
    ) WITH (fillfactor = 90)$ddl$, route_type, route_collation);
  CREATE INDEX routed_keys_expires_at_idx ON idempotency.routed_keys (reap_slot, expires_at);
  CREATE INDEX routed_keys_lease_expires_at_idx ON idempotency.routed_keys (lease_expires_at)
    WHERE lease_expires_at IS NOT NULL;
  CREATE INDEX routed_keys_leased_idx ON idempotency.routed_keys (role, first_claimed_at)
    WHERE lease IS NOT NULL;
  REVOKE ALL ON TABLE idempotency.routed_keys FROM PUBLIC;
  PERFORM create_distributed_table('idempotency.routed_keys', 'route',
                                   colocate_with => business::text);
END $$;
REVOKE ALL ON FUNCTION idem_distribute(regclass) FROM PUBLIC;

CREATE FUNCTION idem_undistribute() RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  IF to_regclass('idempotency.routed_keys') IS NULL THEN
    RAISE EXCEPTION 'the key store is not distributed'
      USING ERRCODE = 'object_not_in_prerequisite_state';
  END IF;
  -- (SELECT 1: Citus cannot plan a distributed subquery without columns.)
  IF EXISTS (SELECT 1 FROM idempotency.routed_keys) THEN
    RAISE EXCEPTION 'the distributed key store holds keys'
      USING ERRCODE = 'object_not_in_prerequisite_state',
            DETAIL = 'Undistributing would lose them: idempotency.keys has no routing value.',
            HINT = 'Let the keys expire (idem_reap() on every node) or remove them (idem_forget) first.';
  END IF;
  DROP TABLE idempotency.routed_keys;
END $$;
REVOKE ALL ON FUNCTION idem_undistribute() FROM PUBLIC;

-- The key functions take the routing value as a last argument, `route`, of any
-- type (the business table's distribution-column type, whatever that is: hence
-- "any"), NULL by default: named, route => p_account, it reads best. A new last
-- parameter with a default rather than overloads, which calls with untyped literals
-- (idem_complete('s', 'k', '{}')) would find ambiguous. Dropped and made again, as a
-- function's parameters cannot change in place. Their privileges are carried over
-- (a REVOKE EXECUTE ... FROM PUBLIC that limits who may claim must survive it):
-- kept aside here, granted again below.
SELECT pg_catalog.set_config('idem_upgrade.acls', COALESCE(pg_catalog.jsonb_object_agg(
         p.proname, (SELECT pg_catalog.jsonb_agg(pg_catalog.jsonb_build_array(
                              a.grantee, a.is_grantable))
                     FROM pg_catalog.aclexplode(p.proacl) a
                     WHERE a.privilege_type = 'EXECUTE'))::text, '{}'), true)
FROM pg_catalog.pg_proc p
WHERE p.pronamespace = '@extschema@'::regnamespace AND p.proacl IS NOT NULL
  AND p.proname IN ('idem_claim', 'idem_complete', 'idem_fail', 'idem_release',
                    'idem_checkpoint', 'idem_once', 'idem_forget', 'idem_lookup',
                    'idem_abandoned', 'idem_stats');

DROP FUNCTION idem_claim(text, idem_key, bytea, interval, interval, interval);
CREATE FUNCTION idem_claim(scope text, key idem_key,
    fingerprint bytea DEFAULT NULL, ttl interval DEFAULT NULL,
    lease interval DEFAULT NULL, wait interval DEFAULT NULL, route "any" DEFAULT NULL)
  RETURNS idem_claim_result
  AS 'MODULE_PATHNAME' LANGUAGE C VOLATILE;

DROP FUNCTION idem_complete(text, idem_key, jsonb, integer);
CREATE FUNCTION idem_complete(scope text, key idem_key,
    response jsonb DEFAULT NULL, attempt integer DEFAULT NULL, route "any" DEFAULT NULL)
  RETURNS void AS 'MODULE_PATHNAME' LANGUAGE C VOLATILE;

DROP FUNCTION idem_fail(text, idem_key, jsonb, integer);
CREATE FUNCTION idem_fail(scope text, key idem_key,
    error jsonb DEFAULT NULL, attempt integer DEFAULT NULL, route "any" DEFAULT NULL)
  RETURNS void AS 'MODULE_PATHNAME' LANGUAGE C VOLATILE;

DROP FUNCTION idem_release(text, idem_key, integer);
CREATE FUNCTION idem_release(scope text, key idem_key,
    attempt integer DEFAULT NULL, route "any" DEFAULT NULL)
  RETURNS void AS 'MODULE_PATHNAME' LANGUAGE C VOLATILE;

DROP FUNCTION idem_checkpoint(text, idem_key, text, jsonb, integer);
CREATE FUNCTION idem_checkpoint(scope text, key idem_key,
    point text, data jsonb DEFAULT NULL, attempt integer DEFAULT NULL, route "any" DEFAULT NULL)
  RETURNS void AS 'MODULE_PATHNAME' LANGUAGE C VOLATILE;

DROP FUNCTION idem_once(text, idem_key, interval, interval);
CREATE FUNCTION idem_once(scope text, key idem_key,
    ttl interval DEFAULT NULL, wait interval DEFAULT NULL, route "any" DEFAULT NULL)
  RETURNS boolean AS 'MODULE_PATHNAME' LANGUAGE C VOLATILE;

DROP FUNCTION idem_forget(text, idem_key);
CREATE FUNCTION idem_forget(scope text, key idem_key, route "any" DEFAULT NULL)
  RETURNS boolean AS 'MODULE_PATHNAME' LANGUAGE C VOLATILE;

DROP FUNCTION idem_lookup(text, idem_key);
CREATE FUNCTION idem_lookup(scope text, key idem_key, route "any" DEFAULT NULL)
  RETURNS TABLE(state text, response jsonb, attempt integer, checkpoint text,
                checkpoint_data jsonb, first_claimed_at timestamptz,
                expires_at timestamptz, lease_expires_at timestamptz)
  AS 'MODULE_PATHNAME' LANGUAGE C STABLE ROWS 1;

-- idem_abandoned on the coordinator of a distributed store lists the role's claims on
-- every node; node_only => true, this node's alone.
DROP FUNCTION idem_abandoned(text, integer);
CREATE FUNCTION idem_abandoned(scope text DEFAULT NULL, max_rows integer DEFAULT 100,
                               node_only boolean DEFAULT false)
  RETURNS TABLE(scope text, key idem_key, attempt integer, checkpoint text,
                checkpoint_data jsonb, first_claimed_at timestamptz)
  AS 'MODULE_PATHNAME' LANGUAGE C STABLE;

-- idem_stats on the coordinator of a distributed store counts the keys of the whole
-- cluster (idem_node_stats below, summed); node_only => true, this node's alone.
DROP FUNCTION idem_stats();
CREATE FUNCTION idem_stats(node_only boolean DEFAULT false)
  RETURNS TABLE(keys_total bigint, pending bigint, completed bigint, failed bigint,
                abandoned bigint, expired_awaiting_reap bigint, reaped_total bigint,
                reclaimed_total bigint, last_reap_at timestamptz, last_reap_ms bigint,
                worker_pid integer, stale_leases bigint, outbox_undelivered bigint,
                outbox_dead bigint, outbox_oldest_undelivered_at timestamptz)
  AS 'MODULE_PATHNAME' LANGUAGE C VOLATILE;

-- Every node's idem_stats(node_only => true), through Citus, one row per node (an
-- unreachable node: a row of NULLs with a WARNING).
CREATE FUNCTION idem_node_stats()
  RETURNS TABLE(nodename text, nodeport integer, keys_total bigint, pending bigint,
                completed bigint, failed bigint, abandoned bigint,
                expired_awaiting_reap bigint, reaped_total bigint, reclaimed_total bigint,
                last_reap_at timestamptz, last_reap_ms bigint, worker_pid integer,
                stale_leases bigint, outbox_undelivered bigint, outbox_dead bigint,
                outbox_oldest_undelivered_at timestamptz)
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  node record;
BEGIN
  IF NOT EXISTS (SELECT FROM pg_extension WHERE extname = 'citus') THEN
    RAISE EXCEPTION 'idem_node_stats needs Citus'
      USING ERRCODE = 'object_not_in_prerequisite_state', HINT = 'Call idem_stats().';
  END IF;
  FOR node IN
    SELECT n.nodename AS name, n.nodeport AS port, r.success, r.result
    FROM run_command_on_all_nodes(
           'SELECT row_to_json(s) FROM @extschema@.idem_stats(node_only => true) s') r
    JOIN pg_dist_node n USING (nodeid) ORDER BY n.groupid, n.nodeid
  LOOP
    nodename := node.name;
    nodeport := node.port;
    IF NOT node.success THEN
      RAISE WARNING 'idem_node_stats: node %:% did not answer: %', node.name, node.port, node.result;
      SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL
        INTO keys_total, pending, completed, failed, abandoned, expired_awaiting_reap,
             reaped_total, reclaimed_total, last_reap_at, last_reap_ms, worker_pid,
             stale_leases, outbox_undelivered, outbox_dead, outbox_oldest_undelivered_at;
    ELSE
      SELECT * INTO keys_total, pending, completed, failed, abandoned, expired_awaiting_reap,
             reaped_total, reclaimed_total, last_reap_at, last_reap_ms, worker_pid,
             stale_leases, outbox_undelivered, outbox_dead, outbox_oldest_undelivered_at
      FROM json_to_record(node.result::json) AS r(
             keys_total bigint, pending bigint, completed bigint, failed bigint,
             abandoned bigint, expired_awaiting_reap bigint, reaped_total bigint,
             reclaimed_total bigint, last_reap_at timestamptz, last_reap_ms bigint,
             worker_pid integer, stale_leases bigint, outbox_undelivered bigint,
             outbox_dead bigint, outbox_oldest_undelivered_at timestamptz);
    END IF;
    RETURN NEXT;
  END LOOP;
END $$;
REVOKE ALL ON FUNCTION idem_node_stats() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION idem_node_stats() TO pg_monitor;

DO $$
DECLARE
  acls jsonb := pg_catalog.current_setting('idem_upgrade.acls')::jsonb;
  name text;
  grant_entry jsonb;
  signature regprocedure;
BEGIN
  FOR name IN SELECT pg_catalog.jsonb_object_keys(acls) LOOP
    SELECT p.oid INTO signature FROM pg_catalog.pg_proc p
      WHERE p.proname = name AND p.pronamespace = '@extschema@'::regnamespace;
    EXECUTE pg_catalog.format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', signature);
    FOR grant_entry IN SELECT pg_catalog.jsonb_array_elements(
                                COALESCE(acls -> name, '[]')) LOOP
      EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION %s TO %s%s', signature,
        CASE WHEN (grant_entry ->> 0)::oid = 0 THEN 'PUBLIC'
             ELSE pg_catalog.quote_ident((grant_entry ->> 0)::oid::regrole::text) END,
        CASE WHEN (grant_entry ->> 1)::boolean THEN ' WITH GRANT OPTION' ELSE '' END);
    END LOOP;
  END LOOP;
END $$;
