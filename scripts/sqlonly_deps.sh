# What the SQL-only edition's tests need besides PostgreSQL (source it from the
# repository root, like scripts/citus.sh; sourcing defines functions and variables and
# changes nothing else):
#
#   pg_copy_without_native PG_PREFIX DEST
#                  copies the PostgreSQL installed in PG_PREFIX to DEST without any file
#                  of the native edition (idempotency.so, idempotency.control, its
#                  scripts), and prints the copy's prefix (its bin/ is PREFIX/bin). pg_tle
#                  refuses to register a name that has a control file on disk
#                  ("control file already exists for the idempotency extension"), so the
#                  SQL-only edition is tested in such a copy, never beside the native one.
#                  Debian's layout (/usr/lib/postgresql/15 + /usr/share/postgresql/15 +
#                  /usr/include/postgresql) is copied as a unit below DEST, keeping the
#                  paths' relation to bin/ (PostgreSQL finds its share/ and lib/ from
#                  where its programs are); a relocatable prefix (scripts/pg_versions.sh's
#                  builds) is copied as one directory.
#   addon_for NAME PG_PREFIX
#                  makes NAME (pg_tle or pg_cron) usable in the PostgreSQL of PG_PREFIX
#                  (normally such a copy): one installed there already (Debian's
#                  postgresql-15-cron, say) is used as it is; else it is built once per
#                  PostgreSQL build from a sha256-pinned source tarball, staged
#                  (make install DESTDIR=...) in a cache, and copied in from there. Prints
#                  the version on stdout, progress on stderr. Returns 0 when it can be
#                  loaded, 2 when there is no source, 1 when building or installing failed
#                  (a tarball with a wrong sha256 included).
#
# Both are test dependencies only (pg_tle: Apache-2.0; pg_cron: PostgreSQL licence):
# nothing of them is built into or shipped with the extension. Neither is packaged for
# Debian 12's source builds of 17 and 18 (postgresql-15-cron, 1.4.2, is for 15), so a
# source tarball of each is looked for, first found wins, in:
#
#   $PG_TLE_TARBALL, $PG_CRON_TARBALL          a path to NAME-VERSION.tar.gz
#   $PG_TLE_SOURCE_DIR/pg_tle-*.tar.gz, $PG_CRON_SOURCE_DIR/pg_cron-*.tar.gz
#                                              (CI passes the workplace's vendor directory)
#   $SQLONLY_DEPS_CACHE/NAME-*.tar.gz          (a tarball found elsewhere is copied here
#                                              once verified, so later runs need no variable)
#
# Building needs root (Debian packages, the cache).

declare -F logged_step >/dev/null || . scripts/pg_versions.sh
SQLONLY_DEPS_CACHE=${SQLONLY_DEPS_CACHE:-${PGV_CACHE:-/var/cache/idempotency-pg}/sqlonly-deps}
# sha256 of each release's tarball as `git archive --prefix=NAME-V/ vV | gzip -9n` makes it.
declare -A ADDON_PINNED_SHA256=(
  [pg_tle-1.5.2]=4adfc063109da259a50e294a6010a9db1ca6cc3672fbe422042fc6f315813748
  [pg_cron-1.6.7]=070bbdb9c951727b8c7963e12466b3f88d3a27f0cc92d8373481ddfb07dbbbbb
)
# Debian packages each build needs besides PostgreSQL's headers: pg_tle includes
# libpq-be.h, which includes the Kerberos headers on Debian's 15.
declare -A ADDON_BUILD_DEPS=([pg_tle]="libkrb5-dev" [pg_cron]="")

# _addon_var NAME SUFFIX: the value of PG_TLE_SUFFIX / PG_CRON_SUFFIX.
_addon_var() {
  local var
  var=$(tr '[:lower:]' '[:upper:]' <<<"$1")_$2
  echo "${!var:-}"
}

# _addon_tarball NAME: the tarball to use, nothing when there is none.
_addon_tarball() {
  local name=$1 dir found tarball
  tarball=$(_addon_var "$name" TARBALL)
  if [ -n "$tarball" ]; then
    [ -f "$tarball" ] || { echo "$name: ${name^^}_TARBALL=$tarball is not a file" >&2; return 1; }
    echo "$tarball"
    return 0
  fi
  for dir in "$(_addon_var "$name" SOURCE_DIR)" "$SQLONLY_DEPS_CACHE"; do
    [ -n "$dir" ] && [ -d "$dir" ] || continue
    found=$(compgen -G "$dir/$name-[0-9]*.tar.gz" | sort -V | tail -n 1)
    [ -n "$found" ] && { echo "$found"; return 0; }
  done
  return 0
}

