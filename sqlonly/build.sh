#!/bin/sh
# Builds the SQL-only edition's two files from sqlonly/sql/*.sql (in name order):
#   dist/idempotency-sql--VERSION.sql    plain SQL: `psql -f` by the database owner
#   dist/idempotency-pgtle--VERSION.sql  registers the edition with pg_tle (a role with
#                                        pgtle_admin runs it), then CREATE EXTENSION
# and, for each sqlonly/updates/idempotency-sql--A--B.sql, the update files
#   dist/idempotency-sql--A--B.sql and an install_update_path call in the pg_tle file.
# Usage: sqlonly/build.sh [output directory, default dist]
set -eu
here=$(cd "$(dirname "$0")" && pwd)
top=$(dirname "$here")
out=${1:-$top/dist}
version=$(sed -n "s/^default_version = '\(.*\)'/\1/p" "$top/idempotency.control")
mkdir -p "$out"

body=$(mktemp)
trap 'rm -f "$body"' EXIT
for f in "$here"/sql/*.sql; do
  printf -- '-- ---- %s ----\n' "sqlonly/sql/$(basename "$f")" >>"$body"
  cat "$f" >>"$body"
  printf '\n' >>"$body"
done
# A released version's sources are frozen (sqlonly/released/VERSION.sql, pinned in
# scripts/released.sha256): the build of that version must give exactly them. Changes
# go into a new version and its update file.
released=$here/released/$version.sql
if [ -f "$released" ] && ! cmp -s "$body" "$released"; then
  echo "build.sh: $version is released and sqlonly/sql/ no longer gives sqlonly/released/$version.sql;" >&2
  echo "build.sh: change the sources for a new version (default_version) with an update in sqlonly/updates/" >&2
  exit 1
fi
if grep -q '\$_pgtle_\$' "$body"; then
  echo "build.sh: the sources contain \$_pgtle_\$, which pg_tle's installer uses as its quote" >&2
  exit 1
fi
if grep -q '^\\' "$body"; then
  echo "build.sh: the sources contain a psql meta-command, which pg_tle cannot run" >&2
  exit 1
fi

plain=$out/idempotency-sql--$version.sql
{
  printf -- '-- idempotency %s, the SQL-only edition, as plain SQL.\n' "$version"
  printf -- '-- Run as the database owner (no superuser needed), in the database to serve:\n'
  printf -- '--   psql -v ON_ERROR_STOP=1 -d DB -f idempotency-sql--%s.sql\n' "$version"
  printf -- '-- The functions go into the first schema on the search_path (usually public),\n'
  printf -- '-- the key store into a schema "idempotency". Built by sqlonly/build.sh; do not edit.\n'
  printf '\\set ON_ERROR_STOP on\n'
  printf 'BEGIN;\n'
  cat "$body"
  printf 'COMMIT;\n'
} >"$plain.tmp"
mv "$plain.tmp" "$plain"

tle=$out/idempotency-pgtle--$version.sql
{
  printf -- '-- idempotency %s, the SQL-only edition, for pg_tle (Trusted Language Extensions).\n' "$version"
  printf -- '-- Run by a role with pgtle_admin in the database to serve, after CREATE EXTENSION pg_tle:\n'
  printf -- '--   psql -v ON_ERROR_STOP=1 -d DB -f idempotency-pgtle--%s.sql\n' "$version"
  printf -- '-- then CREATE EXTENSION idempotency. Built by sqlonly/build.sh; do not edit.\n'
  printf '\\set ON_ERROR_STOP on\n'
  printf "SELECT pgtle.install_extension('idempotency', '%s',\n" "$version"
  printf "  'Effectively-once processing: idempotency keys, an outbox and ordered apply (SQL-only edition)',\n"
  printf '$_pgtle_$\n'
  cat "$body"
  printf '$_pgtle_$, ARRAY[]::text[]);\n'
  for u in "$here"/updates/idempotency-sql--*--*.sql; do
    [ -f "$u" ] || continue
    name=$(basename "$u" .sql)
    range=${name#idempotency-sql--}
    from=${range%%--*}
    to=${range#*--}
    printf "SELECT pgtle.install_update_path('idempotency', '%s', '%s', \$_pgtle_\$\n" "$from" "$to"
    cat "$u"
    printf '$_pgtle_$);\n'
    cp "$u" "$out/$(basename "$u")"
  done
  printf "SELECT pgtle.set_default_version('idempotency', '%s');\n" "$version"
} >"$tle.tmp"
mv "$tle.tmp" "$tle"
echo "sqlonly/build.sh: wrote $plain and $tle"
