-- The SQL-only edition, part 4: reaping, monitoring, scheduling, the install notice.
--
-- There is no background worker: idem_reap() makes the worker's pass when it is
-- called, by pg_cron (idem_schedule_reaping()) or by an application's job. Expiry
-- itself is by time, as in the native edition: a key past expires_at is free at once
-- whether or not it was reaped.

-- What idem_reap has done since the edition was installed (idem_stats shows it).
CREATE TABLE idempotency.reap_stats (
  reaped_total    bigint      NOT NULL,
  reclaimed_total bigint      NOT NULL,
  last_reap_at    timestamptz,
  last_reap_ms    bigint
);
CREATE UNIQUE INDEX reap_stats_one_row ON idempotency.reap_stats ((true));
INSERT INTO idempotency.reap_stats VALUES (0, 0, NULL, NULL);
REVOKE ALL ON TABLE idempotency.reap_stats FROM PUBLIC;

------------------------------------------------------------------------------
-- idem_reap(max_rows): one pass in the current database: (a) deletes expired rows that
-- are not live, skipping rows that live transactions are writing or locking, and the
-- rows of roles that no longer exist; (b) marks pending rows whose lease ran out
-- abandoned; and removes expired applied versions and delivered outbox events past
-- idempotency.outbox_retention. Returns the key rows deleted. It sees every role's
-- keys: SECURITY DEFINER (the owner is not subject to the store's row-level
-- security), and granted to no one (superusers, the owner, or roles granted it).
------------------------------------------------------------------------------
CREATE FUNCTION idem_reap(max_rows bigint DEFAULT NULL) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  started timestamptz := clock_timestamp();
  now timestamptz := started;
  budget bigint := coalesce(max_rows, 9223372036854775807);
  deleted bigint := 0;
  orphans bigint := 0;
  reclaimed bigint := 0;
BEGIN
  IF max_rows < 0 THEN
    RAISE EXCEPTION 'max_rows must not be negative' USING ERRCODE = 'invalid_parameter_value';
  END IF;
  PERFORM idempotency._check_writable('idem_reap');

  -- (a) Expired rows that are not live: past expires_at, and not pending under a live
  -- lease. Rows another transaction writes or locks now are skipped (SKIP LOCKED);
  -- rows it inserted are not visible yet.
  WITH gone AS (
    DELETE FROM idempotency.keys k
      WHERE k.ctid IN (SELECT e.ctid FROM idempotency.keys e
                       WHERE e.expires_at <= now
                         AND NOT (e.state = 'p' AND e.lease_expires_at > now)
                         AND e.xact IS DISTINCT FROM pg_current_xact_id_if_assigned()
                       ORDER BY e.expires_at
                       LIMIT budget
                       FOR UPDATE SKIP LOCKED)
        AND k.expires_at <= now AND NOT (k.state = 'p' AND k.lease_expires_at > now)
      RETURNING 1)
  SELECT count(*) INTO deleted FROM gone;
  -- The rows of roles that no longer exist (DROP ROLE leaves them: regrole is an oid).
  IF deleted < budget THEN
    WITH gone AS (
      DELETE FROM idempotency.keys k
        WHERE k.ctid IN (SELECT e.ctid FROM idempotency.keys e
                         WHERE NOT EXISTS (SELECT FROM pg_roles a WHERE a.oid = e.role)
                         LIMIT budget - deleted
                         FOR UPDATE SKIP LOCKED)
        RETURNING 1)
    SELECT count(*) INTO orphans FROM gone;
    deleted := deleted + orphans;
  END IF;

  -- (b) Pending rows whose lease ran out: abandoned (their late holder is fenced out
  -- with IK003; a retry takes over with the checkpoint). lease stays, so
  -- idem_abandoned finds them.
  WITH stale AS (
    UPDATE idempotency.keys k SET state = 'a', lease_expires_at = NULL
      WHERE k.ctid IN (SELECT e.ctid FROM idempotency.keys e
                       WHERE e.lease_expires_at <= now AND e.state = 'p'
                       ORDER BY e.lease_expires_at
                       LIMIT budget
                       FOR UPDATE SKIP LOCKED)
        AND k.state = 'p' AND k.lease_expires_at <= now
      RETURNING 1)
  SELECT count(*) INTO reclaimed FROM stale;

  -- Messaging's (sqlonly/sql/20_messaging.sql): expired applied versions, and delivered
  -- outbox events past idempotency.outbox_retention; counted with the keys' rows.
  IF deleted < budget THEN
    deleted := deleted + idempotency._reap_applied_versions(budget - deleted);
  END IF;
  IF deleted < budget THEN
    deleted := deleted + idempotency._reap_outbox(budget - deleted);
  END IF;

  UPDATE idempotency.reap_stats SET
      reaped_total = reaped_total + deleted, reclaimed_total = reclaimed_total + reclaimed,
      last_reap_at = started,
      last_reap_ms = (extract(epoch FROM clock_timestamp() - started) * 1000)::bigint;
  RETURN deleted;
