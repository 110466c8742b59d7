#!/usr/bin/env bash
# Two builds of the library, A (a commit) and B (the work tree), on one cluster, taking
# turns: whether a change costs anything visible. Not part of CI.
#   BASE=main test/bench/ab.sh        # ROUNDS=5 SECONDS_PER_RUN=10 CLIENTS=8 by default
#   SCENARIOS="ext_new ext_replay" BASE=HEAD~1 test/bench/ab.sh
# Both libraries serve the work tree's SQL scripts (the scenarios call nothing whose
# result type differs between them). Each round runs A then B, or B then A (they
# alternate, so a drift of the machine's load falls on both alike), each after a
# restart with that library installed. Measured: pgbench TPS per scenario
# (synchronous_commit off, as the benchmark's first table), and one session's own CPU
# per transaction of ext_new's procedure over 20,000 calls (utime + stime from /proc,
# which moves far less than throughput does on a shared machine). Prints each run
# and a Markdown table of medians.
set -euo pipefail
cd "$(dirname "$0")/../.."
. scripts/lib.sh
BASE=${BASE:-main}
ROUNDS=${ROUNDS:-5}
SECONDS_PER_RUN=${SECONDS_PER_RUN:-10}
CLIENTS=${CLIENTS:-8}
read -r -a SCENARIOS <<<"${SCENARIOS:-ext_new ext_replay}"

work=$(mktemp -d /tmp/idempotency-ab.XXXXXX)
chmod 755 "$work"
libdir=$("$PG_CONFIG" --pkglibdir)
# At exit: the cluster stopped, the work tree's library installed again.
trap 'stop_cluster "$work/cluster"; [ -f "$work/b.so" ] && cp "$work/b.so" "$libdir/idempotency.so"; rm -rf "$work"' EXIT

say "A: $BASE ($(git rev-parse --short "$BASE")), B: the work tree"
mkdir "$work/base"
git archive "$BASE" | tar -x -C "$work/base"
make -s -C "$work/base" -j2 PG_CONFIG="$PG_CONFIG" >/dev/null
cp "$work/base/idempotency.so" "$work/a.so"
build_and_install >/dev/null
cp "$libdir/idempotency.so" "$work/b.so"

cp test/bench/*.sql "$work/"
cpu_script() {  # 20,000 calls of ext_new's procedure, then µs of CPU per call
  local i
  echo "SET synchronous_commit = off;"
  echo "SELECT split_part(pg_read_file('/proc/self/stat'), ' ', 14)::bigint
             + split_part(pg_read_file('/proc/self/stat'), ' ', 15)::bigint AS t0 \\gset"
  for i in $(seq 20000); do echo "CALL create_payment(gen_random_uuid()::idem_key, $i, 10);"; done
  echo "SELECT round((split_part(pg_read_file('/proc/self/stat'), ' ', 14)::bigint
                    + split_part(pg_read_file('/proc/self/stat'), ' ', 15)::bigint - :t0) / 2.0)
         AS us \\gset"  # ticks of 10 ms over 20,000 transactions
  echo "\\echo :us"
}
cpu_script >"$work/cpu_ext_new.sql"
chmod 644 "$work"/*.sql
port=$(free_port)
start_cluster "$work/cluster" "$port" "shared_preload_libraries = 'idempotency'" \
  "max_connections = 50" "shared_buffers = '512MB'" "max_wal_size = '4GB'" \
  "idempotency.reaper_naptime = '1s'"
psql_() { runuser -u postgres -- psql -X -q -h 127.0.0.1 -p "$port" -d postgres -v ON_ERROR_STOP=1 "$@"; }
psql_ -f "$work/setup.sql"

use_library() {  # a or b: installed, and the cluster restarted with it
  stop_cluster "$work/cluster"
  cp "$work/$1.so" "$libdir/idempotency.so"
  launch_cluster "$work/cluster" "$port" || { tail -n 20 "$work/cluster/server.log" >&2; return 1; }
}

tps_of() {
  runuser -u postgres -- env PGOPTIONS="-c synchronous_commit=off" \
    "$PG_BIN/pgbench" -n -h 127.0.0.1 -p "$port" -c "$CLIENTS" -j 2 -T "$SECONDS_PER_RUN" \
    -f "$work/$1.sql" postgres 2>&1 | sed -nE 's/^tps = ([0-9.]+).*/\1/p'
}

median() { sort -n | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

declare -A runs
for round in $(seq "$ROUNDS"); do
  order="a b"
  if [ $((round % 2)) = 0 ]; then order="b a"; fi
  for lib in $order; do
    use_library "$lib"
    for scenario in "${SCENARIOS[@]}"; do
      tps=$(tps_of "$scenario")
      runs[$lib,$scenario]+="${tps:-0}"$'\n'
      echo "round $round ${lib^^} $scenario: ${tps:-0} tps" >&2
    done
    us=$(psql_ -f "$work/cpu_ext_new.sql" | tail -1)
    runs[$lib,cpu]+="$us"$'\n'
    echo "round $round ${lib^^} one session, ext_new: $us µs CPU per transaction" >&2
  done
done

echo "| measure | A: $BASE | B: work tree | B / A | A runs | B runs |"
echo "| --- | --- | --- | --- | --- | --- |"
for measure in "${SCENARIOS[@]}" cpu; do
  a=$(awk 'NF' <<<"${runs[a,$measure]}" | median)
  b=$(awk 'NF' <<<"${runs[b,$measure]}" | median)
  label="$measure TPS (median)"
  if [ "$measure" = cpu ]; then label="one session, ext_new, µs CPU per transaction (median)"; fi
  echo "| $label | $a | $b | $(awk -v a="$a" -v b="$b" 'BEGIN { printf "%.3f", b / a }') |" \
    "$(awk 'NF' <<<"${runs[a,$measure]}" | tr '\n' ' ') |" \
    "$(awk 'NF' <<<"${runs[b,$measure]}" | tr '\n' ' ') |"
done
