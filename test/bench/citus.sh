#!/usr/bin/env bash
# The scale-out benchmark (README, "Scaling out with Citus"): a Citus coordinator and
# two workers on this machine, payments distributed by account in 32 shards and the
# key store with them (examples/create_payment_citus.sql). The payment procedure with
# its claim (ext) against the same procedure without claim and completion (floor), and
# against what teams write instead (hand): a key table of their own distributed beside
# payments (by account, co-located), in the same transaction shape: an insert of the
# key ... ON CONFLICT DO NOTHING, the business insert, an update of the key row with
# the response. Each called
#   coordinator: through the coordinator, which delegates the CALL to the worker that
#                holds the account (one round trip for the client, one for Citus);
#   worker:      on worker1 directly, for accounts whose shard it holds;
#   block:       the transaction block of an application through the coordinator
#                (BEGIN; idem_claim(..., route); INSERT; idem_complete(..., route);
#                COMMIT), its key functions forwarded to the account's worker (1.4),
#                against the same block without them (BEGIN; INSERT; COMMIT) and the
#                hand-written one (BEGIN; INSERT INTO hand_keys ... ON CONFLICT DO
#                NOTHING; INSERT; UPDATE hand_keys; COMMIT), each statement routed by
#                Citus to the account's worker;
#   relay:       events emitted in every shard, drained by 4 relays on the
#                coordinator, against the same on one node.
# New keys, accounts spread over all shards, CLIENTS clients, interleaved rounds.
# Not part of CI.
#   test/bench/citus.sh                # PG_VERSION=18 ROUNDS=3 SECONDS_PER_RUN=10 CLIENTS=4
#   PG_PREFIX=/path/to/18 test/bench/citus.sh   # an installation of one's own
# Needs Citus for that PostgreSQL (scripts/citus.sh: a tarball in CITUS_TARBALL,
# CITUS_SOURCE_DIR or the cache). Prints a Markdown table and writes
# test/bench/results-citus-pgNN.md.
set -euo pipefail
cd "$(dirname "$0")/../.."
. scripts/lib.sh
. scripts/pg_versions.sh
. scripts/citus.sh
PG_VERSION=${PG_VERSION:-18}
ROUNDS=${ROUNDS:-3}
SECONDS_PER_RUN=${SECONDS_PER_RUN:-10}
CLIENTS=${CLIENTS:-4}
ensure_packages
prefix=${PG_PREFIX:-$(pg_prefix "$PG_VERSION")}
PG_BIN=$prefix/bin
PG_CONFIG=$PG_BIN/pg_config
export PATH="$PG_BIN:$PATH"
citus=$(citus_for "$prefix") || { echo "no Citus for PostgreSQL $PG_VERSION: see scripts/citus.sh" >&2; exit 2; }

work=$(mktemp -d /tmp/idempotency-citus-bench.XXXXXX)
chmod 755 "$work"
trap 'stop_clusters_under "$work"; rm -rf "$work"; make -s clean PG_CONFIG="$PG_CONFIG" >/dev/null' EXIT
make -s clean PG_CONFIG="$PG_CONFIG" >/dev/null
build_and_install

ports=()
for node in coordinator worker1 worker2; do
  port=$(free_port)
  start_cluster "$work/$node" "$port" "shared_preload_libraries = 'citus,idempotency'" \
    "max_connections = 100" "max_prepared_transactions = 100" "shared_buffers = '256MB'" \
    "max_wal_size = '4GB'" "citus.enable_statistics_collection = off" \
    "citus.enable_stat_counters = on" \
    "idempotency.reaper_naptime = '1s'" "idempotency.outbox_retention = '1h'"
  ports+=("$port")
done
on() { runuser -u postgres -- psql -X -q -h 127.0.0.1 -p "$1" -d postgres -v ON_ERROR_STOP=1 "${@:2}"; }
for port in "${ports[@]}"; do on "$port" -c 'CREATE EXTENSION citus'; done
on "${ports[0]}" -c "SELECT citus_set_coordinator_host('127.0.0.1', ${ports[0]})" \
  -c "SELECT citus_add_node('127.0.0.1', ${ports[1]})" -c "SELECT citus_add_node('127.0.0.1', ${ports[2]})" >/dev/null
