-- The SQL-only edition, part 3: messaging. The transactional outbox (idem_emit), its
-- relay (idem_outbox_claim, _ack, _dead, _retry, _dead_letters) and ordered apply
-- (idem_apply_version), as the native edition's (SPEC "Messaging"), plus the internal
-- functions idem_stats and idem_reap call for them (30_operations.sql).
--
-- Events belong to the database, not to a role: idem_emit and the relay's functions
-- are SECURITY DEFINER (run as the installing role, which owns the outbox) and are not
-- granted to PUBLIC. idem_apply_version's records belong to a role, as keys do: it runs
-- as its caller (SECURITY INVOKER), and row-level security keeps each role to its own
-- records.
--
-- Waits. A wait for another transaction is a row-lock wait (INSERT ... ON CONFLICT,
-- UPDATE), which PostgreSQL's deadlock detector sees and lock_timeout ends, bounded by
-- idempotency.wait_timeout in the subtransaction that may wait (see
-- idempotency._lock_timeout). Where a call can tell without waiting that no one else
-- holds what it writes, it takes no subtransaction: an emit without event id for an
-- aggregate whose counter it locks at once (or for none), a relay's claim, an ack,
-- dead or retry of events no one else is writing, a duplicate idem_apply_version. An
-- emit for an aggregate waits for another emitter of its id holding nothing, as
-- native: it takes back what it wrote (its subtransaction) and waits in a probe that is
-- rolled back. Past the 48-subtransaction cap (idempotency._take_subtransaction) each
-- of these waits runs the same, bounded, in a subtransaction that is then rolled back,
-- and the write is made again in the transaction itself.

------------------------------------------------------------------------------
-- Tables: the native edition's, plus `xact` (the transaction that wrote the row's
-- version; the native edition asks the row's xmin, which in a subtransaction is the
-- subtransaction's).
------------------------------------------------------------------------------

-- Emission order. An event takes its position after its aggregate's counter, so
-- within an aggregate position order is seq order, and a relay that reads pending
-- events by position meets each aggregate's events in seq order.
CREATE SEQUENCE idempotency.outbox_position;

CREATE TABLE idempotency.outbox (
  event_id         idem_key    NOT NULL,
  position         bigint      NOT NULL,
  topic            text        COLLATE "C" NOT NULL,
  aggregate        text        COLLATE "C",
  seq              bigint,
  payload          jsonb       NOT NULL,
  headers          jsonb,
  emitted_at       timestamptz NOT NULL,
  -- p = pending (ready, or leased while lease_expires_at lies ahead), d = delivered,
  -- x = dead (a dead letter)
  state            "char"      NOT NULL CHECK (state IN ('p', 'd', 'x')),
  attempt          integer     NOT NULL,
  relay            text,
  lease_expires_at timestamptz,
  delivered_at     timestamptz,
  reason           text,
  xact             xid8        NOT NULL,
  CONSTRAINT outbox_pkey PRIMARY KEY (event_id)
) WITH (fillfactor = 80);  -- room for the lease's HOT update
-- The relay's queue: pending events in emission order.
CREATE INDEX outbox_pending_idx ON idempotency.outbox (position) WHERE state = 'p';
-- The dead letters, oldest first.
CREATE INDEX outbox_dead_idx ON idempotency.outbox (position) WHERE state = 'x';
-- idem_reap's way to delivered events past idempotency.outbox_retention.
CREATE INDEX outbox_delivered_idx ON idempotency.outbox (delivered_at) WHERE state = 'd';

-- The last seq given per (topic, aggregate). Kept when the events are removed: a new
-- event continues the sequence its consumers have seen. Its row, updated in place by
-- an emit, is what the next emitter for the aggregate waits for.
CREATE TABLE idempotency.outbox_aggregates (
  topic     text   COLLATE "C" NOT NULL,
  aggregate text   COLLATE "C" NOT NULL,
  last_seq  bigint NOT NULL,
  CONSTRAINT outbox_aggregates_pkey PRIMARY KEY (topic, aggregate)
);

-- idem_apply_version's record: the last version applied per (role, scope, entity).
CREATE TABLE idempotency.applied_versions (
  role       regrole     NOT NULL,
  expires_at timestamptz NOT NULL,
  version    bigint      NOT NULL,
  scope      text        COLLATE "C" NOT NULL,
  entity     text        COLLATE "C" NOT NULL,
  xact       xid8        NOT NULL,
  CONSTRAINT applied_versions_pkey PRIMARY KEY (role, scope, entity)
);
CREATE INDEX applied_versions_expires_at_idx ON idempotency.applied_versions (expires_at);

-- The outbox is the database's, reached through the functions only. A role's applied
-- versions are its own, as its keys are (00_store.sql): it may read and write them
-- directly too, never another role's.
REVOKE ALL ON TABLE idempotency.outbox, idempotency.outbox_aggregates,
  idempotency.applied_versions FROM PUBLIC;
REVOKE ALL ON SEQUENCE idempotency.outbox_position FROM PUBLIC;
ALTER TABLE idempotency.applied_versions ENABLE ROW LEVEL SECURITY;
CREATE POLICY applied_versions_own_rows ON idempotency.applied_versions
  USING (role OPERATOR(pg_catalog.=) idempotency._me())
  WITH CHECK (role OPERATOR(pg_catalog.=) idempotency._me());
GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE idempotency.applied_versions TO PUBLIC;

-- Installed as an extension (pg_tle), the rows go into pg_dump output as the native
-- edition's do; installed as plain SQL, the tables are dumped like any other.
DO $$
BEGIN
  PERFORM pg_catalog.pg_extension_config_dump('idempotency.outbox', '');
  PERFORM pg_catalog.pg_extension_config_dump('idempotency.outbox_aggregates', '');
  PERFORM pg_catalog.pg_extension_config_dump('idempotency.applied_versions', '');
  PERFORM pg_catalog.pg_extension_config_dump('idempotency.outbox_position', '');
EXCEPTION WHEN feature_not_supported THEN
  NULL;  -- not run by CREATE EXTENSION
END $$;

------------------------------------------------------------------------------
-- Shared by the functions below.
------------------------------------------------------------------------------

