#!/usr/bin/env bash
# Instructions per call of the benchmark's scenarios and their floors, counted by
# valgrind's callgrind in one backend (not timed: the count does not depend on the
# machine's load). Not part of CI.
#   PG_CONFIG=/path/to/bin/pg_config test/bench/profile.sh   # builds, installs, profiles
#   PG_VERSION=18 test/bench/profile.sh          # a PostgreSQL of scripts/pg_versions.sh
#   CALLS=2000 KEYS=20000 OUT=/tmp/profile test/bench/profile.sh
#   ONLY=batch BATCH=100 BATCH_KEYS=20000 test/bench/profile.sh   # the batch inbox alone
#   ONLY=claims test/bench/profile.sh   # a new key and a replay alone (an A/B of the claim path)
# Each scenario runs in a session of its own against a postmaster started under
# callgrind: a warm-up (the session's caches, the first call's look-ups), then
# `SELECT pg_sleep(0)`, before which callgrind zeroes its counters, then the measured
# calls. Only what runs inside exec_simple_query is counted (parse, plan, execution
# and commit of each statement; not reading the client's messages). Prints a table of
# instructions per call (per key for idem_once) and leaves in $OUT, for each
# scenario, the callgrind file and callgrind_annotate's inclusive and exclusive
# listings.
set -euo pipefail
cd "$(dirname "$0")/../.."
given_pg_config=${PG_CONFIG:-}
. scripts/lib.sh  # sets PG_BIN and PG_CONFIG to Debian's PostgreSQL 15
if [ -n "$given_pg_config" ]; then
  PG_CONFIG=$given_pg_config
elif [ -n "${PG_VERSION:-}" ] && [ "$PG_VERSION" != 15 ]; then
  . scripts/pg_versions.sh
  PG_CONFIG=$(pg_prefix "$PG_VERSION")/bin/pg_config
fi
PG_BIN=$("$PG_CONFIG" --bindir)
CALLS=${CALLS:-2000}  # calls per procedure scenario
KEYS=${KEYS:-20000}   # keys of the idem_once statement and of its floor
OUT=${OUT:-$(mktemp -d /tmp/idempotency-profile.XXXXXX)}
mkdir -p "$OUT"

command -v valgrind >/dev/null || apt-get install -y valgrind >/dev/null
# -g only adds debug information (file and line in the listings), not other code.
make -s clean PG_CONFIG="$PG_CONFIG" >/dev/null  # objects of another version's headers
make -s -j2 PG_CONFIG="$PG_CONFIG" COPT=-g && make -s install PG_CONFIG="$PG_CONFIG"

work=$(mktemp -d /tmp/idempotency-profile-work.XXXXXX)
chmod 755 "$work"
trap 'stop_cluster "$work/cluster"; rm -rf "$work"' EXIT
port=$(free_port)
# As test/bench/run.sh's cluster, with nothing running beside the measured session.
init_cluster "$work/cluster" "port = $port" "shared_preload_libraries = 'idempotency'" \
  "max_connections = 20" "shared_buffers = '512MB'" "max_wal_size = '4GB'" \
  "autovacuum = off" "idempotency.reaper_enabled = off"
mkdir -p "$work/cg" && chown postgres "$work/cg"
runuser -u postgres -- valgrind --tool=callgrind --collect-atstart=no \
  --toggle-collect=exec_simple_query --zero-before=pg_sleep \
  --callgrind-out-file="$work/cg/callgrind.%p" \
  "$PG_BIN/postgres" -D "$work/cluster/data" >"$work/cluster/server.log" 2>&1 &
postmaster=$!
until runuser -u postgres -- "$PG_BIN/pg_isready" -q -h 127.0.0.1 -p "$port"; do
  kill -0 "$postmaster" 2>/dev/null || { tail -n 20 "$work/cluster/server.log" >&2; exit 1; }
  sleep 1
done
psql_() { runuser -u postgres -- "$PG_BIN/psql" -X -q -h 127.0.0.1 -p "$port" -d postgres -v ON_ERROR_STOP=1 "$@"; }

