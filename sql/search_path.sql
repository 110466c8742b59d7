-- Nothing depends on the caller's search_path (SPEC Security, v1.5), operators
-- included. A schema put before pg_catalog holds a look-alike of every function,
-- aggregate, operator, catalog relation and base type of pg_catalog and of the
-- extension's own schema that can be made (generated from the catalogs), and a
-- collation "C" that sorts otherwise; each look-alike fails loudly when used: a WARNING
-- naming it (seen even where an error would be caught), then an error (look-alikes of
-- functions taking "any", which PL/pgSQL cannot take: the error alone). With that
-- search_path every public function of the contract is called on its main paths, and
-- must answer as it does without it.
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idempotency;
DROP SCHEMA IF EXISTS shadow CASCADE;
DROP ROLE IF EXISTS regress_idem_shadowed;
RESET client_min_messages;
CREATE ROLE regress_idem_shadowed;
CREATE SCHEMA shadow;
GRANT USAGE ON SCHEMA shadow TO PUBLIC;

DO $gen$
DECLARE
  here regnamespace[] := ARRAY['pg_catalog'::regnamespace,
    (SELECT e.extnamespace FROM pg_extension e WHERE e.extname = 'idempotency')];
  o record;
  trap text;
BEGIN
  -- Functions and aggregates, with the same arguments and results. What PL/pgSQL
  -- cannot take ("any", internal, ...) gets a C function that always fails ('cannot
  -- accept a value of type any'); what neither can be is left out.
  FOR o IN SELECT p.oid, p.proname, p.prokind, pg_get_function_arguments(p.oid) AS args,
                  pg_get_function_identity_arguments(p.oid) AS ident,
                  pg_get_function_result(p.oid) AS result
           FROM pg_proc p WHERE p.pronamespace = ANY (here) AND p.prokind IN ('f', 'w', 'a')
  LOOP
    trap := format('BEGIN RAISE WARNING USING MESSAGE = %1$L; RAISE EXCEPTION USING MESSAGE = %1$L; END',
                   format('shadow.%s(%s) ran', o.proname, o.ident));
    BEGIN
      IF o.prokind = 'a' THEN
        EXECUTE format('CREATE FUNCTION shadow.%I(%s) RETURNS %s LANGUAGE plpgsql AS %L',
                       'agg_step_' || o.oid, concat_ws(', ', o.result, nullif(o.ident, '')),
                       o.result, trap);
        EXECUTE format('CREATE FUNCTION shadow.%I(%s) RETURNS %s LANGUAGE plpgsql AS %L',
                       'agg_final_' || o.oid, o.result, o.result, trap);
        EXECUTE format('CREATE AGGREGATE shadow.%I(%s) (SFUNC = shadow.%I, STYPE = %s, FINALFUNC = shadow.%I)',
                       o.proname, coalesce(nullif(o.ident, ''), '*'), 'agg_step_' || o.oid,
                       o.result, 'agg_final_' || o.oid);
      ELSE
        EXECUTE format('CREATE FUNCTION shadow.%I(%s) RETURNS %s LANGUAGE plpgsql AS %L',
                       o.proname, o.args, o.result, trap);
      END IF;
    EXCEPTION WHEN OTHERS THEN
      BEGIN
        EXECUTE format('CREATE FUNCTION shadow.%I(%s) RETURNS %s LANGUAGE internal AS %L',
                       o.proname, o.ident, o.result, 'any_in');
      EXCEPTION WHEN OTHERS THEN
        NULL;
      END;
    END;
  END LOOP;
  -- Operators, prefix and infix.
  FOR o IN SELECT op.oid, op.oprname, nullif(op.oprleft, 0)::regtype AS l,
                  op.oprright::regtype AS r, op.oprresult::regtype AS result
           FROM pg_operator op WHERE op.oprnamespace = ANY (here)
  LOOP
    trap := format('shadow operator %s(%s) ran', o.oprname, concat_ws(', ', o.l, o.r));
    EXECUTE format('CREATE FUNCTION shadow.%I(%s) RETURNS %s LANGUAGE plpgsql AS %L',
                   'op_' || o.oid, concat_ws(', ', o.l, o.r), o.result,
                   format('BEGIN RAISE WARNING USING MESSAGE = %1$L; RAISE EXCEPTION USING MESSAGE = %1$L; END',
                          trap));
    EXECUTE format('CREATE OPERATOR shadow.%s (%s RIGHTARG = %s, FUNCTION = shadow.%I)',
                   o.oprname, 'LEFTARG = ' || o.l || ',', o.r, 'op_' || o.oid);
  END LOOP;
  -- Catalog relations: views that fail when read (a function scan on the preserved side
  -- of an outer join is run even when the catalog is empty).
  FOR o IN SELECT c.relname, string_agg(quote_ident(a.attname), ', x.' ORDER BY a.attnum) AS cols
           FROM pg_class c
           JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
                              AND a.atttypid NOT IN ('anyarray'::regtype, 'pg_statistic[]'::regtype)
           WHERE c.relnamespace = 'pg_catalog'::regnamespace AND c.relkind IN ('r', 'v', 'p')
           GROUP BY c.relname
  LOOP
    EXECUTE format('CREATE FUNCTION shadow.%I() RETURNS SETOF boolean LANGUAGE plpgsql AS %L',
                   'rel_' || o.relname,
                   format('BEGIN RAISE WARNING USING MESSAGE = %1$L; RAISE EXCEPTION USING MESSAGE = %1$L; END',
                          format('shadow.%s was read', o.relname)));
    EXECUTE format('CREATE VIEW shadow.%I AS SELECT x.%s FROM shadow.%I() LEFT JOIN pg_catalog.%I x ON true',
                   o.relname, o.cols, 'rel_' || o.relname, o.relname);
  END LOOP;
  -- Types: domains whose check fails.
  CREATE FUNCTION shadow.type_used(name text) RETURNS boolean LANGUAGE plpgsql AS $t$
  BEGIN
    RAISE WARNING 'shadow type % was used', name;
    RAISE EXCEPTION 'shadow type % was used', name;
  END $t$;
  FOR o IN SELECT t.typname FROM pg_type t
           WHERE t.typnamespace = 'pg_catalog'::regnamespace AND t.typtype IN ('b', 'r', 'm')
             AND t.typcategory <> 'A'
  LOOP
    EXECUTE format('CREATE DOMAIN shadow.%I AS pg_catalog.%I CHECK (shadow.type_used(%L))',
                   o.typname, o.typname, o.typname);
  END LOOP;
  -- A collation "C" that sorts 'a' before 'B' (ICU's root); without ICU, one that
  -- only has the name.
  BEGIN
    CREATE COLLATION shadow."C" (provider = icu, locale = 'und');
  EXCEPTION WHEN OTHERS THEN
    CREATE COLLATION shadow."C" FROM pg_catalog."POSIX";
  END;
END $gen$;

-- Every comparison operator of the types the editions compare has its look-alike
-- (regrole compares as oid).
SELECT o.oprname, o.oprleft::regtype, o.oprright::regtype
FROM pg_operator o
WHERE o.oprnamespace = 'pg_catalog'::regnamespace
  AND o.oprname IN ('=', '<>', '<', '<=', '>', '>=') AND o.oprleft = o.oprright
  AND o.oprleft IN ('text'::regtype, '"char"'::regtype, 'bytea'::regtype, 'integer'::regtype,
                    'bigint'::regtype, 'xid'::regtype, 'xid8'::regtype, 'timestamptz'::regtype,
                    'interval'::regtype, 'oid'::regtype, 'name'::regtype, 'jsonb'::regtype,
                    'numeric'::regtype, 'boolean'::regtype, 'tid'::regtype)
  AND NOT EXISTS (SELECT FROM pg_operator s WHERE s.oprnamespace = 'shadow'::regnamespace
                  AND (s.oprname, s.oprleft, s.oprright) = (o.oprname, o.oprleft, o.oprright));
-- So do the functions and aggregates the editions call.
SELECT f AS missing_function
FROM unnest(ARRAY['current_setting', 'set_config', 'octet_length', 'clock_timestamp',
                  'pg_current_xact_id', 'pg_current_xact_id_if_assigned', 'sha256',
                  'convert_to', 'textsend', 'concat', 'format', 'pg_column_size',
                  'jsonb_typeof', 'string_agg', 'array_agg', 'count', 'min', 'unnest',
                  'quote_ident', 'make_interval', 'nextval', 'gen_random_uuid',
                  'idem_claim', 'idem_fingerprint']) f
WHERE NOT EXISTS (SELECT FROM pg_proc p WHERE p.pronamespace = 'shadow'::regnamespace
                  AND p.proname = f);

-- ---------------------------------------------------------------------------------
-- The calls, with the look-alikes first. (The statements here name nothing
-- unqualified but the functions' literal arguments.)
SET search_path = shadow, pg_catalog, public;

-- A claim finished in its transaction; COMMIT fires the IK002 check.
BEGIN;
SELECT outcome, state, attempt, retry_after FROM public.idem_claim('sp', 'a');
SELECT outcome, state, attempt FROM public.idem_claim('sp', 'a');
SELECT public.idem_complete('sp', 'a', '{"ok": true}');
COMMIT;
SELECT outcome, state, response, attempt FROM public.idem_claim('sp', 'a');
-- With a fingerprint: new, replay, mismatch.
BEGIN;
SELECT outcome FROM public.idem_claim('sp', 'b', public.idem_fingerprint('{"n": 1}'::pg_catalog.jsonb));
SELECT public.idem_fail('sp', 'b', '{"error": "declined"}');
COMMIT;
SELECT outcome, state, response
FROM public.idem_claim('sp', 'b', public.idem_fingerprint('{"n": 1}'::pg_catalog.jsonb));
SELECT outcome FROM public.idem_claim('sp', 'b', public.idem_fingerprint('{"n": 2}'::pg_catalog.jsonb));
-- IK002: a claim left unfinished at COMMIT; then one released.
BEGIN;
SELECT outcome FROM public.idem_claim('sp', 'c');
COMMIT;
BEGIN;
SELECT outcome FROM public.idem_claim('sp', 'c', ttl => '1 hour');
SELECT public.idem_release('sp', 'c');
COMMIT;
SELECT pg_catalog.count(*) AS released FROM public.idem_lookup('sp', 'c');
-- A lease claim: in progress for others, checkpointed, completed by its attempt.
SELECT outcome, state, attempt FROM public.idem_claim('sp', 'd', lease => '1 hour');
SELECT outcome, attempt, retry_after IS NOT NULL AS retry_after
FROM public.idem_claim('sp', 'd');
SELECT outcome, attempt FROM public.idem_claim('sp', 'd', wait => '0');
SELECT public.idem_checkpoint('sp', 'd', 'step 1', '{"done": 1}', attempt => 1);
SELECT state, attempt, checkpoint, checkpoint_data FROM public.idem_lookup('sp', 'd');
SELECT public.idem_complete('sp', 'd', '"done"', attempt => 1);
SELECT state, response FROM public.idem_lookup('sp', 'd');
-- A stale lease (made so without the look-alikes): abandoned, taken over with its
-- checkpoint, released.
SELECT outcome FROM public.idem_claim('sp', 'e', lease => '1 hour');
SELECT public.idem_checkpoint('sp', 'e', 'half', attempt => 1);
RESET search_path;
UPDATE idempotency.keys SET lease_expires_at = now() - interval '1 second'
  WHERE scope = 'sp' AND key = 'e';
SET search_path = shadow, pg_catalog, public;
SELECT scope, key, attempt, checkpoint FROM public.idem_abandoned('sp');
SELECT outcome, attempt, checkpoint FROM public.idem_claim('sp', 'e', lease => '1 hour');
SELECT public.idem_release('sp', 'e', attempt => 2);
SELECT public.idem_release('sp', 'e', attempt => 2);
-- Settings that take the general paths.
SET idempotency.default_ttl = '2h';
SELECT outcome FROM public.idem_claim('sp', 'g', lease => '1 min', wait => '1 s');
SELECT public.idem_fail('sp', 'g', attempt => 1);
SELECT public.idem_once('sp', 'g-once');
RESET idempotency.default_ttl;
-- A read-only transaction reads, and writes nothing.
BEGIN READ ONLY;
SELECT state FROM public.idem_lookup('sp', 'a');
SELECT outcome FROM public.idem_claim('sp', 'a');
ROLLBACK;
-- Bad arguments.
SELECT outcome FROM public.idem_claim('', 'a');
SELECT public.idem_complete('sp', 'nothing');
SELECT public.idem_key('bad key'::pg_catalog.text);

-- The inbox.
SELECT public.idem_once('sp', 'o1') AS first, public.idem_once('sp', 'o1') AS again;
SELECT public.idem_once('sp', 'o2', ttl => '1 hour', wait => '1 s') AS general,
       public.idem_once('sp', 'o2', wait => '1 s') AS general_again;
BEGIN;
SELECT outcome FROM public.idem_claim('sp', 'o3');
SELECT public.idem_once('sp', 'o3') AS own_claim;
SELECT public.idem_release('sp', 'o3');
COMMIT;
SELECT public.idem_once_many('sp', '{m1,o1,m1,m2}') AS batch,
       public.idem_once_many('sp', '{m2,m3}', ttl => '1 hour') AS again;
SELECT public.idem_forget('sp', 'o1') AS forgot, public.idem_forget('sp', 'o1') AS again;
-- More than 48 new keys in a transaction: past 48 the writes take no subtransaction.
BEGIN;
SELECT pg_catalog.count(*) FILTER (
         WHERE public.idem_once('sp', ('sub-' OPERATOR(pg_catalog.||) i)::public.idem_key)) AS applied
FROM pg_catalog.generate_series(1, 50) i;
SELECT outcome FROM public.idem_claim('sp', 'sub-claim');
SELECT public.idem_complete('sp', 'sub-claim');
SELECT public.idem_apply_version('sp', 'sub-entity', 1);
COMMIT;

-- Keys, fingerprints, derived keys. ("a" sorts after "B" bytewise, before it in the
-- look-alike "C" collation.)
SELECT public.idem_key('k-text'::pg_catalog.text) AS from_text,
       public.idem_key('7f1b5c1e-8a1f-4e0e-9c43-5b3e8e2d1a00'::pg_catalog.uuid) AS from_uuid,
       public.idem_key_send('abc') AS wire;
SELECT public.idem_fingerprint('{"b": 1.50, "a": "x", "B": [1, 2.0]}'::pg_catalog.jsonb) AS flat;
SELECT public.idem_fingerprint('{"b": 1, "a": "x", "B": 2}'::pg_catalog.jsonb) AS flat_object;
SELECT public.idem_fingerprint('{"o": {"b": 1, "a": {"B": "\\", "a": 0.10}}, "A": [true, null]}'::pg_catalog.jsonb)
  AS nested;
SELECT public.idem_fingerprint('[3, "x", {"z": 1, "Z": 2}]'::pg_catalog.jsonb) AS array,
       public.idem_fingerprint('-0.0'::pg_catalog.jsonb) AS number;
SELECT public.idem_fingerprint('request'::pg_catalog.text) AS text,
       public.idem_fingerprint('\x0001ff'::pg_catalog.bytea) AS bytes;
SELECT public.idem_fingerprint(NULL::pg_catalog.jsonb);
SELECT public.idem_derive('root', 'step 1') AS derived;

-- Messaging.
SELECT public.idem_emit('sp-topic', '{"n": 1}', 'agg-1', event_id => 'sp-e1') AS given,
       public.idem_emit('sp-topic', '{"n": 1}', event_id => 'sp-e1') AS again;
SELECT public.idem_emit('sp-topic', '{"n": 2}', 'agg-1', '{"h": "v"}') IS NOT NULL AS emitted,
       public.idem_emit('sp-topic', '{"n": 3}') IS NOT NULL AS without_aggregate;
SELECT public.idem_emit('sp-topic', '{"n": 4}', 'agg-2', event_id => 'sp-e4');
CREATE TEMP TABLE sp_claimed AS
  SELECT * FROM public.idem_outbox_claim('sp-relay', 10, '1 min', '{sp-topic}');
SELECT topic, aggregate, seq, payload, headers, attempt FROM pg_temp.sp_claimed;
SELECT public.idem_outbox_ack('sp-relay', '{sp-e1}') AS acked,
       public.idem_outbox_dead('sp-relay', '{sp-e4}', 'poison') AS dead;
SELECT event_id, topic, aggregate, seq, payload, attempt, reason
FROM public.idem_outbox_dead_letters('sp-topic');
SELECT public.idem_outbox_retry('{sp-e4}') AS retried;
SELECT event_id, seq, attempt FROM public.idem_outbox_claim('sp-relay', 10, '1 min', '{sp-topic}');
SELECT public.idem_apply_version('sp', 'entity', 1) AS first,
       public.idem_apply_version('sp', 'entity', 1) AS duplicate,
       public.idem_apply_version('sp', 'entity', 2, '1 hour') AS newer;

-- Another role: row-level security, and who may add keys.
SET ROLE regress_idem_shadowed;
BEGIN;
SELECT outcome FROM public.idem_claim('sp', 'a');
SELECT public.idem_complete('sp', 'a', '"mine"');
COMMIT;
SELECT outcome, response FROM public.idem_claim('sp', 'a');
SELECT state, response FROM public.idem_lookup('sp', 'a');
SELECT public.idem_once('sp', 'r1') AS once, public.idem_apply_version('sp', 'entity', 1) AS applied;
SELECT public.idem_forget('sp', 'a') AS forgot;
RESET ROLE;

-- Operations.
SELECT public.idem_once('sp', 'expired', ttl => '1 ms');
SELECT pg_catalog.pg_sleep(0.01);
SELECT public.idem_reap() AS reaped \gset
SELECT keys_total, pending, completed, failed, abandoned, stale_leases
FROM public.idem_stats() \gset shadowed_

RESET search_path;
-- ---------------------------------------------------------------------------------

-- What the calls left, read without the look-alikes.
SELECT :reaped >= 1 AS reaped;
SELECT (keys_total, pending, completed, failed, abandoned, stale_leases) =
       (:shadowed_keys_total, :shadowed_pending, :shadowed_completed, :shadowed_failed,
        :shadowed_abandoned, :shadowed_stale_leases) AS same_stats
FROM idem_stats();
SELECT count(*) AS expired_left FROM idem_lookup('sp', 'expired');
SELECT state, response FROM idem_lookup('sp', 'a');
SELECT public.idem_fingerprint('{"o": {"b": 1, "a": {"B": "\\", "a": 0.10}}, "A": [true, null]}'::jsonb) =
       sha256(convert_to('{"A":[true,null],"o":{"a":{"B":"\\","a":0.1},"b":1}}', 'UTF8'))
       AS nested_is_canonical;

-- Clean up.
SELECT idem_forget('sp', k::idem_key)
FROM unnest(ARRAY['a', 'b', 'd', 'g', 'g-once', 'o2', 'm1', 'm2', 'm3', 'sub-claim']) k;
SELECT count(*) FILTER (WHERE idem_forget('sp', ('sub-' || i)::idem_key)) AS forgot
FROM generate_series(1, 50) i;
SET ROLE regress_idem_shadowed;
SELECT idem_forget('sp', 'r1');
RESET ROLE;
SELECT idem_outbox_ack('sp-relay', array_agg(event_id)) FROM sp_claimed;
SET client_min_messages = warning;
DROP SCHEMA shadow CASCADE;
RESET client_min_messages;
DROP ROLE regress_idem_shadowed;
