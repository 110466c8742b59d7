# Citus, the distributed-PostgreSQL extension, for the scale-out tests (source it from
# the repository root, like scripts/pg_versions.sh; sourcing defines functions and
# variables and changes nothing else).
#
#   citus_for PG_PREFIX   makes Citus usable in the PostgreSQL installed in PG_PREFIX:
#                         a Citus already installed there is used as it is; else one
#                         is built from a source tarball and installed there, once per
#                         PostgreSQL build (a stamp per prefix). Prints the Citus
#                         version on stdout, progress on stderr. Returns 0 when Citus
#                         can be loaded, 2 when there is no Citus source, 3 when the
#                         source found does not support this PostgreSQL, 1 when building
#                         or installing failed (a tarball with a wrong sha256 included).
#
# Citus is a test dependency only (AGPL-3.0): nothing of it is built into or shipped
# with the extension. It is not packaged for Debian 12 and cannot be downloaded on these
# machines, so its source tarball is looked for, first found wins, in:
#
#   $CITUS_TARBALL                 a path to citus-VERSION.tar.gz
#   $CITUS_SOURCE_DIR/citus-*.tar.gz   (CI passes the workplace's vendor directory)
#   $CITUS_CACHE/citus-*.tar.gz    (a tarball found elsewhere is copied here once its
#                                   checksum is verified, so later runs need no variable)
#
# A tarball is used only if its sha256 is pinned below (or given in CITUS_SHA256 for
# a release not pinned here). Building needs root (Debian packages, the prefix);
# using a Citus already installed does not.

declare -F logged_step >/dev/null || . scripts/pg_versions.sh
CITUS_CACHE=${CITUS_CACHE:-${PGV_CACHE:-/var/cache/idempotency-pg}/citus}
# sha256 of each release's tarball as `git archive --prefix=citus-V/ vV | gzip -9` makes it.
declare -A CITUS_PINNED_SHA256=(
  [14.0.1]=26ddb8ec9de07c5fa8426e435d10936e5cd6bed01a5ad94aab92e818081e5ec9
)
# The PostgreSQL majors each Citus major builds against (its configure refuses others).
declare -A CITUS_PG_MAJORS=([14]="16 17 18")
# What its configure checks for and links, besides what PostgreSQL's build needs
# (gcc, make, libssl-dev, libicu-dev: scripts/pg_versions.sh's PGV_BUILD_DEPS).
CITUS_BUILD_DEPS=(libcurl4-openssl-dev liblz4-dev libzstd-dev)

# _citus_tarball: prints the tarball to use (the first of the places above), nothing
# when there is none. In a directory with several, the newest release.
_citus_tarball() {
  local dir found
  if [ -n "${CITUS_TARBALL:-}" ]; then
    [ -f "$CITUS_TARBALL" ] || { echo "citus: CITUS_TARBALL=$CITUS_TARBALL is not a file" >&2; return 1; }
    echo "$CITUS_TARBALL"
    return 0
  fi
  for dir in "${CITUS_SOURCE_DIR:-}" "$CITUS_CACHE"; do
    [ -n "$dir" ] && [ -d "$dir" ] || continue
    found=$(compgen -G "$dir/citus-*.tar.gz" | sort -V | tail -n 1)
    [ -n "$found" ] && { echo "$found"; return 0; }
  done
  return 0
}

