#!/usr/bin/env bash
# How scripts/citus.sh finds, verifies, builds and reuses Citus, with stand-ins for
# PostgreSQL installations (a pg_config that prints what it is asked), for the source
# tarballs and for the build: nothing is compiled, installed or written outside a
# temporary directory. One "ok N" or "not ok N" line per check (run by
# test/run_all.sh's package stage; the real build is exercised by the Citus TAP test).
set -uo pipefail
cd "$(dirname "$0")/.."

tmp=$(mktemp -d /tmp/citus-test.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
export CALLS=$tmp/calls CITUS_CACHE=$tmp/cache
unset CITUS_TARBALL CITUS_SOURCE_DIR CITUS_SHA256

# fake_pg DIR MAJOR: an installation whose pg_config reports PostgreSQL MAJOR.
fake_pg() {
  mkdir -p "$1/bin" "$1/lib" "$1/share/extension"
  cat >"$1/bin/pg_config" <<EOF
#!/bin/sh
case "\$1" in
  --version) echo "PostgreSQL $2.1" ;;
  --pkglibdir) echo "$1/lib" ;;
  --sharedir) echo "$1/share" ;;
esac
EOF
  chmod 755 "$1/bin/pg_config"
}
# fake_tarball DIR VERSION: a tarball of that name (its content is not Citus).
fake_tarball() {
  mkdir -p "$1" && echo "citus $2 $RANDOM" | gzip >"$1/citus-$2.tar.gz"
}

. scripts/citus.sh
# The build: records its call and "installs" as `make install` would, then writes the
# stamp as the real build does.
_citus_build() {
  local tarball=$1 version=$2 sha=$3 prefix=$4 stamp=$5
  echo "build $version $prefix $tarball" >>"$CALLS"
  echo "so $RANDOM" >"$prefix/lib/citus.so"
  echo "default_version = '${version%.*}-1'" >"$prefix/share/extension/citus.control"
  printf 'version %s\ntarball sha256 %s\ncitus.so sha256 %s\n' "$version" "$sha" \
    "$(sha256sum "$prefix/lib/citus.so" | cut -d' ' -f1)" >"$stamp"
}
# As root or not: the stand-ins need no privileges.
id() { if [ "${1:-}" = -u ]; then echo 0; else command id "$@"; fi; }

n=0 failed=0
check() {  # check DESCRIPTION COMMAND...
  n=$((n + 1))
  if "${@:2}"; then echo "ok $n - $1"; else echo "not ok $n - $1"; failed=1; fi
}
builds() { grep -c '^build ' "$CALLS" 2>/dev/null || true; }

fake_pg "$tmp/pg18" 18
fake_pg "$tmp/pg18b" 18
fake_pg "$tmp/pg15" 15
fake_tarball "$tmp/vendor" 14.0.1
fake_sha=$(sha256sum "$tmp/vendor/citus-14.0.1.tar.gz" | cut -d' ' -f1)

# Nothing anywhere: "no source" (2), which run_all reports as not run.
: >"$CALLS"
out=$(citus_for "$tmp/pg18" 2>&1)
status=$?
check "no Citus and no source: status 2" test "$status" = 2
check "and the message names CITUS_SOURCE_DIR and CITUS_TARBALL" \
  grep -q 'CITUS_SOURCE_DIR.*CITUS_TARBALL' <<<"$out"

# A tarball whose sha256 is not the pinned one: refused (1), nothing built.
: >"$CALLS"
CITUS_SOURCE_DIR=$tmp/vendor citus_for "$tmp/pg18" >/dev/null 2>&1
status=$?
check "a tarball that is not the pinned 14.0.1: status 1" test "$status" = 1
check "and nothing built" test "$(builds)" = 0

# PostgreSQL 15: Citus 14 does not build there (3), nothing built.
: >"$CALLS"
CITUS_SOURCE_DIR=$tmp/vendor CITUS_SHA256=$fake_sha citus_for "$tmp/pg15" >/dev/null 2>&1
status=$?
check "PostgreSQL 15 with Citus 14: status 3" test "$status" = 3

# The tarball from CITUS_SOURCE_DIR (its checksum given): built once, kept in the cache.
: >"$CALLS"
version=$(CITUS_SOURCE_DIR=$tmp/vendor CITUS_SHA256=$fake_sha citus_for "$tmp/pg18" 2>/dev/null)
status=$?
check "built from CITUS_SOURCE_DIR: status 0, prints 14.0.1" test "$status:$version" = "0:14.0.1"
check "one build" test "$(builds)" = 1
check "the tarball is kept in the cache" cmp -s "$tmp/vendor/citus-14.0.1.tar.gz" \
  "$CITUS_CACHE/citus-14.0.1.tar.gz"

# Again, without any variable: the stamp says it is there, nothing is built.
: >"$CALLS"
version=$(citus_for "$tmp/pg18" 2>/dev/null)
check "the second call uses the stamp" test "$?:$version:$(builds)" = "0:14.0.1:0"

# Another PostgreSQL build, no variable: the cached tarball is found and built.
: >"$CALLS"
CITUS_SHA256=$fake_sha citus_for "$tmp/pg18b" >/dev/null 2>&1
check "another prefix is built from the cached tarball" \
  grep -q "^build 14.0.1 $tmp/pg18b $CITUS_CACHE/citus-14.0.1.tar.gz" "$CALLS"

# CITUS_TARBALL wins over CITUS_SOURCE_DIR and the cache.
fake_pg "$tmp/pg18c" 18
fake_tarball "$tmp/elsewhere" 14.0.1
: >"$CALLS"
CITUS_TARBALL=$tmp/elsewhere/citus-14.0.1.tar.gz CITUS_SOURCE_DIR=$tmp/vendor \
  CITUS_SHA256=$(sha256sum "$tmp/elsewhere/citus-14.0.1.tar.gz" | cut -d' ' -f1) \
  citus_for "$tmp/pg18c" >/dev/null 2>&1
check "CITUS_TARBALL is used first" grep -q "$tmp/elsewhere/citus-14.0.1.tar.gz" "$CALLS"

# A Citus installed otherwise (no stamp): used as it is, nothing built.
fake_pg "$tmp/pg17" 17
echo so >"$tmp/pg17/lib/citus.so"
echo "default_version = '13.2-1'" >"$tmp/pg17/share/extension/citus.control"
: >"$CALLS"
version=$(citus_for "$tmp/pg17" 2>/dev/null)
check "an installed Citus is used, not built" test "$?:$version:$(builds)" = "0:13.2-1:0"

# A prefix rebuilt since (the stamp's citus.so checksum no longer matches) with no Citus
# installed: built again.
rm -f "$tmp/pg18/lib/citus.so" "$tmp/pg18/share/extension/citus.control"
: >"$CALLS"
CITUS_SOURCE_DIR=$tmp/vendor CITUS_SHA256=$fake_sha citus_for "$tmp/pg18" >/dev/null 2>&1
check "a stale stamp without an installed Citus means a new build" test "$(builds)" = 1

exit "$failed"
