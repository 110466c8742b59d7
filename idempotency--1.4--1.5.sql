-- idempotency 1.4 -> 1.5
\echo Use "ALTER EXTENSION idempotency UPDATE TO '1.5'" to load this file. \quit

-- As from 1.4, objects whose signature does not change are kept in place (CREATE OR
-- REPLACE), so that users' views and SQL-standard functions over them survive the update;
-- grants are carried by exact signature.

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

-- Gives `target` exactly the EXECUTE grants idem_once has (grantees and grant options;
-- made by the owner), and nothing else. They are the database's grants, not the
-- extension's initial ones: a GRANT in an extension script is recorded in pg_init_privs,
-- and pg_dump writes only what differs from there, so a restore (into a fresh install,
-- where idem_once_many is PUBLIC's) would lose them. The record is put back as it was.
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
  -- PostgreSQL 17 and later also record the roles named in pg_init_privs in
  -- pg_shdepend (deptype 'i'): only those of the initial grants put back stay.
  IF initial IS NULL THEN
    DELETE FROM pg_init_privs i
    WHERE i.classoid = 'pg_proc'::regclass AND i.objoid = target AND i.objsubid = 0;
  ELSE
    UPDATE pg_init_privs i SET initprivs = initial
    WHERE i.classoid = 'pg_proc'::regclass AND i.objoid = target AND i.objsubid = 0;
  END IF;
  DELETE FROM pg_shdepend d
  WHERE d.dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
    AND d.classid = 'pg_proc'::regclass AND d.objid = target AND d.objsubid = 0
    AND d.deptype = 'i'
    AND (initial IS NULL OR NOT EXISTS (SELECT FROM aclexplode(initial) a
                                        WHERE d.refobjid IN (a.grantee, a.grantor)));
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
