// The store's scans for the reaper, idem_reap, idem_stats and idem_abandoned: they
// find rows and hand each to a visitor, which decides (with the core) what to do.
#include "pg/keys/store.hpp"
#include "pg/common/open_relations.hpp"

#include "pg/common/compat.hpp"
#include "pg/keys/store_catalog.hpp"

#include <optional>

extern "C" {
#include "access/genam.h"
#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/relation.h"
#include "access/table.h"
#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_collation.h"
#include "catalog/pg_type.h"
#include "common/hashfn.h"
#include "executor/executor.h"
#include "miscadmin.h"
#include "storage/latch.h"
#include "storage/bufmgr.h"
#include "storage/lmgr.h"
#include "utils/builtins.h"
#include "utils/datum.h"
#include "utils/fmgroids.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"
#include "utils/wait_event.h"
}

namespace idempotency {

// Visits each row of `scan`, a copy of it alive only while it is visited: a pass over
// a large backlog (idem_reap with no limit) must not hold every row it read.
template <typename Next, typename Seen>
static int64 visit_rows(KeyStore* store, Next next, int64 max_rows, RowVisitor visit, void* context,
                        Seen seen) {
  MemoryContext row_context =
      AllocSetContextCreate(CurrentMemoryContext, "idempotency scan row", ALLOCSET_SMALL_SIZES);
  int64 counted = 0;
  while (counted < max_rows && next(store->read_slot)) {
    MemoryContext caller = MemoryContextSwitchTo(row_context);
    KeyRow row;
    StoredRow view;
    ItemPointerData tid = store->read_slot->tts_tid;
    read_slot_row(store->read_slot, &row, &view);
    seen(view);
    if (visit(store, &row, view, &tid, context)) counted++;
    MemoryContextSwitchTo(caller);
    MemoryContextReset(row_context);
    CHECK_FOR_INTERRUPTS();
  }
  MemoryContextDelete(row_context);
  ExecClearTuple(store->read_slot);
  return counted;
}

static auto next_in(IndexScanDesc scan) {
  return
      [scan](TupleTableSlot* slot) { return index_getnext_slot(scan, ForwardScanDirection, slot); };
}

int64 store_scan_table(KeyStore* store, Snapshot snapshot, RowVisitor visit, void* context) {
  TableScanDesc scan = table_beginscan(store->heap, snapshot, 0, nullptr);
  int64 counted = visit_rows(
      store,
      [scan](TupleTableSlot* slot) {
        return table_scan_getnextslot(scan, ForwardScanDirection, slot);
      },
      PG_INT64_MAX, visit, context, [](const StoredRow&) {});
  table_endscan(scan);
  return counted;
}

// Scans `index` for entries up to `bound` in its timestamp column (from `*from` on,
// after a first column equal to `prefix`, if given) and visits each row; stops after
// max_rows rows the visitor counted. `*from` follows the rows visited.
static int64 scan_index_range(KeyStore* store, Relation index, Snapshot snapshot,
                              std::optional<int16> prefix, TimestampTz* from, TimestampTz bound,
                              int64 max_rows, RowVisitor visit, void* context) {
  ScanKeyData keys[3];
  int nkeys = 0;
  if (prefix)
    ScanKeyInit(&keys[nkeys++], 1, BTEqualStrategyNumber, F_INT2EQ, Int16GetDatum(*prefix));
  AttrNumber column = nkeys + 1;
  if (*from != DT_NOBEGIN)
    ScanKeyInit(&keys[nkeys++], column, BTGreaterEqualStrategyNumber, F_TIMESTAMPTZ_GE,
                TimestampTzGetDatum(*from));
  ScanKeyInit(&keys[nkeys++], column, BTLessEqualStrategyNumber, F_TIMESTAMPTZ_LE,
              TimestampTzGetDatum(bound));
  IndexScanDesc scan = compat::index_beginscan(store->heap, index, snapshot, nkeys);
  index_rescan(scan, keys, nkeys, nullptr, 0);
  int64 counted = visit_rows(store, next_in(scan), max_rows, visit, context,
                             [&](const StoredRow& view) { *from = view.expires_at; });
  index_endscan(scan);
  return counted;
}

int64 store_scan_expired(KeyStore* store, Snapshot snapshot, TimestampTz now, int64 max_rows,
                         ReapPosition* position, RowVisitor visit, void* context) {
  Oid opened;  // the index now of that name (REINDEX CONCURRENTLY)
  Relation index = open_current(store->oids.expires_index, RowExclusiveLock, &opened);
  int64 counted = 0;
  while (position->slot < kReapSlots) {
    counted += scan_index_range(store, index, snapshot, position->slot, &position->from, now,
                                max_rows - counted, visit, context);
    if (counted >= max_rows) break;
    *position = ReapPosition{static_cast<int16>(position->slot + 1), DT_NOBEGIN};
  }
  index_close(index, NoLock);
  return counted;
}

int64 store_scan_lease_ends(KeyStore* store, Snapshot snapshot, TimestampTz now, int64 max_rows,
                            RowVisitor visit, void* context) {
  Oid opened;  // the index now of that name (REINDEX CONCURRENTLY)
  Relation index = open_current(store->oids.lease_index, AccessShareLock, &opened);
  TimestampTz from = DT_NOBEGIN;
  int64 counted =
      scan_index_range(store, index, snapshot, std::nullopt, &from, now, max_rows, visit, context);
  index_close(index, NoLock);
  return counted;
}

// A loose scan of the primary key: one probe per role.
Oid store_next_role(KeyStore* store, Snapshot snapshot, Oid after) {
  ScanKeyData key;
  ScanKeyInit(&key, 1, BTGreaterStrategyNumber, F_OIDGT, ObjectIdGetDatum(after));
  IndexScanDesc scan = compat::index_beginscan(store->heap, store->index, snapshot, 1);
  index_rescan(scan, &key, 1, nullptr, 0);
  Oid role = InvalidOid;
  if (index_getnext_slot(scan, ForwardScanDirection, store->read_slot)) {
    bool isnull;
    role = DatumGetObjectId(slot_getattr(store->read_slot, kRole, &isnull));
  }
  index_endscan(scan);
  ExecClearTuple(store->read_slot);
  return role;
}

static int64 scan_role(KeyStore* store, Relation index, Snapshot snapshot, Oid role, int64 max_rows,
                       RowVisitor visit, void* context) {
  ScanKeyData key;
  ScanKeyInit(&key, 1, BTEqualStrategyNumber, F_OIDEQ, ObjectIdGetDatum(role));
  IndexScanDesc scan = compat::index_beginscan(store->heap, index, snapshot, 1);
  index_rescan(scan, &key, 1, nullptr, 0);
  int64 counted =
      visit_rows(store, next_in(scan), max_rows, visit, context, [](const StoredRow&) {});
  index_endscan(scan);
  return counted;
}

int64 store_scan_role(KeyStore* store, Snapshot snapshot, Oid role, int64 max_rows,
                      RowVisitor visit, void* context) {
  return scan_role(store, store->index, snapshot, role, max_rows, visit, context);
}

bool store_scan_leased(KeyStore* store, Snapshot snapshot, Oid role, int64 max_rows,
                       RowVisitor visit, void* context) {
  Oid leased = store->oids.leased_index;
  if (!OidIsValid(leased)) return false;
  Oid opened;  // the index now of that name (REINDEX CONCURRENTLY)
  Relation index = open_current(leased, AccessShareLock, &opened);
  scan_role(store, index, snapshot, role, max_rows, visit, context);
  index_close(index, NoLock);
  return true;
}

}  // namespace idempotency
