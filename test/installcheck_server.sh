#!/usr/bin/env bash
# make installcheck-server: the regression tests (the Makefile's REGRESS) against a
# running server, the one libpq's environment names (PGHOST, PGPORT, PGUSER, PGPASSWORD
# ...), after `make install` (or the package) put this version of the extension there.
#
#   make installcheck-server                        # the server of the default socket
#   PGHOST=db1 PGPORT=5433 PGUSER=postgres make installcheck-server
#
# It needs a superuser (the tests create the extension, roles and three databases of
# their own, all dropped again), and runs in a database of its own, SERVER_TESTDB
# (default idempotency_installcheck), made anew and dropped afterwards. What it sets:
#   - the database is a template database, which the extension's background worker
#     never serves: the tests expect only idem_reap to reap, as on `make installcheck`'s
#     instance (idempotency.reaper_enabled = off there), while on a server the worker
#     may run every idempotency.reaper_naptime;
#   - English messages, C locale settings and the idempotency.* settings a session may
#     change at their defaults, for that database only (as pg_regress does for its own);
# and the tests that need a server-wide setting the server lacks are skipped, each with
# the reason: two_phase (max_prepared_transactions > 0) and outbox
# (idempotency.outbox_retention = 0, its default). Everything else runs whatever the
# server's configuration, with or without the library preloaded.
#
# Called by the Makefile with PG_REGRESS, PG_BINDIR, EXT_VERSION and SERVER_TESTDB set
# and the tests as arguments; exits with pg_regress's status (0: all that ran passed).
set -euo pipefail
cd "$(dirname "$0")/.."
: "${PG_REGRESS:?set by the Makefile}" "${PG_BINDIR:?set by the Makefile}" "${EXT_VERSION:?set by the Makefile}"
db=${SERVER_TESTDB:-idempotency_installcheck}
if ! [[ $db =~ ^[a-z_][a-z0-9_]*$ ]]; then
  echo "installcheck-server: SERVER_TESTDB must be a plain lower-case name, not '$db'" >&2
  exit 2
fi
export PGCLIENTENCODING=UTF8 LC_MESSAGES=C
where="host ${PGHOST:-(the default socket)}, port ${PGPORT:-5432}, user ${PGUSER:-$(id -un)}"

# sql DATABASE STATEMENT...: one psql session, unaligned output, stops at an error.
sql() {
  local database=$1
  shift
  local args=()
  for statement in "$@"; do args+=(-c "$statement"); done
  "$PG_BINDIR/psql" -X -q -At -v ON_ERROR_STOP=1 -d "$database" "${args[@]}"
}
fail() {
  echo "installcheck-server: $*" >&2
  exit 2
}

# Whether it answers, and as a superuser.
if ! superuser=$(sql postgres "SELECT rolsuper FROM pg_roles WHERE rolname = current_user" 2>&1); then
  fail "cannot connect to the server ($where; the maintenance database 'postgres'): $superuser
Set PGHOST, PGPORT and PGUSER (and PGPASSWORD or ~/.pgpass) as for psql."
fi
[ "$superuser" = t ] ||
  fail "$where is not a superuser: the tests create the extension, roles and databases. Set PGUSER to a superuser."
# What the server is.
facts=$(sql postgres "SELECT current_setting('server_version_num')::int / 10000,
                             coalesce((SELECT default_version FROM pg_available_extensions
                                       WHERE name = 'idempotency'), 'none'),
                             current_setting('max_prepared_transactions'),
                             current_setting('shared_preload_libraries')")
IFS='|' read -r server_major available max_prepared preload <<<"$facts"
client_major=$("$PG_BINDIR/pg_config" --version | sed -E 's/^PostgreSQL ([0-9]+).*/\1/')
[ "$server_major" = "$client_major" ] ||
  fail "the server runs PostgreSQL $server_major, this build is for $client_major: make install installcheck-server PG_CONFIG=<PostgreSQL $server_major's pg_config>"
[ "$available" = "$EXT_VERSION" ] ||
  fail "the server has idempotency '$available' installed, this source is $EXT_VERSION: run 'make install' (as root, PG_CONFIG of that server) first"

# Settings the library defines are known once it is loaded.
if ! settings=$(sql postgres "LOAD 'idempotency'" \
      "SELECT name || '=' || setting || '=' || boot_val || '=' || context FROM pg_settings
       WHERE name LIKE 'idempotency.%' ORDER BY name" 2>&1); then
  fail "the server cannot load the extension's library: $settings"
fi
retention=$(sed -nE 's/^idempotency\.outbox_retention=([^=]*)=.*/\1/p' <<<"$settings")

# The tests to skip, each with why.
declare -A skip
if [ "$max_prepared" = 0 ]; then
  skip[two_phase]="needs max_prepared_transactions > 0; the server has 0"
fi
if [ "$retention" != 0 ]; then
  skip[outbox]="needs idempotency.outbox_retention = 0 (its default); the server has ${retention}s"
fi
tests=()
for test in "$@"; do
  [ -n "${skip[$test]:-}" ] || tests+=("$test")
done
report_skips() {
  local test
  for test in "$@"; do
    if [ -n "${skip[$test]:-}" ]; then echo "skipped: $test (${skip[$test]})"; fi
  done
}

echo "installcheck-server: PostgreSQL $server_major at $where, idempotency $available," \
  "shared_preload_libraries '$preload'; database $db"
report_skips "$@"

drop_database() {
  if [ "$(sql postgres "SELECT count(*) FROM pg_database WHERE datname = '$db'")" = 1 ]; then
    sql postgres "ALTER DATABASE $db IS_TEMPLATE false" "DROP DATABASE $db WITH (FORCE)"
  fi
}
drop_database
# The locale of pg_regress's own instances (C.UTF-8), else C.
sql postgres "CREATE DATABASE $db TEMPLATE template0 ENCODING 'UTF8' LOCALE 'C.UTF-8' IS_TEMPLATE true" \
  >/dev/null 2>&1 ||
  sql postgres "CREATE DATABASE $db TEMPLATE template0 ENCODING 'UTF8' LOCALE 'C' IS_TEMPLATE true" >/dev/null
trap 'drop_database || echo "installcheck-server: could not drop database $db" >&2' EXIT
pins=("ALTER DATABASE $db SET lc_messages TO 'C'" "ALTER DATABASE $db SET lc_monetary TO 'C'"
      "ALTER DATABASE $db SET lc_numeric TO 'C'" "ALTER DATABASE $db SET lc_time TO 'C'"
      "ALTER DATABASE $db SET bytea_output TO 'hex'"
      "ALTER DATABASE $db SET timezone_abbreviations TO 'Default'")
while IFS='=' read -r name _ boot_val context; do
  [ "$context" = user ] && pins+=("ALTER DATABASE $db SET $name TO '$boot_val'")
done <<<"$settings"
sql postgres "${pins[@]}" >/dev/null

status=0
# shellcheck disable=SC2086  # EXTRA_REGRESS_OPTS is a list of options, as in PGXS
"$PG_REGRESS" --inputdir=. --bindir="$PG_BINDIR" --use-existing --dbname="$db" \
  ${EXTRA_REGRESS_OPTS:-} "${tests[@]}" || status=$?
report_skips "$@"
exit "$status"
