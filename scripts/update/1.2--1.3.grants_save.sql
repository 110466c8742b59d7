-- Kept aside by exact signature (this path's fix of idempotency--1.2--1.3.sql, which
-- looked the functions up by name alone: a function of the same name in this schema,
-- such as an application's wrapper idem_claim(integer), then gave its grants or took
-- the extension's, and the extension's own was left granted to PUBLIC). Each row: the
-- function as 1.2 has it, found by its signature and only if it is a member of this
-- extension (pg_depend deptype 'e'), and the signature this script makes it again with.
SELECT pg_catalog.set_config('idem_upgrade.acls', COALESCE(pg_catalog.jsonb_object_agg(
         f.new_signature, COALESCE((SELECT pg_catalog.jsonb_agg(pg_catalog.jsonb_build_array(
                                              a.grantee, a.is_grantable))
                                    FROM pg_catalog.aclexplode(p.proacl) a
                                    WHERE a.privilege_type = 'EXECUTE'), '[]')
       )::text, '{}'), true)
FROM (VALUES
  ('@extschema@.idem_claim(text, @extschema@.idem_key, bytea, interval, interval, interval)',
   '@extschema@.idem_claim(text, @extschema@.idem_key, bytea, interval, interval, interval, "any")'),
  ('@extschema@.idem_complete(text, @extschema@.idem_key, jsonb, integer)',
   '@extschema@.idem_complete(text, @extschema@.idem_key, jsonb, integer, "any")'),
  ('@extschema@.idem_fail(text, @extschema@.idem_key, jsonb, integer)',
   '@extschema@.idem_fail(text, @extschema@.idem_key, jsonb, integer, "any")'),
  ('@extschema@.idem_release(text, @extschema@.idem_key, integer)',
   '@extschema@.idem_release(text, @extschema@.idem_key, integer, "any")'),
  ('@extschema@.idem_checkpoint(text, @extschema@.idem_key, text, jsonb, integer)',
   '@extschema@.idem_checkpoint(text, @extschema@.idem_key, text, jsonb, integer, "any")'),
  ('@extschema@.idem_once(text, @extschema@.idem_key, interval, interval)',
   '@extschema@.idem_once(text, @extschema@.idem_key, interval, interval, "any")'),
  ('@extschema@.idem_forget(text, @extschema@.idem_key)',
   '@extschema@.idem_forget(text, @extschema@.idem_key, "any")'),
  ('@extschema@.idem_lookup(text, @extschema@.idem_key)',
   '@extschema@.idem_lookup(text, @extschema@.idem_key, "any")'),
  ('@extschema@.idem_abandoned(text, integer)',
   '@extschema@.idem_abandoned(text, integer, boolean)'),
  ('@extschema@.idem_stats()',
   '@extschema@.idem_stats(boolean)')
) AS f(old_signature, new_signature)
JOIN pg_catalog.pg_proc p ON p.oid = pg_catalog.to_regprocedure(f.old_signature)
JOIN pg_catalog.pg_depend d
  ON d.classid = 'pg_catalog.pg_proc'::pg_catalog.regclass AND d.objid = p.oid AND d.deptype = 'e'
 AND d.refclassid = 'pg_catalog.pg_extension'::pg_catalog.regclass
 AND d.refobjid = (SELECT e.oid FROM pg_catalog.pg_extension e WHERE e.extname = 'idempotency')
WHERE p.proacl IS NOT NULL;
