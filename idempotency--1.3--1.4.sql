-- idempotency 1.3 -> 1.4
-- All below the \echo line also goes into idempotency--1.2--1.4.sql (the path from 1.2,
-- and so of CREATE EXTENSION): `make` remakes it; commit the two together.
\echo Use "ALTER EXTENSION idempotency UPDATE TO '1.4'" to load this file. \quit

-- From 1.4 on, an update script keeps every object whose signature does not change in
-- place (CREATE OR REPLACE), so that views and SQL-standard functions that users built
-- on the extension's functions survive ALTER EXTENSION ... UPDATE.

------------------------------------------------------------------------------
-- idem_once_many (issue 37): the batch inbox, idem_once for an array of message keys
-- in one call. Granted to PUBLIC like idem_once (keys are per role).
CREATE FUNCTION idem_once_many(scope text, keys idem_key[],
    ttl interval DEFAULT NULL, wait interval DEFAULT NULL, route "any" DEFAULT NULL)
  RETURNS boolean[] AS 'MODULE_PATHNAME' LANGUAGE C VOLATILE;

------------------------------------------------------------------------------
-- Key functions anywhere in a Citus cluster, in the caller's transaction (SPEC v1.3,
-- "Scale-out with Citus"): a key function called where its key's shard is not (a
-- transaction block on the coordinator, say) runs on the shard's node through a twin,
-- <function>_routed, whose last argument `route` has the distribution column's type,
-- distributed with force_delegation: Citus delegates a call of it with a constant
-- route even inside a transaction block, over the connection that the transaction's
-- later statements on that shard reuse, so the key commits with the business rows.
-- (Citus refuses a distribution argument of type "any", hence typed twins, made by
-- idem_distribute for the column's type. src/pg/citus/citus_forward.hpp.)
------------------------------------------------------------------------------

-- Makes and distributes the twins for routes of type `route_type`, each with the
-- privileges of the function it stands for.
CREATE FUNCTION idempotency.distribute_key_functions(route_type text) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  f record;
  twin regprocedure;
  acl aclitem[];
  grant_entry record;
BEGIN
  FOR f IN SELECT * FROM (VALUES
      ('idem_claim', 'scope text, key @extschema@.idem_key, fingerprint bytea, ttl interval, '
                     'lease interval, wait interval', '@extschema@.idem_claim_result'),
      ('idem_once', 'scope text, key @extschema@.idem_key, ttl interval, wait interval', 'boolean'),
      ('idem_once_many', 'scope text, keys @extschema@.idem_key[], ttl interval, wait interval',
       'boolean[]'),
      ('idem_complete', 'scope text, key @extschema@.idem_key, response jsonb, attempt integer', 'void'),
      ('idem_fail', 'scope text, key @extschema@.idem_key, error jsonb, attempt integer', 'void'),
      ('idem_release', 'scope text, key @extschema@.idem_key, attempt integer', 'void'),
      ('idem_checkpoint', 'scope text, key @extschema@.idem_key, point text, data jsonb, '
                          'attempt integer', 'void'),
      ('idem_forget', 'scope text, key @extschema@.idem_key', 'boolean'),
      ('idem_lookup', 'scope text, key @extschema@.idem_key',
       'TABLE(state text, response jsonb, attempt integer, checkpoint text, '
       'checkpoint_data jsonb, first_claimed_at timestamptz, expires_at timestamptz, '
       'lease_expires_at timestamptz)'),
      ('idem_emit', 'topic text, payload jsonb, aggregate text, headers jsonb, '
                    'event_id @extschema@.idem_key', '@extschema@.idem_key'),
      ('idem_apply_version', 'scope text, entity text, version bigint, ttl interval', 'boolean'),
      -- The relay's: called on the coordinator, each runs once per shard (with a routing
      -- value of that shard), on the node that holds it.
      ('idem_outbox_claim', 'relay text, max_events integer, lease interval, topics text[]',
       'TABLE(event_id @extschema@.idem_key, topic text, aggregate text, seq bigint, '
       'payload jsonb, headers jsonb, emitted_at timestamptz, attempt integer)'),
      ('idem_outbox_ack', 'relay text, event_ids @extschema@.idem_key[]', 'bigint'),
      ('idem_outbox_dead', 'relay text, event_ids @extschema@.idem_key[], reason text', 'bigint'),
      ('idem_outbox_retry', 'event_ids @extschema@.idem_key[]', 'bigint'),
      ('idem_outbox_dead_letters', 'topic text, max_rows integer',
       'TABLE(event_id @extschema@.idem_key, topic text, aggregate text, seq bigint, '
       'payload jsonb, headers jsonb, emitted_at timestamptz, attempt integer, reason text)'))
    AS t(name, params, returns)
  LOOP
    -- After the route, the caller's idempotency.wait_timeout (in ms), which the twin
    -- applies on its node (citus_forward.hpp).
    EXECUTE format('CREATE FUNCTION @extschema@.%I(%s, route %s, wait_timeout_ms integer) '
                   'RETURNS %s AS %L, %L LANGUAGE C',
                   f.name || '_routed', f.params, route_type, f.returns, 'MODULE_PATHNAME', f.name);
    SELECT p.oid INTO twin FROM pg_proc p
      WHERE p.proname = f.name || '_routed' AND p.pronamespace = '@extschema@'::regnamespace;
    -- Made by ALTER EXTENSION ... UPDATE (a store distributed with 1.3), it would be a
    -- member of the extension; like those idem_distribute makes, it is not.
    IF EXISTS (SELECT FROM pg_depend d WHERE d.classid = 'pg_proc'::regclass
               AND d.objid = twin AND d.deptype = 'e') THEN
      EXECUTE format('ALTER EXTENSION idempotency DROP FUNCTION %s', twin);
    END IF;
    EXECUTE format('COMMENT ON FUNCTION %s IS %L', twin,
                   'internal: ' || f.name || ' forwarded to the node of its shard');
    SELECT p.proacl INTO acl FROM pg_proc p
      WHERE p.proname = f.name AND p.pronamespace = '@extschema@'::regnamespace;
    IF acl IS NOT NULL THEN
      EXECUTE format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', twin);
      FOR grant_entry IN SELECT a.grantee, a.is_grantable FROM aclexplode(acl) a
                         WHERE a.privilege_type = 'EXECUTE' LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %s%s', twin,
          CASE WHEN grant_entry.grantee = 0 THEN 'PUBLIC'
               ELSE quote_ident(grant_entry.grantee::regrole::text) END,
          CASE WHEN grant_entry.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
      END LOOP;
    END IF;
    PERFORM create_distributed_function(twin, 'route', colocate_with => 'idempotency.routed_keys',
                                        force_delegation => true);
  END LOOP;