# _citus_version TARBALL: the release in its name (citus-14.0.1.tar.gz: 14.0.1).
_citus_version() {
  local name=${1##*/}
  name=${name#citus-}
  echo "${name%.tar.gz}"
}

# _citus_key PG_PREFIX: the stamp's name for a prefix (/var/cache/x/18-ab: var_cache_x_18-ab).
_citus_key() {
  local key=${1#/}
  echo "${key//\//_}"
}

# _citus_installed PG_CONFIG: the default_version of the installed citus.control, if
# citus.control and citus.so are both installed there.
_citus_installed() {
  local pg_config=$1 control
  control="$("$pg_config" --sharedir)/extension/citus.control"
  [ -f "$control" ] && [ -f "$("$pg_config" --pkglibdir)/citus.so" ] || return 1
  sed -n "s/^default_version *= *'\(.*\)'/\1/p" "$control"
}

citus_for() {
  local prefix=${1:-} pg_config major version tarball sha want stamp installed status
  if [ -z "$prefix" ] || [ ! -x "$prefix/bin/pg_config" ]; then
    echo "citus_for: '$prefix' is not a PostgreSQL installation (no bin/pg_config)" >&2
    return 1
  fi
  pg_config=$prefix/bin/pg_config
  major=$("$pg_config" --version | sed -nE 's/^PostgreSQL ([0-9]+).*/\1/p')
  stamp=$CITUS_CACHE/stamps/$(_citus_key "$prefix")
  # 1. Built and installed here before by this script: the stamp names the library's
  #    checksum, so a prefix rebuilt since (same path, new files) is not mistaken for it.
  if [ -f "$stamp" ] && installed=$(_citus_installed "$pg_config") &&
     [ "$(sed -n 's/^citus.so sha256 //p' "$stamp")" = \
       "$(sha256sum "$("$pg_config" --pkglibdir)/citus.so" | cut -d' ' -f1)" ]; then
    sed -n 's/^version //p' "$stamp"
    return 0
  fi
  # 2. A Citus installed otherwise (a package, by hand): used as it is.
  if installed=$(_citus_installed "$pg_config"); then
    echo "citus: using the Citus installed in $prefix (extension version $installed)" >&2
    echo "$installed"
    return 0
  fi
  # 3. Built from a tarball.
  tarball=$(_citus_tarball) || return 1
  if [ -z "$tarball" ]; then
    echo "citus: no Citus in $prefix and no Citus source: set CITUS_SOURCE_DIR (a directory" \
      "with citus-VERSION.tar.gz) or CITUS_TARBALL, or put the tarball in $CITUS_CACHE/" >&2
    return 2
  fi
  version=$(_citus_version "$tarball")
  if [[ " ${CITUS_PG_MAJORS[${version%%.*}]:-} " != *" $major "* ]]; then
    echo "citus: Citus $version does not support PostgreSQL $major" \
      "(it builds against ${CITUS_PG_MAJORS[${version%%.*}]:-an unknown set of} only)" >&2
    return 3
  fi
  want=${CITUS_SHA256:-${CITUS_PINNED_SHA256[$version]:-}}
  if [ -z "$want" ]; then
    echo "citus: no sha256 pinned for Citus $version ($tarball): set CITUS_SHA256" >&2
    return 1
  fi
  sha=$(sha256sum "$tarball" | cut -d' ' -f1)
  if [ "$sha" != "$want" ]; then
    echo "citus: $tarball has sha256 $sha, expected $want: not used" >&2
    return 1
  fi
  if [ "$(id -u)" -ne 0 ]; then
    echo "citus: building Citus $version into $prefix needs root" >&2
    return 1
  fi
  mkdir -p "$CITUS_CACHE/stamps" && chmod 755 "$CITUS_CACHE" || return 1
  # One build per prefix at a time; a second caller waits and then finds the stamp.
  (
    flock 9 || exit 1
    if [ -f "$stamp" ] && _citus_installed "$pg_config" >/dev/null; then exit 0; fi
    # Kept for the next run, which then needs no CITUS_SOURCE_DIR or CITUS_TARBALL.
    if [ "$(realpath "$(dirname "$tarball")")" != "$(realpath "$CITUS_CACHE")" ]; then
      cp "$tarball" "$CITUS_CACHE/citus-$version.tar.gz.part" &&
        mv "$CITUS_CACHE/citus-$version.tar.gz.part" "$CITUS_CACHE/citus-$version.tar.gz" ||
        exit 1
    fi
    _citus_build "$tarball" "$version" "$sha" "$prefix" "$stamp"
  ) 9>"$stamp.lock"
  status=$?
  [ "$status" = 0 ] || return 1
  echo "$version"
}

# _citus_step LOG NAME COMMAND...: one line per step (pg_versions.sh's logged_step).
_citus_step() { logged_step citus "$@"; }

# _citus_deps: installs the Debian packages of CITUS_BUILD_DEPS that are missing.
_citus_deps() {
  local dep missing=()
  for dep in "${CITUS_BUILD_DEPS[@]}"; do
    dpkg-query -W -f='${Status}' "$dep" 2>/dev/null | grep -q 'install ok installed' ||
      missing+=("$dep")
  done
  [ "${#missing[@]}" -eq 0 ] && return 0
  echo "citus: installing ${missing[*]}" >&2
  DEBIAN_FRONTEND=noninteractive apt-get -q -o DPkg::Lock::Timeout=600 install -y \
    --no-install-recommends -o Dpkg::Use-Pty=0 "${missing[@]}" >/dev/null 2>&1 ||
    { DEBIAN_FRONTEND=noninteractive apt-get -q -o DPkg::Lock::Timeout=600 update >/dev/null &&
        DEBIAN_FRONTEND=noninteractive apt-get -q -o DPkg::Lock::Timeout=600 install -y \
          --no-install-recommends -o Dpkg::Use-Pty=0 "${missing[@]}" >/dev/null; }
}

# _citus_build TARBALL VERSION SHA256 PG_PREFIX STAMP: unpacks, configures, builds and
# installs into PG_PREFIX, then writes STAMP; the build tree is removed after success,
# the log stays in CITUS_CACHE.
_citus_build() {
  local tarball=$1 version=$2 sha=$3 prefix=$4 stamp=$5 work log
  work=$CITUS_CACHE/build/$(_citus_key "$prefix") log=$stamp.log
  echo "citus: building Citus $version into $prefix (log: $log)" >&2
  : >"$log" && rm -rf "$work" && mkdir -p "$work" || return 1
  (
    umask 022 # the postgres OS user loads what is installed
    _citus_step "$log" "build dependencies" _citus_deps &&
      _citus_step "$log" "unpack" tar -xzf "$tarball" -C "$work" --strip-components=1 &&
      cd "$work" &&
      _citus_step "$log" "configure" ./configure PG_CONFIG="$prefix/bin/pg_config" &&
      _citus_step "$log" "make -j2" make -j2 &&
      _citus_step "$log" "make install" make install &&
      printf 'version %s\ntarball sha256 %s\ncitus.so sha256 %s\n' "$version" "$sha" \
        "$(sha256sum "$("$prefix/bin/pg_config" --pkglibdir)/citus.so" | cut -d' ' -f1)" \
        >"$stamp"
  ) || return 1
  rm -rf "$work"
}
