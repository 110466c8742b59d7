// Direct table and index access to idempotency.keys: no SPI, no planning, no
// subtransaction. Waits on other writers are polled, never queued, so a claim can
// give up after `wait` without aborting its transaction.
#include "pg/keys/store.hpp"

#include "pg/common/compat.hpp"
#include "pg/common/open_relations.hpp"
#include "pg/keys/store_catalog.hpp"
#include "pg/common/table.hpp"

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

static void copy_slot_row(TupleTableSlot* slot, KeyRow* row) {
  slot_getallattrs(slot);
  int natts = slot->tts_tupleDescriptor->natts;
  for (int i = 0; i < natts; i++) {
    Form_pg_attribute att = TupleDescAttr(slot->tts_tupleDescriptor, i);
    row->isnull[i] = slot->tts_isnull[i];
    row->values[i] =
        row->isnull[i] ? 0 : datumCopy(slot->tts_values[i], att->attbyval, att->attlen);
  }
  row->route_type = Route{};
  if (natts < kRowColumns) {
    row->clear(kRoute);
  } else {
    Form_pg_attribute att = TupleDescAttr(slot->tts_tupleDescriptor, kRoute - 1);
    row->route_type = Route{0, att->atttypid, att->attlen, att->attbyval};
  }
}

void read_slot_row(TupleTableSlot* slot, KeyRow* row, StoredRow* view) {
  copy_slot_row(slot, row);
  read_row(*row, view);
  bool should_free;
  HeapTuple tuple = ExecFetchSlotHeapTuple(slot, false, &should_free);
  // Its subtransactions' too, but not those rolled back (their versions are gone).
  view->written_by_this_transaction =
      TransactionIdIsCurrentTransactionId(HeapTupleHeaderGetXmin(tuple->t_data));
}

void store_open(KeyStore* store, const StoreOids& oids, bool for_write) {
  LOCKMODE mode = for_write ? RowExclusiveLock : AccessShareLock;
  *store = KeyStore{};
  store->oids = oids;
  store->context = CurrentMemoryContext;
  store->heap = open_for_transaction(oids.heap, mode);
  store->index = open_for_transaction(oids.index, mode);  // follows a REINDEX CONCURRENTLY
  store->read_slot = table_slot_create(store->heap, nullptr);
}

void store_close(KeyStore* store) {
  if (store->write_slot != nullptr) ExecDropSingleTupleTableSlot(store->write_slot);
  ExecDropSingleTupleTableSlot(store->read_slot);
  // Later calls in the same statement must see (and may update) what this one wrote.
  if (store->wrote) CommandCounterIncrement();
}

static void init_identity_scankeys(const Identity& id, RegProcedure key_eq, ScanKeyData keys[3]) {
  ScanKeyInit(&keys[0], 1, BTEqualStrategyNumber, F_OIDEQ, ObjectIdGetDatum(id.role));
  ScanKeyEntryInitialize(&keys[1], 0, 2, BTEqualStrategyNumber, InvalidOid, C_COLLATION_OID,
                         F_TEXTEQ, PointerGetDatum(id.scope));
  ScanKeyInit(&keys[2], 3, BTEqualStrategyNumber, key_eq, PointerGetDatum(id.key));
}

void store_probe(KeyStore* store, const Identity& id, Snapshot snapshot, Probe* probe) {
  SnapshotData dirty;
  bool dirty_read = snapshot == nullptr;
  if (dirty_read) InitDirtySnapshot(dirty);
  ScanKeyData keys[3];
  init_identity_scankeys(id, store->oids.key_eq, keys);

  *probe = Probe{};
  // A dirty read scans every version and judges each itself, so that it can follow
  // the ones an update moved away.
  IndexScanDesc scan =
      compat::index_beginscan(store->heap, store->index, dirty_read ? SnapshotAny : snapshot, 3);
  index_rescan(scan, keys, 3, nullptr, 0);
  TupleTableSlot* slot = store->read_slot;
  // At most one version of an identity is committed and live. A dirty read may also
  // see the versions another transaction is writing: report the newest of those, so
  // an in_progress result shows the attempt that holds the key.
  while (index_getnext_slot(scan, ForwardScanDirection, slot)) {
    if (dirty_read) {
      bool should_free;
      HeapTuple tuple = ExecFetchSlotHeapTuple(slot, false, &should_free);
      auto buffered = reinterpret_cast<BufferHeapTupleTableSlot*>(slot);
      VersionLook look = look_at_version(tuple, buffered->buffer, &dirty, true);
      if (!look.visible && !follow_update_chain(store->heap, look, &dirty, slot)) continue;
    }
    TransactionId writer = InvalidTransactionId;
    if (dirty_read) writer = TransactionIdIsValid(dirty.xmin) ? dirty.xmin : dirty.xmax;
    bool being_inserted = dirty_read && TransactionIdIsValid(dirty.xmin);
    if (!probe->found || being_inserted) {
      probe->found = true;
      probe->tid = slot->tts_tid;
      probe->writer = writer;
      read_slot_row(slot, &probe->row, &probe->view);
      probe->view.written_by_other_in_progress = TransactionIdIsValid(writer);
      // As ON CONFLICT does: acting on a row the transaction snapshot cannot see
      // would break REPEATABLE READ.
      if (dirty_read && !TransactionIdIsValid(writer) && !probe->view.written_by_this_transaction &&
          IsolationUsesXactSnapshot() &&
          !table_tuple_satisfies_snapshot(store->heap, slot, GetTransactionSnapshot()))
        ereport(ERROR, errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
                errmsg("could not serialize access due to concurrent update"),
                errdetail("Another transaction committed this idempotency key after this "
                          "transaction's snapshot was taken."));
    }
    // Only a version some other transaction is changing can have a successor.
    if (!TransactionIdIsValid(writer) || being_inserted) break;
  }
  index_endscan(scan);
  ExecClearTuple(slot);
}

