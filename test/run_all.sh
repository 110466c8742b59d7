#!/usr/bin/env bash
# The one test command, for a fresh clone on a fresh Debian 12 machine (run as root):
#
#   1. installs the Debian packages it needs (all of them again when CI=true);
#   2. packs the source with `make dist` and works from that tarball from here on (so
#      the tests also prove the tarball complete); checks META.json and that the
#      derived update script (idempotency--1.2--1.4.sql) is what
#      scripts/update_scripts.sh makes of its sources, and that no released script changed
#      (scripts/released.sha256: the native 1.0 to 1.5 scripts, the SQL-only edition's
#      1.5 sources in sqlonly/released/); builds the Debian package
#      (debian/, pg_buildext), installs it with apt-get on PostgreSQL 15 and runs
#      pg_regress (REGRESS) against it with PGXS's `make installcheck`, then removes it
#      again; builds (with WERROR=1: a compiler warning fails the build) and installs
#      the extension (PGXS), and checks `make install DESTDIR=...`;
#   3. unit tests of the C++ core with ctest, plainly and under ASan/UBSan, the Node.js
#      fingerprint client against test/fingerprint_vectors.json, and the libFuzzer
#      targets for FUZZ_SECONDS each (default 30; 0 skips them);
#   4. `make format-check`, `make layers-check` (test/check_layers.sh: no include runs
#      back up the folders of src/pg), `make search-path-check` (test/check_search_path.py:
#      the SQL and PL/pgSQL functions without SET search_path qualify every operator,
#      function, type, collation and relation) and `make lint` (clang-format,
#      clang-tidy), one pass or failure each;
#   5. for each PostgreSQL version of PG_VERSIONS, the extension built and installed
#      against it, and from a copy of the repository owned by the postgres OS user,
#      `make installcheck` three times: pg_regress (REGRESS) and the isolation specs
#      (ISOLATION), each on a temporary instance of its own (test/regress.conf), then
#      the TAP tests (TAP_TESTS), which start clusters of their own; a line per version.
#      On the first version, also `make installcheck-server` (the regression tests
#      against a running server, as a user runs them) against a throwaway cluster
#      configured as a user's might be: one pass or failure.
#      The Citus scale-out tests (the test/t/*.pl files that call
#      IdemCitus::require_citus: 017_citus.pl, 025 to 028; a coordinator and two
#      workers each) run on PostgreSQL 17 and later when scripts/citus.sh's citus_for
#      can give that PostgreSQL a Citus (installed there, or built once from
#      CITUS_TARBALL or CITUS_SOURCE_DIR/citus-*.tar.gz or its cache); otherwise a line
#      "not run: 017_citus.pl, ... (why)" names them all, and they count neither as
#      passed nor as failed (a Citus that fails to build counts as failed). The pg_upgrade test
#      (test/t/024_pg_upgrade.pl) upgrades from the last version 17 or later that this
#      run installed the extension into before (17 to 18, 18 to 19); where there is
#      none (15, 17 first, a version tested alone), "not run: 024_pg_upgrade.pl (why)".
#   6. for each PostgreSQL version of PG_VERSIONS, the SQL-only edition (sqlonly/,
#      docs/sql-only.md) as a user installs it: `make sql-only` once (dist/), then a
#      copy of that PostgreSQL without the native edition's files, with pg_tle and
#      pg_cron installed in it (scripts/sqlonly_deps.sh: built once per PostgreSQL build
#      from PG_TLE_SOURCE_DIR/pg_tle-*.tar.gz and PG_CRON_SOURCE_DIR/pg_cron-*.tar.gz,
#      sha256-pinned, or their cache); in a server of that copy the pg_tle installer run
#      by a member of pgtle_admin, then REGRESS and ISOLATION against it with the native
#      expected outputs except test/sqlonly/expected/ and
#      test/sqlonly/isolation/expected/ (test/sqlonly/run.sh), each test one pass or
#      failure, and the edition's own checks (sqlonly/test/edition.sql, one); then the TAP tests of test/sqlonly/t/ (installing through pg_tle and
#      as plain SQL by roles without superuser, updates, pg_cron reaping on schedule,
#      a load with a crash, another role's keys, amcheck), each assertion one pass or
#      failure. Without a pg_tle or pg_cron source a line "not run: ... (why)" names
#      the tests that need it, counted neither way (one that fails to build counts as
#      failed).
#
# It ends with exactly one line "N passed, N failed", counting ctest tests, fuzz
# targets, pg_regress and isolation tests, and TAP assertions (a TODO assertion that
# fails as expected counts neither way and is listed); a stage that cannot
# build or run counts as failed, never as nothing. The exit status is non-zero when
# anything failed.
#
#   ONLY=package|unit|fuzz|style|sql|regress|isolation|tap|sqlonly (comma-separated) runs
#        a part;
#        package is META.json, the derived update script, the Debian package, the
#        DESTDIR install and how scripts/pg_versions.sh finds
#        PostgreSQL's sources (test/pg_versions_test.sh), scripts/citus.sh finds
#        Citus (test/citus_test.sh) and scripts/sqlonly_deps.sh copies PostgreSQL and
#        finds pg_tle and pg_cron (test/sqlonly_deps_test.sh); unit is the two ctest runs, the
#        fingerprint client and fuzz (no PostgreSQL needed, so no PGXS build); style is
#        format-check, layers-check, search-path-check and lint; sql is regress,
#        isolation, tap and sqlonly (the SQL-only edition's stage 6).
#   PG_VERSIONS=15,18  the PostgreSQL versions the SQL, isolation and TAP tests run on
#                      (default 15,17,18,19; 17 and up are built once from Debian's
#                      source packages and cached, see scripts/pg_versions.sh).
#   TAP_ONLY=017_citus.pl,001_concurrency.pl  runs only these TAP test files.
#   CITUS_SOURCE_DIR=../shared/vendor  where citus-VERSION.tar.gz is (relative to the
#                      repository root); or CITUS_TARBALL=path (scripts/citus.sh).
#   PG_TLE_SOURCE_DIR=../shared/vendor, PG_CRON_SOURCE_DIR=../shared/vendor  where
#                      pg_tle-VERSION.tar.gz and pg_cron-VERSION.tar.gz are (or
#                      PG_TLE_TARBALL, PG_CRON_TARBALL: scripts/sqlonly_deps.sh).
#   FUZZ_SECONDS=600   fuzzes longer.
#   KEEP=1             keeps the temporary directory (logs, build trees) for a look.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
. scripts/pg_versions.sh
. scripts/citus.sh
. scripts/sqlonly_deps.sh
# Given relative to the repository root (as .ci/run does); the tests run elsewhere.
for variable in CITUS_SOURCE_DIR PG_TLE_SOURCE_DIR PG_CRON_SOURCE_DIR; do
  if [ -n "${!variable:-}" ] && [ -d "${!variable}" ]; then
    declare "$variable=$(realpath "${!variable}")"
  fi