# _addon_installed NAME PG_CONFIG: the default_version of NAME installed there.
_addon_installed() {
  local control
  control="$("$2" --sharedir)/extension/$1.control"
  [ -f "$control" ] && [ -f "$("$2" --pkglibdir)/$1.so" ] || return 1
  sed -nE "s/^default_version *= *'(.*)'/\1/p" "$control"
}

pg_copy_without_native() {
  local prefix=${1:-} dest=${2:-} pg_config sharedir includedir root dir copy
  pg_config=$prefix/bin/pg_config
  if [ -z "$dest" ] || [ ! -x "$pg_config" ]; then
    echo "pg_copy_without_native: '$prefix' is not a PostgreSQL installation (no bin/pg_config)" >&2
    return 1
  fi
  prefix=$(realpath "$prefix")
  sharedir=$("$pg_config" --sharedir) includedir=$("$pg_config" --includedir)
  rm -rf "$dest" && mkdir -p "$dest" || return 1
  if [[ $sharedir == "$prefix"/* ]]; then
    copy=$dest/${prefix##*/}
    cp -a "$prefix" "$copy" || return 1
  else
    # Debian: the deepest directory the prefix, share and include directories have in
    # common (/usr) stands for DEST; each is copied to its place below it.
    root=$prefix
    while [ "$root" != / ] && { [[ $sharedir != "$root"/* ]] || [[ $includedir != "$root"/* ]]; }; do
      root=$(dirname "$root")
    done
    [ "$root" != / ] || { echo "pg_copy_without_native: $prefix, $sharedir and $includedir share no directory" >&2; return 1; }
    for dir in "$prefix" "$sharedir" "$includedir"; do
      [ -d "$dir" ] || continue
      mkdir -p "$dest/$(dirname "${dir#"$root"/}")" &&
        cp -a "$dir" "$dest/${dir#"$root"/}" || return 1
    done
    copy=$dest/${prefix#"$root"/}
  fi
  # What the copy's pg_config now reports (relocated), not the original's paths.
  rm -f "$("$copy/bin/pg_config" --pkglibdir)"/idempotency.so \
        "$("$copy/bin/pg_config" --sharedir)"/extension/idempotency.control \
        "$("$copy/bin/pg_config" --sharedir)"/extension/idempotency--*.sql || return 1
  rm -rf "$("$copy/bin/pg_config" --pkglibdir)"/bitcode/idempotency* || return 1
  if [ "$("$copy/bin/pg_config" --sharedir)" = "$sharedir" ]; then
    echo "pg_copy_without_native: the copy in $copy did not relocate (its share/ is still $sharedir)" >&2
    return 1
  fi
  chmod -R a+rX "$dest"
  echo "$copy"
}

# _addon_step LOG NAME COMMAND...: one line per step (pg_versions.sh's logged_step).
_addon_step() { logged_step "$_addon_name" "$@"; }

# _addon_deps NAME: installs the Debian packages its build needs that are missing.
_addon_deps() {
  local dep missing=()
  for dep in ${ADDON_BUILD_DEPS[$1]:-}; do
    dpkg-query -W -f='${Status}' "$dep" 2>/dev/null | grep -q 'install ok installed' ||
      missing+=("$dep")
  done
  [ "${#missing[@]}" -eq 0 ] && return 0
  echo "$1: installing ${missing[*]}" >&2
  DEBIAN_FRONTEND=noninteractive apt-get -q -o DPkg::Lock::Timeout=600 install -y \
    --no-install-recommends -o Dpkg::Use-Pty=0 "${missing[@]}" >/dev/null 2>&1 ||
    { DEBIAN_FRONTEND=noninteractive apt-get -q -o DPkg::Lock::Timeout=600 update >/dev/null &&
        DEBIAN_FRONTEND=noninteractive apt-get -q -o DPkg::Lock::Timeout=600 install -y \
          --no-install-recommends -o Dpkg::Use-Pty=0 "${missing[@]}" >/dev/null; }
}

# _addon_stage NAME TARBALL PG_CONFIG STAGE: builds NAME against PG_CONFIG and puts
# what `make install` installs into STAGE/lib (the library directory's files) and
# STAGE/extension (the control file and scripts), then STAGE/.complete.
_addon_stage() {
  local name=$1 tarball=$2 pg_config=$3 stage=$4 work log
  work=$stage.build log=$stage.log
  echo "$name: building $(basename "$tarball" .tar.gz) for $("$pg_config" --version) (log: $log)" >&2
  : >"$log" && rm -rf "$work" "$stage" && mkdir -p "$work/src" "$stage" || return 1
  (
    umask 022 # the postgres OS user loads what is installed
    # No LLVM bitcode (it would need clang): the server loads the library without it.
    local make=(make -C "$work/src" PG_CONFIG="$pg_config" with_llvm=no)
    _addon_step "$log" "build dependencies" _addon_deps "$name" &&
      _addon_step "$log" "unpack" tar -xzf "$tarball" -C "$work/src" --strip-components=1 &&
      _addon_step "$log" "make -j2" "${make[@]}" -j2 &&
      _addon_step "$log" "make install (staged)" "${make[@]}" install DESTDIR="$work/destdir" &&
      mkdir -p "$stage/lib" "$stage/extension" &&
      cp -a "$work/destdir$("$pg_config" --pkglibdir)/." "$stage/lib/" &&
      cp -a "$work/destdir$("$pg_config" --sharedir)/extension/." "$stage/extension/" &&
      touch "$stage/.complete"
  ) || return 1
  rm -rf "$work"
}

addon_for() {
  local name=${1:-} prefix=${2:-} pg_config tarball version want sha key stage status
  local _addon_name=$name
  pg_config=$prefix/bin/pg_config
  if [ -z "${ADDON_BUILD_DEPS[$name]+set}" ]; then
    echo "addon_for: '$name' is none of ${!ADDON_BUILD_DEPS[*]}" >&2
    return 1
  fi
  if [ ! -x "$pg_config" ]; then
    echo "addon_for: '$prefix' is not a PostgreSQL installation (no bin/pg_config)" >&2
    return 1
  fi
  if version=$(_addon_installed "$name" "$pg_config"); then
    echo "$name: using the $name installed in $prefix (extension version $version)" >&2
    echo "$version"
    return 0
  fi
  tarball=$(_addon_tarball "$name") || return 1
  if [ -z "$tarball" ]; then
    echo "$name: not in $prefix and no source: set ${name^^}_SOURCE_DIR (a directory with" \
      "$name-VERSION.tar.gz) or ${name^^}_TARBALL, or put the tarball in $SQLONLY_DEPS_CACHE/" >&2
    return 2
  fi
  version=$(basename "$tarball" .tar.gz)
  version=${version#"$name"-}
  want=$(_addon_var "$name" SHA256)
  want=${want:-${ADDON_PINNED_SHA256[$name-$version]:-}}
  if [ -z "$want" ]; then
    echo "$name: no sha256 pinned for $name $version ($tarball): set ${name^^}_SHA256" >&2
    return 1
  fi
  sha=$(sha256sum "$tarball" | cut -d' ' -f1)
  if [ "$sha" != "$want" ]; then
    echo "$name: $tarball has sha256 $sha, expected $want: not used" >&2
    return 1
  fi
  mkdir -p "$SQLONLY_DEPS_CACHE" && chmod 755 "$SQLONLY_DEPS_CACHE" || return 1
  # One build per release and PostgreSQL build (its server binary's checksum: a copy
  # of a PostgreSQL shares the build of the original, a rebuilt one gets its own).
  key=$name-$version-pg$("$pg_config" --version | sed -nE 's/^PostgreSQL ([0-9]+).*/\1/p')-$(sha256sum "$prefix/bin/postgres" | cut -c1-16)
  stage=$SQLONLY_DEPS_CACHE/$key
  (
    flock 9 || exit 1
    if [ "$(realpath "$(dirname "$tarball")")" != "$(realpath "$SQLONLY_DEPS_CACHE")" ]; then
      cp "$tarball" "$SQLONLY_DEPS_CACHE/$name-$version.tar.gz.part" &&
        mv "$SQLONLY_DEPS_CACHE/$name-$version.tar.gz.part" "$SQLONLY_DEPS_CACHE/$name-$version.tar.gz" ||
        exit 1
    fi
    [ -f "$stage/.complete" ] || _addon_stage "$name" "$tarball" "$pg_config" "$stage"
  ) 9>"$stage.lock"
  status=$?
  [ "$status" = 0 ] || return 1
  cp -a "$stage/lib/." "$("$pg_config" --pkglibdir)/" &&
    cp -a "$stage/extension/." "$("$pg_config" --sharedir)/extension/" || return 1
  _addon_installed "$name" "$pg_config" >/dev/null ||
    { echo "$name: installed from $stage, but $prefix does not show it" >&2; return 1; }
  echo "$version"
}