END $$;
REVOKE ALL ON FUNCTION idem_reap(bigint) FROM PUBLIC;

------------------------------------------------------------------------------
-- idem_stats(): the native columns in the native order. Counts by state are exact up
-- to 1000 pages of the store, beyond from the planner's statistics (as fresh as the
-- last ANALYZE), so it answers quickly whatever the size. worker_pid is NULL (no
-- worker), the per-call counters of 1.5 are NULL (nothing is written per call), and
-- `edition` says 'sql'. node_only: as native; this edition has one node.
------------------------------------------------------------------------------
CREATE FUNCTION idem_stats(node_only boolean DEFAULT false)
RETURNS TABLE(keys_total bigint, pending bigint, completed bigint, failed bigint,
              abandoned bigint, expired_awaiting_reap bigint, reaped_total bigint,
              reclaimed_total bigint, last_reap_at timestamptz, last_reap_ms bigint,
              worker_pid integer, stale_leases bigint, outbox_undelivered bigint,
              outbox_dead bigint, outbox_oldest_undelivered_at timestamptz,
              claims_total bigint, replays_total bigint, fingerprint_mismatches_total bigint,
              in_progress_total bigint, edition text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  now timestamptz := clock_timestamp();
  store oid := 'idempotency.keys'::regclass;
  total double precision;
  state_stats record;
  bounds timestamptz[];
BEGIN
  IF (SELECT c.relpages FROM pg_class c WHERE c.oid = store) <= 1000 THEN
    SELECT count(*),
           count(*) FILTER (WHERE k.state = 'p' AND live),
           count(*) FILTER (WHERE k.state = 'c' AND live),
           count(*) FILTER (WHERE k.state = 'f' AND live),
           count(*) FILTER (WHERE k.state = 'a' AND live),
           count(*) FILTER (WHERE NOT live)
      INTO keys_total, pending, completed, failed, abandoned, expired_awaiting_reap
      FROM idempotency.keys k,
           LATERAL (SELECT k.expires_at > now OR (k.state = 'p' AND coalesce(k.lease_expires_at > now, false)) AS live) l;
  ELSE
    SELECT greatest(c.reltuples, 0) INTO total FROM pg_class c WHERE c.oid = store;
    keys_total := total::bigint;
    pending := 0; completed := 0; failed := 0; abandoned := 0; expired_awaiting_reap := 0;
    FOR state_stats IN
      SELECT v.value, f.freq
        FROM pg_stats s,
             unnest(s.most_common_vals::text::text[]) WITH ORDINALITY AS v(value, i)
             JOIN unnest(s.most_common_freqs) WITH ORDINALITY AS f(freq, i) USING (i)
        WHERE s.schemaname = 'idempotency' AND s.tablename = 'keys' AND s.attname = 'state'
    LOOP
      CASE state_stats.value
        WHEN 'p' THEN pending := (state_stats.freq * total)::bigint;
        WHEN 'c' THEN completed := (state_stats.freq * total)::bigint;
        WHEN 'f' THEN failed := (state_stats.freq * total)::bigint;
        WHEN 'a' THEN abandoned := (state_stats.freq * total)::bigint;
        ELSE NULL;
      END CASE;
    END LOOP;
    SELECT s.histogram_bounds::text::timestamptz[] INTO bounds
      FROM pg_stats s
      WHERE s.schemaname = 'idempotency' AND s.tablename = 'keys' AND s.attname = 'expires_at';
    IF cardinality(bounds) > 1 THEN
      expired_awaiting_reap := (total * (SELECT count(*) FROM unnest(bounds) b WHERE b <= now)
                                / cardinality(bounds))::bigint;
    END IF;
  END IF;
  SELECT r.reaped_total, r.reclaimed_total, r.last_reap_at, r.last_reap_ms
    INTO reaped_total, reclaimed_total, last_reap_at, last_reap_ms
    FROM idempotency.reap_stats r;
  worker_pid := NULL;
  -- Stale leases, exactly through their index, up to 10000.
  SELECT count(*) INTO stale_leases
    FROM (SELECT FROM idempotency.keys k
          WHERE k.lease_expires_at <= now AND k.lease_expires_at IS NOT NULL AND k.state = 'p'
          LIMIT 10000) s;
  SELECT o.outbox_undelivered, o.outbox_dead, o.outbox_oldest_undelivered_at
    INTO outbox_undelivered, outbox_dead, outbox_oldest_undelivered_at
    FROM idempotency._outbox_stats() o;
  claims_total := NULL;
  replays_total := NULL;
  fingerprint_mismatches_total := NULL;
  in_progress_total := NULL;
  edition := 'sql';
  RETURN NEXT;
END $$;
REVOKE ALL ON FUNCTION idem_stats(boolean) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION idem_stats(boolean) TO pg_monitor;

------------------------------------------------------------------------------
-- This install's idem_reap, written into idempotency._reap_function() when the install
-- runs (schema-qualified, with its exact signature), never found by name: a function
-- another role creates anywhere cannot stand in for it. By name rather than by OID, so
-- that a dump of the plain install restores it.
------------------------------------------------------------------------------
DO $$
BEGIN
  EXECUTE pg_catalog.format(
    'CREATE FUNCTION idempotency._reap_function() RETURNS pg_catalog.regprocedure '
    'LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp AS %L',
    pg_catalog.format('SELECT %L::pg_catalog.regprocedure',
                      pg_catalog.format('%I.idem_reap(bigint)', pg_catalog.current_schema())));
END $$;

-- The statement that reaps, as pg_cron or an application job runs it: qualified, and
-- typed so that no other idem_reap in the schema matches the call better.
CREATE FUNCTION idempotency._reap_command() RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
  SELECT format('SELECT %s(NULL::pg_catalog.int8)', idempotency._reap_function()::regproc)
$$;

-- pg_cron's schema in this database (the one its extension created: "cron"), or NULL
-- where pg_cron is not installed here. Found through the extension, so that a schema
-- of that name made by another role is never taken for it.
CREATE FUNCTION idempotency._cron_schema() RETURNS name
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
  SELECT n.nspname FROM pg_extension e
  JOIN pg_depend d ON d.refclassid = 'pg_extension'::regclass AND d.refobjid = e.oid
                  AND d.classid = 'pg_namespace'::regclass AND d.deptype = 'e'
  JOIN pg_namespace n ON n.oid = d.objid
  WHERE e.extname = 'pg_cron'
$$;

------------------------------------------------------------------------------
-- Reaping on a schedule. With pg_cron in this database, idem_schedule_reaping()
-- schedules idem_reap() (job 'idempotency-reap-<database>', every `every`, run as the
-- calling role, which must be allowed to execute idem_reap) and returns the job's id;
-- a second call replaces the schedule. Without pg_cron it fails with 55000 and says
-- what to run instead.
------------------------------------------------------------------------------
CREATE FUNCTION idem_schedule_reaping(every text DEFAULT '10 seconds') RETURNS bigint
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  job_name text := 'idempotency-reap-' || current_database();
  command text := idempotency._reap_command();
  cron_schema name := idempotency._cron_schema();
  -- Superuser-only settings, which pg_settings hides (no row) from a role without
  -- pg_read_all_settings. cron.database_name exists only where pg_cron is loaded.
  cron_database text := (SELECT s.setting FROM pg_settings s WHERE s.name = 'cron.database_name');
  preload_visible boolean := EXISTS (SELECT FROM pg_settings s WHERE s.name = 'shared_preload_libraries');
  elsewhere text;
  app_job text;
  job bigint;
BEGIN
  IF every IS NULL THEN
    RAISE EXCEPTION 'every must not be null' USING ERRCODE = 'null_value_not_allowed';
  END IF;
  IF cron_schema IS NULL THEN
    elsewhere := format('SELECT cron.schedule_in_database(%L, %L, %L, %L);',
                        job_name, every, command, current_database());
    app_job := format('have an application job run %s; every few seconds', command);
    IF cron_database IS NOT NULL AND cron_database <> current_database() THEN
      RAISE EXCEPTION 'pg_cron is not installed in this database'
        USING ERRCODE = 'object_not_in_prerequisite_state',
              DETAIL = format('pg_cron runs in database %s.', cron_database),
              HINT = format('In database %s run: %s', cron_database, elsewhere);
    ELSIF cron_database IS NOT NULL THEN
      RAISE EXCEPTION 'pg_cron is not installed in this database'
        USING ERRCODE = 'object_not_in_prerequisite_state',
              HINT = format('CREATE EXTENSION pg_cron here, or %s.', app_job);
    ELSIF preload_visible THEN
      RAISE EXCEPTION 'pg_cron is not installed in this database'
        USING ERRCODE = 'object_not_in_prerequisite_state',
              DETAIL = 'pg_cron is not loaded on this server.',
              HINT = format('Add pg_cron to shared_preload_libraries and CREATE EXTENSION pg_cron, or %s.', app_job);
    END IF;
    -- This role may not see whether or where pg_cron runs.
    RAISE EXCEPTION 'pg_cron is not installed in this database'
      USING ERRCODE = 'object_not_in_prerequisite_state',
            HINT = format('Where this server loads pg_cron, in the database its setting cron.database_name '
                          'names run: %s Otherwise %s.', elsewhere, app_job);
  END IF;
  EXECUTE format('SELECT %I.schedule_in_database($1, $2, $3, $4)', cron_schema)
    INTO job USING job_name, every, command, current_database();
  RETURN job;
END $$;
REVOKE ALL ON FUNCTION idem_schedule_reaping(text) FROM PUBLIC;

-- Says which serves this database: a pg_cron job of idem_reap, or nothing yet (then
-- what to run), as the native edition's NOTICE says when no worker serves it.
CREATE FUNCTION idempotency._install_notice() RETURNS void
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  cron_schema name := idempotency._cron_schema();
  job record;
BEGIN
  IF cron_schema IS NOT NULL THEN
    FOR job IN EXECUTE format('SELECT j.jobid, j.schedule FROM %I.job j
                               WHERE j.jobname = $1 AND j.active', cron_schema)
               USING 'idempotency-reap-' || current_database() LOOP
      RAISE NOTICE 'idempotency (SQL-only edition): pg_cron job % runs idem_reap() in this database (schedule "%")',
        job.jobid, job.schedule;
      RETURN;
    END LOOP;
    RAISE NOTICE 'idempotency (SQL-only edition): nothing reaps expired keys or reclaims stale leases in this database yet'
      USING HINT = 'pg_cron is installed: SELECT idem_schedule_reaping(); schedules idem_reap() every 10 seconds.';
  ELSE
    RAISE NOTICE 'idempotency (SQL-only edition): nothing reaps expired keys or reclaims stale leases in this database'
      USING HINT = format('Where pg_cron is available, CREATE EXTENSION pg_cron and SELECT idem_schedule_reaping();. '
                          'Otherwise have an application job run %s; every few seconds.',
                          idempotency._reap_command());
  END IF;
END $$;
REVOKE ALL ON FUNCTION idempotency._install_notice() FROM PUBLIC;

-- The notice waits for COMMIT, as the native edition's does: PostgreSQL runs an
-- extension script (pg_tle's CREATE EXTENSION, ALTER EXTENSION ... UPDATE) with
-- client_min_messages raised to WARNING, so a NOTICE raised there never reaches the
-- user; a deferred trigger fires after the script, with the user's settings, and not
-- at all if the install is rolled back.
CREATE TABLE idempotency.install_notice (requested_at timestamptz NOT NULL);
REVOKE ALL ON TABLE idempotency.install_notice FROM PUBLIC;
CREATE FUNCTION idempotency._send_install_notice() RETURNS trigger
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  -- Once, however many installs and updates the transaction ran.
  DELETE FROM idempotency.install_notice;
  IF FOUND THEN
    PERFORM idempotency._install_notice();
  END IF;
  RETURN NULL;
END $$;
REVOKE ALL ON FUNCTION idempotency._send_install_notice() FROM PUBLIC;
CREATE CONSTRAINT TRIGGER send_at_commit AFTER INSERT ON idempotency.install_notice
  DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION idempotency._send_install_notice();
INSERT INTO idempotency.install_notice VALUES (pg_catalog.now());