done
for variable in CITUS_TARBALL PG_TLE_TARBALL PG_CRON_TARBALL; do
  if [ -n "${!variable:-}" ] && [ -f "${!variable}" ]; then
    declare "$variable=$(realpath "${!variable}")"
  fi
done

# The Citus tests, for the line that says they did not run.
citus_tests=$(grep -l 'IdemCitus::require_citus' test/t/*.pl | xargs -n1 basename | paste -sd, |
  sed 's/,/, /g')
ONLY=${ONLY:-all}
PG_VERSIONS=${PG_VERSIONS:-15,17,18,19}
FUZZ_SECONDS=${FUZZ_SECONDS:-30}
# Upper bounds, so that a hung test ends with a count instead of a killed CI job.
REGRESS_TIMEOUT=${REGRESS_TIMEOUT:-900}
ISOLATION_TIMEOUT=${ISOLATION_TIMEOUT:-900}
TAP_TIMEOUT=${TAP_TIMEOUT:-2400}
TAP_ONLY=${TAP_ONLY:-}

work=$(mktemp -d /tmp/idempotency-tests.XXXXXX)
chmod 755 "$work"
passed=0
failed=0
finished=no

# ---------------------------------------------------------------------------------
# Counting and the final line
# ---------------------------------------------------------------------------------

count() { passed=$((passed + $1)); failed=$((failed + $2)); }

# A stage that could not build or run counts as failed (NUMBER times, default once).
stage_failed() {
  echo "!! FAILED: $1" >&2
  count 0 "${2:-1}"
}

# Runs on every exit: stops what this script started, removes its files and prints
# the final line, which is the last thing printed.
finish() {
  local status=$?
  trap - EXIT
  set +e
  if [ "$finished" != yes ]; then
    echo "!! run_all.sh stopped early (exit status $status); counted as one failure" >&2
    failed=$((failed + 1))
  fi
  stop_clusters_under "$work"
  if [ -n "${KEEP:-}" ]; then echo "(kept $work)"; else rm -rf "$work"; fi
  echo
  echo "$passed passed, $failed failed"
  if [ "$failed" -gt 0 ]; then exit 1; fi
  exit "$status"
}
trap finish EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ---------------------------------------------------------------------------------
# Parsers: each reads a log and prints "PASSED FAILED"
# ---------------------------------------------------------------------------------

# ctest's summary: "100% tests passed, 0 tests failed out of 45". Prints nothing when
# there is no summary (the tests did not run).
ctest_counts() {
  sed -nE 's/^[0-9]+% tests passed, ([0-9]+) tests? failed out of ([0-9]+).*/\2 \1/p' "$1" |
    tail -n 1 | awk '{ print $1 - $2, $2 }'
}

# pg_regress and pg_isolation_regress, one line per test. PostgreSQL 15 prints
#   test key_type                     ... ok           12 ms
#   test claim                        ... FAILED       30 ms
# (parallel groups indent the name instead of "test"; "failed (ignored)" counts as
# neither); PostgreSQL 16 and later print "ok 1 - key_type" and "not ok 2 - claim".
regress_counts() {
  awk '/ \.\.\. ok( |$)/ || /^ok [0-9]+ / { ok++ }
       / \.\.\. FAILED/ || /^not ok [0-9]+ / { bad++ }
       END { print ok + 0, bad + 0 }' "$1"
}

# prove: every assertion counts. "Files=3, Tests=45, ..." gives the assertions run;
# the "Test Summary Report" lists each file that failed, as
#   test/t/001_concurrency.pl (Wstat: 256 (exited 1) Tests: 12 Failed: 1)
# Its failed assertions count, or one failure if it died without a failed assertion
# (nonzero Wstat, no plan, ...). "Result: FAIL" with nothing listed counts one failure.
# Prints nothing when prove printed no "Files=" line (it did not run).
tap_counts() {
  awk '
    /^Files=[0-9]+, Tests=[0-9]+/ { split($2, t, "="); total = t[2] + 0; seen = 1 }
    /\(Wstat: [0-9]+.*Tests: [0-9]+ Failed: [0-9]+\)/ {
      match($0, /Failed: [0-9]+\)/); f = substr($0, RSTART + 8, RLENGTH - 9) + 0
      bad += f; if (f == 0) died++
    }
    /^Result: FAIL/ { result_fail = 1 }
    END {
      if (!seen) exit
      if (result_fail && bad + died == 0) died = 1
      ok = total - bad; if (ok < 0) ok = 0
      print ok, bad + died
    }' "$1"
}

# The files that prove listed as failed, one per line.
tap_failed_files() {
  sed -nE 's/^([^ ]+\.pl) +\(Wstat: .*/\1/p' "$1"
}

# ---------------------------------------------------------------------------------
# Stages
# ---------------------------------------------------------------------------------

# describe_status STATUS TIMEOUT: how a `make installcheck` ended, in words.
describe_status() {
  case $1 in
    0) echo "ended" ;;
    124 | 137) echo "timed out after $2s" ;;
    *) echo "failed (make exited with $1)" ;;
  esac
}

# Is STAGE (or its GROUP) selected by ONLY?
selected() {
  local item
  [ "$ONLY" = all ] && return 0
  for item in ${ONLY//,/ }; do
    if [ "$item" = "$1" ] || [ "$item" = "$2" ]; then return 0; fi
  done
  return 1
}

check_only() {
  local item
  for item in ${ONLY//,/ }; do
    case $item in
      all | package | unit | fuzz | style | sql | regress | isolation | tap | sqlonly) ;;
      *) stage_failed "ONLY=$ONLY: '$item' is none of package, unit, fuzz, style, sql, regress, isolation, tap, sqlonly"
         finished=yes
         exit 2 ;;
    esac
  done
}

install_packages() {
  say "packages"
  if [ "$(id -u)" -ne 0 ]; then
    stage_failed "run this as root: it installs packages and the extension, and runs clusters as postgres"
    exit 1
  fi
  ensure_packages || { stage_failed "could not install the packages"; exit 1; }
  echo "all there: ${REQUIRED_PACKAGES[*]}"
}

