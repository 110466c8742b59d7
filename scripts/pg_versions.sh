# PostgreSQL majors besides Debian 12's 15, built from upstream source (source it from
# the repository root, like scripts/lib.sh; sourcing defines functions and variables
# and changes nothing else).
#
#   ensure_pg_sources          deb-src lines + build dependencies (root)
#   pg_prefix VERSION          prints the install prefix of 15, 17, 18 or 19, building
#                              it first if it is not cached: "$(pg_prefix 18)/bin/pg_config"
#   pg_versions_selftest [V..] checks each version (default 15 17 18 19) end to end
#
# Debian 12 has no binary packages of 17+ and packages of another release must not be
# installed here, so the upstream tarball is taken from the newer releases' *source*
# packages (their .orig.tar, without Debian's patches) and built with upstream
# configure. Progress goes to stderr; stdout carries only the prefix.
#
# A build is cached in $PGV_CACHE/VERSION-<first 16 hex of the tarball's sha256>, so a
# new upload to the suite (seen after any apt-get update) means one new build, about
# 10 minutes on 2 cores. Building needs root; using a cached build does not.
# Where the archive does not serve the tarball its index names (this workplace's mirror
# answers 404 for experimental's postgresql-19, and for trixie's 17.12 while its pool
# still has 17.11), an earlier cached build of the same major is used; without one,
# the pinned earlier release of PGV_FALLBACK is downloaded from the pool; without that
# either, a copy with the expected sha256 placed in $PGV_CACHE/src/.

PGV_CACHE=${PGV_CACHE:-/var/cache/idempotency-pg}
PGV_SOURCES_FILE=${PGV_SOURCES_FILE:-/etc/apt/sources.list.d/idempotency-src.sources}
PGV_APT_LISTS=${PGV_APT_LISTS:-/var/lib/apt/lists}  # (both set elsewhere by test/pg_versions_test.sh)
# Per major, an earlier upstream tarball in the pool of the mirror: its path and sha256,
# taken from the Checksums-Sha256 of its Debian .dsc, whose signature gpgv checked
# against Debian's debian-keyring (postgresql-17_17.11-0+deb13u1.dsc, signed by the
# PostgreSQL maintainer, checked 2026-11-24). Used only when the index's tarball is not
# served and no build of the major is cached.
declare -A PGV_FALLBACK=(
  [17]="pool/main/p/postgresql-17/postgresql-17_17.11.orig.tar.bz2 dd27f2b3c59e73ed14aa3324901242bf69a032a6347805f274e6260322d42979"
)
# What configure needs for --enable-tap-tests --with-openssl (ICU is on by default since
# 16; keeping it makes collation behave as in Debian's packages).
PGV_BUILD_DEPS=(gcc make perl bzip2 bison flex pkg-config libreadline-dev zlib1g-dev
                libssl-dev libicu-dev libipc-run-perl curl)

# The Debian suite whose source package carries each major.
_pgv_suite() {
  case ${1:-} in
    17) echo trixie ;;
    18) echo sid ;;
    19) echo experimental ;;
    *) echo "pg_versions: unknown version '${1:-}' (15, 17, 18 or 19)" >&2; return 1 ;;
  esac
}

# The mirror the machine's own Debian sources use (deb822 .sources or one-line .list),
# so that the deb-src lines go through the same archive; our file is skipped.
_pgv_mirror() {
  local codename mirror f
  codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-bookworm}")
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] && [ "$f" != "$PGV_SOURCES_FILE" ] || continue
    mirror=$(awk -v RS= -v c="$codename" '{
        uris = ""; hit = 0
        n = split($0, line, "\n")
        for (i = 1; i <= n; i++) {
          if (line[i] ~ /^URIs:/) { split(line[i], w, /[ \t]+/); uris = w[2] }
          if (line[i] ~ /^Suites:/ && (" " line[i] " ") ~ (" " c " ")) hit = 1
        }
        if (hit && uris != "") { print uris; exit }
      }' "$f")
    [ -n "$mirror" ] && { echo "$mirror"; return 0; }
  done
  mirror=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null |
    sed -n 's/^deb\(-src\)\?[ \t]\+\(\[[^]]*\][ \t]\+\)\?//p' |
    awk -v c="$codename" '$2 == c { print $1; exit }')
  echo "${mirror:-http://deb.debian.org/debian}"
}