static TupleTableSlot* store_row_in_slot(KeyStore* store, const KeyRow* row) {
  if (store->write_slot == nullptr) {
    MemoryContext caller = MemoryContextSwitchTo(store->context);
    store->write_slot = table_slot_create(store->heap, nullptr);
    MemoryContextSwitchTo(caller);
  }
  TupleTableSlot* slot = store->write_slot;
  ExecClearTuple(slot);
  int natts = slot->tts_tupleDescriptor->natts;  // with or without the route
  memcpy(slot->tts_values, row->values, natts * sizeof(Datum));
  memcpy(slot->tts_isnull, row->isnull, natts * sizeof(bool));
  ExecStoreVirtualTuple(slot);
  return slot;
}

// Every unique index is an arbiter (as for INSERT ... ON CONFLICT DO NOTHING without a
// target), so a row of the identity that appeared unseen (whatever wrote it), in the
// primary key or in a copy of it that REINDEX CONCURRENTLY is building, is found
// without raising 23505 or waiting in a unique check. kBackOut inserts speculatively,
// as INSERT ... ON CONFLICT does, and takes the row back on a conflict; kReport
// inserts plainly (no speculative lock, no confirmation record) and leaves the row
// for the caller, who must then fail.
bool store_insert(KeyStore* store, const KeyRow* row, OnConflict on_conflict) {
  IndexWriter writer = index_writer_for_transaction(store->heap);
  TupleTableSlot* slot = store_row_in_slot(store, row);
  CommandId command = GetCurrentCommandId(true);
  bool conflict = false;
  if (on_conflict == OnConflict::kReport) {
    table_tuple_insert(store->heap, slot, command, 0, nullptr);
    list_free(compat::insert_index_tuples(writer.result_rel, slot, writer.estate, false, true,
                                          &conflict, NIL, false));
  } else {
    TransactionId xid = GetCurrentTransactionId();
    uint32 token = SpeculativeInsertionLockAcquire(xid);
    table_tuple_insert_speculative(store->heap, slot, command, 0, nullptr, token);
    list_free(compat::insert_index_tuples(writer.result_rel, slot, writer.estate, false, true,
                                          &conflict, NIL, false));
    table_tuple_complete_speculative(store->heap, slot, token, !conflict);
    SpeculativeInsertionLockRelease(xid);
  }
  ResetPerTupleExprContext(writer.estate);
  store->wrote = true;
  return !conflict;
}

// (write_version gave the busy version's holder.)
static WriteResult write_result(TM_Result result) {
  switch (result) {
    case TM_Ok: return WriteResult::kDone;
    case TM_BeingModified: return WriteResult::kBusy;
    case TM_Updated:
    case TM_Deleted:
      if (IsolationUsesXactSnapshot())
        ereport(ERROR, errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
                errmsg("could not serialize access due to concurrent update"));
      return WriteResult::kChanged;
    default: elog(ERROR, "unexpected result %d writing idempotency.keys", static_cast<int>(result));
  }
  return WriteResult::kChanged;
}

WriteResult store_update(KeyStore* store, ItemPointer tid, const KeyRow* row,
                         TransactionId* writer) {
  TupleTableSlot* slot = store_row_in_slot(store, row);
  compat::IndexUpdate indexes;
  auto update = [&](bool wait) {
    TM_FailureData failure;
    return compat::tuple_update(store->heap, tid, slot, GetCurrentCommandId(true), wait, &failure,
                                &indexes);
  };
  TM_Result result = write_version(store->heap, tid, update, writer);
  if (result == TM_Ok) {
    store->wrote = true;
    if (indexes != compat::IndexUpdate::kNone) {
      IndexWriter writer = index_writer_for_transaction(store->heap);
      list_free(compat::insert_index_tuples(writer.result_rel, slot, writer.estate, true, false,
                                            nullptr, NIL,
                                            indexes == compat::IndexUpdate::kSummarizing));
      ResetPerTupleExprContext(writer.estate);
    }
  }
  return write_result(result);
}

WriteResult store_delete(KeyStore* store, ItemPointer tid, TransactionId* writer) {
  auto remove = [&](bool wait) {
    TM_FailureData failure;
    return table_tuple_delete(store->heap, tid, GetCurrentCommandId(true), InvalidSnapshot,
                              InvalidSnapshot, wait, &failure, false);
  };
  TM_Result result = write_version(store->heap, tid, remove, writer);
  if (result == TM_Ok) store->wrote = true;
  return write_result(result);
}

}  // namespace idempotency
