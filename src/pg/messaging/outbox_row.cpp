#include "pg/messaging/outbox_row.hpp"

extern "C" {
#include "access/sysattr.h"
#include "access/xact.h"
#include "executor/tuptable.h"
}

namespace idempotency {

using namespace outbox_column;

bool same_text(Datum a, const text* b) {
  const text* t = DatumGetTextPP(a);
  return VARSIZE_ANY_EXHDR(t) == VARSIZE_ANY_EXHDR(b) &&
         memcmp(VARDATA_ANY(t), VARDATA_ANY(b), VARSIZE_ANY_EXHDR(b)) == 0;
}

// Whether the calling transaction (or a subtransaction of it not rolled back) wrote
// the row version in the slot.
static bool written_here(TupleTableSlot* slot) {
  bool isnull;
  TransactionId writer =
      DatumGetTransactionId(slot_getsysattr(slot, MinTransactionIdAttributeNumber, &isnull));
  return TransactionIdIsCurrentTransactionId(writer);
}

OutboxEvent read_event(Table* outbox, const text* relay) {
  Datum values[kCount];
  bool nulls[kCount];
  slot_getallattrs(outbox->slot);
  memcpy(values, outbox->slot->tts_values, sizeof(values));
  memcpy(nulls, outbox->slot->tts_isnull, sizeof(nulls));
  OutboxEvent event;
  if (!parse_event_state(DatumGetChar(values[kState - 1]), &event.state))
    ereport(ERROR, errcode(ERRCODE_DATA_CORRUPTED),
            errmsg("idempotency.outbox holds an event in an unknown state"));
  event.attempt = DatumGetInt32(values[kAttempt - 1]);
  if (!nulls[kLeaseExpiresAt - 1])
    event.lease_expires_at = DatumGetTimestampTz(values[kLeaseExpiresAt - 1]);
  if (!nulls[kDeliveredAt - 1]) event.delivered_at = DatumGetTimestampTz(values[kDeliveredAt - 1]);
  event.leased_to_caller =
      relay != nullptr && !nulls[kRelay - 1] && same_text(values[kRelay - 1], relay);
  event.written_by_this_transaction = written_here(outbox->slot);
  // Only an emit writes an event not yet handed out (attempt 0): this version's
  // writer is then its emitter.
  event.emitted_here = event.attempt == 0 && event.written_by_this_transaction;
  return event;
}

AppliedRecord read_applied(Table* applied) {
  namespace col = applied_column;
  AppliedRecord record;
  bool isnull;
  record.version = DatumGetInt64(column(applied, col::kVersion, &isnull));
  record.expires_at = DatumGetTimestampTz(column(applied, col::kExpiresAt, &isnull));
  record.written_by_this_transaction = written_here(applied->slot);
  return record;
}

Write write_event(Table* outbox, const OutboxEvent& next, const text* relay, const text* reason,
                  bool set_reason, bool locked) {
  // A shard of routed_outbox has one more column, the route: kept as it is.
  Datum values[kCount + 1];
  bool nulls[kCount + 1];
  int natts = outbox->slot->tts_tupleDescriptor->natts;
  if (natts > kCount + 1) elog(ERROR, "idempotency's outbox has %d columns", natts);
  slot_getallattrs(outbox->slot);
  memcpy(values, outbox->slot->tts_values, sizeof(Datum) * natts);
  memcpy(nulls, outbox->slot->tts_isnull, sizeof(bool) * natts);
  values[kState - 1] = CharGetDatum(static_cast<char>(next.state));
  values[kAttempt - 1] = Int32GetDatum(next.attempt);
  nulls[kLeaseExpiresAt - 1] = !next.lease_expires_at;
  values[kLeaseExpiresAt - 1] = TimestampTzGetDatum(next.lease_expires_at.value_or(0));
  nulls[kDeliveredAt - 1] = !next.delivered_at;
  values[kDeliveredAt - 1] = TimestampTzGetDatum(next.delivered_at.value_or(0));
  if (relay != nullptr || next.state == EventState::kPending) {
    nulls[kRelay - 1] = relay == nullptr;
    values[kRelay - 1] = PointerGetDatum(relay);
  }
  if (set_reason) {
    nulls[kReason - 1] = reason == nullptr;
    values[kReason - 1] = PointerGetDatum(reason);
  }
  ItemPointerData tid = outbox->slot->tts_tid;
  if (!locked) return table_try_update(outbox, &tid, values, nulls);
  table_update(outbox, &tid, values, nulls);
  return Write::kDone;
}

}  // namespace idempotency
