#!/usr/bin/env bash
# Runs every test from a fresh clone: installs what it needs, builds and installs
# the extension, runs the C++ unit tests (ctest), then, against a throwaway cluster
# and as the postgres OS user, pg_regress, the isolation specs and the TAP tests.
# Ends with one line "N passed, N failed"; exits non-zero if anything failed.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

work=$(mktemp -d /tmp/idempotency-tests.XXXXXX)
chmod 755 "$work"
passed=0
failed=0
cleanup() { stop_cluster "$work/cluster"; rm -rf "$work"; }
trap cleanup EXIT

count() { passed=$((passed + $1)); failed=$((failed + $2)); }

# A stage that could not run at all counts as one failure, never as nothing.
stage_failed() { echo "!! $1" >&2; count 0 1; }

# run_unit_tests DIRNAME LABEL [CMAKE OPTION...]
run_unit_tests() {
  local build=$work/build-$1 log=$work/ctest-$1.log
  say "unit tests ($2)"
  shift 2
  if cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" >/dev/null &&
     cmake --build "$build" -j2 >/dev/null; then
    ctest --test-dir "$build" --output-on-failure 2>&1 | tee "$log" | tail -n 3 || true
    local line total bad
    line=$(grep -E 'tests passed, [0-9]+ tests failed out of' "$log" || true)
    if [ -z "$line" ]; then stage_failed "ctest printed no summary"; return; fi
    bad=$(sed -E 's/.* ([0-9]+) tests failed out of ([0-9]+).*/\1/' <<<"$line")
    total=$(sed -E 's/.*out of ([0-9]+).*/\1/' <<<"$line")
    count $((total - bad)) "$bad"
  else
    stage_failed "the unit tests did not build"
  fi
}

# Each libFuzzer target runs for FUZZ_SECONDS (30 by default; longer by hand) from
# its committed corpus; a crash or a broken property is one failure.
run_fuzzers() {
  say "fuzzing (${FUZZ_SECONDS:-30}s per target)"
  local build=$work/build-fuzz
  if ! CXX=clang++ cmake -S . -B "$build" -DIDEM_FUZZ=ON >/dev/null ||
     ! cmake --build "$build" -j2 >/dev/null; then
    stage_failed "the fuzz targets did not build"
    return
  fi
  local target corpus
  for target in key canonical_json; do
    corpus=$work/corpus-$target
    cp -r "test/fuzz/corpus/$target" "$corpus"
    if "$build/${target}_fuzz" -max_total_time="${FUZZ_SECONDS:-30}" -max_len=4096 "$corpus" \
         >"$work/fuzz-$target.log" 2>&1; then
      echo "${target}_fuzz: $(grep -oE 'Done [0-9]+ runs' "$work/fuzz-$target.log")"
      count 1 0
    else
      tail -n 40 "$work/fuzz-$target.log"
      stage_failed "${target}_fuzz found a failure"
    fi
  done
}

# make installcheck for one kind of test; the others are switched off.
installcheck() {
  local log=$1
  shift
  (cd "$work/src" && runuser -u postgres -- make installcheck PG_CONFIG="$PG_BIN/pg_config" \
     PGHOST=127.0.0.1 PGPORT="$port" PGUSER=postgres "$@") >"$log" 2>&1
}

run_regress_stage() {
  local name=$1 diffs=$2
  shift 2
  say "$name"
  local log=$work/$name.log status=0
  installcheck "$log" "$@" || status=$?
  grep -E '^(test |ok |not ok )' "$log" || true
  local ok bad
  ok=$(grep -cE '^test .* \.\.\. ok|^ok ' "$log" || true)
  bad=$(grep -cE '^test .* \.\.\. FAILED|^not ok ' "$log" || true)
  if [ "$status" -ne 0 ] && [ "$bad" -eq 0 ]; then
    cat "$log"
    stage_failed "$name did not run"
  fi
  [ -f "$diffs" ] && [ "$bad" -gt 0 ] && cat "$diffs"
  count "$ok" "$bad"
}

run_tap_stage() {
  say "TAP tests"
  local log=$work/tap.log status=0
  installcheck "$log" REGRESS= ISOLATION= || status=$?
  grep -E '^test/t/|^Files=|^Result' "$log" || true
  local total bad
  total=$(sed -nE 's/^Files=[0-9]+, Tests=([0-9]+),.*/\1/p' "$log")
  bad=$({ grep -oE 'Failed [0-9]+/[0-9]+ subtests' "$log" || true; } |
        awk '{ split($2, n, "/"); sum += n[1] } END { print sum + 0 }')
  if [ -z "$total" ]; then
    cat "$log"
    stage_failed "the TAP tests did not run"
    return
  fi
  if [ "$status" -ne 0 ]; then
    cat "$work"/src/tmp_check/log/regress_log_* 2>/dev/null | tail -n 100 || true
    [ "$bad" -eq 0 ] && bad=1
  fi
  count $((total - bad)) "$bad"
}

say "packages"
ensure_packages

say "build and install"
build_and_install

if [ "${ONLY:-all}" != sql ]; then
  run_unit_tests plain ctest
  run_unit_tests sanitized "ctest under AddressSanitizer and UBSan" -DIDEM_SANITIZE=ON
  run_fuzzers
fi

if [ "${ONLY:-all}" != unit ]; then
  # The tests run from a copy owned by postgres, since TAP tests start clusters.
  mkdir -p "$work/src"
  tar cf - --exclude=.git --exclude='*.o' --exclude='*.so' . | tar xf - -C "$work/src"
  chown -R postgres "$work/src"
  port=$(free_port)
  # The reaper is loaded but idle here, so pg_regress output does not depend on it;
  # test/t/003_worker.pl tests it running.
  start_cluster "$work/cluster" "$port" "shared_preload_libraries = 'idempotency'" \
    "idempotency.reaper_enabled = off" "max_prepared_transactions = 10"
  run_regress_stage "regression tests" "$work/src/regression.diffs" ISOLATION= TAP_TESTS=
  run_regress_stage "isolation tests" "$work/src/output_iso/regression.diffs" REGRESS= TAP_TESTS=
  stop_cluster "$work/cluster"
  run_tap_stage
fi

echo
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
