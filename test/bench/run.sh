#!/usr/bin/env bash
# The benchmark: claim path against a bare insert and a hand-written PL/pgSQL layer,
# replays, hot keys, the reaper, a batch consumer and storage. Not part of CI.
#   test/bench/run.sh            # ROUNDS=3 SECONDS_PER_RUN=10 CLIENTS=8 by default
#   PG_VERSION=18 test/bench/run.sh   # another PostgreSQL (scripts/pg_versions.sh)
# Prints a Markdown table and writes test/bench/results.md (results-pgNN.md for a
# PG_VERSION other than 15), then draws the charts from the results files with
# test/bench/charts.sh (tps.svg or tps-pgNN.svg, and targets.svg).
set -euo pipefail
cd "$(dirname "$0")/../.."
. scripts/lib.sh
. scripts/pg_versions.sh
PG_VERSION=${PG_VERSION:-15}
suffix=""
if [ "$PG_VERSION" != 15 ]; then
  PG_BIN=$(pg_prefix "$PG_VERSION")/bin
  PG_CONFIG=$PG_BIN/pg_config
  export PATH="$PG_BIN:$PATH"
  suffix=-pg$PG_VERSION
fi

ROUNDS=${ROUNDS:-3}
SECONDS_PER_RUN=${SECONDS_PER_RUN:-10}
CLIENTS=${CLIENTS:-8}
SCENARIOS=(bare floor floor_ttl floor_emit plpgsql ext_new ext_plain_emit ext_emit ext_replay ext_hot plpgsql_hot)

work=$(mktemp -d /tmp/idempotency-bench.XXXXXX)
chmod 755 "$work"
# At exit the objects built for this version go, so that a later build for another starts clean.
trap 'stop_cluster "$work/cluster"; rm -rf "$work"; make -s clean PG_CONFIG="$PG_CONFIG" >/dev/null' EXIT
REQUIRED_PACKAGES+=(gnuplot-nox)  # the charts
ensure_packages
make -s clean PG_CONFIG="$PG_CONFIG" >/dev/null  # objects of another version's headers
build_and_install
cp test/bench/*.sql "$work/"
chmod 644 "$work"/*.sql
port=$(free_port)
start_cluster "$work/cluster" "$port" "shared_preload_libraries = 'idempotency'" \
  "max_connections = 50" "shared_buffers = '512MB'" "max_wal_size = '4GB'" \
  "idempotency.reaper_naptime = '1s'"
psql_() { runuser -u postgres -- psql -X -q -h 127.0.0.1 -p "$port" -d postgres -v ON_ERROR_STOP=1 "$@"; }
value() { psql_ -At -c "$1"; }
psql_ -f "$work/setup.sql"

# pgbench_run SCENARIO SYNC: prints "tps latency_ms failed"
pgbench_run() {
  local out
  out=$(runuser -u postgres -- env PGOPTIONS="-c synchronous_commit=$2" \
    "$PG_BIN/pgbench" -n -h 127.0.0.1 -p "$port" -c "$CLIENTS" -j 2 -T "$SECONDS_PER_RUN" \
    -f "$work/$1.sql" postgres 2>&1) || true  # an aborted client is counted below
  local tps latency failed
  tps=$(sed -nE 's/^tps = ([0-9.]+).*/\1/p' <<<"$out")
  latency=$(sed -nE 's/^latency average = ([0-9.]+) ms/\1/p' <<<"$out")
  failed=$(sed -nE 's/^number of failed transactions: ([0-9]+).*/\1/p' <<<"$out")
  if grep -q 'aborted' <<<"$out"; then failed=aborted; fi
  echo "${tps:-0} ${latency:-0} ${failed:-0}"
}