on "${ports[0]}" -c 'CREATE EXTENSION idempotency' -c 'SET citus.shard_count = 32' \
  -f examples/create_payment_citus.sql >/dev/null
# The floor: the same procedure without the claim and the completion.
on "${ports[0]}" >/dev/null <<'SQL'
CREATE PROCEDURE floor_payment(p_key idem_key, p_account bigint, p_amount numeric,
                               INOUT result jsonb DEFAULT NULL)
LANGUAGE plpgsql AS $$
DECLARE v_id bigint;
BEGIN
  INSERT INTO payments(account, amount) VALUES (p_account, p_amount) RETURNING id INTO v_id;
  result := jsonb_build_object('payment_id', v_id, 'amount', p_amount);
END $$;
SELECT create_distributed_function('floor_payment(idem_key, bigint, numeric, jsonb)',
                                   distribution_arg_name => 'p_account',
                                   colocate_with => 'payments');
-- hand: a hand-written key table distributed beside payments (its primary key must
-- hold the distribution column), and the procedure such teams write over it.
CREATE TABLE hand_keys (account bigint NOT NULL, key text NOT NULL, status text NOT NULL,
                        response jsonb, created_at timestamptz NOT NULL DEFAULT now(),
                        PRIMARY KEY (account, key));
SELECT create_distributed_table('hand_keys', 'account', colocate_with => 'payments');
CREATE PROCEDURE hand_payment(p_key text, p_account bigint, p_amount numeric,
                              INOUT result jsonb DEFAULT NULL)
LANGUAGE plpgsql AS $$
DECLARE v_id bigint; v_row hand_keys;
BEGIN
  INSERT INTO hand_keys(account, key, status) VALUES (p_account, p_key, 'started')
    ON CONFLICT DO NOTHING;
  IF NOT FOUND THEN
    SELECT * INTO v_row FROM hand_keys WHERE account = p_account AND key = p_key;
    IF v_row.status = 'done' THEN result := v_row.response; RETURN; END IF;
    RAISE EXCEPTION 'payment % is in progress', p_key USING ERRCODE = '55006';
  END IF;
  INSERT INTO payments(account, amount) VALUES (p_account, p_amount) RETURNING id INTO v_id;
  result := jsonb_build_object('payment_id', v_id, 'amount', p_amount);
  UPDATE hand_keys SET status = 'done', response = result WHERE account = p_account AND key = p_key;
END $$;
SELECT create_distributed_function('hand_payment(text, bigint, numeric, jsonb)',
                                   distribution_arg_name => 'p_account',
                                   colocate_with => 'payments');
SQL
# Accounts whose shard worker1 holds, numbered 1..n in a local table there.
on "${ports[1]}" -c "CREATE TABLE local_accounts (i int PRIMARY KEY, account bigint)"
on "${ports[0]}" -At -c "SELECT a FROM generate_series(1, 100000) a
  JOIN citus_shards s ON s.shardid = get_shard_id_for_distribution_column('payments', a::bigint)
  WHERE s.table_name = 'payments'::regclass AND s.nodeport = ${ports[1]}" |
  awk '{ print NR "\t" $1 }' | on "${ports[1]}" -c "COPY local_accounts FROM STDIN"
local_count=$(on "${ports[1]}" -At -c "SELECT count(*) FROM local_accounts")

# A new key per call; the account a pgbench variable (Citus delegates a CALL only when
# its distribution argument is a constant), the key an immutable expression of one.
for procedure in create_payment floor_payment hand_payment; do
  keytype=idem_key
  [ "$procedure" = hand_payment ] && keytype=text
  cat >"$work/coordinator_$procedure.sql" <<SQL
\\set account random(1, 100000)
\\set k random(1, 2000000000)
CALL $procedure(('k' || :k || '-' || :client_id)::$keytype, :account, 10);
SQL
  cat >"$work/worker_$procedure.sql" <<SQL
