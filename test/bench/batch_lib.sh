# The batch inbox's statements, for test/bench/batch.sh and profile.sh (sourced).
#
# batch_keys N TAG B [HALF]: an SQL array of N message ids for batch B: new ones
# ('b-TAG-B-g'), or with HALF=half every second one an id already stored (one of
# setup.sql's 100,000 keys 'replay-n' of scope payments, in idempotency.keys and in
# floor_many alike), the others new.
# Sets BATCH_KEYS_SQL (no subshell: a script of 100,000 batches is written in seconds).
batch_keys() {
  local n=$1 tag=$2 b=$3 half=${4:-}
  if [ "$half" = half ]; then
    BATCH_KEYS_SQL="ARRAY(SELECT (CASE WHEN g % 2 = 0 THEN 'replay-' || (($b * 50 + g / 2) % 100000 + 1)
                        ELSE 'b-$tag-$b-' || g END)::idem_key FROM generate_series(1, $n) g)"
  else
    BATCH_KEYS_SQL="ARRAY(SELECT ('b-$tag-$b-' || g)::idem_key FROM generate_series(1, $n) g)"
  fi
}

# batch_statement KIND N TAG B [HALF]: one transaction taking batch B (batch_keys):
#   many    SELECT idem_once_many(...)
#   floor   the hand-written floor: one INSERT ... SELECT unnest(keys) ... ON CONFLICT
#           DO NOTHING RETURNING into floor_many (the store's columns and indexes)
#   single  the same keys through idem_once, one call each, in one statement
#   single_statements  one statement per key in a transaction block, as a consumer
#           loop sends them
batch_statement() {
  local kind=$1 n=$2 tag=$3 b=$4 half=${5:-} keys g
  batch_keys "$n" "$tag" "$b" "$half"
  keys=$BATCH_KEYS_SQL
  case $kind in
    many) echo "SELECT cardinality(idem_once_many('payments', $keys));" ;;
    floor)
      echo "WITH applied AS (
              INSERT INTO floor_many(role, attempt, first_claimed_at, expires_at, reap_slot, scope, key, state)
              SELECT current_user::regrole, 1, now(), now() + interval '24 hours', 0, 'payments', k, 'c'
              FROM unnest($keys) k
              ON CONFLICT DO NOTHING RETURNING key)
            SELECT count(*) FROM applied;" ;;
    single) echo "SELECT count(*) FILTER (WHERE idem_once('payments', k)) FROM unnest($keys) k;" ;;
    single_statements)
      echo "BEGIN;"
      for g in $(seq "$n"); do echo "SELECT idem_once('payments', 'b-$tag-$b-$g');"; done
      echo "COMMIT;" ;;
  esac
}