END $$;
REVOKE ALL ON FUNCTION idempotency.distribute_key_functions(text) FROM PUBLIC;

-- idem_distribute makes the twins too; idem_undistribute drops them.
-- (Shards made and read one after the other: Citus refuses to distribute or drop a
-- function in a transaction that used shards in parallel.)
CREATE OR REPLACE FUNCTION idem_distribute(business regclass) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
SET citus.multi_shard_modify_mode = 'sequential' AS $$
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
  -- Once distributed, the relay serves the shards' events only.
  IF EXISTS (SELECT FROM idempotency.outbox WHERE state <> 'd') THEN
    RAISE EXCEPTION 'the outbox holds events not delivered yet'
      USING ERRCODE = 'object_not_in_prerequisite_state',
            DETAIL = 'Once the store is distributed, the relay functions serve the events of '
                     'its shards, not those of idempotency.outbox.',
            HINT = 'Relay them first (idem_outbox_claim, idem_outbox_ack); retry and relay dead '
                   'letters, or delete them.';
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
  PERFORM idempotency.distribute_key_functions(route_type);
  PERFORM idempotency.distribute_messaging();
END $$;

CREATE OR REPLACE FUNCTION idem_undistribute() RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
SET citus.multi_shard_modify_mode = 'sequential' AS $$
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
  IF to_regclass('idempotency.routed_outbox') IS NOT NULL
     AND (EXISTS (SELECT 1 FROM idempotency.routed_outbox)
          OR EXISTS (SELECT 1 FROM idempotency.routed_applied_versions)) THEN
    RAISE EXCEPTION 'the distributed outbox or applied versions hold rows'
      USING ERRCODE = 'object_not_in_prerequisite_state',
            DETAIL = 'Undistributing would lose them: the node-local tables have no routing value.',
            HINT = 'Delete them from idempotency.routed_outbox and '
                   'idempotency.routed_applied_versions first, once consumed.';
  END IF;
  DROP FUNCTION IF EXISTS @extschema@.idem_claim_routed, @extschema@.idem_once_routed,
    @extschema@.idem_once_many_routed,
    @extschema@.idem_complete_routed, @extschema@.idem_fail_routed,
    @extschema@.idem_release_routed, @extschema@.idem_checkpoint_routed,
    @extschema@.idem_forget_routed, @extschema@.idem_lookup_routed,
    @extschema@.idem_emit_routed, @extschema@.idem_apply_version_routed,
    @extschema@.idem_outbox_claim_routed, @extschema@.idem_outbox_ack_routed,
    @extschema@.idem_outbox_dead_routed, @extschema@.idem_outbox_retry_routed,
    @extschema@.idem_outbox_dead_letters_routed;
  DROP TABLE IF EXISTS idempotency.routed_outbox, idempotency.routed_outbox_aggregates,
    idempotency.routed_applied_versions;
  DROP TABLE idempotency.routed_keys;