-- A jsonb argument's bytes as native counts them (its binary form without header):
-- recomputed for a value that may be compressed (read from a table) or small (a short
-- header, as in a tuple).
CREATE FUNCTION idempotency._jsonb_bytes(value jsonb) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN CASE WHEN pg_catalog.pg_column_size(value) OPERATOR(pg_catalog.<) 130
                 OR pg_catalog.pg_column_compression(value) IS NOT NULL
            THEN pg_catalog.pg_column_size(value::pg_catalog.text::pg_catalog.jsonb)
                 OPERATOR(pg_catalog.-) 4
            ELSE pg_catalog.pg_column_size(value) OPERATOR(pg_catalog.-) 4 END;

-- An event's headers against idempotency.max_response_size, then its payload and
-- headers together (54000); the payload alone is checked before.
CREATE FUNCTION idempotency._check_headers_size(payload_bytes bigint, headers jsonb)
RETURNS void
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  headers_bytes bigint := idempotency._jsonb_bytes(headers);
  max_size bigint;
BEGIN
  PERFORM idempotency._check_size(headers_bytes, 'headers');
  max_size := idempotency._setting('idempotency.max_response_size', 'B', 1048576);
  IF payload_bytes + headers_bytes > max_size THEN
    RAISE EXCEPTION 'payload and headers are too large'
      USING ERRCODE = 'program_limit_exceeded',
            DETAIL = format('They are %s bytes together; idempotency.max_response_size is %s bytes.',
                            payload_bytes + headers_bytes, max_size);
  END IF;
END $$;

CREATE FUNCTION idempotency._raise_emit_in_progress(what text) RETURNS void
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  RAISE EXCEPTION 'another transaction in progress is emitting for the same %', what
    USING ERRCODE = 'IK005', DETAIL = 'It did not end within idempotency.wait_timeout.',
          HINT = 'Retry later.';
END $$;

-- Waits for another transaction in progress that emits `event_id`, taking nothing: a
-- probe row inserted in a subtransaction that is then rolled back. 'busy' (the wait
-- ran out: `timeout`, in ms), 'stored' (an event with the id is committed) or 'free'
-- (no other transaction emits it). `timeout` NULL: the caller's own lock_timeout
-- bounds the wait, and its 55P03 is raised.
CREATE FUNCTION idempotency._event_id_probe(event_id text, timeout text) RETURNS text
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  inserted boolean;
BEGIN
  BEGIN
    IF timeout IS NOT NULL THEN
      PERFORM set_config('lock_timeout', timeout, true);
    END IF;
    INSERT INTO idempotency.outbox AS o (event_id, position, topic, payload, emitted_at, state,
                                         attempt, xact)
      VALUES (_event_id_probe.event_id, 0, '-', '{}', '-infinity', 'x', 0, '0')
      ON CONFLICT ON CONSTRAINT outbox_pkey DO NOTHING
      RETURNING true INTO inserted;
    RAISE EXCEPTION USING ERRCODE = 'IK999', MESSAGE = coalesce(inserted, false)::text;
  EXCEPTION
    WHEN lock_not_available THEN
      IF timeout IS NULL THEN
        RAISE;
      END IF;
      RETURN 'busy';
    WHEN SQLSTATE 'IK999' THEN
      RETURN CASE WHEN SQLERRM = 'true' THEN 'free' ELSE 'stored' END;
  END;
END $$;
REVOKE ALL ON FUNCTION idempotency._event_id_probe(text, text) FROM PUBLIC;

-- idem_apply_version's scope, entity and version: raises the first one wrong, in the
-- native order (22004, then 22023).
CREATE FUNCTION idempotency._check_apply_arguments(scope text, entity text, version bigint)
RETURNS void
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  IF scope IS NULL THEN
    RAISE EXCEPTION 'scope must not be null' USING ERRCODE = 'null_value_not_allowed';
  END IF;
  IF entity IS NULL THEN
    RAISE EXCEPTION 'entity must not be null' USING ERRCODE = 'null_value_not_allowed';
  END IF;
  IF version IS NULL THEN
    RAISE EXCEPTION 'version must not be null' USING ERRCODE = 'null_value_not_allowed';
  END IF;
  PERFORM idempotency._check_name(scope, 'scope');
  PERFORM idempotency._check_name(entity, 'entity');
END $$;

------------------------------------------------------------------------------
-- idem_emit
------------------------------------------------------------------------------
CREATE FUNCTION idem_emit(topic text, payload jsonb, aggregate text DEFAULT NULL,
                          headers jsonb DEFAULT NULL, event_id idem_key DEFAULT NULL)