# Adds the deb-src lines and installs the build dependencies; apt-get update runs only
# when the file changed, an index is missing or something is to be installed. Needs
# root only when there is something to do, so a cached build is usable by anyone.
ensure_pg_sources() {
  local mirror want suite dep write=0 update=0 missing=()
  local apt=(env DEBIAN_FRONTEND=noninteractive apt-get -q -o DPkg::Lock::Timeout=600)
  mirror=$(_pgv_mirror) || return 1
  # Only deb-src: no binary package of another release may be installed on Debian 12.
  want="# idempotency: upstream PostgreSQL tarballs (scripts/pg_versions.sh); sources only
Types: deb-src
URIs: $mirror
Suites: trixie sid experimental
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg"
  # write and update apart: a fresh machine lacks both the file and the indexes.
  [ "$(cat "$PGV_SOURCES_FILE" 2>/dev/null)" = "$want" ] || write=1 update=1
  for suite in trixie sid experimental; do
    compgen -G "$PGV_APT_LISTS/*_dists_${suite}_main_source_Sources*" >/dev/null || update=1
  done
  for dep in "${PGV_BUILD_DEPS[@]}"; do
    dpkg-query -W -f='${Status}' "$dep" 2>/dev/null | grep -q 'install ok installed' ||
      missing+=("$dep")
  done
  [ "${#missing[@]}" -gt 0 ] && update=1
  [ "$update" = 0 ] && return 0
  [ "$(id -u)" -eq 0 ] ||
    { echo "ensure_pg_sources: apt sources or build dependencies missing; run as root" >&2; return 1; }
  if [ "$write" = 1 ]; then printf '%s\n' "$want" >"$PGV_SOURCES_FILE" || return 1; fi
  echo "pg_versions: apt-get update" >&2
  "${apt[@]}" update >/dev/null || return 1
  if [ "${#missing[@]}" -gt 0 ]; then
    echo "pg_versions: installing ${missing[*]}" >&2
    "${apt[@]}" install -y --no-install-recommends -o Dpkg::Use-Pty=0 "${missing[@]}" >/dev/null ||
      return 1
  fi
}

