-- The grants kept aside above, given to the functions this script made, each named by
-- its exact signature and checked to be the extension's member (never another function
-- of that name).
DO $$
DECLARE
  acls jsonb := pg_catalog.current_setting('idem_upgrade.acls')::jsonb;
  signature text;
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