RETURNS idem_key
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_topic text := topic;
  v_payload jsonb := payload;
  v_aggregate text := aggregate;
  v_headers jsonb := headers;
  given boolean := event_id IS NOT NULL;
  -- The id as an idem_key (the argument's own type, which the body cannot name): a
  -- given id is stored and returned as it came, without checking it again.
  v_id event_id%TYPE := event_id;
  v_seq bigint;
  payload_bytes bigint;
  max_size bigint;
  started timestamptz;
  wait_ms bigint;
  remaining bigint;
  timeout text;
  own text;
  waiting_for text;
  id_busy boolean;
  written boolean;
  taken integer;
  keep boolean;
BEGIN
  -- Arguments, in the native order; then 25006, before anything is read. (Checked
  -- here, and the helpers called only to raise: each call of a function with a SET
  -- clause costs about as much as the emit's insert.)
  IF v_topic IS NULL OR octet_length(v_topic) NOT BETWEEN 1 AND 255 THEN
    PERFORM idempotency._check_name(v_topic, 'topic');
  END IF;
  IF v_payload IS NULL THEN
    RAISE EXCEPTION 'payload must not be null' USING ERRCODE = 'null_value_not_allowed';
  END IF;
  max_size := CASE WHEN coalesce(current_setting('idempotency.max_response_size', true), '') = ''
                   THEN 1048576
                   ELSE idempotency._setting('idempotency.max_response_size', 'B', 1048576) END;
  payload_bytes := idempotency._jsonb_bytes(v_payload);
  IF payload_bytes > max_size THEN
    PERFORM idempotency._check_size(payload_bytes, 'payload');
  END IF;
  IF v_aggregate IS NOT NULL AND octet_length(v_aggregate) NOT BETWEEN 1 AND 255 THEN
    PERFORM idempotency._check_name(v_aggregate, 'aggregate');
  END IF;
  IF v_headers IS NOT NULL
     AND payload_bytes + idempotency._jsonb_bytes(v_headers) > max_size THEN
    PERFORM idempotency._check_headers_size(payload_bytes, v_headers);
  END IF;
  IF current_setting('transaction_read_only') = 'on' THEN
    PERFORM idempotency._check_writable('idem_emit');
  END IF;

  IF given THEN
    -- At most one event per id: one stored (committed, or by this transaction), in any
    -- state, is the one.
    PERFORM FROM idempotency.outbox o WHERE o.event_id = v_id;
    IF FOUND THEN
      RETURN v_id;
    END IF;
  ELSE
    v_id := gen_random_uuid()::text;
    IF v_aggregate IS NOT NULL THEN
      -- The aggregate's next seq, if its counter can be locked at once (no one else
      -- holds it, or this transaction does): the counter's row, updated in place, then
      -- makes the next emitter for the aggregate wait until this transaction ends.
      UPDATE idempotency.outbox_aggregates a SET last_seq = a.last_seq + 1
        WHERE a.ctid = (SELECT f.ctid FROM idempotency.outbox_aggregates f
                        WHERE f.topic = v_topic AND f.aggregate = v_aggregate
                        FOR UPDATE SKIP LOCKED)
        RETURNING a.last_seq INTO v_seq;
    END IF;
    IF v_aggregate IS NULL OR v_seq IS NOT NULL THEN
      -- Nothing to wait for.
      INSERT INTO idempotency.outbox (event_id, position, topic, aggregate, seq, payload,
                                      headers, emitted_at, state, attempt, xact)
        VALUES (v_id, nextval('idempotency.outbox_position'), v_topic, v_aggregate, v_seq,
                v_payload, v_headers, clock_timestamp(), 'p', 0, pg_current_xact_id());
      RETURN v_id;
    END IF;
  END IF;

  -- What may wait, at most idempotency.wait_timeout in all, as the native edition
  -- waits: for the aggregate's counter holding nothing (its holder may be about to emit
  -- this id); then the id: without an aggregate the insert waits for another
  -- transaction emitting it; with one it is inserted without waiting (1 ms): if another
  -- transaction is emitting it, everything is taken back (the subtransaction), that
  -- transaction is waited for holding nothing, and the emit looks again. Past the
  -- 48-subtransaction cap (idempotency._take_subtransaction) the same waits run in a
  -- subtransaction that is then rolled back (a rolled-back subtransaction takes no slot
  -- of PostgreSQL's cache of them), and the writes are made again in the transaction
  -- itself: only another transaction writing the counter or the id in between those
  -- two is waited for without the bound.
  -- (No NULLIF: it compares with the caller's `=`.)
  taken := CASE WHEN current_setting('idempotency.subtransactions', true) = '' THEN 0
                ELSE coalesce(current_setting('idempotency.subtransactions', true), '0')::integer END;
  keep := taken < 48;
  IF keep THEN
    PERFORM set_config('idempotency.subtransactions', (taken + 1)::text, true);
  END IF;
  started := clock_timestamp();
  own := current_setting('lock_timeout');
  IF own = '0' AND coalesce(current_setting('idempotency.wait_timeout', true), '') = '' THEN
    wait_ms := 5000;  -- the defaults
  ELSE
    wait_ms := idempotency._wait_ms(NULL);
  END IF;
  FOR round IN 1 .. 1000 LOOP
    remaining := wait_ms - (extract(epoch FROM clock_timestamp() - started) * 1000)::bigint;
    timeout := CASE WHEN own = '0' THEN greatest(remaining, 1)::text
                    ELSE idempotency._lock_timeout(remaining) END;
    id_busy := false;
    written := false;
    BEGIN
      IF timeout IS NOT NULL THEN
        PERFORM set_config('lock_timeout', timeout, true);
      END IF;
      IF v_aggregate IS NOT NULL THEN
        waiting_for := 'aggregate';
        v_seq := NULL;
        UPDATE idempotency.outbox_aggregates a SET last_seq = a.last_seq + 1
          WHERE a.ctid = (SELECT f.ctid FROM idempotency.outbox_aggregates f
                          WHERE f.topic = v_topic AND f.aggregate = v_aggregate
                          FOR UPDATE SKIP LOCKED)
          RETURNING a.last_seq INTO v_seq;
        IF v_seq IS NULL THEN
          INSERT INTO idempotency.outbox_aggregates AS a (topic, aggregate, last_seq)
            VALUES (v_topic, v_aggregate, 1)
            ON CONFLICT ON CONSTRAINT outbox_aggregates_pkey DO UPDATE SET last_seq = a.last_seq + 1
            RETURNING a.last_seq INTO v_seq;
        END IF;
      END IF;
      IF given THEN
        waiting_for := 'event id';
        IF v_aggregate IS NOT NULL THEN
          PERFORM set_config('lock_timeout', '1', true);  -- not holding the counter
        END IF;
      END IF;
      INSERT INTO idempotency.outbox AS o (event_id, position, topic, aggregate, seq, payload,
                                           headers, emitted_at, state, attempt, xact)
        VALUES (v_id, nextval('idempotency.outbox_position'), v_topic, v_aggregate, v_seq,
                v_payload, v_headers, clock_timestamp(), 'p', 0, pg_current_xact_id())
        ON CONFLICT ON CONSTRAINT outbox_pkey DO NOTHING;
      written := FOUND;
      IF NOT written AND v_seq IS NOT NULL THEN
        -- Another transaction stored the id meanwhile: that event is the one, and the
        -- seq taken goes back (the counter stays locked: no one took the next).
        UPDATE idempotency.outbox_aggregates a SET last_seq = a.last_seq - 1
          WHERE a.topic = v_topic AND a.aggregate = v_aggregate;
      END IF;
      PERFORM set_config('lock_timeout', own, true);
      IF NOT keep THEN
        RAISE EXCEPTION USING ERRCODE = 'IK999';  -- past the cap: it only waited
      END IF;
    EXCEPTION
      WHEN lock_not_available THEN
        IF waiting_for = 'event id' AND v_aggregate IS NOT NULL THEN
          id_busy := true;  -- another transaction emits the id: taken back, waited for below
        ELSIF timeout IS NULL THEN
          RAISE;  -- the caller's own lock_timeout
        ELSE
          -- The wait ran out. For the aggregate, the native edition looks at the id
          -- first: if another transaction is emitting it, that is what it waited for;
          -- if it is stored by now, it is the one.
          IF given AND waiting_for = 'aggregate' THEN
            CASE idempotency._event_id_probe(v_id, '1')
              WHEN 'busy' THEN waiting_for := 'event id';
              WHEN 'stored' THEN RETURN v_id;
              ELSE NULL;
            END CASE;
          END IF;
          PERFORM idempotency._raise_emit_in_progress(waiting_for);
        END IF;
      WHEN SQLSTATE 'IK999' THEN
        -- Past the cap, after the bounded wait: the writes in the transaction itself
        -- (none when the id was found stored).
        IF NOT written THEN
          RETURN v_id;
        END IF;
        IF v_aggregate IS NOT NULL THEN
          v_seq := NULL;
          UPDATE idempotency.outbox_aggregates a SET last_seq = a.last_seq + 1
            WHERE a.ctid = (SELECT f.ctid FROM idempotency.outbox_aggregates f
                            WHERE f.topic = v_topic AND f.aggregate = v_aggregate
                            FOR UPDATE SKIP LOCKED)
            RETURNING a.last_seq INTO v_seq;
          IF v_seq IS NULL THEN
            INSERT INTO idempotency.outbox_aggregates AS a (topic, aggregate, last_seq)
              VALUES (v_topic, v_aggregate, 1)
              ON CONFLICT ON CONSTRAINT outbox_aggregates_pkey DO UPDATE SET last_seq = a.last_seq + 1
              RETURNING a.last_seq INTO v_seq;
          END IF;
        END IF;
        INSERT INTO idempotency.outbox AS o (event_id, position, topic, aggregate, seq, payload,
                                             headers, emitted_at, state, attempt, xact)
          VALUES (v_id, nextval('idempotency.outbox_position'), v_topic, v_aggregate, v_seq,
                  v_payload, v_headers, clock_timestamp(), 'p', 0, pg_current_xact_id())
          ON CONFLICT ON CONSTRAINT outbox_pkey DO NOTHING;
        IF NOT FOUND AND v_seq IS NOT NULL THEN
          UPDATE idempotency.outbox_aggregates a SET last_seq = a.last_seq - 1
            WHERE a.topic = v_topic AND a.aggregate = v_aggregate;
        END IF;
        RETURN v_id;
    END;
    IF NOT id_busy THEN
      RETURN v_id;
    END IF;
    remaining := wait_ms - (extract(epoch FROM clock_timestamp() - started) * 1000)::bigint;
    timeout := CASE WHEN own = '0' THEN greatest(remaining, 1)::text
                    ELSE idempotency._lock_timeout(remaining) END;
    CASE idempotency._event_id_probe(v_id, timeout)
      WHEN 'busy' THEN PERFORM idempotency._raise_emit_in_progress('event id');
      WHEN 'stored' THEN RETURN v_id;
      ELSE
        -- Its emitter rolled back: look again, within the bound (other emitters of the
        -- id taking it at every look are as busy as a wait running out).
        IF remaining <= 0 THEN
          PERFORM idempotency._raise_emit_in_progress('event id');
        END IF;
    END CASE;
  END LOOP;
  -- Other transactions took the id at every look: as busy as a wait running out.
  PERFORM idempotency._raise_emit_in_progress('event id');
  RETURN NULL;
END $$;
-- Emitting is a privilege (SPEC v1.2): events belong to the database, so a role that
-- could emit could pre-empt another's event id or hold its aggregate.
REVOKE ALL ON FUNCTION idem_emit(text, jsonb, text, jsonb, idem_key) FROM PUBLIC;

------------------------------------------------------------------------------
-- The relay: idem_outbox_claim, _ack, _dead, _retry, _dead_letters. Not granted to
-- PUBLIC: they see every event (grant them to the relay's role).
------------------------------------------------------------------------------

-- Leases to `relay` up to `max_events` committed events, not delivered, not dead, not
-- held by a live lease, in emission order; per aggregate only while every earlier
-- event of it is delivered, dead or in this batch. Rows are locked without queueing
-- (SKIP LOCKED): an event another transaction is writing closes its aggregate for
-- this batch. It reads what is pending, not from a position it passed, so an event
-- committed late is handed out all the same.
CREATE FUNCTION idem_outbox_claim(relay text, max_events integer DEFAULT 100,
                                  lease interval DEFAULT '30s', topics text[] DEFAULT NULL)
RETURNS TABLE(event_id idem_key, topic text, aggregate text, seq bigint, payload jsonb,
              headers jsonb, emitted_at timestamptz, attempt integer)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER ROWS 100
SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
  v_relay text := relay;
  v_max integer := max_events;
  v_lease interval := lease;
  v_topics text[] := topics;
  v_now timestamptz := clock_timestamp();
  lease_end timestamptz;
  mine xid8 := pg_current_xact_id_if_assigned();
  -- At most this many pending events are examined per call, in emission order: behind
  -- a backlog held by other relays' leases a claim returns fewer, or none.
  window_size bigint;
  scan_limit bigint;
  scanned bigint;
  handed integer := 0;
  taken text[] := '{}';
  blocked text[] := '{}';  -- aggregates (topic, newline, aggregate) closed for this batch
  c record;
  r record;
BEGIN
  PERFORM idempotency._check_name(v_relay, 'relay');
  IF v_max IS NULL THEN
    RAISE EXCEPTION 'max_events must not be null' USING ERRCODE = 'null_value_not_allowed';
  END IF;
  IF v_lease IS NULL THEN
    RAISE EXCEPTION 'lease must not be null' USING ERRCODE = 'null_value_not_allowed';
  END IF;
  IF v_max <= 0 THEN
    RAISE EXCEPTION 'max_events must be positive' USING ERRCODE = 'invalid_parameter_value';
  END IF;
  lease_end := v_now + v_lease;
  IF lease_end <= v_now THEN
    RAISE EXCEPTION 'lease must be positive' USING ERRCODE = 'invalid_parameter_value';
  END IF;
  PERFORM idempotency._check_writable('idem_outbox_claim');

  window_size := greatest(v_max::bigint * 10, 10000);
  -- First the head of the queue; the whole window only if that fell short.
  scan_limit := least(window_size, v_max::bigint * 2 + 16);
  LOOP
    scanned := 0;
    -- Ready: not leased (or its lease ran out), and not emitted by this transaction
    -- (not committed: it may still roll back). The gate: every earlier pending event
    -- of the aggregate is ready or in this batch.
    FOR c IN
      SELECT q.event_id, q.topic, q.aggregate, q.ready, q.in_batch,
             coalesce(bool_and(q.ready OR q.in_batch) OVER (
               PARTITION BY q.topic, q.aggregate ORDER BY q.position
               ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), true) AS gate_open
      FROM (SELECT o.event_id, o.topic, o.aggregate, o.position,
                   (o.lease_expires_at IS NULL OR o.lease_expires_at <= v_now)
                     AND NOT (o.attempt = 0 AND coalesce(o.xact = mine, false)) AS ready,
                   o.event_id = ANY (taken) AS in_batch
            FROM idempotency.outbox o
            WHERE o.state = 'p' AND (v_topics IS NULL OR o.topic = ANY (v_topics))
            ORDER BY o.position
            LIMIT scan_limit) q
      ORDER BY q.position
    LOOP
      scanned := scanned + 1;
      CONTINUE WHEN NOT c.ready OR c.in_batch;
      CONTINUE WHEN c.aggregate IS NOT NULL
                    AND (NOT c.gate_open OR c.topic || E'\n' || c.aggregate = ANY (blocked));
      -- Leased if no one else holds its row, deciding on its newest version.
      UPDATE idempotency.outbox o
        SET attempt = o.attempt + 1, relay = v_relay, lease_expires_at = lease_end,
            xact = pg_current_xact_id()
        WHERE o.ctid = (SELECT f.ctid FROM idempotency.outbox f
                        -- (state as text: not the pending index's predicate,
                        -- which a generic plan made on a small outbox would scan)
                        WHERE f.event_id = c.event_id AND f.state::text = 'p'
                          AND (f.lease_expires_at IS NULL OR f.lease_expires_at <= v_now)
                          AND NOT (f.attempt = 0 AND coalesce(f.xact = mine, false))
                        FOR UPDATE SKIP LOCKED)
        RETURNING o.event_id, o.topic, o.aggregate, o.seq, o.payload, o.headers,
                  o.emitted_at, o.attempt INTO r;
      IF r.event_id IS NOT NULL THEN
        event_id := r.event_id;
        topic := r.topic;
        aggregate := r.aggregate;
        seq := r.seq;
        payload := r.payload;
        headers := r.headers;
        emitted_at := r.emitted_at;
        attempt := r.attempt;
        RETURN NEXT;
        handed := handed + 1;
        taken := taken || c.event_id::text;
        EXIT WHEN handed >= v_max;
      ELSIF c.aggregate IS NOT NULL THEN
        -- Another transaction holds it, or it changed since the scan: still pending,
        -- it closes its aggregate for this batch (delivered or dead, it does not).
        PERFORM FROM idempotency.outbox o WHERE o.event_id = c.event_id AND o.state::text = 'p';
        IF FOUND THEN
          blocked := blocked || (c.topic || E'\n' || c.aggregate);
        END IF;
      END IF;
    END LOOP;
    EXIT WHEN handed >= v_max OR scanned < scan_limit OR scan_limit >= window_size;
    scan_limit := window_size;
  END LOOP;
END $$;

-- The settling calls (ack, dead, retry): first, without waiting, every listed event no
-- other transaction is writing; then the others, waiting for their writers in the lock
-- queue (in one subtransaction, at most idempotency.wait_timeout: events still busy
-- then are left as they are, and a relay will have them again).
-- `how`: 'ack', 'dead' or 'retry'; `ids` NULL (retry only): every dead letter.
-- (enable_seqscan off: PL/pgSQL keeps a generic plan, and one made while the outbox was
-- small would read the whole outbox, not the listed rows, once it is large. The state
-- compared as text, as in idem_outbox_claim: `state = 'p'` is the pending index's
-- predicate, and a plan made while the statistics counted few pending events, before a
-- backlog, read all of them for every ack.)
CREATE FUNCTION idempotency._settle(how text, relay text, ids text[], reason text)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp SET enable_seqscan = off AS $$
DECLARE
  v_relay text := relay;
  v_reason text := reason;
  v_now timestamptz := clock_timestamp();
  settled bigint;
  more bigint := 0;
  busy text[];
  timeout text;
  own text;
  keep boolean;
BEGIN
  IF ids IS NULL THEN
    -- Every dead letter (retry), through the dead letters' index.
    SELECT array_agg(o.event_id::text) INTO ids FROM idempotency.outbox o WHERE o.state = 'x';
    IF ids IS NULL THEN
      RETURN 0;
    END IF;
  END IF;
  -- An ack or dead counts for events last handed out to this relay and neither
  -- delivered nor dead since (a late relay's ack, after another took the event, is
  -- ignored); a retry for dead letters.
  UPDATE idempotency.outbox o SET
      state = CASE how WHEN 'ack' THEN 'd' WHEN 'dead' THEN 'x' ELSE 'p' END,
      delivered_at = CASE WHEN how = 'ack' THEN v_now ELSE o.delivered_at END,
      lease_expires_at = NULL,
      relay = CASE WHEN how = 'retry' THEN NULL ELSE o.relay END,
      reason = CASE WHEN how = 'dead' THEN v_reason ELSE o.reason END,
      xact = pg_current_xact_id()
    WHERE o.ctid = ANY (ARRAY(
      SELECT f.ctid FROM idempotency.outbox f
      WHERE f.event_id = ANY (ids)
        AND CASE WHEN how = 'retry' THEN f.state::text = 'x'
                 ELSE f.state::text = 'p' AND f.relay = v_relay AND f.lease_expires_at IS NOT NULL END
      FOR UPDATE SKIP LOCKED));
  GET DIAGNOSTICS settled = ROW_COUNT;

  -- What is left qualifying is held by another transaction.
  SELECT array_agg(o.event_id::text ORDER BY o.event_id) INTO busy FROM idempotency.outbox o
    WHERE o.event_id = ANY (ids)
      AND CASE WHEN how = 'retry' THEN o.state::text = 'x'
               ELSE o.state::text = 'p' AND o.relay = v_relay AND o.lease_expires_at IS NOT NULL END;
  IF busy IS NULL THEN
    RETURN settled;
  END IF;
  -- In a subtransaction, so that a wait running out is an answer; past the cap
  -- (idempotency._take_subtransaction, counted inside it) it only waits, is rolled back
  -- (taking no slot of PostgreSQL's cache of subtransactions), and the events are
  -- written again in the transaction itself.
  BEGIN
    keep := idempotency._take_subtransaction();
    timeout := idempotency._lock_timeout(idempotency._wait_ms(NULL));
    IF timeout IS NOT NULL THEN
      own := current_setting('lock_timeout');
      PERFORM set_config('lock_timeout', timeout, true);
    END IF;
    UPDATE idempotency.outbox o SET
        state = CASE how WHEN 'ack' THEN 'd' WHEN 'dead' THEN 'x' ELSE 'p' END,
        delivered_at = CASE WHEN how = 'ack' THEN v_now ELSE o.delivered_at END,
        lease_expires_at = NULL,
        relay = CASE WHEN how = 'retry' THEN NULL ELSE o.relay END,
        reason = CASE WHEN how = 'dead' THEN v_reason ELSE o.reason END,
        xact = pg_current_xact_id()
      WHERE o.event_id = ANY (busy)
        AND CASE WHEN how = 'retry' THEN o.state::text = 'x'
                 ELSE o.state::text = 'p' AND o.relay = v_relay AND o.lease_expires_at IS NOT NULL END;
    GET DIAGNOSTICS more = ROW_COUNT;
    IF own IS NOT NULL THEN
      PERFORM set_config('lock_timeout', own, true);
    END IF;
    IF NOT keep THEN
      RAISE EXCEPTION USING ERRCODE = 'IK999';
    END IF;
  EXCEPTION
    WHEN lock_not_available THEN
      IF timeout IS NULL THEN
        RAISE;  -- the caller's own lock_timeout
      END IF;
      more := 0;  -- still busy: left as they are
    WHEN SQLSTATE 'IK999' THEN
      IF more > 0 THEN
        UPDATE idempotency.outbox o SET
            state = CASE how WHEN 'ack' THEN 'd' WHEN 'dead' THEN 'x' ELSE 'p' END,
            delivered_at = CASE WHEN how = 'ack' THEN v_now ELSE o.delivered_at END,
            lease_expires_at = NULL,
            relay = CASE WHEN how = 'retry' THEN NULL ELSE o.relay END,
            reason = CASE WHEN how = 'dead' THEN v_reason ELSE o.reason END,
            xact = pg_current_xact_id()
          WHERE o.event_id = ANY (busy)
            AND CASE WHEN how = 'retry' THEN o.state::text = 'x'
                     ELSE o.state::text = 'p' AND o.relay = v_relay AND o.lease_expires_at IS NOT NULL END;
        GET DIAGNOSTICS more = ROW_COUNT;
      END IF;
  END;
  RETURN settled + more;
END $$;
REVOKE ALL ON FUNCTION idempotency._settle(text, text, text[], text) FROM PUBLIC;

CREATE FUNCTION idem_outbox_ack(relay text, event_ids idem_key[]) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  PERFORM idempotency._check_name(relay, 'relay');
  IF event_ids IS NULL THEN
    RAISE EXCEPTION 'event_ids must not be null' USING ERRCODE = 'null_value_not_allowed';
  END IF;
  PERFORM idempotency._check_writable('idem_outbox_ack');
  RETURN idempotency._settle('ack', relay, event_ids::text[], NULL);
END $$;

CREATE FUNCTION idem_outbox_dead(relay text, event_ids idem_key[], reason text DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  PERFORM idempotency._check_name(relay, 'relay');
  IF event_ids IS NULL THEN
    RAISE EXCEPTION 'event_ids must not be null' USING ERRCODE = 'null_value_not_allowed';
  END IF;
  IF reason IS NOT NULL THEN
    PERFORM idempotency._check_size(octet_length(reason), 'reason');
  END IF;
  PERFORM idempotency._check_writable('idem_outbox_dead');
  RETURN idempotency._settle('dead', relay, event_ids::text[], reason);
END $$;

-- Dead letters back to pending (the given ones, or all), with their seq, position and
-- attempt count: their aggregates' later events wait for them again.
CREATE FUNCTION idem_outbox_retry(event_ids idem_key[] DEFAULT NULL) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  PERFORM idempotency._check_writable('idem_outbox_retry');
  RETURN idempotency._settle('retry', NULL, event_ids::text[], NULL);
END $$;

-- max_rows of idem_outbox_dead_letters: not null, not negative.
CREATE FUNCTION idempotency._check_max_rows(max_rows integer) RETURNS void
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  IF max_rows IS NULL THEN
    RAISE EXCEPTION 'max_rows must not be null' USING ERRCODE = 'null_value_not_allowed';
  END IF;
  IF max_rows < 0 THEN
    RAISE EXCEPTION 'max_rows must not be negative' USING ERRCODE = 'invalid_parameter_value';
  END IF;
END $$;

-- The dead letters, oldest first (by emission), of one topic or all. Writes nothing:
-- it also runs in a read-only transaction and on a standby. (SQL, not PL/pgSQL: its
-- argument `topic` has the name of a result column.)
CREATE FUNCTION idem_outbox_dead_letters(topic text DEFAULT NULL, max_rows integer DEFAULT 100)
RETURNS TABLE(event_id idem_key, topic text, aggregate text, seq bigint, payload jsonb,
              headers jsonb, emitted_at timestamptz, attempt integer, reason text)
LANGUAGE sql STABLE SECURITY DEFINER ROWS 100
SET search_path = pg_catalog, pg_temp AS $$
  SELECT idempotency._check_max_rows($2);
  SELECT o.event_id, o.topic, o.aggregate, o.seq, o.payload, o.headers, o.emitted_at,
         o.attempt, o.reason
  FROM idempotency.outbox o
  WHERE o.state = 'x' AND ($1 IS NULL OR o.topic = $1)
  ORDER BY o.position
  LIMIT $2;
$$;

REVOKE ALL ON FUNCTION idem_outbox_claim(text, integer, interval, text[]),
  idem_outbox_ack(text, idem_key[]), idem_outbox_dead(text, idem_key[], text),
  idem_outbox_retry(idem_key[]), idem_outbox_dead_letters(text, integer) FROM PUBLIC;

------------------------------------------------------------------------------
-- idem_apply_version
------------------------------------------------------------------------------
-- Runs as its caller: row-level security keeps it to the caller's records. No SET
-- clause (each call of a function with one costs about as much as the call's own
-- work): every type, operator and function is schema-qualified instead.
CREATE FUNCTION idem_apply_version(scope text, entity text, version bigint,
                                   ttl interval DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  v_scope pg_catalog.text := scope;
  v_entity pg_catalog.text := entity;
  v_version pg_catalog.int8 := version;
  v_ttl pg_catalog.interval := ttl;
  v_now pg_catalog.timestamptz := pg_catalog.clock_timestamp();
  me pg_catalog.regrole;
  mine pg_catalog.xid8;
  r record;
  applied pg_catalog.bool;
  timeout pg_catalog.text;
  own pg_catalog.text;
  taken pg_catalog.int4;
  keep pg_catalog.bool;
BEGIN
  -- Arguments, in the native order; then 25006, before anything is read.
  IF v_scope IS NULL OR v_entity IS NULL OR v_version IS NULL
     OR pg_catalog.octet_length(v_scope) OPERATOR(pg_catalog.<) 1
     OR pg_catalog.octet_length(v_scope) OPERATOR(pg_catalog.>) 255
     OR pg_catalog.octet_length(v_entity) OPERATOR(pg_catalog.<) 1
     OR pg_catalog.octet_length(v_entity) OPERATOR(pg_catalog.>) 255 THEN
    PERFORM idempotency._check_apply_arguments(v_scope, v_entity, v_version);
  END IF;
  IF v_ttl IS NULL THEN
    v_ttl := CASE WHEN coalesce(pg_catalog.current_setting('idempotency.default_ttl', true), '')
                       OPERATOR(pg_catalog.=) ''
                  THEN '24 hours'::pg_catalog.interval
                  ELSE idempotency._default_ttl() END;
  ELSIF v_now OPERATOR(pg_catalog.+) v_ttl OPERATOR(pg_catalog.<=) v_now THEN
    RAISE EXCEPTION 'ttl must be positive' USING ERRCODE = 'invalid_parameter_value';
  END IF;
  IF pg_catalog.current_setting('transaction_read_only') OPERATOR(pg_catalog.=) 'on' THEN
    PERFORM idempotency._check_writable('idem_apply_version');
  END IF;

  me := idempotency._me();
  -- A duplicate or older version of a live record is skipped without a write or a
  -- wait: whatever another transaction writing the record now leaves, it is not below
  -- what is seen here. A record is live until it expires, and whatever its expires_at
  -- while the transaction that wrote it, this one, is in progress.
  mine := pg_catalog.pg_current_xact_id_if_assigned();
  SELECT a.version, a.expires_at, a.xact INTO r FROM idempotency.applied_versions a
    WHERE a.role OPERATOR(pg_catalog.=) me AND a.scope OPERATOR(pg_catalog.=) v_scope
      AND a.entity OPERATOR(pg_catalog.=) v_entity;
  IF FOUND AND (r.expires_at OPERATOR(pg_catalog.>) v_now
                OR coalesce(r.xact OPERATOR(pg_catalog.=) mine, false))
     AND r.version OPERATOR(pg_catalog.>=) v_version THEN
    RETURN false;
  END IF;

  -- Record it, deciding on the newest version of the record: waits (bounded) for
  -- another transaction writing it, in the one subtransaction (at most 48 in a
  -- transaction: idempotency._take_subtransaction).
  -- (No NULLIF: it compares with the caller's `=`.)
  taken := CASE WHEN pg_catalog.current_setting('idempotency.subtransactions', true)
                     OPERATOR(pg_catalog.=) '' THEN 0
                ELSE coalesce(pg_catalog.current_setting('idempotency.subtransactions', true),
                              '0')::pg_catalog.int4 END;
  -- Past the cap, the same wait in a subtransaction that is then rolled back (taking no
  -- slot of PostgreSQL's cache of subtransactions), and the record written again in the
  -- transaction itself.
  keep := taken OPERATOR(pg_catalog.<) 48;
  BEGIN
    IF keep THEN
      PERFORM pg_catalog.set_config('idempotency.subtransactions',
                                    (taken OPERATOR(pg_catalog.+) 1)::pg_catalog.text, true);
    END IF;
    own := pg_catalog.current_setting('lock_timeout');
    IF own OPERATOR(pg_catalog.=) '0'
       AND coalesce(pg_catalog.current_setting('idempotency.wait_timeout', true), '')
           OPERATOR(pg_catalog.=) '' THEN
      timeout := '5000';  -- the defaults
    ELSE
      timeout := idempotency._lock_timeout(idempotency._wait_ms(NULL));
    END IF;
    IF timeout IS NOT NULL THEN
      PERFORM pg_catalog.set_config('lock_timeout', timeout, true);
    END IF;
    INSERT INTO idempotency.applied_versions AS a (role, expires_at, version, scope, entity, xact)
      VALUES (me, v_now OPERATOR(pg_catalog.+) v_ttl, v_version, v_scope, v_entity,
              pg_catalog.pg_current_xact_id())
      ON CONFLICT ON CONSTRAINT applied_versions_pkey DO UPDATE
        SET expires_at = excluded.expires_at, version = excluded.version, xact = excluded.xact
        WHERE NOT ((a.expires_at OPERATOR(pg_catalog.>) v_now
                    OR a.xact OPERATOR(pg_catalog.=) excluded.xact)
                   AND a.version OPERATOR(pg_catalog.>=) excluded.version)
      RETURNING true INTO applied;
    IF timeout IS NOT NULL THEN
      PERFORM pg_catalog.set_config('lock_timeout', own, true);
    END IF;
    IF NOT keep THEN
      RAISE EXCEPTION USING ERRCODE = 'IK999';  -- past the cap: it only waited
    END IF;
  EXCEPTION
    WHEN lock_not_available THEN
      IF timeout IS NULL THEN
        RAISE;  -- the caller's own lock_timeout
      END IF;
      RAISE EXCEPTION 'entity "%" in scope "%" is being applied by another transaction',
          v_entity, v_scope
        USING ERRCODE = 'IK005', DETAIL = 'It did not end within idempotency.wait_timeout.',
              HINT = 'Retry later.';
    WHEN SQLSTATE 'IK999' THEN
      IF applied THEN
        applied := NULL;
        INSERT INTO idempotency.applied_versions AS a (role, expires_at, version, scope, entity, xact)
          VALUES (me, v_now OPERATOR(pg_catalog.+) v_ttl, v_version, v_scope, v_entity,
                  pg_catalog.pg_current_xact_id())
          ON CONFLICT ON CONSTRAINT applied_versions_pkey DO UPDATE
            SET expires_at = excluded.expires_at, version = excluded.version, xact = excluded.xact
            WHERE NOT ((a.expires_at OPERATOR(pg_catalog.>) v_now
                        OR a.xact OPERATOR(pg_catalog.=) excluded.xact)
                       AND a.version OPERATOR(pg_catalog.>=) excluded.version)
          RETURNING true INTO applied;
      END IF;
  END;
  RETURN coalesce(applied, false);
END $$;
-- Granted to PUBLIC, like idem_claim: a role's records are its own. Who may record
-- versions is a matter of EXECUTE on it, however a role tries (the function or an
-- INSERT of its own, which row-level security lets it make): a restrictive policy,
-- as for keys (10_keys.sql).
CREATE POLICY applied_versions_added_by_appliers ON idempotency.applied_versions
  AS RESTRICTIVE FOR INSERT
  WITH CHECK (pg_catalog.has_function_privilege(
    'idem_apply_version(text, text, bigint, interval)'::pg_catalog.regprocedure, 'EXECUTE'));

------------------------------------------------------------------------------
-- For idem_stats and idem_reap (30_operations.sql). Not granted to PUBLIC.
------------------------------------------------------------------------------

-- The outbox's figures: undelivered (pending, leased or not) and dead events, each
-- exact up to 10,000 and beyond that at least that many (the index's size at the
-- last VACUUM or ANALYZE if larger), and the emission time of the first undelivered
-- event in emission order (NULL when none).
CREATE FUNCTION idempotency._outbox_stats(OUT outbox_undelivered bigint,
    OUT outbox_dead bigint, OUT outbox_oldest_undelivered_at timestamptz)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  SELECT count(*) INTO outbox_undelivered
    FROM (SELECT FROM idempotency.outbox o WHERE o.state = 'p' LIMIT 10000) s;
  IF outbox_undelivered >= 10000 THEN
    outbox_undelivered := greatest(outbox_undelivered,
      (SELECT c.reltuples::bigint FROM pg_class c
       WHERE c.oid = 'idempotency.outbox_pending_idx'::regclass));
  END IF;
  SELECT count(*) INTO outbox_dead
    FROM (SELECT FROM idempotency.outbox o WHERE o.state = 'x' LIMIT 10000) s;
  IF outbox_dead >= 10000 THEN
    outbox_dead := greatest(outbox_dead,
      (SELECT c.reltuples::bigint FROM pg_class c
       WHERE c.oid = 'idempotency.outbox_dead_idx'::regclass));
  END IF;
  SELECT o.emitted_at INTO outbox_oldest_undelivered_at FROM idempotency.outbox o
    WHERE o.state = 'p' ORDER BY o.position LIMIT 1;
END $$;
REVOKE ALL ON FUNCTION idempotency._outbox_stats() FROM PUBLIC;

-- Removes up to `max_rows` (NULL: no limit) delivered events delivered at least
-- idempotency.outbox_retention ago, and not by this transaction (a pass never removes
-- what a transaction in progress wrote); skips rows another transaction holds.
-- Returns how many it removed.
CREATE FUNCTION idempotency._reap_outbox(max_rows bigint) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off AS $$
DECLARE
  retention interval :=
    make_interval(secs => idempotency._setting('idempotency.outbox_retention', 's', 0));
  mine xid8 := pg_current_xact_id_if_assigned();
  removed bigint;
BEGIN
  WITH gone AS (
    SELECT o.ctid FROM idempotency.outbox o
    WHERE o.state = 'd' AND o.delivered_at <= clock_timestamp() - retention
      AND o.xact IS DISTINCT FROM mine
    ORDER BY o.delivered_at
    LIMIT max_rows
    FOR UPDATE SKIP LOCKED)
  DELETE FROM idempotency.outbox o WHERE o.ctid = ANY (ARRAY(SELECT gone.ctid FROM gone));
  GET DIAGNOSTICS removed = ROW_COUNT;
  RETURN removed;
END $$;
REVOKE ALL ON FUNCTION idempotency._reap_outbox(bigint) FROM PUBLIC;

-- Removes up to `max_rows` (NULL: no limit) applied-version records that expired and
-- were not written by this transaction, or whose role no longer exists; skips rows
-- another transaction holds. Returns how many it removed.
CREATE FUNCTION idempotency._reap_applied_versions(max_rows bigint) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off AS $$
DECLARE
  budget bigint := coalesce(max_rows, 9223372036854775807);
  mine xid8 := pg_current_xact_id_if_assigned();
  removed bigint;
  orphans bigint := 0;
BEGIN
  WITH gone AS (
    SELECT a.ctid FROM idempotency.applied_versions a
    WHERE a.expires_at <= clock_timestamp() AND a.xact IS DISTINCT FROM mine
    LIMIT budget
    FOR UPDATE SKIP LOCKED)
  DELETE FROM idempotency.applied_versions a WHERE a.ctid = ANY (ARRAY(SELECT gone.ctid FROM gone));
  GET DIAGNOSTICS removed = ROW_COUNT;
  IF removed < budget THEN
    -- The records of roles that no longer exist (DROP ROLE leaves them: regrole is an
    -- oid), as the keys' (idem_reap).
    WITH gone AS (
      SELECT a.ctid FROM idempotency.applied_versions a
      WHERE NOT EXISTS (SELECT FROM pg_roles r WHERE r.oid = a.role)
      LIMIT budget - removed
      FOR UPDATE OF a SKIP LOCKED)
    DELETE FROM idempotency.applied_versions a WHERE a.ctid = ANY (ARRAY(SELECT gone.ctid FROM gone));
    GET DIAGNOSTICS orphans = ROW_COUNT;
  END IF;
  RETURN removed + orphans;
END $$;
REVOKE ALL ON FUNCTION idempotency._reap_applied_versions(bigint) FROM PUBLIC;
