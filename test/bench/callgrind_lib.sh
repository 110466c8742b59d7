# Sourced by test/bench/profile.sh and test/bench/profile_editions.sh: counting one
# session's instructions in a postmaster started under callgrind with
# --toggle-collect=exec_simple_query --zero-before=pg_sleep and
# --callgrind-out-file=$work/cg/callgrind.%p. Needs $work and $OUT.

# callgrind_session NAME FILE PSQL...: runs the session FILE (its first statement
# prints the backend's pid) with the command PSQL..., and prints the instructions
# counted after its pg_sleep(0); keeps the profile and its listings in $OUT.
callgrind_session() {
  local name=$1 file=$2 pid out
  shift 2
  chmod 644 "$file"
  "$@" -At -f "$file" >"$work/session.out"  # whole: a pipe closed early would stop psql
  pid=$(head -1 "$work/session.out")
  out=$work/cg/callgrind.$pid
  # The backend writes its profile as it exits.
  until [ -f "$out" ] && grep -q '^totals:' "$out"; do sleep 0.5; done
  cp "$out" "$OUT/$name.callgrind"
  callgrind_annotate --inclusive=yes "$out" >"$OUT/$name.inclusive.txt" 2>/dev/null
  # (--threshold=100: the default, 99 %, stops after the first line, main's.)
  callgrind_annotate --threshold=100 "$out" >"$OUT/$name.exclusive.txt" 2>/dev/null
  awk '/^totals:/ { print $2 }' "$out"
}

# calls_session PROCEDURE KEY COUNT [ACCOUNT]: a session of COUNT calls of PROCEDURE
# with keys of KEY (an SQL expression; none when empty), each for ACCOUNT or a spread
# of accounts: 50 warm-up calls, the marker, then the calls measured.
calls_session() {
  local procedure=$1 key=$2 count=$3 account=${4:-} i
  echo "SELECT pg_backend_pid();"
  echo "SET synchronous_commit = off;"
  for i in $(seq 50); do
    echo "CALL $procedure(${key:+$key, }${account:-$((i * 7919 % 1000000 + 1))}, 10);"
  done
  echo "SELECT pg_sleep(0);"
  for i in $(seq "$count"); do
    echo "CALL $procedure(${key:+$key, }${account:-$(((i * 104729 + 50) % 1000000 + 1))}, 10);"
  done
}
