-- idempotency 1.4 -> 1.5
\echo Use "ALTER EXTENSION idempotency UPDATE TO '1.5'" to load this file. \quit

-- As from 1.4, objects whose signature does not change are kept in place (CREATE OR
-- REPLACE), so that users' views and SQL-standard functions over them survive the update;
-- grants are carried by exact signature.

------------------------------------------------------------------------------
-- idem_stats counts what the key functions answered (issue 43): claims_total,
-- replays_total, fingerprint_mismatches_total, in_progress_total since server start,
-- and the edition ('native'). Its result type changes, so it is dropped and made again,
-- and idem_node_stats, which mirrors its columns, too; each keeps exactly its ACL, by
-- exact signature (pg_monitor's grant only where it still had it). A user's view or function
-- over idem_stats would block the drop: the update stops first, saying which, and
-- docs/operations.md gives the statements to run around it.
------------------------------------------------------------------------------
DO $$
DECLARE
  dependents text;
BEGIN
  SELECT pg_catalog.string_agg(DISTINCT CASE
           WHEN d.classid = 'pg_catalog.pg_rewrite'::pg_catalog.regclass
           THEN (SELECT 'view ' || r.ev_class::pg_catalog.regclass::text
                 FROM pg_catalog.pg_rewrite r WHERE r.oid = d.objid)
           ELSE pg_catalog.pg_describe_object(d.classid, d.objid, 0) END, ', ')
    INTO dependents
  FROM pg_catalog.pg_depend d
  WHERE d.refclassid = 'pg_catalog.pg_proc'::pg_catalog.regclass
    AND d.refobjid IN (pg_catalog.to_regprocedure('@extschema@.idem_stats(boolean)'),
                       pg_catalog.to_regprocedure('@extschema@.idem_node_stats()'))
    AND d.deptype = 'n';
  IF dependents IS NOT NULL THEN
    RAISE EXCEPTION 'idem_stats() cannot be updated while other objects depend on it'
      USING ERRCODE = 'dependent_objects_still_exist',
            DETAIL = pg_catalog.format('Depending on it: %s.', dependents),
            HINT = 'Drop them, run ALTER EXTENSION idempotency UPDATE, then create them again '
                   '(docs/operations.md, "Updating to 1.5").';
  END IF;
END $$;

SELECT pg_catalog.set_config('idem_upgrade.stats_acls', COALESCE(pg_catalog.jsonb_object_agg(
         f.signature, COALESCE((SELECT pg_catalog.jsonb_agg(pg_catalog.jsonb_build_array(
                                          a.grantee, a.is_grantable))
                                FROM pg_catalog.aclexplode(p.proacl) a
                                WHERE a.privilege_type = 'EXECUTE'), '[]')
       )::text, '{}'), true)
FROM (VALUES ('@extschema@.idem_stats(boolean)'), ('@extschema@.idem_node_stats()'))
  AS f(signature)
JOIN pg_catalog.pg_proc p ON p.oid = pg_catalog.to_regprocedure(f.signature)
JOIN pg_catalog.pg_depend d
  ON d.classid = 'pg_catalog.pg_proc'::pg_catalog.regclass AND d.objid = p.oid AND d.deptype = 'e'
 AND d.refclassid = 'pg_catalog.pg_extension'::pg_catalog.regclass
 AND d.refobjid = (SELECT e.oid FROM pg_catalog.pg_extension e WHERE e.extname = 'idempotency')
WHERE p.proacl IS NOT NULL;

DROP FUNCTION idem_node_stats();
DROP FUNCTION idem_stats(boolean);

CREATE FUNCTION idem_stats(node_only boolean DEFAULT false)
  RETURNS TABLE(keys_total bigint, pending bigint, completed bigint, failed bigint,
                abandoned bigint, expired_awaiting_reap bigint, reaped_total bigint,
                reclaimed_total bigint, last_reap_at timestamptz, last_reap_ms bigint,
                worker_pid integer, stale_leases bigint, outbox_undelivered bigint,
                outbox_dead bigint, outbox_oldest_undelivered_at timestamptz,
                claims_total bigint, replays_total bigint, fingerprint_mismatches_total bigint,
                in_progress_total bigint, edition text)
  AS 'MODULE_PATHNAME' LANGUAGE C VOLATILE;
REVOKE ALL ON FUNCTION idem_stats(boolean) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION idem_stats(boolean) TO pg_monitor;

-- Every node's idem_stats(node_only => true), through Citus, one row per node (an
-- unreachable node: a row of NULLs with a WARNING).
CREATE FUNCTION idem_node_stats()
  RETURNS TABLE(nodename text, nodeport integer, keys_total bigint, pending bigint,
                completed bigint, failed bigint, abandoned bigint,
                expired_awaiting_reap bigint, reaped_total bigint, reclaimed_total bigint,
                last_reap_at timestamptz, last_reap_ms bigint, worker_pid integer,
                stale_leases bigint, outbox_undelivered bigint, outbox_dead bigint,
                outbox_oldest_undelivered_at timestamptz, claims_total bigint,
                replays_total bigint, fingerprint_mismatches_total bigint,
                in_progress_total bigint, edition text)
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  node record;
  stats record;
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
    END IF;
    -- A node's columns by name: one not yet updated to 1.5 shows NULL counters.
    SELECT * INTO stats FROM json_to_record(CASE WHEN node.success THEN node.result::json END) AS r(
             keys_total bigint, pending bigint, completed bigint, failed bigint,
             abandoned bigint, expired_awaiting_reap bigint, reaped_total bigint,
             reclaimed_total bigint, last_reap_at timestamptz, last_reap_ms bigint,
             worker_pid integer, stale_leases bigint, outbox_undelivered bigint,
             outbox_dead bigint, outbox_oldest_undelivered_at timestamptz,
             claims_total bigint, replays_total bigint, fingerprint_mismatches_total bigint,
             in_progress_total bigint, edition text);
    keys_total := stats.keys_total; pending := stats.pending; completed := stats.completed;
    failed := stats.failed; abandoned := stats.abandoned;
    expired_awaiting_reap := stats.expired_awaiting_reap; reaped_total := stats.reaped_total;
    reclaimed_total := stats.reclaimed_total; last_reap_at := stats.last_reap_at;
    last_reap_ms := stats.last_reap_ms; worker_pid := stats.worker_pid;
    stale_leases := stats.stale_leases; outbox_undelivered := stats.outbox_undelivered;
    outbox_dead := stats.outbox_dead;
    outbox_oldest_undelivered_at := stats.outbox_oldest_undelivered_at;
    claims_total := stats.claims_total; replays_total := stats.replays_total;
    fingerprint_mismatches_total := stats.fingerprint_mismatches_total;
    in_progress_total := stats.in_progress_total; edition := stats.edition;
    RETURN NEXT;
  END LOOP;