\\set i random(1, $local_count)
\\set k random(1, 2000000000)
SELECT account FROM local_accounts WHERE i = :i \\gset
CALL $procedure(('k' || :k || '-' || :client_id)::$keytype, :account, 10);
SQL
done
cat >"$work/block_create_payment.sql" <<'SQL'
\set account random(1, 100000)
\set k random(1, 2000000000)
BEGIN;
SELECT outcome FROM idem_claim('payments', ('k' || :k || '-' || :client_id)::idem_key, route => :account::bigint);
INSERT INTO payments(account, amount) VALUES (:account, 10);
SELECT idem_complete('payments', ('k' || :k || '-' || :client_id)::idem_key, '{"paid": true}', route => :account::bigint);
COMMIT;
SQL
cat >"$work/block_hand_payment.sql" <<'SQL'
\set account random(1, 100000)
\set k random(1, 2000000000)
BEGIN;
INSERT INTO hand_keys(account, key, status) VALUES (:account, 'k' || :k || '-' || :client_id, 'started') ON CONFLICT DO NOTHING RETURNING key;
INSERT INTO payments(account, amount) VALUES (:account, 10);
UPDATE hand_keys SET status = 'done', response = '{"paid": true}' WHERE account = :account AND key = 'k' || :k || '-' || :client_id;
COMMIT;
SQL
cat >"$work/block_floor_payment.sql" <<'SQL'
\set account random(1, 100000)
BEGIN;
INSERT INTO payments(account, amount) VALUES (:account, 10);
COMMIT;
SQL
chmod 644 "$work"/*.sql

# Distributed query executions Citus counted on all three nodes (each a statement it
# planned and ran on a shard, locally or over a connection).
executions() {
  local port total=0
  for port in "${ports[@]}"; do
    total=$((total + $(on "$port" -At -c "SELECT query_execution_single_shard + query_execution_multi_shard
                                           FROM citus_stat_counters WHERE name = 'postgres'")))
  done
  echo "$total"
}

# CPU ticks (of 1/100 s) that a node's server processes used so far: the postmaster's
# own and its exited children's (it reaps them: cutime, cstime), and its live
# children's. pgbench's own time is not a node's.
node_ticks() {
  local pid child total
  pid=$(head -1 "$work/$1/data/postmaster.pid")
  total=$(awk '{ sub(/^.*\) /, ""); print $12 + $13 + $14 + $15 }' "/proc/$pid/stat")
  for child in $(pgrep -P "$pid"); do
    total=$((total + $(awk '{ sub(/^.*\) /, ""); print $12 + $13 }' "/proc/$child/stat" 2>/dev/null || echo 0)))
  done
  echo "$total"
}

# run WHERE PROCEDURE: prints "tps latency_ms failed executions_per_call
# coordinator_us_per_call workers_us_per_call" (µs of CPU per transaction)
run() {
  local port=${ports[0]} out before coordinator_before workers_before
  [ "$1" = worker ] && port=${ports[1]}
  before=$(executions)
  coordinator_before=$(node_ticks coordinator)
  workers_before=$(($(node_ticks worker1) + $(node_ticks worker2)))
  out=$(runuser -u postgres -- env PGOPTIONS="-c synchronous_commit=off" \
    pgbench -n -h 127.0.0.1 -p "$port" -c "$CLIENTS" -j 2 -T "$SECONDS_PER_RUN" \
    -f "$work/$1_$2.sql" postgres 2>&1) || true
  local tps latency failed processed
  tps=$(sed -nE 's/^tps = ([0-9.]+).*/\1/p' <<<"$out")
  latency=$(sed -nE 's/^latency average = ([0-9.]+) ms/\1/p' <<<"$out")
  failed=$(sed -nE 's/^number of failed transactions: ([0-9]+).*/\1/p' <<<"$out")
  processed=$(sed -nE 's/^number of transactions actually processed: ([0-9]+).*/\1/p' <<<"$out")
  grep -q aborted <<<"$out" && failed=aborted
  sleep 1  # pgbench's backends exit and are reaped
  local coordinator_ticks=$(($(node_ticks coordinator) - coordinator_before))
  local workers_ticks=$(($(node_ticks worker1) + $(node_ticks worker2) - workers_before))
  echo "${tps:-0} ${latency:-0} ${failed:-0} $(awk -v e="$(($(executions) - before))" -v n="${processed:-0}" 'BEGIN { printf "%.2f", n ? e / n : 0 }')" \
    "$(awk -v t="$coordinator_ticks" -v n="${processed:-0}" 'BEGIN { printf "%.0f", n ? t * 10000 / n : 0 }')" \
    "$(awk -v t="$workers_ticks" -v n="${processed:-0}" 'BEGIN { printf "%.0f", n ? t * 10000 / n : 0 }')"
}
median() { sort -n | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

declare -A results
for round in $(seq "$ROUNDS"); do
  for where in coordinator worker block; do
    for procedure in floor_payment hand_payment create_payment; do
      read -r tps latency failed per_call coordinator_us workers_us < <(run "$where" "$procedure")
      results[$where,$procedure]+="$tps $latency $failed $per_call $coordinator_us $workers_us"$'\n'
      echo "round $round $where $procedure: $tps tps, $latency ms, $failed failed, $per_call Citus executions per call, CPU per call: coordinator $coordinator_us µs, workers $workers_us µs" >&2
    done
  done
done

# The relay: RELAY_EVENTS events of 1,000 aggregates (one per account, accounts over
# every shard), emitted by delegated calls, drained by 4 relays on the coordinator
# (test/bench/relay.sql: claim 500, ack), each call serving every shard; against the
# same on one node: a database of the coordinator's server without Citus, whose
# outbox is node-local. (Delivered events are kept for an hour, to be counted.)
RELAY_EVENTS=${RELAY_EVENTS:-20000}
on "${ports[0]}" >/dev/null <<SQL
CREATE FUNCTION bench_emit(p_account bigint, n integer) RETURNS bigint LANGUAGE sql AS \$\$
  SELECT count(idem_emit('bench.relay', jsonb_build_object('n', g), p_account::text, route => p_account))
  FROM generate_series(1, n) g \$\$;
SELECT create_distributed_function('bench_emit(bigint, integer)', 'p_account', colocate_with => 'payments');
CREATE DATABASE single;
SQL
on "${ports[0]}" -d single -c 'CREATE EXTENSION idempotency' >/dev/null
chmod 644 test/bench/relay.sql
# relay DATABASE COUNT_SQL: drains the outbox with 4 relays; prints events/s.
relay() {
  local start rounds=0
  start=$(date +%s.%N)
  until [ "$(on "${ports[0]}" -d "$1" -At -c "$2")" = 0 ]; do
    runuser -u postgres -- env PGOPTIONS="-c synchronous_commit=off" pgbench -n -h 127.0.0.1 \
      -p "${ports[0]}" -c 4 -j 2 -t 5 -f test/bench/relay.sql "$1" >/dev/null 2>&1 || true
    rounds=$((rounds + 1))
    [ "$rounds" -lt 1000 ] || break
  done
  awk -v s="$start" -v e="$(date +%s.%N)" -v n="$RELAY_EVENTS" 'BEGIN { printf "%.0f", n / (e - s) }'
}
per_account=$((RELAY_EVENTS / 1000))
seq 1 1000 | sed "s/.*/SELECT bench_emit(&, $per_account);/" | on "${ports[0]}" >/dev/null
on "${ports[0]}" -d single -c "SELECT count(idem_emit('bench.relay', jsonb_build_object('n', g), (g % 1000)::text))
                               FROM generate_series(1, $RELAY_EVENTS) g" >/dev/null
relay_before=$(executions)
relay_cluster=$(relay postgres "SELECT count(*) FROM idempotency.routed_outbox WHERE state = 'p'")
relay_per_batch=$(awk -v e="$(($(executions) - relay_before))" -v n="$RELAY_EVENTS" 'BEGIN { printf "%.1f", e / (n / 500) }')
relay_single=$(relay single "SELECT count(*) FROM idempotency.outbox WHERE state = 'p'")
delivered=$(on "${ports[0]}" -At -c "SELECT count(*) FROM idempotency.routed_outbox WHERE state = 'd'")
echo "relay: $relay_cluster events/s on the cluster, $relay_single on one node" >&2

# Every call paid once: one payment per key stored.
paid=$(on "${ports[0]}" -At -c "SELECT count(*) FROM payments")
keys=$(on "${ports[0]}" -At -c "SELECT count(*) FROM idempotency.routed_keys")
hand_keys=$(on "${ports[0]}" -At -c "SELECT count(*) FROM hand_keys")

out=test/bench/results-citus-pg$PG_VERSION.md
{
  echo "PostgreSQL $("$PG_CONFIG" --version | awk '{ print $2 }'), Citus $citus, 1 coordinator + 2 workers on one machine ($(nproc) cores), 32 shards, $CLIENTS clients, synchronous_commit off, $ROUNDS rounds x ${SECONDS_PER_RUN}s, median TPS (min-max)."
  echo
  echo "| called | floor (no key) TPS | hand (own key table) TPS | ext (claim + complete) TPS | ext / floor | ext / hand | latency floor / hand / ext ms | Citus executions per call, floor / hand / ext |"
  echo "| --- | --- | --- | --- | --- | --- | --- | --- |"
  for where in coordinator worker block; do
    floor=$(awk 'NF { print $1 }' <<<"${results[$where,floor_payment]}" | median)
    hand=$(awk 'NF { print $1 }' <<<"${results[$where,hand_payment]}" | median)
    ext=$(awk 'NF { print $1 }' <<<"${results[$where,create_payment]}" | median)
    range() { awk 'NF { print $1 }' <<<"${results[$where,$1]}" | sort -n | awk 'NR == 1 { lo = $1 } { hi = $1 } END { printf "%.0f-%.0f", lo, hi }'; }
    lat() { awk 'NF { print $2 }' <<<"${results[$where,$1]}" | median; }
    per_call() { awk 'NF { print $4 }' <<<"${results[$where,$1]}" | median; }
    printf '| %s | %.0f (%s) | %.0f (%s) | %.0f (%s) | %.2f | %.2f | %s / %s / %s | %s / %s / %s |\n' "$where" \
      "$floor" "$(range floor_payment)" "$hand" "$(range hand_payment)" "$ext" "$(range create_payment)" \
      "$(awk -v a="$ext" -v b="$floor" 'BEGIN { print a / b }')" "$(awk -v a="$ext" -v b="$hand" 'BEGIN { print a / b }')" \
      "$(lat floor_payment)" "$(lat hand_payment)" "$(lat create_payment)" \
      "$(per_call floor_payment)" "$(per_call hand_payment)" "$(per_call create_payment)"
  done
  echo
  echo "Server CPU per transaction (µs, median; the processes of each node's postmaster, pgbench not included), coordinator / both workers:"
  echo
  echo "| called | floor | hand | ext |"
  echo "| --- | --- | --- | --- |"
  for where in coordinator worker block; do
    cpu() { echo "$(awk 'NF { print $5 }' <<<"${results[$where,$1]}" | median) / $(awk 'NF { print $6 }' <<<"${results[$where,$1]}" | median)"; }
    echo "| $where | $(cpu floor_payment) | $(cpu hand_payment) | $(cpu create_payment) |"
  done
  echo
  echo "Payments: $paid; keys stored (one per ext call): $keys; hand-written keys (one per hand call): $hand_keys."
  echo
  echo "| relay, $RELAY_EVENTS events of 1,000 aggregates, 4 relays on the coordinator (claim 500, ack) | events/s | Citus executions per batch of 500 (claim and ack) |"
  echo "| --- | --- | --- |"
  echo "| 32 shards on 2 workers | $relay_cluster | $relay_per_batch |"
  echo "| one node (a database without Citus) | $relay_single | 0 |"
  echo
  echo "Events delivered on the cluster: $delivered of $RELAY_EVENTS."
} | tee "$out"
