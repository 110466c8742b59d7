#!/usr/bin/env bash
# The project's regression tests (the Makefile's REGRESS) or isolation specs (ISOLATION)
# against the SQL-only edition, installed as a user of a managed host installs it:
#
#   test/sqlonly/run.sh regress|isolation PG_PREFIX DIST OUT [TEST...]
#
# PG_PREFIX is a PostgreSQL without the native edition's files and with pg_tle
# (scripts/sqlonly_deps.sh: pg_copy_without_native, addon_for pg_tle); DIST holds what
# `make sql-only` wrote (idempotency-pgtle--1.5.sql); OUT is a new directory for the
# cluster, the results and regression.diffs. Run as root, from anywhere; the cluster runs
# as the postgres OS user. TESTs default to the Makefile's list less the tests of
# test/sqlonly/native_only (the native edition's internals).
#
# A server of its own (test/sqlonly/server.conf: pg_tle preloaded), where:
#   - CREATE EXTENSION pg_tle in template1, by the superuser (as a host does);
#   - a role that is no superuser, only a member of pgtle_admin, runs the pg_tle
#     installer with psql -f in template1, so that every database made from it (the
#     tests' own, and those some tests make) has the edition registered;
#   - pg_regress runs in a database made from template1 (--use-existing: pg_regress
#     would make its own from template0), set up as pg_regress sets up its own, and the
#     tests' own CREATE EXTENSION idempotency installs the edition there.
# Expected outputs: the native ones (expected/, test/isolation/expected/), except where
# test/sqlonly/expected/ (regress) or test/sqlonly/isolation/expected/ (isolation) has a
# file of the same test: then those files (TEST.out, TEST_N.out) replace the native ones
# for this run (docs/sql-only.md lists each and why). Replacing rather than adding a
# TEST_N.out beside the native files keeps each edition's tests strict: pg_regress
# accepts any of TEST.out, TEST_1.out..., so an alternative in expected/ would also let
# the native edition pass with the SQL edition's output.
# Exits with pg_regress's status (0: all passed).
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
kind=${1:-} prefix=${2:-} dist=${3:-} out=${4:-}
shift 4 2>/dev/null || { echo "usage: $0 regress|isolation PG_PREFIX DIST OUT [TEST...]" >&2; exit 2; }
case $kind in
  regress) variable=REGRESS native_expected=$root/expected sqlonly_expected=$root/test/sqlonly/expected
           tests_dir=$root/sql db=contrib_regression ;;
  isolation) variable=ISOLATION native_expected=$root/test/isolation/expected
             sqlonly_expected=$root/test/sqlonly/isolation/expected tests_dir=$root/test/isolation/specs
             db=isolation_regression ;;
  # sqlonly/test/edition.sql: what only this edition has to prove, one psql script
  # that stops at the first broken promise; one line "test edition ... ok|FAILED".
  edition) variable="" db=edition_regression ;;
  *) echo "usage: $0 regress|isolation|edition PG_PREFIX DIST OUT [TEST...]" >&2; exit 2 ;;
esac
installer=$dist/idempotency-pgtle--1.5.sql
[ -f "$installer" ] || { echo "sqlonly: no $installer (make sql-only writes it)" >&2; exit 2; }
[ -x "$prefix/bin/pg_config" ] || { echo "sqlonly: $prefix is no PostgreSQL installation" >&2; exit 2; }
installer=$(realpath "$installer") prefix=$(realpath "$prefix")
cd "$root"
PG15_PREFIX=$prefix . scripts/lib.sh
PG_BIN=$prefix/bin PG_CONFIG=$prefix/bin/pg_config
tests=("$@")
if [ "${#tests[@]}" -eq 0 ] && [ -n "$variable" ]; then
  # shellcheck disable=SC2016  # $(...) is make's
  read -ra tests < <(printf 'print-var:\n\t@echo $(%s)\n' "$variable" |
    make -s --no-print-directory -f Makefile -f - print-var PG_CONFIG="$PG_CONFIG")
  # Less the tests of the native edition's internals (test/sqlonly/native_only).
  mapfile -t tests < <(printf '%s\n' "${tests[@]}" |
    grep -vxFf <(grep -vE '^(#|$)' test/sqlonly/native_only | awk '{print $1}'))
fi
pgxs=$(dirname "$(dirname "$(dirname "$("$PG_CONFIG" --pgxs)")")")
if [ "$kind" != isolation ]; then
  runner=$pgxs/src/test/regress/pg_regress
else
  runner=$pgxs/src/test/isolation/pg_isolation_regress
fi

mkdir -p "$out" && chown postgres: "$out" || exit 2
out=$(realpath "$out")
cluster=$out/cluster
trap 'stop_cluster "$cluster"' EXIT
mapfile -t settings < <(grep -vE '^(#|$)' "$root/test/sqlonly/server.conf")
if ! start_cluster_on_free_port "$cluster" "${settings[@]}"; then
  echo "sqlonly: the server did not start" >&2
  exit 2