# Returns non-zero when the extension did not build or install.
build_extension() {
  say "build and install the extension (make && make install)"
  if (cd "$work/src" && WERROR=1 build_and_install) 2>&1 | tee "$work/build.log"; then
    echo "installed $("$PG_CONFIG" --pkglibdir)/idempotency.so"
    return 0
  fi
  stage_failed "the extension did not build or install"
  return 1
}

# run_ctest NAME TITLE [CMAKE OPTION...]: configures, builds and runs ctest in a build
# tree of its own.
run_ctest() {
  local name=$1 title=$2
  shift 2
  say "unit tests: $title"
  local build=$work/build-$name log=$work/ctest-$name.log counts ok bad
  if ! { cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" &&
         cmake --build "$build" -j2; } >"$work/cmake-$name.log" 2>&1; then
    tail -n 60 "$work/cmake-$name.log"
    stage_failed "the unit tests ($title) did not build"
    return
  fi
  ctest --test-dir "$build" --output-on-failure >"$log" 2>&1 || true
  counts=$(ctest_counts "$log")
  if [ -z "$counts" ]; then
    cat "$log"
    stage_failed "ctest ($title) printed no summary"
    return
  fi
  read -r ok bad <<<"$counts"
  if [ "$bad" -gt 0 ]; then
    grep -vE '^ +Start +[0-9]+: |^ *[0-9]+/[0-9]+ Test +#[0-9]+: .* Passed ' "$log"
  else
    grep -E 'tests passed' "$log"
  fi
  if [ $((ok + bad)) -eq 0 ]; then stage_failed "ctest ($title) found no tests"; return; fi
  count "$ok" "$bad"
}

# The Node.js client of docs/fingerprint.md computes every published vector's digest
# from its input: one pass, or one failure on any mismatch.
run_client_vectors() {
  say "unit: the Node.js fingerprint client against test/fingerprint_vectors.json"
  if node examples/fingerprint/check_vectors.mjs test/fingerprint_vectors.json \
       >"$work/client-vectors.log" 2>&1; then
    tail -n 1 "$work/client-vectors.log"
    count 1 0
  else
    tail -n 40 "$work/client-vectors.log"
    stage_failed "examples/fingerprint disagrees with test/fingerprint_vectors.json"
  fi
}

# Each libFuzzer target runs FUZZ_SECONDS from a copy of its committed corpus (with
# test/fuzz/TARGET.dict when there is one); a crash or a broken property is one
# failure, a clean run one pass.
run_fuzzers() {
  say "fuzzing (${FUZZ_SECONDS}s per target)"
  if [ "$FUZZ_SECONDS" = 0 ]; then echo "skipped (FUZZ_SECONDS=0)"; return; fi
  local build=$work/build-fuzz target corpus log dict
  if ! { CXX=clang++ cmake -S . -B "$build" -DIDEM_FUZZ=ON &&
         cmake --build "$build" -j2; } >"$work/cmake-fuzz.log" 2>&1; then
    tail -n 60 "$work/cmake-fuzz.log"
    stage_failed "the fuzz targets did not build"
    return
  fi
  for target in key canonical_json; do
    corpus=$work/corpus-$target log=$work/fuzz-$target.log
    cp -r "test/fuzz/corpus/$target" "$corpus"
    dict=()
    if [ -f "test/fuzz/$target.dict" ]; then dict=(-dict="test/fuzz/$target.dict"); fi
    if "$build/${target}_fuzz" -max_total_time="$FUZZ_SECONDS" -max_len=4096 "${dict[@]}" \
         "$corpus" >"$log" 2>&1; then
      echo "${target}_fuzz: ok ($(grep -oE 'Done [0-9]+ runs' "$log" || echo 'no run count'))"
      count 1 0
    else
      tail -n 40 "$log"
      stage_failed "${target}_fuzz found a failure"
    fi
  done
}

# The Makefile's value of a variable (e.g. REGRESS), read by make itself (the
# recipe's shell expands globs, as in PROVE_TESTS).
make_var() {
  # shellcheck disable=SC2016  # $(...) is make's, not the shell's
  printf 'print-var:\n\t@echo $(%s)\n' "$1" |
    make -s --no-print-directory -C "$work/src" -f Makefile -f - print-var PG_CONFIG="$PG_CONFIG"
}

# The source that every later stage builds and tests, in $work/src: the tarball of
# `make dist` when this is a git work tree, else a copy of this directory without
# build outputs.
prepare_source() {
  say "source: make dist"
  mkdir -p "$work/src"
  if ! git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    echo "not a git work tree: testing a copy of $(pwd)"
    tar cf - --exclude=./build --exclude=./results --exclude=./output_iso \
        --exclude=./tmp_check --exclude=./log --exclude='*.o' --exclude='*.so' --exclude='*.bc' \
        --exclude=./regression.diffs --exclude=./regression.out . | tar xf - -C "$work/src"
    return 0
  fi
  rm -f idempotency-*.tar.gz
  local tarball
  if ! make -s --no-print-directory dist PG_CONFIG="$PG_CONFIG" ||
     ! tarball=$(compgen -G 'idempotency-*.tar.gz') || ! mv "$tarball" "$work/" ||
     ! tar xzf "$work/$tarball" -C "$work/src" --strip-components=1; then
    stage_failed "make dist made no tarball to test from"
    return 1
  fi
  echo "testing from $tarball ($(tar tzf "$work/$tarball" | wc -l) entries)"
}

# Packaging, each check one pass or failure: META.json agrees with the control file;
# `make install DESTDIR=...` stages the library, control file and install script.
check_meta() {
  say "package: META.json"
  if /usr/bin/python3 "$work/src/test/check_meta.py" "$work/src"; then
    count 1 0
  else
    stage_failed "META.json is incomplete or disagrees with the control file"
  fi
}

# The update script derived from others (idempotency--1.2--1.4.sql, the direct path from
# 1.2) is committed; it must be exactly what scripts/update_scripts.sh makes of the
# released 1.2 -> 1.3 script and the current 1.3 -> 1.4 script, so that it never
# drifts from them. Checked before the build, which would remake it.
check_update_scripts() {
  say "package: derived update scripts (scripts/update_scripts.sh --check)"
  if bash "$work/src/scripts/update_scripts.sh" --check; then
    count 1 0
  else
    stage_failed "idempotency--1.2--1.4.sql differs from what scripts/update_scripts.sh makes: run make and commit it"
  fi
}