cp test/bench/setup.sql "$work/"
chmod 644 "$work/setup.sql"
psql_ -f "$work/setup.sql"
# The floors' key tables as large as the store (setup.sql put 100,000 keys there), so
# that each primary key is as deep as the store's.
psql_ -c "INSERT INTO floor_keys SELECT 'payments', 'replay-' || g, '\\x'::bytea, NULL, now() + interval '1 day'
          FROM generate_series(1, 100000) g" \
      -c "INSERT INTO floor_ttl_keys SELECT * FROM floor_keys" \
      -c "VACUUM ANALYZE" -c "CHECKPOINT"

. test/bench/callgrind_lib.sh
scenario() { callgrind_session "$1" "$2" psql_; }  # NAME FILE

once_session() {  # idem_once over $KEYS keys in one statement; $1 = a tag for the keys
  echo "SELECT pg_backend_pid();"
  echo "SELECT count(*) FROM generate_series(1, 100) g WHERE idem_once('inbox', ('warm-$1-' || g)::idem_key);"
  echo "CHECKPOINT;"
  echo "SELECT pg_sleep(0);"
  echo "SELECT count(*) FROM generate_series(1, $KEYS) g WHERE idem_once('inbox', ('m-$1-' || g)::idem_key);"
}

once_floor_session() {
  echo "SELECT pg_backend_pid();"
  echo "INSERT INTO floor_keys(scope, key, fingerprint, response, expires_at)
        SELECT 'inbox', 'warm-$1-' || g, '\\x'::bytea, NULL, now() + interval '24 hours'
        FROM generate_series(1, 100) g;"
  echo "CHECKPOINT;"
  echo "SELECT pg_sleep(0);"
  echo "INSERT INTO floor_keys(scope, key, fingerprint, response, expires_at)
        SELECT 'inbox', 'm-$1-' || g, '\\x'::bytea, NULL, now() + interval '24 hours'
        FROM generate_series(1, $KEYS) g;"
}

once_floor_ttl_session() {  # the same into floor_ttl_keys, which has an expiry index
  once_floor_session "$1" | sed 's/INTO floor_keys/INTO floor_ttl_keys/'
}

# The batch inbox (idem_once_many) and its floors, per key: batches of BATCH keys,
# BATCH_KEYS keys in all, after a warm-up of 5 batches (test/bench/batch_lib.sh).
. test/bench/batch_lib.sh
BATCH=${BATCH:-100}
BATCH_KEYS=${BATCH_KEYS:-20000}
batch_session() {  # kind [half]
  local b
  echo "SELECT pg_backend_pid();"
  echo "SET synchronous_commit = off;"
  for b in $(seq 5); do batch_statement "$1" "$BATCH" "warm-$1-${2:-}" "$b" "${2:-}"; done
  echo "CHECKPOINT;"
  echo "SELECT pg_sleep(0);"
  for b in $(seq $((BATCH_KEYS / BATCH))); do batch_statement "$1" "$BATCH" "$1-${2:-}" "$b" "${2:-}"; done
}
declare -A ir
if [ "${ONLY:-}" = batch ]; then
  for kind in many floor single; do
    batch_session $kind >"$work/batch_$kind.sql"
    ir[batch_$kind]=$(scenario "batch_$kind" "$work/batch_$kind.sql")
    batch_session $kind half >"$work/batch_${kind}_half.sql"
    ir[batch_${kind}_half]=$(scenario "batch_${kind}_half" "$work/batch_${kind}_half.sql")
  done
  per() { awk -v t="$1" -v n="$2" 'BEGIN { printf "%.0f", t / n }'; }
  {
    echo "| per key, batches of $BATCH | idem_once_many | floor (INSERT ... ON CONFLICT DO NOTHING RETURNING) | idem_once, one call each | floor / idem_once_many | idem_once / idem_once_many |"
    echo "| --- | --- | --- | --- | --- | --- |"
    for half in "" _half; do
      m=$(per "${ir[batch_many$half]}" "$BATCH_KEYS") f=$(per "${ir[batch_floor$half]}" "$BATCH_KEYS")
      s=$(per "${ir[batch_single$half]}" "$BATCH_KEYS")
      echo "| ${half:+half already seen}${half:-new keys} | $m | $f | $s | $(awk -v a="$m" -v b="$f" 'BEGIN { printf "%.2f", b / a }') | $(awk -v a="$m" -v b="$s" 'BEGIN { printf "%.2f", b / a }') |"
    done
    echo
    echo "PostgreSQL $("$PG_BIN/postgres" --version | awk '{print $3}'), $BATCH_KEYS keys per scenario, synchronous_commit off; profiles in $OUT."
  } | tee "$OUT/summary.md"
  exit 0
