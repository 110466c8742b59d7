\echo Use "ALTER EXTENSION idempotency UPDATE TO '1.1'" to load this file. \quit
-- idempotency 1.0 to 1.1. A fresh CREATE EXTENSION runs the 1.0 script and then this
-- one, so an upgraded database and a fresh one have the same objects.

-- The key of the identity locks' hash. pg_locks shows every lock's tag to every role:
-- keyed with a secret that no ordinary role can read, no role can compute the tag of
-- another role's (scope, key), nor craft a key whose lock collides with another
-- role's. Per database, generated here, and not dumped: a restored database gets a
-- secret of its own from its own CREATE EXTENSION.
CREATE TABLE idempotency.lock_secret (
  secret bytea NOT NULL CHECK (octet_length(secret) = 32)
);
CREATE UNIQUE INDEX lock_secret_one_row ON idempotency.lock_secret ((true));
-- gen_random_uuid() draws from pg_strong_random: two of them carry 244 random bits.
INSERT INTO idempotency.lock_secret
  SELECT pg_catalog.sha256(pg_catalog.convert_to(
    pg_catalog.gen_random_uuid()::text || pg_catalog.gen_random_uuid()::text, 'UTF8'));
REVOKE ALL ON TABLE idempotency.lock_secret FROM PUBLIC;

-- idem_abandoned's way to a role's lease claims, oldest first, without reading its
-- other keys. From 1.1 a completion or failure clears `lease`, so the index holds only
-- pending (live or stale) and abandoned lease claims. In-transaction claims never
-- enter it and never change `lease`, so their completion stays a HOT update.
UPDATE idempotency.keys SET lease = NULL WHERE state IN ('c', 'f') AND lease IS NOT NULL;
CREATE INDEX keys_leased_idx ON idempotency.keys (role, first_claimed_at)
  WHERE lease IS NOT NULL;

------------------------------------------------------------------------------
-- Messaging (1.1): the transactional outbox, its relay, and ordered apply.
------------------------------------------------------------------------------

-- Emission order. An event takes its position after its aggregate's lock, so within
-- an aggregate position order is seq order, and a relay that reads pending events by
-- position meets each aggregate's events in seq order.
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
  CONSTRAINT outbox_pkey PRIMARY KEY (event_id)
) WITH (fillfactor = 80);  -- room for the lease's HOT update
-- The relay's queue: pending events in emission order. Leasing changes no indexed
-- column and keeps the state, so it is a HOT update.
CREATE INDEX outbox_pending_idx ON idempotency.outbox (position) WHERE state = 'p';
-- The dead letters, oldest first.
CREATE INDEX outbox_dead_idx ON idempotency.outbox (position) WHERE state = 'x';
-- The worker's way to delivered events past idempotency.outbox_retention.
CREATE INDEX outbox_delivered_idx ON idempotency.outbox (delivered_at) WHERE state = 'd';

-- The last seq given per (topic, aggregate). Kept when the events are removed: a new
-- event continues the sequence its consumers have seen.
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
  CONSTRAINT applied_versions_pkey PRIMARY KEY (role, scope, entity)
);
CREATE INDEX applied_versions_expires_at_idx ON idempotency.applied_versions (expires_at);

REVOKE ALL ON TABLE idempotency.outbox, idempotency.outbox_aggregates,
  idempotency.applied_versions FROM PUBLIC;
REVOKE ALL ON SEQUENCE idempotency.outbox_position FROM PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('idempotency.outbox', '');
SELECT pg_catalog.pg_extension_config_dump('idempotency.outbox_aggregates', '');
SELECT pg_catalog.pg_extension_config_dump('idempotency.applied_versions', '');
SELECT pg_catalog.pg_extension_config_dump('idempotency.outbox_position', '');

CREATE FUNCTION idem_emit(topic text, payload jsonb, aggregate text DEFAULT NULL,
                          headers jsonb DEFAULT NULL, event_id idem_key DEFAULT NULL)
  RETURNS idem_key AS 'MODULE_PATHNAME' LANGUAGE C VOLATILE;

CREATE FUNCTION idem_apply_version(scope text, entity text, version bigint,
                                   ttl interval DEFAULT NULL)
  RETURNS boolean AS 'MODULE_PATHNAME' LANGUAGE C VOLATILE;

-- The relay's functions see every role's events: not PUBLIC (grant them to the
-- relay's role).
CREATE FUNCTION idem_outbox_claim(relay text, max_events integer DEFAULT 100,
                                  lease interval DEFAULT '30s', topics text[] DEFAULT NULL)
  RETURNS TABLE(event_id idem_key, topic text, aggregate text, seq bigint, payload jsonb,
                headers jsonb, emitted_at timestamptz, attempt integer)
  AS 'MODULE_PATHNAME' LANGUAGE C VOLATILE ROWS 100;
CREATE FUNCTION idem_outbox_ack(relay text, event_ids idem_key[]) RETURNS bigint
  AS 'MODULE_PATHNAME' LANGUAGE C VOLATILE;
CREATE FUNCTION idem_outbox_dead(relay text, event_ids idem_key[], reason text DEFAULT NULL)
  RETURNS bigint AS 'MODULE_PATHNAME' LANGUAGE C VOLATILE;
CREATE FUNCTION idem_outbox_retry(event_ids idem_key[] DEFAULT NULL) RETURNS bigint
  AS 'MODULE_PATHNAME' LANGUAGE C VOLATILE;
CREATE FUNCTION idem_outbox_dead_letters(topic text DEFAULT NULL, max_rows integer DEFAULT 100)
  RETURNS TABLE(event_id idem_key, topic text, aggregate text, seq bigint, payload jsonb,
                headers jsonb, emitted_at timestamptz, attempt integer, reason text)
  AS 'MODULE_PATHNAME' LANGUAGE C VOLATILE ROWS 100;
REVOKE ALL ON FUNCTION idem_outbox_claim(text, integer, interval, text[]),
  idem_outbox_ack(text, idem_key[]), idem_outbox_dead(text, idem_key[], text),
  idem_outbox_retry(idem_key[]), idem_outbox_dead_letters(text, integer) FROM PUBLIC;

-- idem_stats adds the outbox's figures (a new result type: dropped and made again).
DROP FUNCTION idem_stats();
CREATE FUNCTION idem_stats()
  RETURNS TABLE(keys_total bigint, pending bigint, completed bigint, failed bigint,
                abandoned bigint, expired_awaiting_reap bigint, reaped_total bigint,
                reclaimed_total bigint, last_reap_at timestamptz, last_reap_ms bigint,
                worker_pid integer, stale_leases bigint, outbox_undelivered bigint,
                outbox_dead bigint, outbox_oldest_undelivered_at timestamptz)
  AS 'MODULE_PATHNAME' LANGUAGE C VOLATILE;
REVOKE ALL ON FUNCTION idem_stats() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION idem_stats() TO pg_monitor;