END $$;

------------------------------------------------------------------------------
-- Messaging on a distributed store (issue 34, first step): idem_emit and
-- idem_apply_version take a routing value, as the key functions do, and write to
-- routed copies of the outbox, the aggregates' counters and the applied versions,
-- co-located with the business table (made by idem_distribute, or by
-- idempotency.distribute_messaging() for a store distributed with 1.3), or forward to
-- the shard's node through their twins. The relay functions called on the coordinator
-- serve every shard, through twins of their own, one call per shard.
------------------------------------------------------------------------------

-- The routed messaging tables: each the node-local table's columns in its order (the
-- C code reads both by the same attribute numbers), then the route of routed_keys'
-- type and collation; every unique index holds the route (Citus wants it), and the
-- role is an idem_role (moved by name, as in routed_keys). An aggregate's counter also
-- keeps its last event's position: a shard's events are relayed in position order, and
-- the node a shard moves to numbers from its own sequence, which may be behind.
CREATE FUNCTION idempotency.distribute_messaging() RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
SET citus.multi_shard_modify_mode = 'sequential' AS $$
DECLARE
  route_type text;
  route_collation text;
BEGIN
  IF NOT citus_is_coordinator() THEN
    RAISE EXCEPTION 'idempotency.distribute_messaging runs on the Citus coordinator'
      USING ERRCODE = 'object_not_in_prerequisite_state';
  END IF;
  IF to_regclass('idempotency.routed_keys') IS NULL THEN
    RAISE EXCEPTION 'the key store is not distributed'
      USING ERRCODE = 'object_not_in_prerequisite_state',
            HINT = 'idem_distribute(business table) distributes the store and the messaging tables.';
  END IF;
  IF to_regclass('idempotency.routed_outbox') IS NOT NULL THEN
    RETURN;
  END IF;
  SELECT format_type(a.atttypid, a.atttypmod),
         CASE WHEN a.attcollation <> 0 THEN format(' COLLATE %s', a.attcollation::regcollation) ELSE '' END
    INTO route_type, route_collation
    FROM pg_attribute a
    WHERE a.attrelid = 'idempotency.routed_keys'::regclass AND a.attname = 'route';
  EXECUTE format($ddl$
    CREATE TABLE idempotency.routed_outbox (
      event_id         @extschema@.idem_key NOT NULL,
      position         bigint      NOT NULL,
      topic            text        COLLATE "C" NOT NULL,
      aggregate        text        COLLATE "C",
      seq              bigint,
      payload          jsonb       NOT NULL,
      headers          jsonb,
      emitted_at       timestamptz NOT NULL,
      state            "char"      NOT NULL CHECK (state IN ('p', 'd', 'x')),
      attempt          integer     NOT NULL,
      relay            text,
      lease_expires_at timestamptz,
      delivered_at     timestamptz,
      reason           text,
      route            %1$s%2$s NOT NULL,
      CONSTRAINT routed_outbox_pkey PRIMARY KEY (event_id, route)
    ) WITH (fillfactor = 80);
    CREATE TABLE idempotency.routed_outbox_aggregates (
      topic     text   COLLATE "C" NOT NULL,
      aggregate text   COLLATE "C" NOT NULL,
      last_seq  bigint NOT NULL,
      route     %1$s%2$s NOT NULL,
      last_position bigint NOT NULL,
      CONSTRAINT routed_outbox_aggregates_pkey PRIMARY KEY (topic, aggregate, route)
    );
    CREATE TABLE idempotency.routed_applied_versions (
      role       @extschema@.idem_role NOT NULL,
      expires_at timestamptz NOT NULL,
      version    bigint      NOT NULL,
      scope      text        COLLATE "C" NOT NULL,
      entity     text        COLLATE "C" NOT NULL,
      route      %1$s%2$s NOT NULL,
      CONSTRAINT routed_applied_versions_pkey PRIMARY KEY (role, scope, entity, route)
    )$ddl$, route_type, route_collation);
  CREATE INDEX routed_outbox_pending_idx ON idempotency.routed_outbox (position)
    WHERE state = 'p';
  CREATE INDEX routed_outbox_dead_idx ON idempotency.routed_outbox (position) WHERE state = 'x';
  CREATE INDEX routed_outbox_delivered_idx ON idempotency.routed_outbox (delivered_at)
    WHERE state = 'd';
  CREATE INDEX routed_applied_versions_expires_at_idx
    ON idempotency.routed_applied_versions (expires_at);
  REVOKE ALL ON TABLE idempotency.routed_outbox, idempotency.routed_outbox_aggregates,
    idempotency.routed_applied_versions FROM PUBLIC;
  -- Made by ALTER EXTENSION ... UPDATE (a store distributed with 1.3), they would be
  -- members of the extension, which Citus leaves to the extension to make on the
  -- workers; like those idem_distribute makes, they are not.
  IF EXISTS (SELECT FROM pg_depend d WHERE d.classid = 'pg_class'::regclass
             AND d.objid = 'idempotency.routed_outbox'::regclass AND d.deptype = 'e') THEN
    ALTER EXTENSION idempotency DROP TABLE idempotency.routed_outbox;
    ALTER EXTENSION idempotency DROP TABLE idempotency.routed_outbox_aggregates;
    ALTER EXTENSION idempotency DROP TABLE idempotency.routed_applied_versions;
  END IF;
  PERFORM create_distributed_table('idempotency.routed_outbox', 'route',
                                   colocate_with => 'idempotency.routed_keys');
  PERFORM create_distributed_table('idempotency.routed_outbox_aggregates', 'route',
                                   colocate_with => 'idempotency.routed_keys');
  PERFORM create_distributed_table('idempotency.routed_applied_versions', 'route',
                                   colocate_with => 'idempotency.routed_keys');
