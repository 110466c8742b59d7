#!/usr/bin/env bash
# test/bench/peers: the extension side by side with what a team would use instead.
# Not part of CI.
#
#   test/bench/peers/run.sh     # CLIENTS=8 ROUNDS=3 SECONDS_PER_RUN=10 RELAY_EVENTS=5000 RELAY_SECONDS=20
#   PG_VERSION=18 test/bench/peers/run.sh   # another PostgreSQL (scripts/pg_versions.sh)
#
# It installs the npm packages pinned in package-lock.json here (npm ci), builds and
# installs the extension into PostgreSQL 15 (or PG_VERSION; pg_stat_statements added to
# that build if it lacks it), starts ONE throwaway cluster (as the
# postgres OS user, in a temporary directory, on 127.0.0.1; pg_stat_statements and
# idempotency preloaded; wal_level logical for the library's replication relay;
# checkpoint_timeout 1h and max_wal_size 8GB, so that no checkpoint and its full-page
# images fall inside a measured run), and
# runs bench.js: one Node.js process, one client stack (the pg driver) for all. With
# synchronous_commit off and then on, in interleaved rounds, CLIENTS connections each:
#   payment request (claim, insert the payment, store the response), for fresh keys,
#   replays, and 4-way concurrent duplicates of every key:
#     extension  one CALL of create_payment (examples/create_payment.sql's procedure)
#     sqlOnly    the same CALL against the SQL-only edition (dist/idempotency-sql--1.5.sql
#                of `make sql-only`, run with psql -f by the owner of database bench_sql),
#                as role bench_app, a plain role under the store's row-level security.
#                In a second cluster with the same settings but without the native
#                library (which reserves the idempotency.* settings the SQL edition
#                uses as placeholders); server CPU, WAL and statements are counted
#                over both clusters for every run
#     appTable   a hand-written table: BEGIN; INSERT ... ON CONFLICT DO NOTHING;
#                SELECT ... FOR UPDATE; the payment's INSERT; UPDATE of the response;
#                COMMIT, each a statement from the client
#     dbos       DBOS Transact: a workflow whose id is the key, one transaction step
#                (KnexDataSource) inserting the payment
#   messaging: the producer (BEGIN; the payment; its event; COMMIT) through idem_emit and
#   through pg-transactional-outbox's storage, then one relay draining RELAY_EVENTS
#   events: idem_outbox_claim/idem_outbox_ack against the library's polling listener
#   and its logical-replication listener.
# For each: requests/s, round trips per request (queries sent by the pg driver),
# statements per request (pg_stat_statements), server CPU per request (utime + stime
# of every process of the cluster from /proc), client CPU per request (the Node.js
# process), WAL bytes per request (pg_current_wal_insert_lsn), p50 and p99 latency;
# for duplicates the payments per key and how long a duplicate waits.
# Prints Markdown tables and writes them to test/bench/peers/results-pgNN.md, then
# draws test/bench/peers/peers.svg from the results files (test/bench/charts.sh).
# docs/performance-peers.md says what each contender does and the caveats.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/../../.."
. scripts/lib.sh
. scripts/pg_versions.sh
PG_VERSION=${PG_VERSION:-15}

export CLIENTS=${CLIENTS:-8} ROUNDS=${ROUNDS:-3} SECONDS_PER_RUN=${SECONDS_PER_RUN:-10}
export RELAY_EVENTS=${RELAY_EVENTS:-5000} RELAY_SECONDS=${RELAY_SECONDS:-20}

work=$(mktemp -d /tmp/idempotency-peers.XXXXXX)
chmod 755 "$work"
trap 'stop_cluster "$work/cluster"; stop_cluster "$work/cluster-sql"; rm -rf "$work"; make -s clean PG_CONFIG="$PG_CONFIG" >/dev/null' EXIT

REQUIRED_PACKAGES=(postgresql-15 postgresql-server-dev-15 libssl-dev g++ make nodejs gnuplot-nox)  # npm comes with nodejs
ensure_packages
if [ "$PG_VERSION" != 15 ]; then
  PG_BIN=$(pg_prefix "$PG_VERSION")/bin
  PG_CONFIG=$PG_BIN/pg_config
  export PATH="$PG_BIN:$PATH"
  pg_contrib "$PG_VERSION" pg_stat_statements
fi
(cd "$here" && npm ci --no-audit --no-fund --loglevel=error) >&2
make -s clean PG_CONFIG="$PG_CONFIG" >/dev/null  # objects of another version's headers
build_and_install

start_cluster_on_free_port "$work/cluster" "shared_preload_libraries = 'pg_stat_statements, idempotency'" \
  "max_connections = 100" "shared_buffers = '512MB'" "max_wal_size = '8GB'" "checkpoint_timeout = '1h'" \
  "wal_level = logical" "max_wal_senders = 4" "max_replication_slots = 4"
port=$CLUSTER_PORT
# The SQL-only edition's cluster: no custom library; otherwise the same settings.
start_cluster_on_free_port "$work/cluster-sql" "shared_preload_libraries = 'pg_stat_statements'" \
  "max_connections = 100" "shared_buffers = '512MB'" "max_wal_size = '8GB'" "checkpoint_timeout = '1h'" \
  "wal_level = logical" "max_wal_senders = 4" "max_replication_slots = 4"
port_sql=$CLUSTER_PORT
psql_() { runuser -u postgres -- psql -X -q -h 127.0.0.1 -p "$port" -v ON_ERROR_STOP=1 "$@"; }
psql_ -d postgres -c "CREATE DATABASE bench" -c "CREATE ROLE observer SUPERUSER LOGIN"
psql_ -d bench -c "CREATE EXTENSION pg_stat_statements" -f "$here/setup.sql"
# The SQL-only edition: no extension, no library; installed by the database's owner.
make -s sql-only >/dev/null
psql_sql() { runuser -u postgres -- psql -X -q -h 127.0.0.1 -p "$port_sql" -v ON_ERROR_STOP=1 "$@"; }
psql_sql -d postgres -c "CREATE ROLE observer SUPERUSER LOGIN" -c "CREATE ROLE bench_owner LOGIN" \
  -c "CREATE ROLE bench_app LOGIN" -c "CREATE DATABASE bench_sql OWNER bench_owner"
psql_sql -d bench_sql -c "CREATE EXTENSION pg_stat_statements"
psql_sql -U bench_owner -d bench_sql -f dist/idempotency-sql--1.5.sql >/dev/null
psql_sql -U bench_owner -d bench_sql -f "$here/setup-sql.sql"

SQL_EDITION="$(sed -n "s/^default_version = '\(.*\)'/\1/p" idempotency.control) built at $(git rev-parse --short HEAD)" \
PGPORT=$port PGDATA="$work/cluster/data" PGPORT_SQL=$port_sql PGDATA_SQL="$work/cluster-sql/data" RESULTS="$here/results-pg$PG_VERSION.md" node "$here/bench.js"
test/bench/charts.sh  # the charts, from the results files (this one and the others committed)
