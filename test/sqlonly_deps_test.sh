#!/usr/bin/env bash
# How scripts/sqlonly_deps.sh copies a PostgreSQL without the native edition and finds,
# verifies, builds and reuses pg_tle and pg_cron: the copy of the real PostgreSQL 15
# (PG15_PREFIX or Debian's), and stand-ins for a relocatable prefix, the tarballs and the
# build (nothing is compiled; everything is written in a temporary directory). One "ok
# N" or "not ok N" line per check (run by test/run_all.sh's package stage; the real
# builds are exercised by the stage sqlonly).
set -uo pipefail
cd "$(dirname "$0")/.."

tmp=$(mktemp -d /tmp/sqlonly-deps-test.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
export CALLS=$tmp/calls SQLONLY_DEPS_CACHE=$tmp/cache
unset PG_TLE_TARBALL PG_TLE_SOURCE_DIR PG_TLE_SHA256 PG_CRON_TARBALL PG_CRON_SOURCE_DIR PG_CRON_SHA256

. scripts/sqlonly_deps.sh
# The build: records its call and stages what `make install` would.
_addon_stage() {
  local name=$1 tarball=$2 pg_config=$3 stage=$4
  echo "build $name $tarball $pg_config" >>"$CALLS"
  mkdir -p "$stage/lib" "$stage/extension"
  echo "so" >"$stage/lib/$name.so"
  echo "default_version = '1.0'" >"$stage/extension/$name.control"
  touch "$stage/.complete"
}

n=0 failed=0
check() {  # check DESCRIPTION COMMAND...
  n=$((n + 1))
  if "${@:2}"; then echo "ok $n - $1"; else echo "not ok $n - $1"; failed=1; fi
}
builds() { if [ -f "$CALLS" ]; then grep -c '^build ' "$CALLS"; else echo 0; fi; }

# A relocatable prefix (as scripts/pg_versions.sh builds): share/ inside it.
fake_pg() {
  mkdir -p "$1/bin" "$1/lib" "$1/share/extension" "$1/include"
  cat >"$1/bin/pg_config" <<'EOF'
#!/bin/sh
root=$(cd "$(dirname "$0")/.." && pwd)
case "$1" in
  --version) echo "PostgreSQL 18.1" ;;
  --pkglibdir) echo "$root/lib" ;;
  --sharedir) echo "$root/share" ;;
  --includedir) echo "$root/include" ;;
esac
EOF
  chmod 755 "$1/bin/pg_config"
  echo "postgres $RANDOM" >"$1/bin/postgres"
}
fake_pg "$tmp/pg18"
echo so >"$tmp/pg18/lib/idempotency.so"
echo "default_version = '1.5'" >"$tmp/pg18/share/extension/idempotency.control"
echo "-- 1.4--1.5" >"$tmp/pg18/share/extension/idempotency--1.4--1.5.sql"
copy=$(pg_copy_without_native "$tmp/pg18" "$tmp/copy18" 2>"$tmp/err")
check "a relocatable prefix is copied as one directory" [ "$copy" = "$tmp/copy18/pg18" ]
check "the copy's pg_config reports the copy's share/" \
  [ "$("$copy/bin/pg_config" --sharedir)" = "$tmp/copy18/pg18/share" ]
check "the copy has none of the native edition's files" \
  [ ! -e "$copy/lib/idempotency.so" -a ! -e "$copy/share/extension/idempotency.control" \
    -a ! -e "$copy/share/extension/idempotency--1.4--1.5.sql" ]
check "the original keeps them" [ -f "$tmp/pg18/share/extension/idempotency.control" ]

