#include "pg/worker/reaper_pass.hpp"

#include "pg/common/guc.hpp"
#include "pg/messaging/outbox_row.hpp"

extern "C" {
#include "miscadmin.h"
#include "utils/fmgroids.h"
#include "utils/syscache.h"
}

namespace idempotency {

struct SweepClock {
  TimestampTz now;
};

static bool delete_if_reapable(KeyStore* store, KeyRow*, const StoredRow& view, ItemPointer tid,
                               void* context) {
  TransactionId writer;
  return is_reapable(view, static_cast<SweepClock*>(context)->now) &&
         store_delete(store, tid, &writer) == WriteResult::kDone;
}

int64 sweep_expired(KeyStore* store, Snapshot snapshot, TimestampTz now, int64 max_rows,
                    ReapPosition* position) {
  SweepClock clock{now};
  return store_scan_expired(store, snapshot, now, max_rows, position, delete_if_reapable, &clock);
}

static bool delete_row(KeyStore* store, KeyRow*, const StoredRow&, ItemPointer tid, void*) {
  TransactionId writer;
  return store_delete(store, tid, &writer) == WriteResult::kDone;
}

int64 sweep_dropped_roles(KeyStore* store, Snapshot snapshot, int64 max_rows) {
  int64 deleted = 0;
  for (Oid role = store_next_role(store, snapshot, InvalidOid);
       OidIsValid(role) && deleted < max_rows; role = store_next_role(store, snapshot, role)) {
    CHECK_FOR_INTERRUPTS();
    if (SearchSysCacheExists1(AUTHOID, ObjectIdGetDatum(role))) continue;
    deleted += store_scan_role(store, snapshot, role, max_rows - deleted, delete_row, nullptr);
  }
  return deleted;
}

static bool abandon_if_stale(KeyStore* store, KeyRow* row, const StoredRow& view, ItemPointer tid,
                             void* context) {
  if (!is_stale(view, static_cast<SweepClock*>(context)->now)) return false;
  write_row(abandon(view), row);
  TransactionId writer;
  return store_update(store, tid, row, &writer) == WriteResult::kDone;
}

int64 sweep_stale(KeyStore* store, Snapshot snapshot, TimestampTz now, int64 max_rows) {
  SweepClock clock{now};
  return store_scan_lease_ends(store, snapshot, now, max_rows, abandon_if_stale, &clock);
}

static bool stale(KeyStore*, KeyRow*, const StoredRow& view, ItemPointer, void* context) {
  return is_stale(view, static_cast<SweepClock*>(context)->now);
}

int64 count_stale(KeyStore* store, Snapshot snapshot, TimestampTz now, int64 max_rows) {
  SweepClock clock{now};
  return store_scan_lease_ends(store, snapshot, now, max_rows, stale, &clock);
}

// Deletes the rows `index` finds at or before `until` that `removable` (asked of each
// row as read) allows; a row another transaction holds, or that changed since it was
// read, is skipped (the next pass sees it again).
template <typename Removable>
static int64 sweep_index(Table* table, Oid index, Snapshot snapshot, TimestampTz until,
                         int64 max_rows, Removable removable) {
  ScanKeyData key;
  ScanKeyInit(&key, 1, BTLessEqualStrategyNumber, F_TIMESTAMPTZ_LE, TimestampTzGetDatum(until));
  IndexCursor cursor;
  cursor_open(table, &cursor, index, snapshot, &key, 1);
  int64 deleted = 0;
  while (deleted < max_rows && cursor_next(table, &cursor)) {
    CHECK_FOR_INTERRUPTS();
    ItemPointerData tid = table->slot->tts_tid;
    if (removable() && table_try_delete(table, &tid) == Write::kDone) deleted++;
  }
  cursor_close(&cursor);
  return deleted;
}

// The first role after `after` with applied versions (one probe of the primary key).
static Oid next_applied_role(Table* applied, Oid index, Snapshot snapshot, Oid after) {
  ScanKeyData key;
  ScanKeyInit(&key, 1, BTGreaterStrategyNumber, F_OIDGT, ObjectIdGetDatum(after));
  IndexCursor cursor;
  cursor_open(applied, &cursor, index, snapshot, &key, 1);
  Oid role = InvalidOid;
  bool isnull;
  if (cursor_next(applied, &cursor))
    role = DatumGetObjectId(column(applied, applied_column::kRole, &isnull));
  cursor_close(&cursor);
  return role;
}

// Deletes the applied versions of roles that no longer exist, as the keys'.
static int64 sweep_applied_of_dropped_roles(Table* applied, Oid index, Snapshot snapshot,
                                            int64 max_rows) {
  int64 deleted = 0;
  for (Oid role = next_applied_role(applied, index, snapshot, InvalidOid);
       OidIsValid(role) && deleted < max_rows;
       role = next_applied_role(applied, index, snapshot, role)) {
    CHECK_FOR_INTERRUPTS();
    if (SearchSysCacheExists1(AUTHOID, ObjectIdGetDatum(role))) continue;
    ScanKeyData key;
    ScanKeyInit(&key, 1, BTEqualStrategyNumber, F_OIDEQ, ObjectIdGetDatum(role));
    IndexCursor cursor;
    cursor_open(applied, &cursor, index, snapshot, &key, 1);
    while (deleted < max_rows && cursor_next(applied, &cursor)) {
      ItemPointerData tid = applied->slot->tts_tid;
      if (table_try_delete(applied, &tid) == Write::kDone) deleted++;
    }
    cursor_close(&cursor);
  }
  return deleted;
}

static int64 sweep_applied(Oid heap, Oid pkey, Oid expires, Snapshot snapshot, TimestampTz now,
                           int64 max_rows) {
  Table applied;
  open_table(&applied, heap, true);
  int64 deleted = sweep_index(&applied, expires, snapshot, now, max_rows,
                              [&] { return is_reapable(read_applied(&applied), now); });
  deleted += sweep_applied_of_dropped_roles(&applied, pkey, snapshot, max_rows - deleted);
  close_table(&applied);
  return deleted;
}

// Delivered events past idempotency.outbox_retention (the core's is_removable);
// undelivered and dead ones are not in the index.
static int64 sweep_outbox(Oid heap, Oid delivered, Snapshot snapshot, TimestampTz now,
                          int64 max_rows) {
  Micros retention = static_cast<Micros>(settings.outbox_retention_s) * USECS_PER_SEC;
  Table outbox;
  open_table(&outbox, heap, true);
  int64 deleted = sweep_index(&outbox, delivered, snapshot, now - retention, max_rows, [&] {
    return is_removable(read_event(&outbox, nullptr), now, retention);
  });
  close_table(&outbox);
  return deleted;
}

bool sweep_messaging(int n, Snapshot snapshot, TimestampTz now, int64 max_rows, int64* deleted) {
  *deleted = 0;
  MessagingOids oids;
  if (!messaging_oids(&oids)) return false;
  if (n == 0) {
    *deleted = sweep_outbox(oids.outbox, oids.outbox_delivered, snapshot, now, max_rows);
    *deleted += sweep_applied(oids.applied, oids.applied_pkey, oids.applied_expires, snapshot, now,
                              max_rows - *deleted);
    return true;
  }
  AppliedShard* applied;
  int napplied = local_applied_shards(&applied);
  if (n <= napplied) {
    const AppliedShard& shard = applied[n - 1];
    *deleted = sweep_applied(shard.applied, shard.applied_pkey, shard.applied_expires, snapshot,
                             now, max_rows);
    return true;
  }
  OutboxShard* outbox;
  if (n - napplied > local_outbox_shards(&outbox)) return false;
  const OutboxShard& shard = outbox[n - napplied - 1];
  *deleted = sweep_outbox(shard.outbox, shard.outbox_delivered, snapshot, now, max_rows);
  return true;
}

}  // namespace idempotency
