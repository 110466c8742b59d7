#!/usr/bin/env bash
# Instructions per request of the two editions side by side, counted by valgrind's
# callgrind (not timed: the count does not depend on the machine's load). Not part of CI.
#   test/bench/profile_editions.sh                 # PostgreSQL 18 (scripts/pg_versions.sh)
#   PG_VERSION=17 CALLS=500 test/bench/profile_editions.sh
# (Not Debian's 15: its postgres is stripped, so callgrind cannot find exec_simple_query.)
# Two postmasters under callgrind: one with the native library preloaded (database
# bench, test/bench/setup.sql), one without it (the native library reserves the
# idempotency.* settings the SQL-only edition reads) where the database owner runs
# dist/idempotency-sql--1.5.sql and test/bench/peers/setup-sql.sql, as a user would.
# The requests are test/bench/peers' payment request, `CALL create_payment(...)`: new
# keys and replays, as the store's owner (native) and as a plain role (SQL-only, under
# row-level security); each store holds 100,000 keys of that role. The hand-written
# table (setup.sql's plpgsql_payment) runs in the native cluster; two yardsticks of
# test/bench/yardsticks-sql.sql in the SQL-only edition's database: the payment's insert
# alone, and the edition's three statements of a new key alone on a copy of its store.
# Counted as profile.sh counts: only exec_simple_query, from the session's pg_sleep(0)
# on, after 50 warm-up calls. Prints instructions per call and leaves the profiles and
# callgrind_annotate's listings in $OUT.
set -euo pipefail
cd "$(dirname "$0")/../.."
. scripts/lib.sh
. scripts/pg_versions.sh
PG_CONFIG=$(pg_prefix "${PG_VERSION:-18}")/bin/pg_config
PG_BIN=$("$PG_CONFIG" --bindir)
CALLS=${CALLS:-500}
OUT=${OUT:-$(mktemp -d /tmp/idempotency-profile-editions.XXXXXX)}
mkdir -p "$OUT"

command -v valgrind >/dev/null || apt-get install -y valgrind >/dev/null
make -s clean PG_CONFIG="$PG_CONFIG" >/dev/null
make -s -j2 PG_CONFIG="$PG_CONFIG" && make -s install PG_CONFIG="$PG_CONFIG"
make -s sql-only >/dev/null

work=$(mktemp -d /tmp/idempotency-profile-editions-work.XXXXXX)
chmod 755 "$work"
postmasters=()
# A postmaster under valgrind can outlast pg_ctl's wait: whatever is left is killed.
trap 'stop_cluster "$work/native"; stop_cluster "$work/sql"
      for pid in "${postmasters[@]}"; do pkill -KILL -P "$pid" 2>/dev/null || true; kill -KILL "$pid" 2>/dev/null || true; done
      rm -rf "$work"' EXIT
mkdir -p "$work/cg" && chown postgres "$work/cg"
cp test/bench/setup.sql test/bench/peers/setup-sql.sql test/bench/yardsticks-sql.sql \
  dist/idempotency-sql--1.5.sql "$work/"
