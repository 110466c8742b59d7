#!/usr/bin/env bash
# The demo: builds and installs the extension, starts a throwaway cluster with it,
# and walks through the SPEC's payment procedure and a lease claim that survives a
# crashed holder, printing what happens in plain words.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

work=$(mktemp -d /tmp/idempotency-demo.XXXXXX)
chmod 755 "$work"
trap 'stop_cluster "$work/cluster"; rm -rf "$work"' EXIT

ensure_packages
say "building and installing the extension"
build_and_install
port=$(free_port)
start_cluster "$work/cluster" "$port" "shared_preload_libraries = 'idempotency'" \
  "idempotency.reaper_naptime = '500ms'"
say "a throwaway PostgreSQL 15 cluster is running on 127.0.0.1:$port"

sql() { runuser -u postgres -- psql -X -q -h 127.0.0.1 -p "$port" -d postgres -v ON_ERROR_STOP=1 "$@"; }
value() { sql -At -c "$1"; }
step() { printf '\n-- %s\n' "$*"; }
show() { printf '   %s\n' "$1"; sql -c "$1"; }

sql <<'SQL'
CREATE EXTENSION idempotency;
CREATE TABLE payments (id bigserial PRIMARY KEY, account bigint, amount numeric);
CREATE PROCEDURE create_payment(p_key idem_key, p_account bigint, p_amount numeric,
                                INOUT result jsonb DEFAULT NULL)
LANGUAGE plpgsql AS $$
DECLARE c idem_claim_result;
BEGIN
  c := idem_claim('payments', p_key,
                  idem_fingerprint(jsonb_build_object('account', p_account, 'amount', p_amount)));
  IF c.outcome = 'replay' THEN result := c.response; RETURN; END IF;
  IF c.outcome = 'in_progress' THEN RAISE EXCEPTION 'retry after %', c.retry_after; END IF;
  INSERT INTO payments(account, amount) VALUES (p_account, p_amount)
    RETURNING jsonb_build_object('payment_id', id, 'amount', amount) INTO result;
  PERFORM idem_complete('payments', p_key, result);
END $$;
SQL
say "part 1: the SPEC's create_payment procedure (see README, Getting started)"

step "A client pays 19.99 from account 42 with the idempotency key 'order-1001'."
show "CALL create_payment('order-1001', 42, 19.99);"

step "Its network drops the response, so it sends the same request again."
step "The stored response comes back: the same payment_id, and no second payment."
show "CALL create_payment('order-1001', 42, 19.99);"
show "SELECT count(*) AS payments FROM payments;"

step "A buggy client reuses the key for a different amount: refused with SQLSTATE IK001."
printf '   %s\n' "CALL create_payment('order-1001', 42, 20.00);"
runuser -u postgres -- psql -X -q -h 127.0.0.1 -p "$port" -d postgres \
  -c '\set VERBOSITY verbose' -c "CALL create_payment('order-1001', 42, 20.00);" 2>&1 |
  grep -E '^(ERROR|HINT)' | sed 's/^/   /' || true
show "SELECT count(*) AS payments FROM payments;"

step "An attempt whose transaction rolls back (say, the app crashed) leaves the key free:"
show "BEGIN; CALL create_payment('order-1002', 7, 5.00); ROLLBACK;"
show "SELECT count(*) AS stored_keys FROM idem_lookup('payments', 'order-1002');"
step "so the retry claims it afresh and pays exactly once (id 2 went with the rollback)."
show "CALL create_payment('order-1002', 7, 5.00);"
show "SELECT id, account, amount FROM payments ORDER BY id;"

say "part 2: a lease claim around an outside call (examples/lease_order.sql)"
sql -f examples/lease_order.sql
step "fulfil_order claims with a 2-second lease and commits, charges a payment provider with
   a key derived by idem_derive, checkpoints 'charged', then ships and completes."
show "CALL fulfil_order('order-7', 25);"

step "Now the holder of order-8 charges the card, checkpoints, and then hangs..."
runuser -u postgres -- psql -X -q -h 127.0.0.1 -p "$port" -d postgres \
  -c "CALL fulfil_order('order-8', 40, '1 hour')" >/dev/null 2>&1 &
until [ "$(value "SELECT checkpoint FROM idem_lookup('orders', 'order-8')")" = charged ]; do sleep 0.1; done
show "SELECT state, attempt, checkpoint, checkpoint_data FROM idem_lookup('orders', 'order-8');"
step "...and its session is terminated, as a crash would end it."
value "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query LIKE 'CALL fulfil_order(''order-8''%'" >/dev/null
wait || true
step "Its lease runs out; the background worker marks the claim abandoned."
until [ "$(value "SELECT state FROM idem_lookup('orders', 'order-8')")" = abandoned ]; do sleep 0.2; done
show "SELECT key, attempt, checkpoint FROM idem_abandoned('orders');"
step "A retry takes over as attempt 2, resumes after the checkpoint, and ships once."
show "CALL fulfil_order('order-8', 40);"
show "SELECT order_key, count(*) AS charges FROM provider_charges GROUP BY 1 ORDER BY 1;"
show "SELECT order_key, count(*) AS shipments FROM shipments GROUP BY 1 ORDER BY 1;"

say "what the worker and the store look like"
show "SELECT keys_total, pending, completed, abandoned, reaped_total, reclaimed_total FROM idem_stats();"

say "done: every retry above took effect exactly once. The cluster is removed now."
