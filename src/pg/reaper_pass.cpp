#include "pg/reaper_pass.hpp"

extern "C" {
#include "miscadmin.h"
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

}  // namespace idempotency