median() { sort -n | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

declare -A results
for sync in off on; do
  for round in $(seq "$ROUNDS"); do
    for scenario in "${SCENARIOS[@]}"; do   # interleaved: A B C ... A B C ...
      read -r tps latency failed < <(pgbench_run "$scenario" "$sync")
      results[$sync,$scenario]+="$tps $latency $failed"$'\n'
      echo "round $round synchronous_commit=$sync $scenario: $tps tps, $latency ms, $failed failed" >&2
    done
  done
done

report=test/bench/results$suffix.md
{
  echo "| scenario | synchronous_commit | TPS median (min–max) | latency ms | × bare | × floor | × floor_ttl | × plpgsql | failed |"
  echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"
  for sync in off on; do
    bare=$(awk 'NF { print $1 }' <<<"${results[$sync,bare]}" | median)
    plpgsql=$(awk 'NF { print $1 }' <<<"${results[$sync,plpgsql]}" | median)
    floor=$(awk 'NF { print $1 }' <<<"${results[$sync,floor]}" | median)
    floor_ttl=$(awk 'NF { print $1 }' <<<"${results[$sync,floor_ttl]}" | median)
    for scenario in "${SCENARIOS[@]}"; do
      rows=${results[$sync,$scenario]}
      tps=$(awk 'NF { print $1 }' <<<"$rows" | median)
      low=$(awk 'NF { print $1 }' <<<"$rows" | sort -n | head -1)
      high=$(awk 'NF { print $1 }' <<<"$rows" | sort -n | tail -1)
      latency=$(awk 'NF { print $2 }' <<<"$rows" | median)
      failed=$(awk 'NF { s += $3 } END { print s + 0 }' <<<"$rows")
      echo "| $scenario | $sync | $tps ($low–$high) | $latency | $(awk -v a="$tps" -v b="$bare" 'BEGIN { printf "%.2f", a / b }') | $(awk -v a="$tps" -v b="$floor" 'BEGIN { printf "%.2f", a / b }') | $(awk -v a="$tps" -v b="$floor_ttl" 'BEGIN { printf "%.2f", a / b }') | $(awk -v a="$tps" -v b="$plpgsql" 'BEGIN { printf "%.2f", a / b }') | $failed |"
    done
  done
} >"$report"

# The batch consumer: idem_once over 100,000 message ids in one transaction, and its
# floor: the same keys' finished rows in one plain INSERT ... SELECT into floor_keys
# (its primary key only). Three times each, alternating, each after a CHECKPOINT (and
# first a VACUUM of what the rounds wrote), so that neither autovacuum nor a
# checkpoint the rounds started runs during a measurement, and each pays the same
# full-page images.
psql_ -c "VACUUM" >/dev/null
ms_of() {
  psql_ -c "CHECKPOINT" >/dev/null
  local start
  start=$(value "SELECT extract(epoch FROM clock_timestamp()) * 1000")
  psql_ -c "$1" >/dev/null
  awk -v s="$start" -v e="$(value "SELECT extract(epoch FROM clock_timestamp()) * 1000")" 'BEGIN { print e - s }'
}
once_runs="" once_floor_runs=""
for run in 1 2 3; do
  once_runs+="$(ms_of "SELECT count(*) FROM generate_series(1, 100000) g
                       WHERE idem_once('inbox', ('msg-$run-' || g)::idem_key)")"$'\n'
  once_floor_runs+="$(ms_of "INSERT INTO floor_keys(scope, key, fingerprint, response, expires_at)
                             SELECT 'inbox', 'msg-$run-' || g, '\\x'::bytea, NULL, now() + interval '24 hours'
                             FROM generate_series(1, 100000) g")"$'\n'
done
echo "idem_once runs (ms): $(tr '\n' ' ' <<<"$once_runs")floor: $(tr '\n' ' ' <<<"$once_floor_runs")" >&2
once_ms=$(awk 'NF' <<<"$once_runs" | median)
once_floor_ms=$(awk 'NF' <<<"$once_floor_runs" | median)

# Messaging. idem_emit's cost: ext_emit against ext_new; what a plain event row adds to
# the same transaction (ext_plain_emit against ext_new: the least any table-backed
# outbox adds) and to the floor (floor_emit against floor), from the rounds above.
ratio_off() {
  awk -v a="$(awk 'NF { print $1 }' <<<"${results[off,$1]}" | median)" \
    -v b="$(awk 'NF { print $1 }' <<<"${results[off,$2]}" | median)" 'BEGIN { printf "%.2f", a / b }'
}
ratio_on() {
  awk -v a="$(awk 'NF { print $1 }' <<<"${results[on,$1]}" | median)" \
    -v b="$(awk 'NF { print $1 }' <<<"${results[on,$2]}" | median)" 'BEGIN { printf "%.2f", a / b }'
}
emit_ratio=$(ratio_off ext_emit ext_new)
plain_emit_ratio=$(ratio_off ext_plain_emit ext_new)
floor_emit_ratio=$(ratio_off floor_emit floor)
# The same four measured as one session's CPU per transaction (its utime + stime from
# /proc, in 10 ms ticks, over 20,000 transactions): throughput with 8 clients on 2
# cores moves by 10-20 % from run to run, a backend's own CPU time far less. Three
# runs each, alternating; medians in microseconds.
cpu_script() {  # procedure key_expression -> a psql script of 20,000 calls
  local i
  echo "SET synchronous_commit = off;"
  echo "SELECT split_part(pg_read_file('/proc/self/stat'), ' ', 14)::bigint
             + split_part(pg_read_file('/proc/self/stat'), ' ', 15)::bigint AS t0 \\gset"
  for i in $(seq 20000); do echo "CALL $1($2, $((RANDOM * 32 + RANDOM % 32)), 10);"; done
  echo "SELECT round((split_part(pg_read_file('/proc/self/stat'), ' ', 14)::bigint
                    + split_part(pg_read_file('/proc/self/stat'), ' ', 15)::bigint - :t0) / 2.0)
         AS us \\gset"  # ticks of 10 ms over 20,000 transactions
  echo "\\echo :us"
}
cpu_script floor_payment "gen_random_uuid()::text" >"$work/cpu_floor.sql"
cpu_script floor_ttl_payment "gen_random_uuid()::text" >"$work/cpu_floor_ttl.sql"
cpu_script floor_payment_emit "gen_random_uuid()::text" >"$work/cpu_floor_emit.sql"
cpu_script create_payment "gen_random_uuid()::idem_key" >"$work/cpu_ext_new.sql"
cpu_script create_payment_emit "gen_random_uuid()::idem_key" >"$work/cpu_ext_emit.sql"
cpu_script create_payment_plain_emit "gen_random_uuid()::idem_key" >"$work/cpu_ext_plain_emit.sql"
chmod 644 "$work"/cpu_*.sql
declare -A cpu_runs
for run in 1 2 3; do
  for scenario in floor floor_ttl floor_emit ext_new ext_plain_emit ext_emit; do
    cpu_runs[$scenario]+="$(psql_ -f "$work/cpu_$scenario.sql" | tail -1)"$'\n'
  done