END $$;
REVOKE ALL ON FUNCTION idem_node_stats() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION idem_node_stats() TO pg_monitor;

-- The grants kept aside above, given again by exact signature to the extension's own
-- functions (never another function of that name), and no others: a grant the function
-- was made with above (the owner's, pg_monitor's) that is not among them goes, as an
-- administrator revoked it (issue 50).
DO $$
DECLARE
  acls jsonb := pg_catalog.current_setting('idem_upgrade.stats_acls')::jsonb;
  signature text;
  grantee oid;
  grant_entry jsonb;
BEGIN
  FOR signature IN SELECT pg_catalog.jsonb_object_keys(acls) LOOP
    IF NOT EXISTS (
        SELECT FROM pg_catalog.pg_depend d
        WHERE d.classid = 'pg_catalog.pg_proc'::pg_catalog.regclass
          AND d.objid = pg_catalog.to_regprocedure(signature) AND d.deptype = 'e'
          AND d.refclassid = 'pg_catalog.pg_extension'::pg_catalog.regclass
          AND d.refobjid = (SELECT e.oid FROM pg_catalog.pg_extension e
                            WHERE e.extname = 'idempotency')) THEN
      RAISE EXCEPTION 'idempotency update: % is not a function of the extension', signature;
    END IF;
    FOR grantee IN
      SELECT DISTINCT a.grantee FROM pg_catalog.pg_proc p,
        pg_catalog.aclexplode(COALESCE(p.proacl, pg_catalog.acldefault('f', p.proowner))) a
      WHERE p.oid = pg_catalog.to_regprocedure(signature)
        AND a.grantee NOT IN (SELECT (e ->> 0)::oid
                              FROM pg_catalog.jsonb_array_elements(acls -> signature) e)
    LOOP
      EXECUTE pg_catalog.format('REVOKE ALL ON FUNCTION %s FROM %s', signature,
        CASE WHEN grantee = 0 THEN 'PUBLIC'
             ELSE (SELECT pg_catalog.quote_ident(r.rolname) FROM pg_catalog.pg_roles r
                   WHERE r.oid = grantee) END);
    END LOOP;
    FOR grant_entry IN SELECT pg_catalog.jsonb_array_elements(acls -> signature) LOOP
      EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION %s TO %s%s', signature,
        CASE WHEN (grant_entry ->> 0)::oid = 0 THEN 'PUBLIC'
             ELSE (SELECT pg_catalog.quote_ident(r.rolname) FROM pg_catalog.pg_roles r
                   WHERE r.oid = (grant_entry ->> 0)::oid) END,
        CASE WHEN (grant_entry ->> 1)::boolean THEN ' WITH GRANT OPTION' ELSE '' END);
    END LOOP;
  END LOOP;
