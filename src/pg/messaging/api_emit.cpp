// idem_emit: an outbox event in the calling transaction. With an event id, at most
// one event per id; with an aggregate, the next seq of its (topic, aggregate), whose
// counter row this transaction then holds until it ends: the next emitter for the
// aggregate waits for it, so seq follows commit order with no gap. Both are
// keyed_write's loop; the rules are in src/core/outbox.hpp.
#include "core/outbox.hpp"
#include "pg/citus/twin_privilege.hpp"
#include "pg/citus/citus_forward.hpp"
#include "pg/keys/arguments.hpp"
#include "pg/keys/key_row.hpp"
#include "pg/common/errors.hpp"
#include "pg/keys/identity_lock.hpp"
#include "pg/messaging/keyed_write.hpp"
#include "pg/common/key_type.hpp"
#include "pg/messaging/messaging_catalog.hpp"
#include "pg/common/table.hpp"

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

// An event's place among its aggregate's: its seq, and in a shard of routed_outbox its
// position (on one node the position is drawn after the seq: see event_row).
struct EventOrder {
  int64 seq;
  std::optional<int64> position;
};

// The aggregate's next seq, counted in outbox_aggregates: the counter's row, written
// here, makes the next emitter for the aggregate wait until this transaction ends.
// With `holder`, nothing waits for another transaction holding the counter: then
// nothing is taken, and *holder is that transaction.
// In a shard of routed_outbox_aggregates, the counter is the (topic, aggregate,
// route)'s, and it keeps the last position, which the next one follows (core
// next_position: a number drawn before the counter's lock still comes after it).
static std::optional<EventOrder> take_seq(const MessagingTarget& target, text* topic,
                                          text* aggregate, const LockSecret& secret,
                                          TimestampTz deadline, TransactionId* holder = nullptr) {
  namespace col = aggregate_column;
  const MessagingOids& oids = target.oids;
  Table counters;
  open_table(&counters, oids.aggregates, true);
  ScanKeyData keys[3];
  ScanKeyEntryInitialize(&keys[0], 0, 1, BTEqualStrategyNumber, InvalidOid, C_COLLATION_OID,
                         F_TEXTEQ, PointerGetDatum(topic));
  ScanKeyEntryInitialize(&keys[1], 0, 2, BTEqualStrategyNumber, InvalidOid, C_COLLATION_OID,
                         F_TEXTEQ, PointerGetDatum(aggregate));
  if (target.routed)
    ScanKeyInit(&keys[2], 3, BTEqualStrategyNumber,  // the primary key's 3rd column
                target.aggregates_route_eq, target.route);
  EventOrder order{};
  int64 drawn = target.routed ? nextval_internal(oids.position, false) : 0;
  Datum values[col::kRoutedCount] = {PointerGetDatum(topic), PointerGetDatum(aggregate), 0,
                                     target.route, 0};
  bool nulls[col::kRoutedCount] = {};
  LOCKTAG lock =
      messaging_lock(MessagingLock::kAggregate, {bytes_of(topic), bytes_of(aggregate)}, secret);
  KeyedLoop loop(&counters, oids.aggregates_pkey, keys, target.routed ? 3 : 2, lock, deadline,
                 holder != nullptr ? KeyedLoop::kReturnBusy : KeyedLoop::kWait);
  bool found;
  while (loop.next(&found)) {
    std::optional<int64> last_seq, last_position;
    bool isnull;
    if (found) last_seq = DatumGetInt64(column(&counters, col::kLastSeq, &isnull));
    if (found && target.routed)
      last_position = DatumGetInt64(column(&counters, col::kLastPosition, &isnull));
    order.seq = next_seq(last_seq);
    if (target.routed) order.position = next_position(last_position, drawn);
    values[col::kLastSeq - 1] = Int64GetDatum(order.seq);
    values[col::kLastPosition - 1] = Int64GetDatum(order.position.value_or(0));
    loop.apply(KeyedWrite{found ? KeyedWrite::kUpdate : KeyedWrite::kInsert, values, nulls});
  }
  if (loop.timed_out()) raise_emit_in_progress("aggregate");
  close_table(&counters);
  if (loop.busy()) {
    *holder = loop.holder();
    return std::nullopt;
  }
  return order;
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
  check_combined_size(payload, headers, "payload and headers");
  bool given_id = !PG_ARGISNULL(4);
  struct varlena* event_id = given_id ? PG_GETARG_VARLENA_PP(4) : random_uuid_key();
  PreventCommandIfReadOnly("idem_emit()");

  MessagingTarget target;
  Route route;
  if (!messaging_target(fcinfo, 5, "idem_emit", &target, &route)) {
    bool isnull;
    return citus_forward(fcinfo, 5, route.value, route.type, &isnull);
  }
  const MessagingOids& oids = target.oids;
  LockSecret secret = store_lock_secret();
  TimestampTz now = GetCurrentTimestamp();
  TimestampTz deadline = default_wait_deadline(now);
  namespace col = outbox_column;
  Datum values[col::kCount + 1] = {};
  bool nulls[col::kCount + 1] = {};
  values[col::kCount] = target.route;  // in a shard of routed_outbox, the last column
  // The event's row, once it is known that no event has its id.
  auto event_row = [&](std::optional<EventOrder> order) {
    values[col::kEventId - 1] = PointerGetDatum(event_id);
    // On one node drawn after the seq, so that an aggregate's events take positions in
    // seq order.
    values[col::kPosition - 1] = Int64GetDatum(
        order && order->position ? *order->position : nextval_internal(oids.position, false));
    values[col::kTopic - 1] = PointerGetDatum(topic);
    nulls[col::kAggregate - 1] = aggregate == nullptr;
    values[col::kAggregate - 1] = PointerGetDatum(aggregate);
    nulls[col::kSeq - 1] = !order;
    values[col::kSeq - 1] = order ? Int64GetDatum(order->seq) : 0;
    values[col::kPayload - 1] = payload;
    nulls[col::kHeaders - 1] = no_headers;
    values[col::kHeaders - 1] = headers;
    values[col::kEmittedAt - 1] = TimestampTzGetDatum(GetCurrentTimestamp());  // after waits
    values[col::kState - 1] = CharGetDatum(static_cast<char>(EventState::kPending));
    values[col::kAttempt - 1] = Int32GetDatum(0);
    nulls[col::kRelay - 1] = nulls[col::kLeaseExpiresAt - 1] = nulls[col::kDeliveredAt - 1] =
        nulls[col::kReason - 1] = true;
    return KeyedWrite{KeyedWrite::kInsert, values, nulls};
  };
  Table outbox;
  open_table(&outbox, oids.outbox, true);
  if (!given_id) {
    std::optional<EventOrder> order;
    if (aggregate != nullptr) order = take_seq(target, topic, aggregate, secret, deadline);
    KeyedWrite row = event_row(order);
    table_insert(&outbox, row.values, row.nulls);
  } else {
    // At most one event per id (and route, in a shard of routed_outbox): an event
    // stored under it (in any state) is the one.
    ScanKeyData keys[2];
    ScanKeyInit(&keys[0], 1, BTEqualStrategyNumber, oids.key_eq, PointerGetDatum(event_id));
    if (target.routed)
      ScanKeyInit(&keys[1], 2, BTEqualStrategyNumber, target.outbox_route_eq,  // pkey's 2nd
                  target.route);
    LOCKTAG lock = messaging_lock(MessagingLock::kEventId, {bytes_of(event_id)}, secret);
    KeyedLoop loop(&outbox, oids.outbox_pkey, keys, target.routed ? 2 : 1, lock, deadline);
    bool found;
    while (loop.next(&found)) {
      std::optional<EventOrder> order;
      TransactionId holder = InvalidTransactionId;
      if (!found && aggregate != nullptr &&
          !(order = take_seq(target, topic, aggregate, secret, deadline, &holder))) {
        // The aggregate's holder is waited for without the id's lock (it may be about
        // to emit this id), then the id is looked at again.
        loop.wait_for(holder);
        if (loop.timed_out()) raise_emit_in_progress("aggregate");
        continue;
      }
      loop.apply(found ? KeyedWrite{} : event_row(order));
    }
    if (loop.timed_out()) raise_emit_in_progress("event id");
  }
  close_table(&outbox);
  PG_RETURN_POINTER(event_id);
}

}  // namespace idempotency

using namespace idempotency;

IDEM_TWINNED_SQL_FUNCTION(idem_emit, emit)
