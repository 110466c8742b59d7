#!/usr/bin/env bash
# The batch inbox: idem_once_many in batches of 1, 10, 100 and 1,000 new keys and of
# 100 keys half already seen, against its floor (one hand-written INSERT ... SELECT
# unnest(keys) ... ON CONFLICT DO NOTHING RETURNING into floor_many, a plain table with
# the store's columns and indexes) and against one idem_once per key (100 calls in one
# statement, and 100 statements in one transaction as a consumer loop sends them).
# Measured as one session's CPU time (its utime + stime from /proc), which moves far
# less than throughput on a shared machine. Not part of CI.
#   test/bench/batch.sh                      # PostgreSQL 15, KEYS=100000 per scenario, 3 runs
#   PG_VERSION=18 test/bench/batch.sh        # another version (scripts/pg_versions.sh)
#   PG_CONFIG=/path/to/pg_config test/bench/batch.sh
# Prints a Markdown table and writes test/bench/results-batch.md (-pgNN for another
# version).
set -euo pipefail
cd "$(dirname "$0")/../.."
given_pg_config=${PG_CONFIG:-}
. scripts/lib.sh  # sets PG_BIN and PG_CONFIG to Debian's PostgreSQL 15
PG_VERSION=${PG_VERSION:-15}
if [ -n "$given_pg_config" ]; then
  PG_CONFIG=$given_pg_config
elif [ "$PG_VERSION" != 15 ]; then
  . scripts/pg_versions.sh
  PG_CONFIG=$(pg_prefix "$PG_VERSION")/bin/pg_config
fi
PG_BIN=$("$PG_CONFIG" --bindir)
version=$("$PG_BIN/postgres" --version | awk '{print $3}')
suffix=$([ "${version%%.*}" = 15 ] || echo "-pg${version%%.*}")
KEYS=${KEYS:-100000}
RUNS=${RUNS:-3}
. test/bench/batch_lib.sh

work=$(mktemp -d /tmp/idempotency-batch.XXXXXX)
chmod 755 "$work"
# At exit the objects built for this version go, so that a later build for another starts clean.
trap 'stop_cluster "$work/cluster"; rm -rf "$work"; make -s clean PG_CONFIG="$PG_CONFIG" >/dev/null' EXIT
make -s clean PG_CONFIG="$PG_CONFIG" >/dev/null  # objects of another version's headers
build_and_install
cp test/bench/setup.sql "$work/"
chmod 644 "$work/setup.sql"
port=$(free_port)
start_cluster "$work/cluster" "$port" "shared_preload_libraries = 'idempotency'" \
  "shared_buffers = '512MB'" "max_wal_size = '4GB'" "autovacuum = off" \
  "idempotency.reaper_enabled = off"
psql_() { runuser -u postgres -- "$PG_BIN/psql" -X -q -h 127.0.0.1 -p "$port" -d postgres -v ON_ERROR_STOP=1 "$@"; }
psql_ -f "$work/setup.sql"

# session KIND N [half] RUN: a psql script of KEYS keys in batches of N, after a warm-up
# of 5 batches; prints the session's CPU time in microseconds per key.
session() {
  local kind=$1 n=$2 half=$3 run=$4 b
  echo "SET synchronous_commit = off;"
  for b in $(seq 5); do batch_statement "$kind" "$n" "warm-$run-$kind$half" "$b" "$half"; done
  echo "CHECKPOINT;"
  echo "SELECT split_part(pg_read_file('/proc/self/stat'), ' ', 14)::bigint
             + split_part(pg_read_file('/proc/self/stat'), ' ', 15)::bigint AS t0 \\gset"
  for b in $(seq $((KEYS / n))); do batch_statement "$kind" "$n" "$run-$kind$half" "$b" "$half"; done
  echo "SELECT round((split_part(pg_read_file('/proc/self/stat'), ' ', 14)::bigint
                    + split_part(pg_read_file('/proc/self/stat'), ' ', 15)::bigint - :t0)
                    * 10000.0 / $KEYS, 2) AS us \\gset"  # ticks of 10 ms
  echo "\\echo :us"
}

median() { sort -n | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
SCENARIOS=("many 1" "floor 1" "many 10" "floor 10" "many 100" "floor 100" "single 100"
           "single_statements 100" "many 1000" "floor 1000" "many 100 half" "floor 100 half"
           "single 100 half")
declare -A us
for run in $(seq "$RUNS"); do
  for scenario in "${SCENARIOS[@]}"; do   # interleaved
    read -r kind n half <<<"$scenario"
    session "$kind" "$n" "${half:-}" "$run" >"$work/session.sql"
    chmod 644 "$work/session.sql"
    result=$(psql_ -At -f "$work/session.sql" | tail -1)
    us[$scenario]+="$result"$'\n'
    echo "run $run, $scenario: $result µs per key" >&2
  done
  psql_ -c "VACUUM" >/dev/null
done

med() { awk 'NF' <<<"${us[$1]}" | median; }
ratio() { awk -v a="$(med "$1")" -v b="$(med "$2")" 'BEGIN { printf "%.2f", b / a }'; }
report=test/bench/results-batch$suffix.md
{
  echo "| batch | idem_once_many µs/key | floor µs/key | × floor | one idem_once per key µs/key | × idem_once |"
  echo "| --- | --- | --- | --- | --- | --- |"
  for n in 1 10 100 1000; do
    if [ "$n" = 100 ]; then
      echo "| $n new keys | $(med "many $n") | $(med "floor $n") | $(ratio "many $n" "floor $n") | $(med "single $n") (one statement); $(med "single_statements $n") (a statement each) | $(ratio "many $n" "single $n"); $(ratio "many $n" "single_statements $n") |"
    else
      echo "| $n new key$([ "$n" = 1 ] || echo s) | $(med "many $n") | $(med "floor $n") | $(ratio "many $n" "floor $n") | | |"
    fi
  done
  echo "| 100 keys, half already seen | $(med "many 100 half") | $(med "floor 100 half") | $(ratio "many 100 half" "floor 100 half") | $(med "single 100 half") (one statement) | $(ratio "many 100 half" "single 100 half") |"
  echo
  echo "PostgreSQL $version, one session, $KEYS keys per scenario, median of $RUNS runs (interleaved), synchronous_commit off; × = the other's time / idem_once_many's (above 1: idem_once_many is faster). $(date -u +%Y-%m-%d), $(nproc) cores."
} | tee "$report"