END $$;

------------------------------------------------------------------------------
-- Who may add keys (issue 41, item 1; SPEC v1.4, Security: an update never widens who
-- may call what). 1.3 -> 1.4 (and 1.2 -> 1.4) made idem_once_many with the default
-- grant, PUBLIC may execute, even where the DBA had revoked idem_once from PUBLIC: a
-- role refused idem_once added keys through idem_once_many. Where idem_once's grants
-- are not the default and idem_once_many's still are, idem_once_many gets idem_once's
-- (by exact signature, the extension's own functions only); one granted otherwise on
-- purpose is left as it is. A function that adds keys, new in a later section, starts
-- with idem_once's grants through the same function.
------------------------------------------------------------------------------

-- Records `initial` (NULL: none) as the extension's initial privileges on the function
-- `target`, whatever GRANT or REVOKE this script ran on it. A GRANT in an extension
-- script is recorded in pg_init_privs, and pg_dump writes only what differs from
-- there: grants this script gives as the database's, not the extension's, would be
-- lost by a restore into a fresh install. PostgreSQL 17 and later also record the
-- roles named there in pg_shdepend (deptype 'i'): only those of `initial` stay.
CREATE FUNCTION idempotency.record_initial_privileges(target regprocedure, initial aclitem[])
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  IF initial IS NULL THEN
    DELETE FROM pg_init_privs i
    WHERE i.classoid = 'pg_proc'::regclass AND i.objoid = target AND i.objsubid = 0;
  ELSIF EXISTS (SELECT FROM pg_init_privs i WHERE i.classoid = 'pg_proc'::regclass
                AND i.objoid = target AND i.objsubid = 0) THEN
    UPDATE pg_init_privs i SET initprivs = initial
    WHERE i.classoid = 'pg_proc'::regclass AND i.objoid = target AND i.objsubid = 0;
  ELSE
    INSERT INTO pg_init_privs (objoid, classoid, objsubid, privtype, initprivs)
    VALUES (target, 'pg_proc'::regclass, 0, 'e', initial);
  END IF;
  DELETE FROM pg_shdepend d
  WHERE d.dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
    AND d.classid = 'pg_proc'::regclass AND d.objid = target AND d.objsubid = 0
    AND d.deptype = 'i'
    AND (initial IS NULL OR NOT EXISTS (SELECT FROM aclexplode(initial) a
                                        WHERE d.refobjid IN (a.grantee, a.grantor)));
END $$;
REVOKE ALL ON FUNCTION idempotency.record_initial_privileges(regprocedure, aclitem[]) FROM PUBLIC;

-- Gives `target` exactly the EXECUTE grants idem_once has (grantees and grant options;
-- made by the owner), and nothing else: the database's grants, so the extension's
-- initial privileges on `target` are put back as they were.
CREATE FUNCTION idempotency.grant_like_idem_once(target regprocedure) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  once regprocedure := to_regprocedure(
    '@extschema@.idem_once(text, @extschema@.idem_key, interval, interval, "any")');
  grant_entry record;
  initial aclitem[];
BEGIN
  SELECT i.initprivs INTO initial FROM pg_init_privs i
  WHERE i.classoid = 'pg_proc'::regclass AND i.objoid = target AND i.objsubid = 0;
  EXECUTE format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', target);
  EXECUTE format('REVOKE ALL ON FUNCTION %s FROM %I', target,
                 (SELECT p.proowner::regrole::text FROM pg_proc p WHERE p.oid = target));
  FOR grant_entry IN
    SELECT a.grantee, bool_or(a.is_grantable) AS is_grantable
    FROM pg_proc p, aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) a
    WHERE p.oid = once AND a.privilege_type = 'EXECUTE' GROUP BY a.grantee
  LOOP
    EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %s%s', target,
      CASE WHEN grant_entry.grantee = 0 THEN 'PUBLIC'
           ELSE quote_ident(grant_entry.grantee::regrole::text) END,
      CASE WHEN grant_entry.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
  END LOOP;
  PERFORM idempotency.record_initial_privileges(target, initial);