done
declare -A cpu_us
for scenario in floor floor_ttl floor_emit ext_new ext_plain_emit ext_emit; do
  echo "CPU per transaction, $scenario (µs): $(tr '\n' ' ' <<<"${cpu_runs[$scenario]}")" >&2
  cpu_us[$scenario]=$(awk 'NF' <<<"${cpu_runs[$scenario]}" | median)
done
added() { awk -v a="${cpu_us[$1]}" -v b="${cpu_us[$2]}" 'BEGIN { printf "+%.0f µs, +%.0f %%", a - b, 100 * (a - b) / b }'; }
# One hot aggregate: every client emits for the same account.
read -r hot_tps _ hot_failed < <(pgbench_run emit_hot off)
# The relay: 200,000 events of 1,000 aggregates, drained by 4 relays (claim 500,
# ack) and then removed by idem_reap (idempotency.outbox_retention 0).
psql_ -c "ALTER SYSTEM SET idempotency.reaper_enabled = off" -c "SELECT pg_reload_conf()" >/dev/null
psql_ -c "DELETE FROM idempotency.outbox" >/dev/null  # what the rounds above emitted
for part in 0 1 2 3; do
  psql_ -c "SELECT count(idem_emit('bench.relay', jsonb_build_object('n', g), (g % 1000)::text))
            FROM generate_series($part * 50000 + 1, ($part + 1) * 50000) g" >/dev/null