END $$;
REVOKE ALL ON FUNCTION idempotency.distribute_messaging() FROM PUBLIC;

-- idem_emit and idem_apply_version get a last parameter, route "any" DEFAULT NULL:
-- made again (a new signature), with the grants of the old ones carried over by exact
-- signature, and only from the extension's own functions.
SELECT pg_catalog.set_config('idem_upgrade.messaging_acls', COALESCE(pg_catalog.jsonb_object_agg(
         f.new_signature, COALESCE((SELECT pg_catalog.jsonb_agg(pg_catalog.jsonb_build_array(
                                              a.grantee, a.is_grantable))
                                    FROM pg_catalog.aclexplode(p.proacl) a
                                    WHERE a.privilege_type = 'EXECUTE'), '[]')
       )::text, '{}'), true)
FROM (VALUES
  ('@extschema@.idem_emit(text, jsonb, text, jsonb, @extschema@.idem_key)',
   '@extschema@.idem_emit(text, jsonb, text, jsonb, @extschema@.idem_key, "any")'),
  ('@extschema@.idem_apply_version(text, text, bigint, interval)',
   '@extschema@.idem_apply_version(text, text, bigint, interval, "any")')
) AS f(old_signature, new_signature)
JOIN pg_catalog.pg_proc p ON p.oid = pg_catalog.to_regprocedure(f.old_signature)
JOIN pg_catalog.pg_depend d
  ON d.classid = 'pg_catalog.pg_proc'::pg_catalog.regclass AND d.objid = p.oid AND d.deptype = 'e'
 AND d.refclassid = 'pg_catalog.pg_extension'::pg_catalog.regclass
 AND d.refobjid = (SELECT e.oid FROM pg_catalog.pg_extension e WHERE e.extname = 'idempotency')