chmod 644 "$work"/*.sql

# start NAME PRELOAD: a postmaster under callgrind; sets started_port.
start() {
  local name=$1 preload=$2 port
  port=$(free_port)
  init_cluster "$work/$name" "port = $port" "shared_preload_libraries = '$preload'" \
    "max_connections = 20" "shared_buffers = '512MB'" "max_wal_size = '4GB'" "autovacuum = off"
  runuser -u postgres -- valgrind --tool=callgrind --collect-atstart=no \
    --toggle-collect=exec_simple_query --zero-before=pg_sleep \
    --callgrind-out-file="$work/cg/callgrind.%p" \
    "$PG_BIN/postgres" -D "$work/$name/data" >"$work/$name/server.log" 2>&1 &
  postmasters+=("$!")
  until runuser -u postgres -- "$PG_BIN/pg_isready" -q -h 127.0.0.1 -p "$port"; do sleep 1; done
  started_port=$port
}
start native idempotency
port_native=$started_port
start sql ''
port_sql=$started_port
psql_() { local port=$1; shift; runuser -u postgres -- "$PG_BIN/psql" -X -q -h 127.0.0.1 -p "$port" -v ON_ERROR_STOP=1 "$@"; }

psql_ "$port_native" -d postgres -f "$work/setup.sql"
# The hand-written table as large as the stores (100,000 keys), so that its primary key
# is as deep and its statements are planned for a table of that size: left empty, its
# completion (a SQL function, whose plan 18 caches) scans the table once the plan is
# made for an empty one, and costs more with every call.
psql_ "$port_native" -d postgres \
  -c "INSERT INTO plpgsql_keys(scope, key, fingerprint, state, response, expires_at)
        SELECT 'payments', 'fill-' || g, '\\x'::bytea, 'completed', '{}', now() + interval '1 day'
        FROM generate_series(1, 100000) g" \
  -c "VACUUM ANALYZE" -c "CHECKPOINT"
psql_ "$port_sql" -d postgres -c "CREATE ROLE bench_owner LOGIN" -c "CREATE ROLE bench_app LOGIN" \
  -c "CREATE DATABASE bench_sql OWNER bench_owner"
psql_ "$port_sql" -U bench_owner -d bench_sql -f "$work/idempotency-sql--1.5.sql" >/dev/null 2>&1
psql_ "$port_sql" -U bench_owner -d bench_sql -f "$work/setup-sql.sql"
# 100,000 completed keys of bench_app, one of them the replayed key (account 42).
psql_ "$port_sql" -U bench_app -d bench_sql \
  -c "SELECT count(*) FROM generate_series(1, 100000) g
        WHERE idem_once('payments', ('fill-' || g)::idem_key)" \
  -c "CALL create_payment('replay-42', 42, 10)" >/dev/null
psql_ "$port_sql" -U bench_owner -d bench_sql -f "$work/yardsticks-sql.sql"
psql_ "$port_sql" -d bench_sql -c "VACUUM ANALYZE" -c "CHECKPOINT"

. test/bench/callgrind_lib.sh
# scenario NAME PORT DB USER FILE: the instructions per call the session counted.
scenario() {
  local total
  total=$(callgrind_session "$1" "$5" psql_ "$2" -U "$4" -d "$3")
  awk -v t="$total" -v n="$CALLS" 'BEGIN { printf "%.0f", t / n }'
}
declare -A ir
calls_session create_payment "gen_random_uuid()::idem_key" "$CALLS" >"$work/native_new.sql"
ir[native_new]=$(scenario native_new "$port_native" postgres postgres "$work/native_new.sql")
calls_session create_payment "'replay-42'::idem_key" "$CALLS" 42 >"$work/native_replay.sql"
ir[native_replay]=$(scenario native_replay "$port_native" postgres postgres "$work/native_replay.sql")
calls_session plpgsql_payment "gen_random_uuid()::text" "$CALLS" >"$work/table_new.sql"
ir[table_new]=$(scenario table_new "$port_native" postgres postgres "$work/table_new.sql")
calls_session create_payment "gen_random_uuid()::text" "$CALLS" >"$work/sql_new.sql"
ir[sql_new]=$(scenario sql_new "$port_sql" bench_sql bench_app "$work/sql_new.sql")
calls_session create_payment "'replay-42'" "$CALLS" 42 >"$work/sql_replay.sql"
ir[sql_replay]=$(scenario sql_replay "$port_sql" bench_sql bench_app "$work/sql_replay.sql")
calls_session floor_payment "gen_random_uuid()::text" "$CALLS" >"$work/floor_new.sql"
ir[floor_new]=$(scenario floor_new "$port_sql" bench_sql bench_app "$work/floor_new.sql")
calls_session statements_payment "gen_random_uuid()::text" "$CALLS" >"$work/statements_new.sql"
ir[statements_new]=$(scenario statements_new "$port_sql" bench_sql bench_app "$work/statements_new.sql")

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
{
  echo "| per request (instructions) | native edition | SQL-only edition | SQL-only / native | table by hand (plpgsql_payment) |"
  echo "| --- | ---: | ---: | ---: | ---: |"
  echo "| new key | ${ir[native_new]} | ${ir[sql_new]} | $(ratio "${ir[sql_new]}" "${ir[native_new]}") | ${ir[table_new]} |"
  echo "| replay | ${ir[native_replay]} | ${ir[sql_replay]} | $(ratio "${ir[sql_replay]}" "${ir[native_replay]}") | |"
  echo
  echo "| yardstick in the SQL-only edition's database (test/bench/yardsticks-sql.sql) | instructions | / native new key |"
  echo "| --- | ---: | ---: |"
  echo "| the payment's insert alone (floor_payment) | ${ir[floor_new]} | $(ratio "${ir[floor_new]}" "${ir[native_new]}") |"
  echo "| the edition's three statements alone on a copy of its store (statements_payment) | ${ir[statements_new]} | $(ratio "${ir[statements_new]}" "${ir[native_new]}") |"
  echo
  echo "PostgreSQL $("$PG_BIN/postgres" --version | awk '{print $3}'), $CALLS calls per scenario, synchronous_commit off; profiles in $OUT."
} | tee "$OUT/summary.md"