done
psql_ -c "VACUUM ANALYZE idempotency.outbox" -c "CHECKPOINT" >/dev/null
relay_start=$(date +%s.%N)
relay_rounds=0
until [ "$(value "SELECT outbox_undelivered FROM idem_stats()")" = 0 ]; do
  runuser -u postgres -- env PGOPTIONS="-c synchronous_commit=off" "$PG_BIN/pgbench" -n -h 127.0.0.1 \
    -p "$port" -c 4 -j 2 -t 25 -f "$work/relay.sql" postgres >/dev/null 2>&1 || true
  relay_rounds=$((relay_rounds + 1))
  [ "$relay_rounds" -lt 100 ] || break
done
relay_claim_s=$(awk -v s="$relay_start" -v e="$(date +%s.%N)" 'BEGIN { print e - s }')
remove_start=$(date +%s.%N)
psql_ -c "SELECT idem_reap()" >/dev/null
relay_remove_s=$(awk -v s="$remove_start" -v e="$(date +%s.%N)" 'BEGIN { print e - s }')
psql_ -c "ALTER SYSTEM RESET idempotency.reaper_enabled" -c "SELECT pg_reload_conf()" >/dev/null

# The reaper: one million expired keys, reaped by the worker on an idle server.
reaper() {
  psql_ -c "ALTER SYSTEM SET idempotency.reaper_enabled = $1" -c "SELECT pg_reload_conf()" >/dev/null
}
expire_a_million_keys() {
  psql_ -c "INSERT INTO idempotency.keys (role, attempt, first_claimed_at, expires_at, reap_slot, state, scope, key, response)
            SELECT current_user::regrole, 1, now() - interval '2 days', now() - interval '1 day', g % 16, 'c',
                   'expired', ('old-' || g)::idem_key, '{\"payment_id\": 1}' FROM generate_series(1, 1000000) g" >/dev/null
  psql_ -c "ANALYZE idempotency.keys" >/dev/null
}
# Polls the worker's counter in shared memory: counting the rows left would be a
# (parallel) scan of the table, competing with the load being measured.
wait_until_reaped() {
  until [ "$(value "SELECT reaped_total - $1 >= 1000000 FROM idem_stats()")" = t ]; do sleep 0.2; done
}
reaper off
expire_a_million_keys
psql_ -c "CHECKPOINT" >/dev/null  # an otherwise idle server
# The pass itself (its batches, without the wait for it to start) is timed by the worker,
# which logs it at DEBUG1; its end is awaited in the log too. Polling idem_stats would
# not do: each poll is a client running a statement, which makes the worker rest
# between batches as it does for a busy server.
psql_ -c "ALTER SYSTEM SET log_min_messages = debug1" >/dev/null
stats_ms=$(psql_ -At -c '\timing on' -c "SELECT * FROM idem_stats()" | sed -nE 's/^Time: ([0-9.]+) ms.*/\1/p')
pass_line='reaper deleted 1000000 keys and abandoned [0-9]+ stale claims in [0-9]+ ms'
start=$(date +%s.%N)
reaper on
until grep -qE "$pass_line" "$work/cluster/server.log"; do sleep 0.05; done
reap_s=$(awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN { print e - s }')
pass_ms=$(grep -oE "$pass_line" "$work/cluster/server.log" | tail -1 | sed -E 's/.* in ([0-9]+) ms/\1/')
psql_ -c "ALTER SYSTEM RESET log_min_messages" >/dev/null

# The same under ext_new load: pgbench reports TPS every second; the worker starts
# reaping 10 s in. ext_new's TPS while it reaps, against the 10 s before.
reaper off
expire_a_million_keys
runuser -u postgres -- env PGOPTIONS="-c synchronous_commit=off" "$PG_BIN/pgbench" -n -h 127.0.0.1 \
  -p "$port" -c "$CLIENTS" -j 2 -T 40 -P 1 -f "$work/ext_new.sql" postgres >/dev/null 2>"$work/progress.log" &
bench_pid=$!
sleep 10
load_start=$(date +%s.%N)
reaped_before=$(value "SELECT reaped_total FROM idem_stats()")
reaper on
wait_until_reaped "$reaped_before"
load_end=$(date +%s.%N)
wait "$bench_pid" || true
# "progress: 12.0 s, 21000.1 tps, ..." lines: t counts from pgbench's start, about
# (load_start - 10 s) on the wall clock.
read -r tps_before tps_reaping < <(awk -v d="$(awk -v s="$load_start" -v e="$load_end" 'BEGIN { print e - s }')" '
  /^progress: / { t = $2 + 0; tps = $4 + 0
    if (t <= 10) { b += tps; nb++ } else if (t <= 10 + d + 1) { r += tps; nr++ } }
  END { printf "%.0f %.0f\n", nb ? b / nb : 0, nr ? r / nr : 0 }' "$work/progress.log")
load_s=$(awk -v s="$load_start" -v e="$load_end" 'BEGIN { print e - s }')

# Storage per key: 100,000 keys of 36 characters (uuids), each with the same
# response, stored through each layer in a database of its own.
runuser -u postgres -- "$PG_BIN/createdb" -h 127.0.0.1 -p "$port" storage
runuser -u postgres -- psql -X -q -h 127.0.0.1 -p "$port" -d storage -v ON_ERROR_STOP=1 -f "$work/setup.sql" >/dev/null
runuser -u postgres -- psql -X -q -h 127.0.0.1 -p "$port" -d storage -v ON_ERROR_STOP=1 <<'SQL'
TRUNCATE idempotency.keys;  -- drop the replay keys setup.sql stored
BEGIN;
SELECT count(*) FROM (
  SELECT idem_claim('payments', u::idem_key, idem_fingerprint(jsonb_build_object('account', 42, 'amount', 10))),
         idem_complete('payments', u::idem_key, jsonb_build_object('payment_id', g, 'amount', 10))
  FROM (SELECT gen_random_uuid()::text AS u, g FROM generate_series(1, 100000) g) k) s;
COMMIT;
SELECT count(*) FROM (
  SELECT plpgsql_claim('payments', u, sha256(convert_to(jsonb_build_object('account', 42, 'amount', 10)::text, 'UTF8'))),
         plpgsql_complete('payments', u, jsonb_build_object('payment_id', g, 'amount', 10))
  FROM (SELECT gen_random_uuid()::text AS u, g FROM generate_series(1, 100000) g) k) s;
VACUUM ANALYZE idempotency.keys;
VACUUM ANALYZE plpgsql_keys;
SQL
bytes_per_key() {
  runuser -u postgres -- psql -X -At -h 127.0.0.1 -p "$port" -d storage -c \
    "SELECT (pg_table_size('$1') + pg_indexes_size('$1')) / count(*) FROM $1"
}
ext_bytes=$(bytes_per_key idempotency.keys)
plpgsql_bytes=$(bytes_per_key plpgsql_keys)
# The same response is stored by both; the target compares the bytes beyond it.
response_bytes=$(runuser -u postgres -- psql -X -At -h 127.0.0.1 -p "$port" -d storage -c \
  "SELECT round(avg(pg_column_size(response))) FROM plpgsql_keys")

{
  echo
  echo "| measure | result |"
  echo "| --- | --- |"
  echo "| idem_once, 100,000 keys in one transaction (median of 3) | $(awk -v ms="$once_ms" 'BEGIN { printf "%.0f keys/s (%.0f ms)", 100000000 / ms, ms }') |"
  echo "| its floor: the same keys' rows in one plain INSERT ... SELECT into floor_keys (median of 3) | $(awk -v ms="$once_floor_ms" 'BEGIN { printf "%.0f keys/s (%.0f ms)", 100000000 / ms, ms }'); idem_once at $(awk -v a="$once_ms" -v b="$once_floor_ms" 'BEGIN { printf "%.2f", b / a }')× |"
  echo "| reaper, 1,000,000 expired keys on an idle server | $(awk -v ms="$pass_ms" -v s="$reap_s" 'BEGIN { printf "%.0f keys/s in its pass (%.0f ms); %.1f s from switching it on to the last key gone, including the wait for the next naptime (1 s)", 1000000000 / ms, ms, s }') |"
  echo "| the same while ext_new runs (synchronous_commit off) | reaped in $(printf '%.1f' "$load_s") s; ext_new $tps_reaping TPS while it reaped against $tps_before in the 10 s before ($(awk -v a="$tps_reaping" -v b="$tps_before" 'BEGIN { printf "%.2f", b ? a / b : 0 }')×) |"
  echo "| idem_stats on a table of over 1,000,000 keys | ${stats_ms} ms |"
  echo "| ext_emit against ext_new (idem_emit with aggregate and event id in the transaction, synchronous_commit off) | ${emit_ratio}× |"
  echo "| ext_plain_emit against ext_new (one plain INSERT of an event row instead of idem_emit; synchronous_commit off) | ${plain_emit_ratio}× |"
  echo "| floor_emit against floor (one plain INSERT of an event row, no order, no id check; synchronous_commit off) | ${floor_emit_ratio}× |"
  echo "| ext_new against floor_ttl (the floor plus the expiry index; synchronous_commit off / on) | $(ratio_off ext_new floor_ttl)× / $(ratio_on ext_new floor_ttl)× |"
  echo "| one session's CPU per transaction (median of 3 × 20,000): floor / floor_ttl / floor_emit / ext_new / ext_plain_emit / ext_emit | ${cpu_us[floor]} / ${cpu_us[floor_ttl]} / ${cpu_us[floor_emit]} / ${cpu_us[ext_new]} / ${cpu_us[ext_plain_emit]} / ${cpu_us[ext_emit]} µs |"
  echo "| what idem_emit adds to ext_new's CPU; what a plain event row adds to ext_new's; and to the floor's | $(added ext_emit ext_new); $(added ext_plain_emit ext_new); $(added floor_emit floor) |"
  echo "| one hot aggregate, $CLIENTS clients emitting (synchronous_commit off) | $hot_tps TPS, $hot_failed failed |"
  echo "| relay, 200,000 events of 1,000 aggregates, 4 relays (claim 500, ack), then removal | $(awk -v c="$relay_claim_s" -v r="$relay_remove_s" 'BEGIN { printf "%.0f events/s (claim and ack %.1f s, removal %.1f s)", 200000 / (c + r), c, r }') |"
  echo "| bytes per key (table + indexes; 36-character key, response {\"payment_id\": n, \"amount\": 10}), extension | $ext_bytes |"
  echo "| the same, plpgsql | $plpgsql_bytes |"
  echo "| beyond the response ($response_bytes bytes), extension against plpgsql | $(awk -v e="$ext_bytes" -v p="$plpgsql_bytes" -v r="$response_bytes" 'BEGIN { printf "%d / %d = %.2f×", e - r, p - r, (e - r) / (p - r) }') |"
  echo
  echo "Measured $(date -u +%Y-%m-%d) on $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')), PostgreSQL $("$PG_BIN/postgres" --version | awk '{print $3}'), $CLIENTS clients, $ROUNDS interleaved rounds of ${SECONDS_PER_RUN}s: \`PG_VERSION=$PG_VERSION ROUNDS=$ROUNDS SECONDS_PER_RUN=$SECONDS_PER_RUN test/bench/run.sh\`."
} >>"$report"

# The charts, from the results files (this one and the others committed).
test/bench/charts.sh
cat "$report"