# Released scripts never change: the native edition's install and update scripts of
# 1.0 to 1.5 and the SQL-only edition's 1.5 sources (sqlonly/released/), each pinned by
# its sha256 in scripts/released.sha256.
check_released_scripts() {
  say "package: released scripts unchanged (scripts/released.sha256)"
  if (cd "$work/src" && sha256sum --check --strict --quiet scripts/released.sha256); then
    count 1 0
  else
    stage_failed "a released script changed: its changes belong in the next version's update"
  fi
}

# How scripts/pg_versions.sh provisions and falls back, against stand-ins for apt-get
# and the build: one pass or failure per check the script prints.
check_pg_versions_script() {
  say "package: scripts/pg_versions.sh against a stand-in archive"
  local out ok bad status=0
  out=$(bash "$work/src/test/pg_versions_test.sh" 2>&1) || status=$?
  echo "$out"
  ok=$(grep -c '^ok ' <<<"$out" || true)
  bad=$(grep -c '^not ok ' <<<"$out" || true)
  # A script that stopped early without a "not ok" line still failed.
  if [ "$status" -ne 0 ] && [ "$bad" -eq 0 ]; then bad=1; fi
  if [ "$ok" -eq 0 ] && [ "$bad" -eq 0 ]; then
    stage_failed "test/pg_versions_test.sh gave no result"
  else
    count "$ok" "$bad"
  fi
}

# How scripts/citus.sh finds, verifies, builds and reuses Citus, against stand-ins for
# PostgreSQL, the tarballs and the build: one pass or failure per check it prints.
check_citus_script() {
  say "package: scripts/citus.sh against stand-ins"
  local out ok bad status=0
  out=$(bash "$work/src/test/citus_test.sh" 2>&1) || status=$?
  echo "$out"
  ok=$(grep -c '^ok ' <<<"$out" || true)
  bad=$(grep -c '^not ok ' <<<"$out" || true)
  if [ "$status" -ne 0 ] && [ "$bad" -eq 0 ]; then bad=1; fi
  if [ "$ok" -eq 0 ] && [ "$bad" -eq 0 ]; then
    stage_failed "test/citus_test.sh gave no result"
  else
    count "$ok" "$bad"
  fi
}

# How scripts/sqlonly_deps.sh copies a PostgreSQL without the native edition and
# finds, verifies, builds and reuses pg_tle and pg_cron, against stand-ins: one pass or
# failure per check it prints.
check_sqlonly_deps_script() {
  say "package: scripts/sqlonly_deps.sh against stand-ins"
  local out ok bad status=0
  out=$(bash "$work/src/test/sqlonly_deps_test.sh" 2>&1) || status=$?
  echo "$out"
  ok=$(grep -c '^ok ' <<<"$out" || true)
  bad=$(grep -c '^not ok ' <<<"$out" || true)
  if [ "$status" -ne 0 ] && [ "$bad" -eq 0 ]; then bad=1; fi
  if [ "$ok" -eq 0 ] && [ "$bad" -eq 0 ]; then
    stage_failed "test/sqlonly_deps_test.sh gave no result"
  else
    count "$ok" "$bad"
  fi
}

# The Debian package (debian/): built by dpkg-buildpackage from a copy of the source,
# one postgresql-N-idempotency per PostgreSQL version whose server headers are
# installed (pg_buildext with PG_SUPPORTED_VERSIONS=installed; debian/control made
# for them by `pg_buildext updatecontrol`); postgresql-15-idempotency installed with
# `apt-get install ./...deb` on Debian's PostgreSQL 15, after removing what an earlier
# `make install` left there; pg_regress (REGRESS) run against the installed package
# with PGXS's `make installcheck` from a fresh copy, with nothing built or installed by
# make. The package is purged afterwards, so that the stages after this one find the
# files `make install` puts there, as before. Building and installing count one pass
# or failure; the regression tests count each.
check_debian_package() {
  say "package: the Debian package (dpkg-buildpackage, apt-get install ./*.deb, make installcheck)"
  local dir=$work/deb version deb missing=0 file
  local pkglib sharedir
  pkglib=$("$PG_BIN/pg_config" --pkglibdir)
  sharedir=$("$PG_BIN/pg_config" --sharedir)
  mkdir -p "$dir"
  cp -a "$work/src" "$dir/build"
  if ! (cd "$dir/build" &&
        PG_SUPPORTED_VERSIONS=installed pg_buildext updatecontrol &&
        PG_SUPPORTED_VERSIONS=installed dpkg-buildpackage -us -uc -b) >"$work/deb-build.log" 2>&1; then
    tail -n 60 "$work/deb-build.log"
    stage_failed "the Debian package did not build"
    return
  fi
  for version in $(cd "$dir/build" && PG_SUPPORTED_VERSIONS=installed pg_buildext supported-versions); do
    if deb=$(compgen -G "$dir/postgresql-${version}-idempotency_*.deb"); then
      echo "built $(basename "$deb")"
    else
      echo "!! no package for PostgreSQL $version"
      missing=1
    fi
  done
  # The relay's package: the program, its man page and the systemd unit.
  local listing=
  deb=$(compgen -G "$dir/idempotency-relay_*.deb" || true)
  [ -n "$deb" ] && listing=$(dpkg-deb -c "$deb")
  for file in ./usr/bin/idem-relay ./usr/share/man/man1/idem-relay.1.gz ./lib/systemd/system/idem-relay@.service; do
    if ! grep -q " $file\$" <<<"$listing"; then
      echo "!! not in the idempotency-relay package: $file"
      missing=1
    fi
  done
  deb=$(compgen -G "$dir/postgresql-15-idempotency_*.deb" || true)
  if [ "$missing" = 1 ] || [ -z "$deb" ]; then
    stage_failed "dpkg-buildpackage left out a package"
    return
  fi
  # A PostgreSQL 15 without the extension: no package of an earlier run, no file of
  # an earlier `make install`.
  DEBIAN_FRONTEND=noninteractive apt-get purge -y -q postgresql-15-idempotency >/dev/null 2>&1 || true
  rm -f "$pkglib/idempotency.so" "$sharedir/extension/idempotency.control" \
        "$sharedir"/extension/idempotency--*.sql
  if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
         -o Dpkg::Use-Pty=0 "$deb" >"$work/deb-install.log" 2>&1; then
    cat "$work/deb-install.log"
    stage_failed "apt-get install $(basename "$deb") failed"
    return
  fi
  for file in "$pkglib/idempotency.so" "$sharedir/extension/idempotency.control" \
              "$sharedir/extension/idempotency--1.3--1.4.sql"; do
    if ! dpkg -S "$file" >/dev/null 2>&1; then echo "!! not installed by the package: $file"; missing=1; fi
  done
  if [ "$missing" = 1 ]; then
    stage_failed "the installed package lacks files"
  else
    echo "installed $(dpkg-query -W -f='${Package} ${Version}' postgresql-15-idempotency)"
    count 1 0
    cp -a "$work/src" "$dir/check"
    chown -R postgres: "$dir/check"
    check_dir=$dir/check run_pg_regress package-regress REGRESS "$REGRESS_TIMEOUT" \
      "$dir/check/regression.diffs" "$dir/check/tmp_check_regress/log/postmaster.log" \
      ISOLATION= TAP_TESTS=
  fi
  DEBIAN_FRONTEND=noninteractive apt-get purge -y -q postgresql-15-idempotency >/dev/null 2>&1 || true
}

