-- idempotency 1.4 -> 1.5
\echo Use "ALTER EXTENSION idempotency UPDATE TO '1.5'" to load this file. \quit

-- As from 1.4, objects whose signature does not change are kept in place (CREATE OR
-- REPLACE), so that users' views and SQL-standard functions over them survive the update;
-- grants are carried by exact signature.

------------------------------------------------------------------------------
-- Privileges of the Citus twins (issue 41, item 2; SPEC v1.4 "Security"). A twin,
-- <function>_routed, used to get a copy of its public function's grants when
-- idem_distribute made it, looked up by name alone: the copy drifted from every later
-- GRANT or REVOKE, and an application's own function of the same name could lend its
-- ACL. From 1.5 a twin is executable by PUBLIC and refuses, at every call on the node
-- where it runs, a caller who may not execute its public function there, found by
-- exact signature among the extension's members (src/pg/citus/twin_privilege.hpp). And
-- the public functions are marked as Citus distributed objects on the coordinator, so
-- that Citus propagates a GRANT or REVOKE on them made there to every node (it
-- propagates grants on distributed functions only; a member of a distributed extension
-- is not one by itself).
------------------------------------------------------------------------------

-- Marks the extension's functions in its schema as distributed objects, on the Citus
-- coordinator (as Citus marks a function distributed: a row of pg_dist_object; Citus
-- creates them with the extension on every node, and propagates a GRANT or REVOKE on
-- a distributed function from the coordinator to every node in the same transaction).
-- Elsewhere, and without Citus, it does nothing.
CREATE FUNCTION idempotency.distribute_grants() RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  IF NOT EXISTS (SELECT FROM pg_extension WHERE extname = 'citus')
     OR to_regclass('pg_catalog.pg_dist_object') IS NULL OR NOT citus_is_coordinator() THEN
    RETURN;
  END IF;
  INSERT INTO pg_catalog.pg_dist_object (classid, objid, objsubid)
    SELECT 'pg_catalog.pg_proc'::regclass, p.oid, 0
    FROM pg_proc p
    JOIN pg_depend d ON d.classid = 'pg_catalog.pg_proc'::regclass AND d.objid = p.oid
     AND d.deptype = 'e' AND d.refclassid = 'pg_catalog.pg_extension'::regclass
     AND d.refobjid = (SELECT e.oid FROM pg_extension e WHERE e.extname = 'idempotency')
    WHERE p.pronamespace = '@extschema@'::regnamespace AND p.prokind = 'f'
  ON CONFLICT DO NOTHING;
END $$;
REVOKE ALL ON FUNCTION idempotency.distribute_grants() FROM PUBLIC;

-- Makes and distributes the twins for routes of type `route_type`, executable by
-- PUBLIC (each checks its caller itself), and marks the public functions distributed.
CREATE OR REPLACE FUNCTION idempotency.distribute_key_functions(route_type text) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  f record;
  twin regprocedure;
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
    -- applies on its node (citus_forward.hpp). The twin's OID is the one just made.
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
                   format('internal: %1$s forwarded to the node of its shard; allowed to '
                          'whoever may execute %1$s', f.name));
    -- Whatever default privileges say: the twin checks its caller itself.
    EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO PUBLIC', twin);
    PERFORM create_distributed_function(twin, 'route', colocate_with => 'idempotency.routed_keys',
                                        force_delegation => true);
  END LOOP;
  PERFORM idempotency.distribute_grants();
END $$;

-- Twins made by 1.4 carry a copy of their public function's grants: on every node that
-- has them (Citus runs this script on each), they become executable by PUBLIC, the
-- check being inside. The grants of a twin are its alone: nothing else is touched.
DO $$
DECLARE
  twin record;
  grantee oid;
BEGIN
  FOR twin IN
    SELECT p.oid::regprocedure AS signature, p.proname, p.proacl, p.proowner
    FROM pg_catalog.pg_proc p
    WHERE p.pronamespace = '@extschema@'::regnamespace
      AND p.proname IN ('idem_claim_routed', 'idem_once_routed', 'idem_once_many_routed',
        'idem_complete_routed', 'idem_fail_routed', 'idem_release_routed',
        'idem_checkpoint_routed', 'idem_forget_routed', 'idem_lookup_routed',
        'idem_emit_routed', 'idem_apply_version_routed', 'idem_outbox_claim_routed',
        'idem_outbox_ack_routed', 'idem_outbox_dead_routed', 'idem_outbox_retry_routed',
        'idem_outbox_dead_letters_routed')
      AND p.probin = 'MODULE_PATHNAME'
      AND NOT EXISTS (SELECT FROM pg_catalog.pg_depend d
                      WHERE d.classid = 'pg_catalog.pg_proc'::regclass AND d.objid = p.oid
                        AND d.deptype = 'e')
  LOOP
    FOR grantee IN SELECT DISTINCT a.grantee FROM pg_catalog.aclexplode(twin.proacl) a
                   WHERE a.grantee <> 0 AND a.grantee <> twin.proowner LOOP
      EXECUTE pg_catalog.format('REVOKE ALL ON FUNCTION %s FROM %s', twin.signature,
                                grantee::regrole);
    END LOOP;
    EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION %s TO PUBLIC', twin.signature);
    EXECUTE pg_catalog.format('COMMENT ON FUNCTION %s IS %L', twin.signature,
      pg_catalog.format('internal: %1$s forwarded to the node of its shard; allowed to whoever '
                        'may execute %1$s', pg_catalog.left(twin.proname::text, -7)));
  END LOOP;
END $$;

-- On the coordinator (with Citus): the public functions become distributed objects,
-- whether the store is distributed yet or not.
DO $$
BEGIN
  IF EXISTS (SELECT FROM pg_catalog.pg_extension WHERE extname = 'citus') THEN
    PERFORM idempotency.distribute_grants();
  END IF;
END $$;