fi
port=$CLUSTER_PORT
# psql_as ROLE DATABASE [PSQL ARGUMENT...]: stops at the first error.
psql_as() {
  local role=$1 database=$2
  shift 2
  runuser -u postgres -- "$PG_BIN/psql" -X -q -At -v ON_ERROR_STOP=1 -h "$cluster" -p "$port" \
    -U "$role" -d "$database" "$@"
}
# The installer's role: pgtle_admin and CREATEDB is all it has.
if ! psql_as postgres template1 -c "CREATE EXTENSION pg_tle" \
       -c "CREATE ROLE regress_idem_tle_admin LOGIN NOSUPERUSER" \
       -c "GRANT pgtle_admin TO regress_idem_tle_admin" ||
   ! psql_as regress_idem_tle_admin template1 -f "$installer" >"$out/installer.log" 2>&1; then
  cat "$out/installer.log" 2>/dev/null
  echo "sqlonly: the pg_tle installer failed in template1 (as a member of pgtle_admin)" >&2
  exit 2
fi
# pg_regress's own set-up of a database it makes.
if ! psql_as postgres postgres -c "CREATE DATABASE $db TEMPLATE template1" \
       -c "ALTER DATABASE $db SET lc_messages TO 'C'" -c "ALTER DATABASE $db SET lc_monetary TO 'C'" \
       -c "ALTER DATABASE $db SET lc_numeric TO 'C'" -c "ALTER DATABASE $db SET lc_time TO 'C'" \
       -c "ALTER DATABASE $db SET bytea_output TO 'hex'" \
       -c "ALTER DATABASE $db SET timezone_abbreviations TO 'Default'"; then
  echo "sqlonly: could not make the test database" >&2
  exit 2
fi

if [ "$kind" = edition ]; then
  status=0
  start=$SECONDS
  psql_as postgres "$db" -c "CREATE EXTENSION idempotency" -f "$root/sqlonly/test/edition.sql" \
    >"$out/edition.out" 2>&1 || status=$?
  if [ "$status" = 0 ] && [ "$(tail -n 1 "$out/edition.out")" = "edition: all passed" ]; then
    echo "test edition (sqlonly/test/edition.sql)    ... ok    $((SECONDS - start)) s"
  else
    tail -n 30 "$out/edition.out"
    echo "test edition (sqlonly/test/edition.sql)    ... FAILED    $((SECONDS - start)) s"
    status=1
  fi
  exit "$status"
fi

# The input directory: the tests themselves, the native expected files overlaid with
# the SQL edition's.
input=$out/input
mkdir -p "$input/expected"
if [ "$kind" = regress ]; then ln -s "$tests_dir" "$input/sql"; else ln -s "$tests_dir" "$input/specs"; fi
cp -a "$native_expected/." "$input/expected/"
launcher=()
if [ "$kind" = regress ]; then
  # An error raised in PL/pgSQL carries a CONTEXT line naming the function and line
  # (the edition's internal ones), which psql shows and the native edition's C code
  # does not have: a difference of every error, not of the contract (SQLSTATE,
  # message, DETAIL, HINT; docs/sql-only.md). So psql here hides CONTEXT
  # (SHOW_CONTEXT=never), and the native files' few CONTEXT lines (all single lines,
  # from the tests' own functions) are left out of this run's expected files.
  printf '#!/bin/sh\nexec "$@" -v SHOW_CONTEXT=never\n' >"$out/psql_launcher"
  chmod 755 "$out/psql_launcher"
  launcher=(--launcher="$out/psql_launcher")
  sed -i '/^CONTEXT:  /d' "$input/expected"/*.out
fi
for file in "$sqlonly_expected"/*.out; do
  [ -f "$file" ] || continue
  name=$(basename "$file" .out)
  name=${name%_[0-9]}
  rm -f "$input/expected/$name.out" "$input/expected/$name"_[0-9].out
done
for file in "$sqlonly_expected"/*.out; do
  [ -f "$file" ] && cp "$file" "$input/expected/"
done
chown -R postgres: "$out"

# From PostgreSQL 16 on, the expected files are looked for in --expecteddir (default:
# the current directory), no longer in --inputdir.
expecteddir=()
if "$runner" --help 2>/dev/null | grep -q -- '--expecteddir'; then expecteddir=(--expecteddir="$input"); fi
status=0
runuser -u postgres -- env PGHOST="$cluster" PGPORT="$port" \
  "$runner" --inputdir="$input" "${expecteddir[@]}" --outputdir="$out" --bindir="$PG_BIN" --use-existing \
  --dbname="$db" --host="$cluster" --port="$port" "${launcher[@]}" "${tests[@]}" || status=$?
if grep -qE 'PANIC|TRAP:|terminated by signal' "$cluster/server.log" 2>/dev/null; then
  echo "sqlonly: the server's log shows a crash:" >&2
  grep -E -B 2 -A 4 'PANIC|TRAP:|terminated by signal' "$cluster/server.log" | tail -n 40 >&2
  [ "$status" != 0 ] || status=1
fi
exit "$status"