check_destdir_install() {
  say "package: make install DESTDIR=..."
  local stage=$work/stage file missing=0
  if ! make -s -C "$work/src" install DESTDIR="$stage" PG_CONFIG="$PG_CONFIG" \
       >"$work/destdir.log" 2>&1; then
    cat "$work/destdir.log"
    stage_failed "make install DESTDIR=... failed"
    return
  fi
  for file in "$("$PG_CONFIG" --pkglibdir)/idempotency.so" \
              "$("$PG_CONFIG" --sharedir)/extension/idempotency.control" \
              "$("$PG_CONFIG" --sharedir)/extension/idempotency--1.0.sql" \
              "$("$PG_CONFIG" --sharedir)/extension/idempotency--1.0--1.1.sql"; do
    if [ -f "$stage$file" ]; then
      echo "staged $file"
    else
      echo "!! not staged: $file"
      missing=1
    fi
  done
  if [ "$missing" = 0 ]; then count 1 0; else stage_failed "make install DESTDIR=... left files out"; fi
}

# make_check NAME TARGET: one `make TARGET` (format-check, lint), one pass or failure.
make_check() {
  say "style: make $2"
  if make -s --no-print-directory -C "$work/src" "$2" PG_CONFIG="$PG_CONFIG" >"$work/$2.log" 2>&1; then
    echo "clean"
    count 1 0
  else
    tail -n 60 "$work/$2.log"
    stage_failed "make $2 ($1)"
  fi
}

# installcheck LOG TIMEOUT [MAKE VARIABLE=VALUE...]: `make installcheck` as postgres in
# the copy (check_dir, else $work/src), its output shown and kept in LOG; returns
# make's status.
installcheck() {
  local log=$1 limit=$2
  shift 2
  (cd "${check_dir:-$work/src}" &&
   runuser -u postgres -- env IDEM_OLD_INSTALL="${IDEM_OLD_INSTALL:-}" IDEM_CITUS="${IDEM_CITUS:-}" \
     IDEM_UPGRADE_FROM="${IDEM_UPGRADE_FROM:-}" \
     timeout -k 30 "$limit" \
     make -s --no-print-directory installcheck PG_CONFIG="$PG_CONFIG" "$@") \
    2>&1 | tee "$log"
}

# Crashes, assertion failures and PANICs in a temporary instance's log (LOG), if any
# (the tests' own ERRORs are expected and not shown).
server_trouble() {
  local log=$1
  if grep -qE 'PANIC|TRAP:|terminated by signal|was terminated by|FATAL' "$log" 2>/dev/null; then
    say "the temporary instance's log: crashes and fatal errors"
    grep -E -B 2 -A 4 'PANIC|TRAP:|terminated by signal|was terminated by|FATAL' "$log" | tail -n 80
  fi
}

# run_pg_regress NAME VARIABLE TIMEOUT DIFFS SERVERLOG [MAKE VARIABLE=VALUE...]: pg_regress or
# pg_isolation_regress for the tests the Makefile lists in VARIABLE, the other kinds
# switched off. A test that printed no result counts as failed.
run_pg_regress() {
  local name=$1 variable=$2 limit=$3 diffs=$4 server_log=$5
  shift 5
  say "$name ($variable in the Makefile)"
  local expected status=0 log=$work/$name.log ok bad missing
  expected=$(make_var "$variable" | wc -w)
  if [ "$expected" -eq 0 ]; then echo "none listed"; return; fi
  installcheck "$log" "$limit" "$@" || status=$?
  read -r ok bad < <(regress_counts "$log")
  missing=$((expected - ok - bad))
  if [ "$missing" -lt 0 ]; then missing=0; fi
  if [ "$status" -ne 0 ] && [ "$bad" -eq 0 ] && [ "$missing" -eq 0 ]; then missing=1; fi
  count "$ok" "$bad"
  if [ "$missing" -gt 0 ]; then
    stage_failed "$name $(describe_status "$status" "$limit"): $missing of $expected tests gave no result" "$missing"
  fi
  if [ "$bad" -gt 0 ] || [ "$missing" -gt 0 ]; then
    if [ -f "$diffs" ]; then
      say "$name: $diffs"
      head -n 3000 "$diffs"
    fi
    server_trouble "$server_log"
  fi
}

# make installcheck-server against a throwaway cluster set up as a user's server might
# be: the library preloaded with its worker on, max_prepared_transactions at its
# default 0 (two_phase is skipped, saying so), a session default changed in
# postgresql.conf. One pass, or one failure.
run_installcheck_server() {
  say "regress: make installcheck-server against a running server"
  local PG_BIN dir=$work/server-check log=$work/installcheck-server.log status=0
  PG_BIN=$(dirname "$PG_CONFIG")
  if ! start_cluster_on_free_port "$dir" "shared_preload_libraries = 'idempotency'" \
       "idempotency.default_ttl = '2h'"; then
    stage_failed "make installcheck-server: its cluster did not start"
    return
  fi
  (cd "$work/src" &&
   runuser -u postgres -- env PGHOST=127.0.0.1 PGPORT="$CLUSTER_PORT" PGUSER=postgres \
     timeout -k 30 "$REGRESS_TIMEOUT" \
     make -s --no-print-directory installcheck-server PG_CONFIG="$PG_CONFIG") 2>&1 | tee "$log" ||
    status=$?
  stop_cluster "$dir"
  if [ "$status" -eq 0 ] && grep -qE 'All [0-9]+ tests passed|^# All [0-9]+ tests passed' "$log"; then
    count 1 0
  else
    if [ -f "$work/src/regression.diffs" ]; then head -n 3000 "$work/src/regression.diffs"; fi
    stage_failed "make installcheck-server $(describe_status "$status" "$REGRESS_TIMEOUT")"
  fi
}