# logged_step TAG LOG NAME COMMAND...: runs COMMAND with its output in LOG, and prints
# one line per step on stderr ("TAG: NAME ok (N s)"); on failure the log's tail.
# scripts/citus.sh uses it too.
logged_step() {
  local tag=$1 log=$2 name=$3 start=$SECONDS
  shift 3
  printf '%s: %-*s' "$tag" $((39 - ${#tag})) "$name" >&2
  echo "== $name: $*" >>"$log"
  if "$@" >>"$log" 2>&1; then
    echo " ok ($((SECONDS - start)) s)" >&2
  else
    echo " FAILED; the end of $log:" >&2
    tail -n 40 "$log" >&2
    return 1
  fi
}

_pgv_step() { logged_step pg_versions "$@"; }

# pg_prefix VERSION: prints the prefix of an installed PostgreSQL VERSION. Returns 2
# when the archive does not serve its source (and no copy was placed by hand), 1 when
# anything else failed.
pg_prefix() {
  local v=${1:-} suite line sha key tarball prefix status url=""
  if [ "$v" = 15 ]; then
    # Debian 12's own packages (scripts/lib.sh's ensure_packages installs them).
    local p15=${PG15_PREFIX:-/usr/lib/postgresql/15}
    [ -x "$p15/bin/pg_config" ] ||
      { echo "pg_prefix: postgresql-server-dev-15 is not installed in $p15" >&2; return 1; }
    echo "$p15"
    return 0
  fi
  suite=$(_pgv_suite "$v") || return 1
  ensure_pg_sources || return 1
  # The cache key is the tarball's checksum from the Sources index, known before
  # downloading: a cached build is found without fetching anything.
  line=$(apt-get source -q --print-uris "postgresql-$v/$suite" 2>/dev/null | grep "\.orig\.tar")
  sha=${line##*SHA256:}
  [[ $sha =~ ^[0-9a-f]{64}$ ]] ||
    { echo "pg_prefix: no upstream tarball of postgresql-$v in $suite" >&2; return 1; }
  tarball=$(awk '{ print $2 }' <<<"$line")
  if [ -n "${PGV_USE_FALLBACK:-}" ]; then
    read -r url sha <<<"${PGV_FALLBACK[$v]}"
    tarball=${url##*/} url=$(_pgv_mirror)/$url
  fi
  key=$v-${sha:0:16} prefix=$PGV_CACHE/$v-${sha:0:16}
  # .complete is written last: a prefix without it is a build that was cut short.
  if ! [ -f "$prefix/.complete" ]; then
    mkdir -p "$PGV_CACHE" && chmod 755 "$PGV_CACHE" || return 1
    # One build per version at a time; a second caller waits and then finds it done.
    (
      flock 9 || exit 1
      [ -f "$prefix/.complete" ] || _pgv_build "$v" "$suite" "$sha" "$tarball" "$prefix" "$url"
    ) 9>"$PGV_CACHE/$key.lock"
    status=$?
    if [ "$status" = 3 ] && [ -z "${PGV_RETRIED:-}" ] && [ -z "$url" ]; then
      # The index may name a tarball the mirror no longer has: refresh it, try once more.
      echo "pg_versions: apt-get update (the download failed)" >&2
      apt-get -q -o DPkg::Lock::Timeout=600 update >/dev/null && PGV_RETRIED=1 pg_prefix "$v"
      return
    elif [ "$status" = 3 ]; then
      # The index can name a point release the mirror does not serve yet: an earlier
      # build of the same major version, if one is cached, is used meanwhile.
      local earlier
      earlier=$(ls -d "$PGV_CACHE/$v"-*/.complete 2>/dev/null | tail -n 1)
      if [ -n "$earlier" ]; then
        echo "pg_prefix: the archive does not serve $tarball; using the earlier build" \
          "${earlier%/.complete}" >&2
        echo "${earlier%/.complete}"
        return 0
      fi
      if [ -n "${PGV_FALLBACK[$v]:-}" ] && [ -z "$url" ]; then
        echo "pg_prefix: the archive does not serve $tarball; building the pinned" \
          "earlier release ${PGV_FALLBACK[$v]%% *}" >&2
        PGV_USE_FALLBACK=1 pg_prefix "$v"
        return
      fi
      echo "pg_prefix: the archive does not serve $tarball; a copy of it placed in" \
        "$PGV_CACHE/src/ is used instead (its sha256 must be $sha)" >&2
      return 2  # unavailable here, as opposed to a build that failed
    fi
    [ "$status" = 0 ] || return 1
  fi
  echo "$prefix"
}

# _pgv_build VERSION SUITE SHA256 TARBALL PREFIX [URL]: downloads (from URL if given,
# else with apt-get source; exit 3 when that fails), builds and installs; logs to
# PREFIX.log; the build tree is removed after success.
_pgv_build() {
  local v=$1 suite=$2 sha=$3 tarball=$4 prefix=$5 url=${6:-} work log
  work=$PGV_CACHE/build/${prefix##*/} log=$prefix.log
  echo "pg_versions: building PostgreSQL $v from $tarball into $prefix (log: $log)" >&2
  # src/ belongs to _apt so that apt-get source downloads in its sandbox.
  rm -rf "$prefix" "$work" && mkdir -p "$PGV_CACHE/src" &&
    chown _apt "$PGV_CACHE/src" && : >"$log" || return 1
  (
    umask 022 # the postgres OS user runs what is installed
    cd "$PGV_CACHE/src" || exit 1
    if ! sha256sum -c --status <<<"$sha  $tarball" 2>/dev/null; then
      if [ -n "$url" ]; then
        _pgv_step "$log" "download" curl -fsSL -o "$tarball" "$url" || exit 3
      else
        _pgv_step "$log" "download" apt-get source -q --download-only "postgresql-$v/$suite" || exit 3
        rm -f ./*.dsc ./*.debian.tar.* # Debian's packaging is not used
      fi
    fi
    _pgv_step "$log" "verify sha256" sha256sum -c --status <<<"$sha  $tarball" &&
      mkdir -p "$work" && _pgv_step "$log" "unpack" tar -xf "$tarball" -C "$work" --strip-components=1 &&
      cd "$work" &&
      _pgv_step "$log" "configure" ./configure --prefix="$prefix" --enable-tap-tests \
        --with-openssl --with-icu &&
      _pgv_step "$log" "make -j2" make -j2 &&
      _pgv_step "$log" "make install" make install &&
      # Tests use amcheck and pgcrypto's hmac(), the peers benchmark pg_stat_statements;
      # PGXS's ISOLATION looks for pg_isolation_regress (and it for isolationtester) in
      # lib/pgxs/src/test/isolation.
      _pgv_step "$log" "install contrib/amcheck" make -C contrib/amcheck install &&
      _pgv_step "$log" "install contrib/pgcrypto" make -C contrib/pgcrypto install &&
      _pgv_step "$log" "install contrib/pg_stat_statements" make -C contrib/pg_stat_statements install &&
      _pgv_step "$log" "install isolation tester" make -C src/test/isolation -j2 install &&
      touch "$prefix/.complete"
  ) || return
  rm -rf "$work" # about 1 GB; the log and the prefix stay
}

# pg_contrib VERSION MODULE: makes sure contrib MODULE is installed in the build of
# VERSION, building it with PGXS from the cached source tarball when the build is older
# than the module's place in _pgv_build (15 has all of contrib from Debian's packages).
pg_contrib() {
  local v=$1 module=$2 prefix pg_config release tarball dir
  prefix=$(pg_prefix "$v") || return 1
  pg_config=$prefix/bin/pg_config
  [ -f "$("$pg_config" --sharedir)/extension/$module.control" ] && return 0
  release=$("$pg_config" --version | awk '{ print $2 }')
  tarball=$(ls "$PGV_CACHE/src/postgresql-${v}_$release.orig.tar."* 2>/dev/null | head -n 1)
  [ -n "$tarball" ] ||
    { echo "pg_contrib: no source tarball of $release in $PGV_CACHE/src" >&2; return 1; }
  dir=$(mktemp -d /tmp/pg-contrib-XXXXXX) || return 1
  tar -xf "$tarball" -C "$dir" --strip-components=1 --wildcards "*/contrib/$module" &&
    logged_step pg_versions "$dir/build.log" "contrib/$module into $v" \
      make -C "$dir/contrib/$module" USE_PGXS=1 PG_CONFIG="$pg_config" install
  local status=$?
  rm -rf "$dir"
  return "$status"
}

# pg_versions_selftest [VERSION...]: for each version, pg_config --version; a cluster
# started by the postgres OS user with amcheck and pgcrypto; and a throwaway PGXS
# project whose `make installcheck` runs a regress test, an isolation spec and a TAP
# test, i.e. PGXS finds pg_regress, pg_isolation_regress and the Perl test modules.
pg_versions_selftest() {
  local v prefix dir failed=0 versions=("$@")
  [ "$#" -gt 0 ] || versions=(15 17 18 19)
  for v in "${versions[@]}"; do
    prefix=$(pg_prefix "$v") || { echo "FAILED: $v (no build)"; failed=1; continue; }
    echo "== $v: $("$prefix/bin/pg_config" --version) in $prefix"
    dir=$(mktemp -d /tmp/pgv-selftest-XXXXXX) && chown postgres: "$dir" && chmod 755 "$dir" || return 1
    # A Unix socket in its own directory: the port number cannot collide with anything.
    if _pgv_selftest_one "$prefix" "$dir"; then
      echo "ok: $v"
      rm -rf "$dir"
    else
      echo "FAILED: $v (logs in $dir)"
      failed=1
    fi
  done
  return "$failed"
}

# _pgv_as_pg DIR COMMAND...: COMMAND as the postgres OS user, with $prefix's binaries
# first on the PATH and the cluster of DIR (socket only, port 5432) as default server.
_pgv_as_pg() {
  local dir=$1
  shift
  runuser -u postgres -- env PATH="$prefix/bin:$PATH" PGHOST="$dir" PGPORT=5432 PGUSER=postgres "$@"
}

_pgv_selftest_one() {
  local prefix=$1 dir=$2 status
  _pgv_as_pg "$dir" initdb -D "$dir/data" -A trust -U postgres -E UTF8 --locale=C.UTF-8 \
    >"$dir/initdb.log" 2>&1 &&
    _pgv_as_pg "$dir" pg_ctl -D "$dir/data" -l "$dir/server.log" -w \
      -o "-c listen_addresses='' -c unix_socket_directories='$dir'" start >/dev/null ||
    { echo "the cluster did not start"; return 1; }
  _pgv_selftest_checks "$prefix" "$dir"
  status=$?
  _pgv_as_pg "$dir" pg_ctl -D "$dir/data" -m fast -w stop >/dev/null 2>&1
  return "$status"
}

_pgv_selftest_checks() {
  local prefix=$1 dir=$2 pgxs_top
  pgxs_top=$(realpath "$(dirname "$("$prefix/bin/pg_config" --pgxs)")/../..")
  _pgv_as_pg "$dir" psql -X -q -v ON_ERROR_STOP=1 -d postgres -tA \
    -c 'CREATE EXTENSION amcheck; CREATE EXTENSION pgcrypto;' \
    -c "SELECT 'amcheck, pgcrypto: hmac ' || encode(hmac('x', 'k', 'sha256'), 'hex')" || return 1
  ls "$pgxs_top/src/test/isolation/pg_isolation_regress" "$pgxs_top/src/test/isolation/isolationtester" \
    "$pgxs_top/src/test/perl/PostgreSQL/Test/Cluster.pm" || return 1
  # The throwaway PGXS project: one test of each kind, all trivially true.
  mkdir -p "$dir/ext/sql" "$dir/ext/expected" "$dir/ext/specs" "$dir/ext/t"
  printf 'SELECT 1 AS one;\n one \n-----\n   1\n(1 row)\n\n' >"$dir/ext/expected/smoke.out"
  printf 'SELECT 1 AS one;\n' >"$dir/ext/sql/smoke.sql"
  printf 'session s1\nstep s1a { SELECT 1 AS one; }\npermutation s1a\n' >"$dir/ext/specs/iso.spec"
  printf 'Parsed test spec with 1 sessions\n\nstarting permutation: s1a\nstep s1a: SELECT 1 AS one;\none\n---\n  1\n(1 row)\n\n' \
    >"$dir/ext/expected/iso.out"
  printf '%s\n' 'use PostgreSQL::Test::Cluster; use Test::More;' \
    'my $n = PostgreSQL::Test::Cluster->new("n"); $n->init; $n->start;' \
    'is($n->safe_psql("postgres", "SELECT 1"), "1", "TAP cluster"); done_testing();' >"$dir/ext/t/001_smoke.pl"
  printf '%s\n' 'REGRESS = smoke' 'ISOLATION = iso' 'TAP_TESTS = 1' \
    'PGXS := $(shell $(PG_CONFIG) --pgxs)' 'include $(PGXS)' >"$dir/ext/Makefile"
  chown -R postgres: "$dir/ext"
  (cd "$dir/ext" && _pgv_as_pg "$dir" make -s installcheck PG_CONFIG="$prefix/bin/pg_config") \
    >"$dir/installcheck.log" 2>&1 || { tail -n 30 "$dir/installcheck.log"; return 1; }
  grep -E '^(test |ok|not ok|All |# All |t/|Result)' "$dir/installcheck.log"
}
