#!/usr/bin/env bash
# The demo, the README's first command. On a Debian 12 machine, as root, it installs
# what it needs, builds and installs the extension, starts a throwaway PostgreSQL 15
# cluster (as the postgres OS user, on 127.0.0.1 only) that preloads it, and shows,
# with real psql calls:
#   part 1, the README's create_payment procedure (Getting started): a payment, its
#           retry replayed, the same key with another amount refused (IK001), a
#           rolled-back attempt that leaves the key free;
#   part 2, a lease claim around an outside call whose holder dies after the call:
#           the background worker marks it abandoned and a retry resumes it;
#   part 3, the payment's event: emitted with the payment, relayed by
#           examples/messaging's relay and applied once by its consumer.
# Every result is also checked: the demo stops with "!! unexpected" if one is wrong.
# The cluster and its files are removed on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

work=$(mktemp -d /tmp/idempotency-demo.XXXXXX)
chmod 755 "$work"
cleanup() {
  trap - EXIT
  stop_clusters_under "$work"
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ---------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------

# psql as postgres on the demo's cluster: no psqlrc, no chatter, no NOTICEs.
psql_demo() {
  PGOPTIONS='-c client_min_messages=warning' \
    runuser -u postgres -- psql -X -q -h 127.0.0.1 -p "$port" -U postgres -d postgres "$@"
}
sql() { psql_demo -v ON_ERROR_STOP=1 "$@"; }
# One value, unaligned.
value() { sql -At -c "$1"; }
# A plain-English sentence before a step.
tell() { printf '\n%s\n' "$*" | fold -s -w 88 | sed 's/ *$//'; }
# Shows SQL as typed at a psql prompt, runs it (each statement, as psql reads a
# script) and shows what psql prints, indented. The output is kept in $OUT.
show() {
  printf '\n    postgres=# %s\n' "$1"
  OUT=$(sql <<<"$1")
  [ -z "$OUT" ] || printf '%s\n' "$OUT" | sed 's/^/    /'
}
# expect ACTUAL EXPECTED WHAT: the demo checks what it claims.
expect() {
  if [ "$1" != "$2" ]; then
    printf '\n!! unexpected: %s: got "%s", expected "%s"\n' "$3" "$1" "$2" >&2
    exit 1
  fi
}
# wait_until SECONDS SQL: polls until the SQL returns true.
wait_until() {
  local limit=$1 query=$2 start=$SECONDS
  until [ "$(value "$query")" = t ]; do
    if ((SECONDS - start > limit)); then
      printf '\n!! unexpected: still false after %ss: %s\n' "$limit" "$query" >&2
      exit 1
    fi
    sleep 0.2
  done
}

# ---------------------------------------------------------------------------------
# Setup
# ---------------------------------------------------------------------------------

say "setup: packages, build, a throwaway cluster"
echo "Installing what is missing of: ${DEMO_PACKAGES[*]}"
ensure_packages "${DEMO_PACKAGES[@]}"
echo "Building and installing the extension: make && make install (PG_CONFIG=$PG_CONFIG)"
build_and_install
start_cluster_on_free_port "$work/cluster" "shared_preload_libraries = 'idempotency'" \
  "idempotency.reaper_naptime = '500ms'"
port=$CLUSTER_PORT
echo "The extension is installed, and a throwaway PostgreSQL 15 cluster that preloads it"
echo "runs on 127.0.0.1:$port (it is removed when the demo ends)."

sql -c 'CREATE EXTENSION idempotency'
sql -f examples/create_payment.sql
echo "In its database: CREATE EXTENSION idempotency, a payments table and the README's"
echo "create_payment procedure (examples/create_payment.sql):"
sed -n '/^CREATE PROCEDURE/,/^END/p' examples/create_payment.sql | sed 's/^/    /'

# ---------------------------------------------------------------------------------
# Part 1: create_payment
# ---------------------------------------------------------------------------------

say "part 1: a payment, its retries, and a rolled-back attempt"

tell "1. A client pays 19.99 from account 42 and names the operation with the \
idempotency key 'order-1001'. The key is new, so the payment is made:"
show "CALL create_payment('order-1001', 42, 19.99);"
first=$(grep -oE '"payment_id": [0-9]+' <<<"$OUT" || true)
expect "${first:+found}" found "the first call returns a payment_id"

tell "2. The response is lost on the way back, so the client sends the same request \
with the same key again. It gets the stored response: the same payment_id..."
show "CALL create_payment('order-1001', 42, 19.99);"
expect "$(grep -oE '"payment_id": [0-9]+' <<<"$OUT" || true)" "$first" "the retry replays the payment_id"
tell "...and no second payment was made:"
show "SELECT count(*) FROM payments;"
expect "$(value 'SELECT count(*) FROM payments')" 1 "one payment after the retry"

tell "3. A buggy client reuses the key for a different amount. That is a different \
request under the same name, so it is refused with SQLSTATE IK001 (fingerprint \
mismatch) and nothing is written:"
printf '\n    postgres=# %s\n' "CALL create_payment('order-1001', 42, 20.00);"
refused=$(psql_demo -v ON_ERROR_STOP=0 -v VERBOSITY=verbose -v SHOW_CONTEXT=never \
            -c "CALL create_payment('order-1001', 42, 20.00)" 2>&1 || true)
grep -v '^LOCATION:' <<<"$refused" | sed 's/^/    /'
expect "$(grep -oE '^ERROR: +[0-9A-Z]{5}' <<<"$refused" | awk '{ print $2 }')" IK001 \
  "the different amount is refused with IK001"
show "SELECT count(*) FROM payments;"
expect "$(value 'SELECT count(*) FROM payments')" 1 "still one payment after the refusal"

tell "4. Another payment, 'order-1002', starts in a transaction that is rolled back \
(the application crashed, or something else in the transaction failed):"
show "BEGIN; CALL create_payment('order-1002', 7, 5.00); ROLLBACK;"
tell "The claim of the key rolled back with the payment, so the key is free. The \
store has nothing for it:"
show "SELECT * FROM idem_lookup('payments', 'order-1002');"
expect "$(value "SELECT count(*) FROM idem_lookup('payments', 'order-1002')")" 0 \
  "no key after the rollback"
tell "So the retry claims the key afresh and pays exactly once (payment_id 2 was used \
by the rolled-back insert: sequences do not roll back):"
show "CALL create_payment('order-1002', 7, 5.00);"
show "SELECT id, account, amount FROM payments ORDER BY id;"
expect "$(value 'SELECT count(*) FROM payments WHERE account = 7')" 1 "one payment for order-1002"
show "SELECT state, response FROM idem_lookup('payments', 'order-1002');"

# ---------------------------------------------------------------------------------
# Part 2: a lease claim around an outside call
# ---------------------------------------------------------------------------------

say "part 2: a lease claim around an outside call (examples/lease_order.sql)"
sql -f examples/lease_order.sql

tell "fulfil_order claims its key with a 2-second lease and commits, charges a \
payment provider (here a table) with a key derived by idem_derive, records the \
checkpoint 'charged', then ships and completes. A plain run:"
show "CALL fulfil_order('order-7', 25);"

tell "Now the holder of 'order-8' charges the card, records its checkpoint, and hangs..."
psql_demo -c "CALL fulfil_order('order-8', 40, '1 hour')" >/dev/null 2>&1 &
holder=$!
wait_until 30 "SELECT coalesce((SELECT checkpoint = 'charged' FROM idem_lookup('orders', 'order-8')), false)"
show "SELECT state, attempt, checkpoint, checkpoint_data FROM idem_lookup('orders', 'order-8');"
tell "...and its session is terminated, as a crash would end it:"
show "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query LIKE 'CALL fulfil_order(''order-8''%';"
wait "$holder" || true

tell "Its lease runs out, and the background worker marks the claim abandoned, with \
the checkpoint the holder left:"
wait_until 30 "SELECT coalesce((SELECT state = 'abandoned' FROM idem_lookup('orders', 'order-8')), false)"
show "SELECT key, attempt, checkpoint FROM idem_abandoned('orders');"

tell "A retry takes over as attempt 2, resumes after the checkpoint, and ships once; \
the provider charged once:"
show "CALL fulfil_order('order-8', 40);"
show "SELECT order_key, count(*) AS charges FROM provider_charges GROUP BY 1 ORDER BY 1;"
show "SELECT order_key, count(*) AS shipments FROM shipments GROUP BY 1 ORDER BY 1;"
expect "$(value "SELECT count(*) FROM provider_charges WHERE order_key = 'order-8'")" 1 "one charge for order-8"
expect "$(value "SELECT count(*) FROM shipments WHERE order_key = 'order-8'")" 1 "one shipment for order-8"

tell "The store and the worker, as monitoring sees them:"
show "SELECT keys_total, pending, completed, abandoned, reaped_total, reclaimed_total FROM idem_stats();"

# ---------------------------------------------------------------------------------

say "part 3: the payment's event, a relay and a consumer (examples/messaging)"
tell "A shop database and a ledger database. create_payment now also emits the event \
payment.created in the payment's transaction (idem_emit, aggregate = the account):"
psql_demo -c "CREATE DATABASE shop" -c "CREATE DATABASE ledger" >/dev/null
shop() { PGOPTIONS='-c client_min_messages=warning' runuser -u postgres -- psql -X -q \
  -h 127.0.0.1 -p "$port" -U postgres -d shop -v ON_ERROR_STOP=1 "$@"; }
ledger() { PGOPTIONS='-c client_min_messages=warning' runuser -u postgres -- psql -X -q \
  -h 127.0.0.1 -p "$port" -U postgres -d ledger -v ON_ERROR_STOP=1 "$@"; }
show_in() {  # show_in DB SQL
  printf '\n    %s=# %s\n' "$1" "$2"
  OUT=$("$1" <<<"$2")
  [ -z "$OUT" ] || printf '%s\n' "$OUT" | sed 's/^/    /'
}
shop -c "CREATE EXTENSION idempotency" -f examples/messaging/producer.sql >/dev/null
ledger -c "CREATE EXTENSION idempotency" -f examples/messaging/consumer.sql >/dev/null
show_in shop "BEGIN; CALL create_payment('order-2001', 42, 19.99); COMMIT;"
tell "A retry replays and emits nothing; a payment that rolls back takes its event with it:"
show_in shop "BEGIN; CALL create_payment('order-2001', 42, 19.99); COMMIT;"
show_in shop "BEGIN; CALL create_payment('order-2002', 42, 5.00); ROLLBACK;"
show_in shop "BEGIN; CALL create_payment('order-2003', 42, 7.50); COMMIT;"
show_in shop "SELECT topic, aggregate, seq, payload FROM idempotency.outbox ORDER BY seq;"
expect "$(shop -At -c "SELECT string_agg(seq::text, ',' ORDER BY seq) FROM idempotency.outbox")" "1,2" \
  "two events, seq 1 and 2"
tell "A relay leases the events (here by hand; idem-relay, in relay/, publishes \
them to RabbitMQ), and acknowledges them once the broker confirmed:"
show_in shop "SELECT event_id, aggregate, seq, attempt FROM idem_outbox_claim('demo-relay', 10, '30s');"
events=$(shop -At -F'|' -c "SELECT event_id, topic, aggregate, seq, payload FROM idempotency.outbox ORDER BY seq")
show_in shop "SELECT idem_outbox_ack('demo-relay', array(SELECT event_id FROM idempotency.outbox));"
tell "The consumer applies each message in one transaction: idem_once makes a \
redelivered copy a duplicate, idem_apply_version skips an older seq:"
while IFS='|' read -r id topic account seq payload; do
  show_in ledger "CALL apply_event('$id', '$topic', '$account', $seq, '$payload');"
done <<<"$events"
first=$(head -1 <<<"$events")
IFS='|' read -r id topic account seq payload <<<"$first"
show_in ledger "CALL apply_event('$id', '$topic', '$account', $seq, '$payload');"
expect "$(ledger -At -c "SELECT balance FROM accounts WHERE account = '42'")" 27.49 "balance 27.49"
show_in ledger "SELECT account, balance, payments FROM accounts;"

# ---------------------------------------------------------------------------------

say "summary"
cat <<'SUMMARY'
- A retry with the same key replayed the stored response: one payment, one payment_id.
- The same key with a different request was refused with IK001, and nothing changed.
- A claim rolled back with its transaction, so the key stayed free for the retry.
- A lease holder that died after its outside call was taken over from its checkpoint:
  one charge, one shipment.
- A payment and its event committed together (a rolled-back payment left no event);
  the relay handed them out in the account's order, and the consumer applied each
  once, skipping a redelivered copy.
The throwaway cluster is stopped and removed now.
SUMMARY
