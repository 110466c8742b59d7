#!/usr/bin/env bash
# How scripts/pg_versions.sh finds a PostgreSQL source on a fresh machine, with apt-get,
# dpkg-query and the build replaced by stand-ins that log what they are asked: no
# download, no build, nothing written outside a temporary directory. One "ok N" or
# "not ok N" line per check (run by test/run_all.sh's package stage, as root).
#
# The stand-in archive's index names 17.12 and 19~rc1, and serves neither (as this
# workplace's mirror did on 2026-11-24); 17 has an earlier release pinned, 19 has none.
set -uo pipefail
cd "$(dirname "$0")/.."

tmp=$(mktemp -d /tmp/pg-versions-test.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/bin" "$tmp/lists" "$tmp/cache"
export PGV_SOURCES_FILE=$tmp/idempotency-src.sources PGV_APT_LISTS=$tmp/lists
export PGV_CACHE=$tmp/cache CALLS=$tmp/calls
cat >"$tmp/bin/apt-get" <<'EOF'
#!/bin/sh
echo "apt-get $*" >>"$CALLS"
case "$*" in
  *--print-uris*postgresql-17/*)
    echo "'http://mirror/postgresql-17_17.12.orig.tar.bz2' postgresql-17_17.12.orig.tar.bz2 1 SHA256:$(printf 1%.0s $(seq 64))" ;;
  *--print-uris*postgresql-19/*)
    echo "'http://mirror/postgresql-19_19~rc1.orig.tar.bz2' postgresql-19_19~rc1.orig.tar.bz2 1 SHA256:$(printf 9%.0s $(seq 64))" ;;
esac
EOF
printf '#!/bin/sh\necho "install ok installed"\n' >"$tmp/bin/dpkg-query"
chmod 755 "$tmp/bin/apt-get" "$tmp/bin/dpkg-query"
export PATH="$tmp/bin:$PATH"

. scripts/pg_versions.sh
# The build: the index's tarball is not served (apt-get source fails: 3); a pinned
# release (given by URL) "builds" at once.
_pgv_build() {
  echo "build $4 ${6:-apt-get}" >>"$CALLS"
  [ -n "${6:-}" ] || return 3
  mkdir -p "$5" && touch "$5/.complete"
}

n=0 failed=0
check() {  # check DESCRIPTION COMMAND...
  n=$((n + 1))
  if "${@:2}"; then echo "ok $n - $1"; else echo "not ok $n - $1"; failed=1; fi
}
called() { grep -qF -- "$1" "$CALLS" 2>/dev/null; }
calls_of() { grep -cF -- "$1" "$CALLS" 2>/dev/null; }

# A fresh machine: neither the deb-src file nor the source indexes.
: >"$CALLS"
ensure_pg_sources 2>/dev/null
check "a fresh machine gets the deb-src file" grep -q '^Types: deb-src$' "$PGV_SOURCES_FILE"
check "and its indexes fetched (apt-get update)" called "apt-get -q -o DPkg::Lock::Timeout=600 update"

# Everything in place: nothing to do.
for suite in trixie sid experimental; do : >"$tmp/lists/mirror_dists_${suite}_main_source_Sources"; done
: >"$CALLS"
ensure_pg_sources 2>/dev/null
check "with the file and the indexes in place, apt-get is not run" test ! -s "$CALLS"

# 17: the index's 17.12 is not served, nothing is cached: the pinned 17.11 is built.
: >"$CALLS"
pinned_sha=${PGV_FALLBACK[17]:-none}; pinned_sha=${pinned_sha##* }
prefix=$(pg_prefix 17 2>/dev/null)
check "17 falls back to the pinned release" test "$prefix" = "$PGV_CACHE/17-${pinned_sha:0:16}"
check "after trying the index's tarball twice, with an apt-get update between" \
  test "$(calls_of 'build postgresql-17_17.12.orig.tar.bz2 apt-get')" = 2
check "downloading the pinned tarball from the mirror's pool" \
  called "build postgresql-17_17.11.orig.tar.bz2 http"

# 17 again: the earlier build is found in the cache, nothing is built.
: >"$CALLS"
prefix=$(pg_prefix 17 2>/dev/null)
check "17 again uses the cached build" test "$prefix" = "$PGV_CACHE/17-${pinned_sha:0:16}"
check "without building the pinned release again" test "$(calls_of 'postgresql-17_17.11')" = 0

# 19: nothing pinned, nothing cached: "not served" (2), which the tests report as not
# tested rather than failed.
: >"$CALLS"
pg_prefix 19 >/dev/null 2>&1
status=$?
check "19 without a source is reported as not served (status 2)" test "$status" = 2

exit "$failed"