WHERE p.proacl IS NOT NULL;

DROP FUNCTION idem_emit(text, jsonb, text, jsonb, idem_key);
CREATE FUNCTION idem_emit(topic text, payload jsonb, aggregate text DEFAULT NULL,
                          headers jsonb DEFAULT NULL, event_id idem_key DEFAULT NULL,
                          route "any" DEFAULT NULL)
  RETURNS idem_key AS 'MODULE_PATHNAME' LANGUAGE C VOLATILE;
DROP FUNCTION idem_apply_version(text, text, bigint, interval);
CREATE FUNCTION idem_apply_version(scope text, entity text, version bigint,
                                   ttl interval DEFAULT NULL, route "any" DEFAULT NULL)
  RETURNS boolean AS 'MODULE_PATHNAME' LANGUAGE C VOLATILE;

DO $$
DECLARE
  acls jsonb := pg_catalog.current_setting('idem_upgrade.messaging_acls')::jsonb;
  signature text;
  grant_entry jsonb;
BEGIN
  FOR signature IN SELECT pg_catalog.jsonb_object_keys(acls) LOOP
    EXECUTE pg_catalog.format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', signature);
    FOR grant_entry IN SELECT pg_catalog.jsonb_array_elements(acls -> signature) LOOP
      EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION %s TO %s%s', signature,
        CASE WHEN (grant_entry ->> 0)::oid = 0 THEN 'PUBLIC'
             ELSE (SELECT pg_catalog.quote_ident(r.rolname) FROM pg_catalog.pg_roles r
                   WHERE r.oid = (grant_entry ->> 0)::oid) END,
        CASE WHEN (grant_entry ->> 1)::boolean THEN ' WITH GRANT OPTION' ELSE '' END);
    END LOOP;
  END LOOP;
END $$;

-- A store distributed with 1.3 gets its twins and its routed messaging tables here,
-- on the coordinator, which distributes them (Citus runs this script on the workers
-- afterwards).
DO $$
BEGIN
  IF to_regclass('idempotency.routed_keys') IS NOT NULL
     AND EXISTS (SELECT FROM pg_catalog.pg_extension WHERE extname = 'citus') THEN
    IF pg_catalog.citus_is_coordinator() THEN
      PERFORM idempotency.distribute_key_functions(
        (SELECT pg_catalog.format_type(a.atttypid, a.atttypmod) FROM pg_catalog.pg_attribute a
         WHERE a.attrelid = 'idempotency.routed_keys'::regclass AND a.attname = 'route'));
      PERFORM idempotency.distribute_messaging();
    END IF;
  END IF;
END $$;

------------------------------------------------------------------------------
-- Install notice (issue 36): on a server that did not preload the library, CREATE
-- EXTENSION (which runs 1.0 -> ... -> 1.4) and ALTER EXTENSION ... UPDATE say so.
-- The function is dropped again, so the catalog is as before; a later update
-- script that should say it too repeats these three lines.
------------------------------------------------------------------------------
CREATE FUNCTION idem_install_notice() RETURNS void
  AS 'MODULE_PATHNAME' LANGUAGE C VOLATILE;
SELECT idem_install_notice();
DROP FUNCTION idem_install_notice();