fi
if [ "${ONLY:-}" = claims ]; then
  calls_session create_payment "gen_random_uuid()::idem_key" "$CALLS" >"$work/ext_new.sql"
  ir[ext_new]=$(scenario ext_new "$work/ext_new.sql")
  # Replays of one completed key (setup.sql's, made for account 42).
  calls_session create_payment "'replay-42'::idem_key" "$CALLS" 42 >"$work/ext_replay.sql"
  ir[ext_replay]=$(scenario ext_replay "$work/ext_replay.sql")
  for name in ext_new ext_replay; do
    echo "$name: $(awk -v t="${ir[$name]}" -v n="$CALLS" 'BEGIN { printf "%.0f", t / n }') instructions per call"
  done | tee "$OUT/summary.md"
  exit 0
fi
once_session 1 >"$work/once.sql"
ir[once]=$(scenario once "$work/once.sql")
once_floor_session 1 >"$work/once_floor.sql"
ir[once_floor]=$(scenario once_floor "$work/once_floor.sql")
once_floor_ttl_session 1 >"$work/once_floor_ttl.sql"
ir[once_floor_ttl]=$(scenario once_floor_ttl "$work/once_floor_ttl.sql")
calls_session bare_payment "" "$CALLS" >"$work/bare.sql"
ir[bare]=$(scenario bare "$work/bare.sql")
calls_session floor_payment "gen_random_uuid()::text" "$CALLS" >"$work/floor.sql"
ir[floor]=$(scenario floor "$work/floor.sql")
calls_session floor_ttl_payment "gen_random_uuid()::text" "$CALLS" >"$work/floor_ttl.sql"
ir[floor_ttl]=$(scenario floor_ttl "$work/floor_ttl.sql")
calls_session create_payment "gen_random_uuid()::idem_key" "$CALLS" >"$work/ext_new.sql"
ir[ext_new]=$(scenario ext_new "$work/ext_new.sql")
calls_session create_payment_plain_emit "gen_random_uuid()::idem_key" "$CALLS" >"$work/ext_plain_emit.sql"
ir[ext_plain_emit]=$(scenario ext_plain_emit "$work/ext_plain_emit.sql")
calls_session create_payment_emit "gen_random_uuid()::idem_key" "$CALLS" >"$work/ext_emit.sql"
ir[ext_emit]=$(scenario ext_emit "$work/ext_emit.sql")

per() { awk -v t="$1" -v n="$2" 'BEGIN { printf "%.0f", t / n }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", b / a }'; }  # floor/scenario: like a TPS ratio
{
  echo "| scenario | instructions per call | against | its instructions | ratio (floor / scenario) |"
  echo "| --- | --- | --- | --- | --- |"
  once=$(per "${ir[once]}" "$KEYS") once_floor=$(per "${ir[once_floor]}" "$KEYS")
  echo "| idem_once (per key, $KEYS in one statement) | $once | INSERT ... SELECT into floor_keys | $once_floor | $(ratio "$once" "$once_floor") |"
  once_floor_ttl=$(per "${ir[once_floor_ttl]}" "$KEYS")
  echo "| idem_once (per key) | $once | the same into floor_ttl_keys (with an expiry index) | $once_floor_ttl | $(ratio "$once" "$once_floor_ttl") |"
  for pair in "ext_new floor_ttl" "ext_new floor" "ext_emit ext_plain_emit" "floor_ttl bare"; do
    read -r a b <<<"$pair"
    echo "| $a | $(per "${ir[$a]}" "$CALLS") | $b | $(per "${ir[$b]}" "$CALLS") | $(ratio "$(per "${ir[$a]}" "$CALLS")" "$(per "${ir[$b]}" "$CALLS")") |"
  done
  echo
  echo "PostgreSQL $("$PG_BIN/postgres" --version | awk '{print $3}'), $CALLS calls per procedure scenario, synchronous_commit off; profiles in $OUT."
} | tee "$OUT/summary.md"