# Debian's PostgreSQL 15: bin/ and lib/ in /usr/lib/postgresql/15, share/ and include/
# elsewhere below /usr; the copy keeps their relation, so PostgreSQL relocates.
p15=${PG15_PREFIX:-/usr/lib/postgresql/15}
if [ -x "$p15/bin/pg_config" ]; then
  copy=$(pg_copy_without_native "$p15" "$tmp/copy15" 2>"$tmp/err")
  check "Debian's 15 is copied as a unit" [ -x "$copy/bin/postgres" ]
  check "its pg_config reports the copy's share/ and lib/" \
    bash -c '[[ $("$1/bin/pg_config" --sharedir) == "$2"/* && $("$1/bin/pg_config" --pkglibdir) == "$2"/* ]]' _ "$copy" "$tmp/copy15"
  check "its share/ holds PostgreSQL's extensions, not idempotency's" \
    bash -c '[ -f "$1/extension/plpgsql.control" ] && [ ! -e "$1/extension/idempotency.control" ]' _ "$("$copy/bin/pg_config" --sharedir)"
  check "its server runs" bash -c '"$1/bin/postgres" --version >/dev/null' _ "$copy"
fi
check "no PostgreSQL: refused" bash -c '! pg_copy_without_native "$1/none" "$1/x" 2>/dev/null' _ "$tmp"

# pg_tle and pg_cron.
fake_pg "$tmp/pgA"
status=0; addon_for pg_tle "$tmp/pgA" >/dev/null 2>&1 || status=$?
check "no source anywhere: status 2 (not run)" [ "$status" = 2 ]
mkdir -p "$tmp/vendor"
echo "not pg_tle" | gzip >"$tmp/vendor/pg_tle-1.5.2.tar.gz"
status=0; PG_TLE_SOURCE_DIR=$tmp/vendor addon_for pg_tle "$tmp/pgA" >/dev/null 2>&1 || status=$?
check "a tarball whose sha256 is not the pinned one: status 1, nothing built" \
  [ "$status" = 1 -a "$(builds)" = 0 ]
sha=$(sha256sum "$tmp/vendor/pg_tle-1.5.2.tar.gz" | cut -d' ' -f1)
out=$(PG_TLE_SOURCE_DIR=$tmp/vendor PG_TLE_SHA256=$sha addon_for pg_tle "$tmp/pgA" 2>/dev/null)
check "a verified tarball: built, installed in the prefix, its release printed" \
  [ "$out" = 1.5.2 -a "$(builds)" = 1 -a -f "$tmp/pgA/lib/pg_tle.so" -a -f "$tmp/pgA/share/extension/pg_tle.control" ]
check "the verified tarball is kept in the cache" [ -f "$SQLONLY_DEPS_CACHE/pg_tle-1.5.2.tar.gz" ]
rm -f "$tmp/pgA/lib/pg_tle.so" "$tmp/pgA/share/extension/pg_tle.control"
cp -a "$tmp/pgA" "$tmp/pgB"
rm -rf "$tmp/pgB/lib/"* "$tmp/pgB/share/extension/"*
out=$(PG_TLE_SHA256=$sha addon_for pg_tle "$tmp/pgB" 2>/dev/null)
check "a copy of the same PostgreSQL: installed from the staged build, no second build, no variable" \
  [ "$out" = 1.5.2 -a "$(builds)" = 1 -a -f "$tmp/pgB/lib/pg_tle.so" ]
out=$(addon_for pg_tle "$tmp/pgB" 2>/dev/null)
check "already installed there: used as it is (its extension version)" [ "$out" = 1.0 -a "$(builds)" = 1 ]
fake_pg "$tmp/pgC"
echo so >"$tmp/pgC/lib/pg_cron.so"
echo "default_version = '1.4-1'" >"$tmp/pgC/share/extension/pg_cron.control"
out=$(addon_for pg_cron "$tmp/pgC" 2>/dev/null)
check "a pg_cron installed otherwise (Debian's package): used, nothing built" [ "$out" = 1.4-1 -a "$(builds)" = 1 ]
status=0; addon_for pg_other "$tmp/pgC" >/dev/null 2>&1 || status=$?
check "an unknown add-on: refused" [ "$status" = 1 ]

exit "$failed"
