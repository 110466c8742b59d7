// idem_emit: an outbox event in the calling transaction. With an event id, at most
// one event per id (under the id's lock); with an aggregate, the next seq of its
// (topic, aggregate), under the aggregate's lock, which the transaction keeps until
// it ends: the next emitter for the aggregate waits for it, so seq follows commit
// order with no gap. The rules are in src/core/outbox.hpp.
#include "core/outbox.hpp"
#include "pg/arguments.hpp"
#include "pg/errors.hpp"
#include "pg/identity_lock.hpp"
#include "pg/key_type.hpp"
#include "pg/messaging_catalog.hpp"
#include "pg/table.hpp"

extern "C" {
#include "access/xact.h"
#include "catalog/pg_collation.h"
#include "commands/sequence.h"
#include "miscadmin.h"
#include "tcop/utility.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/snapmgr.h"
}

namespace idempotency {

static std::string_view bytes_of(const void* value) {
  auto v = static_cast<const struct varlena*>(value);
  return std::string_view(VARDATA_ANY(v), VARSIZE_ANY_EXHDR(v));
}

[[noreturn]] static void raise_emit_in_progress(const char* detail) {
  ereport(ERROR, errcode(ERRCODE_IDEM_IN_PROGRESS),
          errmsg("another transaction in progress is emitting for the same %s", detail),
          errdetail("It did not end within idempotency.wait_timeout."), errhint("Retry later."));
}

// Whether the outbox holds an event with this id (in any state), as committed now.
static bool event_stored(Table* outbox, const MessagingOids& oids, struct varlena* event_id) {
  ScanKeyData key;
  ScanKeyInit(&key, 1, BTEqualStrategyNumber, oids.key_eq, PointerGetDatum(event_id));
  Snapshot snapshot = RegisterSnapshot(GetLatestSnapshot());
  bool found = table_find(outbox, oids.outbox_pkey, snapshot, &key, 1);
  UnregisterSnapshot(snapshot);
  return found;
}

// The aggregate's next seq, counted in outbox_aggregates. The caller holds the
// aggregate's lock, so the newest committed count is the last one given.
static int64 take_seq(const MessagingOids& oids, text* topic, text* aggregate) {
  Table counters;
  open_table(&counters, oids.aggregates, true);
  ScanKeyData keys[2];
  ScanKeyEntryInitialize(&keys[0], 0, 1, BTEqualStrategyNumber, InvalidOid, C_COLLATION_OID,
                         F_TEXTEQ, PointerGetDatum(topic));
  ScanKeyEntryInitialize(&keys[1], 0, 2, BTEqualStrategyNumber, InvalidOid, C_COLLATION_OID,
                         F_TEXTEQ, PointerGetDatum(aggregate));
  Snapshot snapshot = RegisterSnapshot(GetLatestSnapshot());
  bool found = table_find(&counters, oids.aggregates_pkey, snapshot, keys, 2);
  UnregisterSnapshot(snapshot);
  std::optional<int64> last;
  ItemPointerData tid;
  if (found) {
    bool isnull;
    last = DatumGetInt64(column(&counters, aggregate_column::kLastSeq, &isnull));
    tid = counters.slot->tts_tid;
  }
  int64 seq = next_seq(last);
  Datum values[aggregate_column::kCount] = {PointerGetDatum(topic), PointerGetDatum(aggregate),
                                            Int64GetDatum(seq)};
  bool nulls[aggregate_column::kCount] = {};
  if (found)
    table_update(&counters, &tid, values, nulls);
  else
    table_insert(&counters, values, nulls);
  close_table(&counters);
  return seq;
}

static Datum emit(FunctionCallInfo fcinfo) {
  text* topic = name_argument(fcinfo, 0, "topic");
  require_argument(fcinfo, 1, "payload");
  Datum payload = PG_GETARG_DATUM(1);
  check_stored_size(payload, "payload");
  text* aggregate = PG_ARGISNULL(2) ? nullptr : name_argument(fcinfo, 2, "aggregate");
  bool no_headers = PG_ARGISNULL(3);
  Datum headers = no_headers ? 0 : PG_GETARG_DATUM(3);
  if (!no_headers) check_stored_size(headers, "headers");
  struct varlena* event_id = PG_ARGISNULL(4) ? nullptr : PG_GETARG_VARLENA_PP(4);
  PreventCommandIfReadOnly("idem_emit()");

  MessagingOids oids = required_messaging_oids();
  LockSecret secret = store_lock_secret();
  TimestampTz now = GetCurrentTimestamp();
  TimestampTz deadline = default_wait_deadline(now);
  Table outbox;
  open_table(&outbox, oids.outbox, true);
  if (event_id != nullptr) {
    if (!lock_until_transaction_end(
            messaging_lock(MessagingLock::kEventId, {bytes_of(event_id)}, secret), deadline))
      raise_emit_in_progress("event id");
    if (event_stored(&outbox, oids, event_id)) {
      close_table(&outbox);
      PG_RETURN_POINTER(event_id);  // emitted before: at most once
    }
  } else {
    event_id = random_uuid_key();
  }

  std::optional<int64> seq;
  if (aggregate != nullptr) {
    if (!lock_until_transaction_end(messaging_lock(MessagingLock::kAggregate,
                                                   {bytes_of(topic), bytes_of(aggregate)}, secret),
                                    deadline))
      raise_emit_in_progress("aggregate");
    seq = take_seq(oids, topic, aggregate);
  }
  // After the aggregate's lock: an aggregate's events take positions in seq order.
  int64 position = nextval_internal(oids.position, false);

  namespace col = outbox_column;
  Datum values[col::kCount] = {};
  bool nulls[col::kCount] = {};
  values[col::kEventId - 1] = PointerGetDatum(event_id);
  values[col::kPosition - 1] = Int64GetDatum(position);
  values[col::kTopic - 1] = PointerGetDatum(topic);
  nulls[col::kAggregate - 1] = aggregate == nullptr;
  values[col::kAggregate - 1] = PointerGetDatum(aggregate);
  nulls[col::kSeq - 1] = !seq;
  values[col::kSeq - 1] = seq ? Int64GetDatum(*seq) : 0;
  values[col::kPayload - 1] = payload;
  nulls[col::kHeaders - 1] = no_headers;
  values[col::kHeaders - 1] = headers;
  values[col::kEmittedAt - 1] = TimestampTzGetDatum(now);
  values[col::kState - 1] = CharGetDatum(static_cast<char>(EventState::kPending));
  values[col::kAttempt - 1] = Int32GetDatum(0);
  nulls[col::kRelay - 1] = nulls[col::kLeaseExpiresAt - 1] = nulls[col::kDeliveredAt - 1] =
      nulls[col::kReason - 1] = true;
  table_insert(&outbox, values, nulls);
  close_table(&outbox);
  PG_RETURN_POINTER(event_id);
}

}  // namespace idempotency

using namespace idempotency;

IDEM_SQL_FUNCTION(idem_emit, emit)