run_tap_tests() {
  say "TAP tests (TAP_TESTS in the Makefile)"
  local expected status=0 log=$work/tap.log counts ok bad file name server_log
  if [ -z "$(make_var TAP_TESTS)" ]; then echo "none listed"; return; fi
  # The test files: PROVE_TESTS as the recipe's shell expands it, else PGXS's t/*.pl;
  # or those of TAP_ONLY.
  local only=()
  if [ -n "$TAP_ONLY" ]; then
    for file in ${TAP_ONLY//,/ }; do only+=("test/t/${file##*/}"); done
    expected=${#only[@]}
    only=("PROVE_TESTS=${only[*]}")
  else
    expected=$(make_var PROVE_TESTS | wc -w)
    if [ "$expected" -eq 0 ]; then expected=$(cd "$work/src" && { compgen -G 't/*.pl' || true; } | wc -l); fi
  fi
  installcheck "$log" "$TAP_TIMEOUT" REGRESS= ISOLATION= "${only[@]}" || status=$?
  counts=$(tap_counts "$log")
  if [ -z "$counts" ]; then
    # No summary: prove did not run, or was stopped. Each file not reported ok failed.
    local unfinished=$((expected - $(grep -cE '^[^ ]+\.pl \.+ ok' "$log" || true)))
    if [ "$unfinished" -lt 1 ]; then unfinished=1; fi
    stage_failed "the TAP tests $(describe_status "$status" "$TAP_TIMEOUT"): $unfinished of $expected files unfinished" "$unfinished"
  else
    read -r ok bad <<<"$counts"
    if [ "$status" -ne 0 ] && [ "$bad" -eq 0 ]; then bad=1; fi
    # An assertion in a TODO block that failed, as expected (a known gap, e.g. issue
    # 27 in 017_citus.pl), is in prove's Tests= but counts neither as passed nor as
    # failed; each is listed by its file's log line.
    local todo
    todo=$(cat "$work/src"/tmp_check/log/regress_log_* 2>/dev/null |
           grep -cE '^(\[[0-9:.]+\]\([0-9.]+s\) )?not ok [0-9]+ .*# TODO' || true)
    if [ "$todo" -gt 0 ]; then
      echo "todo: $todo assertions in TODO blocks failed as expected (counted neither way):"
      grep -hE '^(\[[0-9:.]+\]\([0-9.]+s\) )?not ok [0-9]+ .*# TODO' \
        "$work/src"/tmp_check/log/regress_log_* | sed -E 's/^\[[^]]*\]\([^)]*\) //; s/^/  /'
      ok=$((ok - todo))
      if [ "$ok" -lt 0 ]; then ok=0; fi
    fi
    count "$ok" "$bad"
    if [ "$bad" -gt 0 ]; then echo "!! FAILED: $bad TAP assertions or files" >&2; fi
  fi
  if [ "$status" -ne 0 ]; then
    for file in $(tap_failed_files "$log"); do
      name=$(basename "$file" .pl)
      say "TAP: tmp_check/log/regress_log_$name (the end)"
      tail -n 150 "$work/src/tmp_check/log/regress_log_$name" 2>/dev/null || echo "(none)"
      for server_log in "$work/src/tmp_check/log/${name}"_*.log; do
        [ -f "$server_log" ] || continue
        say "TAP: ${server_log#"$work/src/"} (the end)"
        tail -n 40 "$server_log"
      done
    done
  fi
}

# ---------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------

check_only
install_packages
if ! prepare_source; then finished=yes; exit 1; fi
cd "$work/src"

if selected package package; then
  check_meta
  check_update_scripts
  check_released_scripts
  check_pg_versions_script
  check_citus_script
  check_sqlonly_deps_script
  check_debian_package
fi

built=yes
if selected package package || selected style style || selected regress sql ||
   selected isolation sql || selected tap sql; then
  build_extension || built=no
fi
if selected package package; then
  if [ "$built" = yes ]; then check_destdir_install; else stage_failed "no DESTDIR install: the build failed"; fi
fi

if selected unit unit; then
  run_ctest plain "ctest"
  run_ctest sanitized "ctest under AddressSanitizer and UBSan" -DIDEM_SANITIZE=ON
  run_client_vectors
fi
if selected fuzz unit; then
  run_fuzzers
fi
if selected style style; then
  make_check "the C++ is not formatted as .clang-format says: run make format" format-check
  make_check "an include runs back up the layers of src/pg (src/pg/README.md)" layers-check
  make_check "a function without SET search_path names something unqualified (SPEC Security)" \
    search-path-check
  if [ "$built" = yes ]; then
    make_check "clang-tidy found problems (.clang-tidy)" lint
  else
    stage_failed "no lint: the extension did not build"
  fi
fi

# ---------------------------------------------------------------------------------
# The SQL-only edition (stage 6)
# ---------------------------------------------------------------------------------

# `make sql-only` once per run: sqlonly_dist is the directory it wrote, or "failed".
sqlonly_dist=""
make_sqlonly_dist() {
  say "SQL-only edition: make sql-only"
  if make -s --no-print-directory -C "$work/src" sql-only PG_CONFIG="$PG_CONFIG" \
       >"$work/sql-only.log" 2>&1 &&
     [ -f "$work/src/dist/idempotency-sql--1.5.sql" ] &&
     [ -f "$work/src/dist/idempotency-pgtle--1.5.sql" ]; then
    sqlonly_dist=$work/src/dist
    ls -l "$sqlonly_dist"
  else
    tail -n 40 "$work/sql-only.log"
    echo "!! make sql-only did not write dist/idempotency-sql--1.5.sql and dist/idempotency-pgtle--1.5.sql"
    sqlonly_dist=failed
  fi
}

# The TAP tests of test/sqlonly/t/, for the "not run" lines: those that need pg_tle,
# those that need pg_cron (each file says which with IDEM_PG_TLE / IDEM_PG_CRON).
sqlonly_tap_needing() {
  grep -l "require_sqlonly_addon('$1')" test/sqlonly/t/*.pl 2>/dev/null | xargs -rn1 basename |
    paste -sd, | sed 's/,/, /g'
}

# sqlonly_addon NAME VERSION COPY: sets addon_ok=1 when NAME can be loaded in COPY;
# else a "not run" line naming WHAT (or one failure when it did not build).
sqlonly_addon() {
  local name=$1 version=$2 copy=$3 what=$4 status=0 release
  addon_ok=0
  release=$(addon_for "$name" "$copy") || status=$?
  case $status in
    0) addon_ok=1; echo "$name $release in the copy" ;;
    2) echo "not run: $what (no $name source: set ${name^^}_SOURCE_DIR or ${name^^}_TARBALL)"
       not_run_lines+=("PostgreSQL $version: not run: $what (no $name source: set ${name^^}_SOURCE_DIR or ${name^^}_TARBALL)") ;;
    *) stage_failed "$name could not be built or installed for PostgreSQL $version" ;;
  esac
}

# sqlonly_native_only TEST: whether test/sqlonly/native_only lists TEST (a test of the
# native edition's internals, left out of the SQL-only edition's run).
sqlonly_native_only() {
  grep -qE "^$1([[:space:]]|\$)" "$work/src/test/sqlonly/native_only" 2>/dev/null
}

# run_sqlonly_suite KIND VERSION COPY: test/sqlonly/run.sh for REGRESS or ISOLATION, or
# the edition's own checks (sqlonly/test/edition.sql), each test one pass or failure; a
# test that gave no result counts as failed.
run_sqlonly_suite() {
  local kind=$1 version=$2 copy=$3 variable tests out log status=0 ok bad missing
  case $kind in
    regress) variable=REGRESS ;;
    isolation) variable=ISOLATION ;;
    *) variable="" ;;
  esac
  out=$work/sqlonly-pg$version/$kind log=$work/sqlonly-pg$version-$kind.log
  if [ -n "$variable" ]; then
    say "SQL-only edition, PostgreSQL $version: $kind ($variable in the Makefile, through pg_tle)"
    read -ra tests < <(make_var "$variable")
    # The native edition's internals (test/sqlonly/native_only): not run, not counted.
    local left_out=() kept=() name
    for name in "${tests[@]}"; do
      if sqlonly_native_only "$name"; then left_out+=("$name"); else kept+=("$name"); fi
    done
    tests=("${kept[@]}")
    if [ "${#left_out[@]}" -gt 0 ]; then
      local names
      names=$(printf '%s, ' "${left_out[@]}")
      names=${names%, }
      echo "not run (native edition's internals): $names (test/sqlonly/native_only)"
      not_run_lines+=("PostgreSQL $version: SQL-only $kind: not run (native edition's internals): $names (test/sqlonly/native_only)")
    fi
  else
    say "SQL-only edition, PostgreSQL $version: sqlonly/test/edition.sql (through pg_tle)"
    tests=(edition)
  fi
  (cd "$work/src" && timeout -k 30 "$REGRESS_TIMEOUT" \
     test/sqlonly/run.sh "$kind" "$copy" "$sqlonly_dist" "$out" "${tests[@]}") 2>&1 | tee "$log" ||
    status=$?
  read -r ok bad < <(regress_counts "$log")
  missing=$((${#tests[@]} - ok - bad))
  if [ "$missing" -lt 0 ]; then missing=0; fi
  if [ "$status" -ne 0 ] && [ "$bad" -eq 0 ] && [ "$missing" -eq 0 ]; then missing=1; fi
  count "$ok" "$bad"
  if [ "$missing" -gt 0 ]; then
    stage_failed "SQL-only $kind on $version $(describe_status "$status" "$REGRESS_TIMEOUT"): $missing of ${#tests[@]} tests gave no result" "$missing"
  fi
  if [ "$bad" -gt 0 ] && [ -f "$out/regression.diffs" ]; then
    say "SQL-only $kind on $version: regression.diffs"
    head -n 3000 "$out/regression.diffs"
  fi
}

# run_sqlonly_tap VERSION COPY: prove test/sqlonly/t/*.pl with the copy's PostgreSQL
# first on PATH (PGXS's installcheck with the copy's pg_config), each assertion one
# pass or failure.
run_sqlonly_tap() {
  local version=$1 copy=$2 log=$work/sqlonly-pg$version-tap.log counts ok bad status=0 file name
  local expected
  expected=$(compgen -G 'test/sqlonly/t/*.pl' | wc -l)
  say "SQL-only edition, PostgreSQL $version: TAP tests (test/sqlonly/t)"
  [ "$expected" -gt 0 ] || { echo "none"; return; }
  (
    export IDEM_SQLONLY_DIST=$sqlonly_dist IDEM_PG_TLE=$tle_ok IDEM_PG_CRON=$cron_ok
    PG_CONFIG=$copy/bin/pg_config installcheck "$log" "$TAP_TIMEOUT" REGRESS= ISOLATION= \
      "PROVE_TESTS=test/sqlonly/t/*.pl"
  ) || status=$?
  counts=$(tap_counts "$log")
  if [ -z "$counts" ]; then
    stage_failed "the SQL-only TAP tests on $version $(describe_status "$status" "$TAP_TIMEOUT"): no summary" "$expected"
    return
  fi
  read -r ok bad <<<"$counts"
  if [ "$status" -ne 0 ] && [ "$bad" -eq 0 ]; then bad=1; fi
  count "$ok" "$bad"
  if [ "$bad" -gt 0 ]; then
    echo "!! FAILED: $bad SQL-only TAP assertions or files" >&2
    for file in $(tap_failed_files "$log"); do
      name=$(basename "$file" .pl)
      say "SQL-only TAP: tmp_check/log/regress_log_$name (the end)"
      tail -n 150 "$work/src/tmp_check/log/regress_log_$name" 2>/dev/null || echo "(none)"
    done
  fi
}

# run_sqlonly VERSION PREFIX: the SQL-only edition on that PostgreSQL, in a copy of it
# without the native files.
run_sqlonly() {
  local version=$1 prefix=$2 copy tle_ok=0 cron_ok=0 addon_ok
  say "SQL-only edition on PostgreSQL $version: a copy without the native edition, pg_tle, pg_cron"
  [ -n "$sqlonly_dist" ] || make_sqlonly_dist
  if [ "$sqlonly_dist" = failed ]; then
    stage_failed "the SQL-only edition not tested on $version: make sql-only failed"
    return
  fi
  if ! copy=$(pg_copy_without_native "$prefix" "$work/sqlonly-pg$version/install"); then
    stage_failed "the SQL-only edition not tested on $version: no copy of $prefix"
    return
  fi
  echo "copy: $copy ($("$copy/bin/pg_config" --version))"
  sqlonly_addon pg_tle "$version" "$copy" \
    "the SQL-only edition's REGRESS, ISOLATION and sqlonly/test/edition.sql through pg_tle, $(sqlonly_tap_needing pg_tle)"
  tle_ok=$addon_ok
  sqlonly_addon pg_cron "$version" "$copy" "$(sqlonly_tap_needing pg_cron)"
  cron_ok=$addon_ok
  chown -R postgres: "$work/src" "$work/sqlonly-pg$version"
  if [ "$tle_ok" = 1 ]; then
    run_sqlonly_suite regress "$version" "$copy"
    run_sqlonly_suite isolation "$version" "$copy"
    run_sqlonly_suite edition "$version" "$copy"
  fi
  run_sqlonly_tap "$version" "$copy"
}

# citus_decision VERSION PREFIX: whether test/t/017_citus.pl runs on this PostgreSQL:
# sets IDEM_CITUS=1 (it runs, and a missing Citus fails it) or IDEM_CITUS=0 (it skips)
# with a "not run" line, printed now and again among the lines per version. Citus 14
# is tested on 17 and 18 (SPEC); a Citus that does not build counts as one failure.
citus_decision() {
  local version=$1 prefix=$2 status=0 reason=""
  IDEM_CITUS=0
  if [ "$version" -lt 17 ]; then
    reason="the Citus tests run on PostgreSQL 17 and later"
  else
    say "Citus for PostgreSQL $version (scripts/citus.sh)"
    citus_for "$prefix" >/dev/null || status=$?
    case $status in
      0) IDEM_CITUS=1; echo "Citus $(citus_for "$prefix" 2>/dev/null) in $prefix" ;;
      2) reason="no Citus source: set CITUS_SOURCE_DIR or CITUS_TARBALL" ;;
      3) reason="the Citus source found does not support PostgreSQL $version" ;;
      *) reason="Citus did not build for PostgreSQL $version"
         stage_failed "Citus could not be built or installed for PostgreSQL $version" ;;
    esac
  fi
  if [ "$IDEM_CITUS" = 0 ]; then
    echo "not run: $citus_tests ($reason)"
    not_run_lines+=("PostgreSQL $version: not run: $citus_tests ($reason)")
  fi
}

# upgrade_decision VERSION: whether test/t/024_pg_upgrade.pl has an older PostgreSQL
# to upgrade from: the last version 17 or later that this run installed the extension
# into (test_version sets it); otherwise a "not run" line.
upgrade_from_version=""
upgrade_from_prefix=""
upgrade_decision() {
  local version=$1 reason
  if [ -n "$upgrade_from_prefix" ]; then
    echo "024_pg_upgrade.pl upgrades from PostgreSQL $upgrade_from_version ($upgrade_from_prefix)"
    return
  fi
  reason="no PostgreSQL 17 or later tested before $version in this run to upgrade from"
  echo "not run: 024_pg_upgrade.pl ($reason)"
  not_run_lines+=("PostgreSQL $version: not run: 024_pg_upgrade.pl ($reason)")
}

# test_version VERSION: builds the extension against that PostgreSQL, installs it
# there, and runs pg_regress, the isolation specs and the TAP tests; prints the
# version's own line. 15 is Debian's; 17, 18 and 19 are built from Debian's source
# packages (scripts/pg_versions.sh, cached). A version whose source the archive does
# not serve (19's release candidate; a point release the index names before the
# mirror has it, with no earlier build cached) is skipped with a line saying so.
test_version() {
  local version=$1 prefix status=0 before_passed=$passed before_failed=$failed
  say "PostgreSQL $version"
  prefix=$(pg_prefix "$version") || status=$?
  if [ "$status" = 2 ]; then
    version_lines+=("PostgreSQL $version: not tested: the Debian archive does not serve its source")
    return
  fi
  if [ "$status" != 0 ]; then
    stage_failed "PostgreSQL $version could not be built or found"
    version_lines+=("PostgreSQL $version: 0 passed, 1 failed (not built)")
    return
  fi
  PG_CONFIG=$prefix/bin/pg_config
  "$PG_CONFIG" --version
  make -s -C "$work/src" clean PG_CONFIG="$PG_CONFIG" >/dev/null 2>&1 || true
  if ! selected regress sql && ! selected isolation sql && ! selected tap sql; then
    : # the SQL-only edition alone (ONLY=sqlonly): no native build
  elif ! build_extension; then
    stage_failed "SQL, isolation and TAP tests not run on $version: the extension did not build"
  else
    # TAP tests start clusters, which must not run as root, and pg_regress writes
    # its results into the source tree.
    chown -R postgres: "$work/src"
    if selected regress sql; then
      run_pg_regress regress REGRESS "$REGRESS_TIMEOUT" "$work/src/regression.diffs" \
        "$work/src/tmp_check_regress/log/postmaster.log" ISOLATION= TAP_TESTS=
      if [ "$server_check_done" = no ]; then
        server_check_done=yes
        run_installcheck_server
      fi
    fi
    if selected isolation sql; then
      run_pg_regress isolation ISOLATION "$ISOLATION_TIMEOUT" \
        "$work/src/output_iso/regression.diffs" "$work/src/tmp_check_iso/log/postmaster.log" \
        REGRESS= TAP_TESTS=
    fi
    if selected tap sql; then
      citus_decision "$version" "$prefix"
      upgrade_decision "$version"
      # 014_dump_across_versions dumps a database of Debian's 15 into this version.
      IDEM_OLD_INSTALL=$(pg_prefix 15) IDEM_UPGRADE_FROM=$upgrade_from_prefix run_tap_tests
    fi
    # Debian's 15 is no source for pg_upgrade: it writes a pg_attver option into every
    # column's attoptions, which upstream 17 and 18 refuse.
    if [ "$version" -ge 17 ]; then
      upgrade_from_version=$version
      upgrade_from_prefix=$prefix
    fi
  fi
  if selected sqlonly sql; then run_sqlonly "$version" "$prefix"; fi
  version_lines+=("PostgreSQL $version ($("$PG_CONFIG" --version)): $((passed - before_passed)) passed, $((failed - before_failed)) failed")
  PG_CONFIG=$PG_BIN/pg_config
}

if selected regress sql || selected isolation sql || selected tap sql || selected sqlonly sql; then
  version_lines=()
  not_run_lines=()
  server_check_done=no
  for version in ${PG_VERSIONS//,/ }; do
    test_version "$version"
  done
  say "per version"
  printf '%s\n' "${version_lines[@]}"
  if [ "${#not_run_lines[@]}" -gt 0 ]; then printf '%s\n' "${not_run_lines[@]}"; fi
fi

finished=yes
