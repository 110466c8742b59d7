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