END $$;
REVOKE ALL ON FUNCTION idempotency.grant_like_idem_once(regprocedure) FROM PUBLIC;

DO $$
DECLARE
  once regprocedure := pg_catalog.to_regprocedure(
    '@extschema@.idem_once(text, @extschema@.idem_key, interval, interval, "any")');
  many regprocedure := pg_catalog.to_regprocedure(
    '@extschema@.idem_once_many(text, @extschema@.idem_key[], interval, interval, "any")');
  -- Whether a function's grants are the default ones (NULL, or the same entries).
  at_default CONSTANT text := $q$
    SELECT p.proacl IS NULL OR NOT EXISTS (
             (SELECT * FROM pg_catalog.aclexplode(p.proacl)
              EXCEPT SELECT * FROM pg_catalog.aclexplode(pg_catalog.acldefault('f', p.proowner)))
             UNION ALL
             (SELECT * FROM pg_catalog.aclexplode(pg_catalog.acldefault('f', p.proowner))
              EXCEPT SELECT * FROM pg_catalog.aclexplode(p.proacl)))
    FROM pg_catalog.pg_proc p WHERE p.oid = $1 $q$;
  once_default boolean;
  many_default boolean;
BEGIN
  IF once IS NULL OR many IS NULL THEN RETURN; END IF;
  EXECUTE at_default INTO once_default USING once;
  EXECUTE at_default INTO many_default USING many;
  IF NOT once_default AND many_default THEN
    PERFORM idempotency.grant_like_idem_once(many);
  END IF;
END $$;

-- Grants carried over by the updates, recorded as the extension's. 1.2 -> 1.3 and
-- 1.2 -> 1.4 made the key functions again with a route argument, 1.3 -> 1.4 (and
-- 1.2 -> 1.4) idem_emit and idem_apply_version, this script idem_stats and
-- idem_node_stats (above), and each granted the new function what the old one had, in
-- the script: pg_init_privs took the database's grants for the extension's, and
-- pg_dump, writing only what differs from there, wrote none of them.
-- Restored into a fresh install, a function revoked from PUBLIC was PUBLIC's again,
-- and a role granted idem_emit lost it. Each gets a fresh install's record (none, or
-- the owner's and pg_monitor's grants the install scripts make); the grants themselves
-- stay as they are.
DO $$
DECLARE
  f record;
BEGIN
  FOR f IN
    SELECT p.oid::pg_catalog.regprocedure AS signature, p.proname, p.proowner
    FROM pg_catalog.pg_proc p
    JOIN pg_catalog.pg_depend d
      ON d.classid = 'pg_catalog.pg_proc'::pg_catalog.regclass AND d.objid = p.oid AND d.deptype = 'e'
     AND d.refobjid = (SELECT e.oid FROM pg_catalog.pg_extension e WHERE e.extname = 'idempotency')
    WHERE p.proname IN ('idem_claim', 'idem_complete', 'idem_fail', 'idem_release',
                        'idem_checkpoint', 'idem_once', 'idem_forget', 'idem_lookup',
                        'idem_abandoned', 'idem_stats', 'idem_node_stats', 'idem_emit',
                        'idem_apply_version')
  LOOP
    PERFORM idempotency.record_initial_privileges(f.signature, CASE
      WHEN f.proname IN ('idem_stats', 'idem_node_stats') THEN
        ARRAY[pg_catalog.makeaclitem(f.proowner, f.proowner, 'EXECUTE', false),
              pg_catalog.makeaclitem('pg_monitor'::pg_catalog.regrole, f.proowner, 'EXECUTE', false)]
      WHEN f.proname = 'idem_emit' THEN
        ARRAY[pg_catalog.makeaclitem(f.proowner, f.proowner, 'EXECUTE', false)]
      END);
  END LOOP;
END $$;

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

------------------------------------------------------------------------------
-- The relay on a domain distribution column (issue 41, item 3). The relay calls each
-- shard through a twin with a routing value that falls in that shard, and Citus checks
-- a domain's constraints on that value at both ends of the call. The relay tries values
-- of the domain's base type that pass them (src/pg/citus/citus_meta.hpp); for a shard
-- none of them reaches, it takes the route of one of the events waiting there (pending
-- or dead), which this function reads on the shard's node, as its owner: it reads every
-- role's routes, so it is executable by nobody; the relay functions call it from C.
-- Returns, for each shard of `shards`, the route as text, or NULL where none waits.
------------------------------------------------------------------------------
CREATE FUNCTION idempotency.shard_routes(outbox regclass, shards bigint[]) RETURNS text[]
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  nodes text[];
  ports integer[];
  commands text[];
  places bigint[];
  routes text[] := array_fill(NULL::text, ARRAY[cardinality(shards)]);
  answer record;
BEGIN
  -- One statement per shard, on the node of its placement ('r' marks a row: a route
  -- may be the empty string).
  SELECT array_agg(p.nodename ORDER BY s.place), array_agg(p.nodeport ORDER BY s.place),
         array_agg(format('SELECT ''r'' || route::text FROM ((SELECT route FROM %1$s WHERE state = ''p'' LIMIT 1) '
                          'UNION ALL (SELECT route FROM %1$s WHERE state = ''x'' LIMIT 1)) w LIMIT 1',
                          shard_name(outbox, s.shardid)) ORDER BY s.place),
         array_agg(s.place ORDER BY s.place)
    INTO nodes, ports, commands, places
    FROM unnest(shards) WITH ORDINALITY AS s(shardid, place)
    CROSS JOIN LATERAL (SELECT d.nodename, d.nodeport FROM pg_dist_shard_placement d
                        WHERE d.shardid = s.shardid AND d.shardstate = 1 LIMIT 1) p;
  IF nodes IS NULL THEN
    RETURN routes;
  END IF;
  FOR answer IN SELECT w.success, w.result, w.n
                FROM master_run_on_worker(nodes, ports, commands, true) WITH ORDINALITY AS w(node_name, node_port, success, result, n) LOOP
    IF answer.success AND answer.result LIKE 'r%' THEN
      routes[places[answer.n]] := substr(answer.result, 2);
    END IF;
  END LOOP;
  RETURN routes;
END $$;
REVOKE ALL ON FUNCTION idempotency.shard_routes(regclass, bigint[]) FROM PUBLIC;
