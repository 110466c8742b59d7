#include "pg/common/table.hpp"

#include "pg/common/compat.hpp"
#include "pg/common/open_relations.hpp"
#include "pg/common/waits.hpp"

extern "C" {
#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/multixact.h"
#include "access/table.h"
#include "access/xact.h"
#include "catalog/dependency.h"
#include "catalog/pg_type.h"
#include "commands/extension.h"
#include "executor/executor.h"
#include "miscadmin.h"
#include "storage/bufmgr.h"
#include "storage/procarray.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"
}

namespace idempotency {

// The extension's own type `name` (idem_key, idem_role), in whichever schema CREATE
// EXTENSION put it: a name compared with its schema would refuse every schema but one.
static bool is_extension_type(Oid type, const char* name) {
  HeapTuple tuple = SearchSysCache1(TYPEOID, ObjectIdGetDatum(type));
  if (!HeapTupleIsValid(tuple)) return false;
  bool named =
      strcmp(NameStr(reinterpret_cast<Form_pg_type>(GETSTRUCT(tuple))->typname), name) == 0;
  ReleaseSysCache(tuple);
  return named &&
         getExtensionOfObject(TypeRelationId, type) == get_extension_oid("idempotency", true);
}

void check_columns(Oid heap, const ColumnSpec* columns, int count) {
  Relation rel = table_open(heap, AccessShareLock);
  TupleDesc desc = RelationGetDescr(rel);
  int natts = desc->natts;
  const char* problem = nullptr;
  for (int i = 0; i < Max(natts, count) && problem == nullptr; i++) {
    if (i >= natts || i >= count) {
      problem = psprintf("It has %d columns; this library expects %d.", natts, count);
      break;
    }
    Form_pg_attribute att = TupleDescAttr(desc, i);
    const ColumnSpec& want = columns[i];
    if (att->attisdropped) {
      problem = psprintf("Column %d was dropped; this library expects \"%s\".", i + 1, want.name);
      break;
    }
    bool type_ok = OidIsValid(want.type) ? att->atttypid == want.type
                                         : is_extension_type(att->atttypid, want.extension_type);
    if (strcmp(NameStr(att->attname), want.name) != 0 || !type_ok)
      problem = psprintf("Column %d is \"%s\" of type %s; this library expects \"%s\".", i + 1,
                         NameStr(att->attname), format_type_be(att->atttypid), want.name);
  }
  const char* name = pstrdup(RelationGetRelationName(rel));
  table_close(rel, AccessShareLock);
  if (problem != nullptr)
    ereport(ERROR, errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
            errmsg("idempotency.%s does not have the columns this library expects", name),
            errdetail("%s", problem),
            errhint("Install the idempotency library that matches the extension's version, "
                    "then run ALTER EXTENSION idempotency UPDATE."));
}

// Judged as heap_hot_search_buffer would.
VersionLook look_at_version(HeapTuple tuple, Buffer buffer, Snapshot dirty, bool by_index) {
  VersionLook look{};
  ItemPointerSetInvalid(&look.successor);
  LockBuffer(buffer, BUFFER_LOCK_SHARE);
  look.visible = HeapTupleSatisfiesVisibility(tuple, dirty, buffer);
  HeapTupleHeader header = tuple->t_data;
  // A HOT successor is returned by the same index entry as its predecessor; off the
  // index (following a chain), no entry returns it.
  if (!look.visible && !(header->t_infomask & HEAP_XMAX_INVALID) &&
      !HEAP_XMAX_IS_LOCKED_ONLY(header->t_infomask) && !HeapTupleHeaderIsSpeculative(header) &&
      !(by_index && HeapTupleHeaderIsHotUpdated(header)) &&
      !ItemPointerEquals(&tuple->t_self, &header->t_ctid)) {
    look.successor = header->t_ctid;
    look.updater = HeapTupleHeaderGetUpdateXid(header);
  }
  LockBuffer(buffer, BUFFER_LOCK_UNLOCK);
  return look;
}

// A version an update moved away is followed to its successor, as EvalPlanQual
// follows update chains.
bool follow_update_chain(Relation heap, VersionLook look, Snapshot dirty, TupleTableSlot* slot) {
  while (ItemPointerIsValid(&look.successor)) {
    CHECK_FOR_INTERRUPTS();
    HeapTuple tuple = static_cast<HeapTuple>(palloc(sizeof(HeapTupleData)));
    tuple->t_self = look.successor;
    Buffer buffer;
    if (!heap_fetch(heap, SnapshotAny, tuple, &buffer, false)) return false;  // pruned: gone
    if (!TransactionIdEquals(HeapTupleHeaderGetRawXmin(tuple->t_data), look.updater)) {
      ReleaseBuffer(buffer);  // the slot was reused: the chain ended long ago
      return false;
    }
    look = look_at_version(tuple, buffer, dirty, false);
    if (look.visible) {
      ExecStorePinnedBufferHeapTuple(tuple, slot, buffer);
      return true;
    }
    ReleaseBuffer(buffer);
  }
  return false;
}

Look table_look(Table* table, Oid index, ScanKey keys, int nkeys) {
  SnapshotData dirty;
  InitDirtySnapshot(dirty);
  IndexCursor cursor;
  // Every version, each judged here, so that one an update moved away is followed.
  cursor_open(table, &cursor, index, SnapshotAny, keys, nkeys);
  Look look{};
  TupleTableSlot* slot = table->slot;
  while (cursor_next(table, &cursor)) {
    bool should_free;
    HeapTuple tuple = ExecFetchSlotHeapTuple(slot, false, &should_free);
    auto buffered = reinterpret_cast<BufferHeapTupleTableSlot*>(slot);
    VersionLook version = look_at_version(tuple, buffered->buffer, &dirty, true);
    if (!version.visible && !follow_update_chain(table->heap, version, &dirty, slot)) continue;
    look.found = true;
    look.tid = slot->tts_tid;
    look.writer = TransactionIdIsValid(dirty.xmin) ? dirty.xmin : dirty.xmax;
    break;  // one identity has one live version; a writer's is waited for, then looked at again
  }
  cursor_close(&cursor);
  return look;
}

void open_table(Table* table, Oid heap, bool for_write) {
  *table = Table{};
  table->heap = open_for_transaction(heap, for_write ? RowExclusiveLock : AccessShareLock);
  table->slot = table_slot_create(table->heap, nullptr);
  table->write_slot = table_slot_create(table->heap, nullptr);
}

void close_table(Table* table) {
  ExecDropSingleTupleTableSlot(table->write_slot);
  ExecDropSingleTupleTableSlot(table->slot);
  if (table->wrote) CommandCounterIncrement();
}

void cursor_open(Table* table, IndexCursor* cursor, Oid index, Snapshot snapshot, ScanKey keys,
                 int nkeys) {
  cursor->index = open_for_transaction(index, AccessShareLock);
  cursor->scan = compat::index_beginscan(table->heap, cursor->index, snapshot, nkeys);
  index_rescan(cursor->scan, keys, nkeys, nullptr, 0);
}

bool cursor_next(Table* table, IndexCursor* cursor) {
  return index_getnext_slot(cursor->scan, ForwardScanDirection, table->slot);
}

void cursor_close(IndexCursor* cursor) { index_endscan(cursor->scan); }

bool table_find(Table* table, Oid index, Snapshot snapshot, ScanKey keys, int nkeys) {
  IndexCursor cursor;
  cursor_open(table, &cursor, index, snapshot, keys, nkeys);
  bool found = cursor_next(table, &cursor);
  cursor_close(&cursor);
  return found;
}

RegProcedure index_equality(Oid index, int column) {
  Oid opened;  // the index now of that name (REINDEX CONCURRENTLY)
  Relation rel = open_current(index, AccessShareLock, &opened);
  Oid opfamily = rel->rd_opfamily[column];
  Oid type = rel->rd_opcintype[column];
  index_close(rel, AccessShareLock);
  return get_opcode(get_opfamily_member(opfamily, type, type, BTEqualStrategyNumber));
}

Datum column(Table* table, int attnum, bool* isnull) {
  return slot_getattr(table->slot, attnum, isnull);
}

// Locks the newest version of the row at `target` without waiting; `target` becomes
// the version reached (when busy, the one another transaction holds).
static Lock lock_version(Table* table, ItemPointer target) {
  TM_FailureData failure;
  TM_Result result = table_tuple_lock(table->heap, target, GetLatestSnapshot(), table->slot,
                                      GetCurrentCommandId(false), LockTupleExclusive, LockWaitSkip,
                                      TUPLE_LOCK_FLAG_FIND_LAST_VERSION, &failure);
  switch (result) {
    case TM_Ok: return Lock::kLocked;
    case TM_WouldBlock:
    case TM_BeingModified: return Lock::kBusy;
    default: return Lock::kGone;  // deleted (or, to this command, not there)
  }
}

Lock table_lock(Table* table, ItemPointer tid) {
  ItemPointerData target = *tid;
  return lock_version(table, &target);
}

Lock table_lock_waiting(Table* table, ItemPointer tid, TimestampTz deadline) {
  for (;;) {
    ItemPointerData target = *tid;
    Lock lock = lock_version(table, &target);
    if (lock != Lock::kBusy || !wait_for_writer(table_holder(table, &target), deadline))
      return lock;
  }
}

// Read from the version's xmax, as heap_lock_tuple reads it before it waits: the
// updater or locker, or a member of a multixact of several, still running.
TransactionId version_holder(Relation heap, ItemPointer tid) {
  HeapTupleData tuple;
  tuple.t_self = *tid;
  Buffer buffer;
  if (!heap_fetch(heap, SnapshotAny, &tuple, &buffer, false)) return InvalidTransactionId;
  LockBuffer(buffer, BUFFER_LOCK_SHARE);
  uint16 infomask = tuple.t_data->t_infomask;
  TransactionId xmax = HeapTupleHeaderGetRawXmax(tuple.t_data);
  LockBuffer(buffer, BUFFER_LOCK_UNLOCK);
  ReleaseBuffer(buffer);
  auto other_running = [](TransactionId xid) {
    return TransactionIdIsValid(xid) && !TransactionIdIsCurrentTransactionId(xid) &&
           TransactionIdIsInProgress(xid);
  };
  if (infomask & HEAP_XMAX_INVALID) return InvalidTransactionId;
  if (!(infomask & HEAP_XMAX_IS_MULTI)) return other_running(xmax) ? xmax : InvalidTransactionId;
  MultiXactMember* members = nullptr;
  int count = GetMultiXactIdMembers(xmax, &members, false, HEAP_XMAX_IS_LOCKED_ONLY(infomask));
  TransactionId holder = InvalidTransactionId;
  for (int i = 0; i < count && !TransactionIdIsValid(holder); i++)
    if (other_running(members[i].xid)) holder = members[i].xid;
  if (members != nullptr) pfree(members);
  return holder;
}

TM_Result write_version(Relation heap, ItemPointer tid, FunctionRef<TM_Result(bool wait)> write,
                        TransactionId* holder) {
  *holder = InvalidTransactionId;
  TM_Result result = write(false);
  if (result != TM_BeingModified) return result;
  *holder = version_holder(heap, tid);
  if (TransactionIdIsValid(*holder)) return result;
  // No one else holds it: lock it for this transaction (at once, as it holds the lock
  // already), so that no one can take it before the write made again. In a slot of its
  // own: the caller's may hold the values to write, or an index scan's row.
  ItemPointerData target = *tid;
  TM_FailureData failure;
  TupleTableSlot* slot = table_slot_create(heap, nullptr);
  TM_Result locked =
      table_tuple_lock(heap, &target, GetLatestSnapshot(), slot, GetCurrentCommandId(false),
                       LockTupleExclusive, LockWaitSkip, 0, &failure);
  ExecDropSingleTupleTableSlot(slot);
  if (locked == TM_Ok) return write(true);
  if (locked == TM_WouldBlock || locked == TM_BeingModified) {
    *holder = version_holder(heap, tid);  // taken meanwhile
    return TM_BeingModified;
  }
  return locked;  // updated or deleted meanwhile
}

static TupleTableSlot* row_in_slot(Table* table, const Datum* values, const bool* nulls) {
  // Not table->slot: the values may point into the row it holds.
  TupleTableSlot* slot = table->write_slot;
  int natts = RelationGetDescr(table->heap)->natts;
  ExecClearTuple(slot);
  memcpy(slot->tts_values, values, natts * sizeof(Datum));
  memcpy(slot->tts_isnull, nulls, natts * sizeof(bool));
  ExecStoreVirtualTuple(slot);
  return slot;
}

void table_insert(Table* table, const Datum* values, const bool* nulls) {
  IndexWriter writer = index_writer_for_transaction(table->heap);
  TupleTableSlot* slot = row_in_slot(table, values, nulls);
  table_tuple_insert(table->heap, slot, GetCurrentCommandId(true), 0, nullptr);
  list_free(compat::insert_index_tuples(writer.result_rel, slot, writer.estate, false, false,
                                        nullptr, NIL, false));
  ResetPerTupleExprContext(writer.estate);
  table->wrote = true;
}

[[noreturn]] static void raise_concurrent_write(Table* table) {
  ereport(ERROR, errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
          errmsg("could not serialize access due to concurrent update"),
          errdetail("A row of idempotency.%s changed outside the extension's functions.",
                    RelationGetRelationName(table->heap)));
}

// After an update: the new version's index entries, unless it is a HOT update.
static void index_new_version(Table* table, compat::IndexUpdate indexes) {
  table->wrote = true;
  if (indexes == compat::IndexUpdate::kNone) return;
  IndexWriter writer = index_writer_for_transaction(table->heap);
  list_free(compat::insert_index_tuples(writer.result_rel, table->write_slot, writer.estate, true,
                                        false, nullptr, NIL,
                                        indexes == compat::IndexUpdate::kSummarizing));
  ResetPerTupleExprContext(writer.estate);
}

// One update of the version at `tid`; `wait` as table_tuple_update's.
static TM_Result update_version(Table* table, ItemPointer tid, const Datum* values,
                                const bool* nulls, bool wait) {
  ItemPointerData target = *tid;
  TupleTableSlot* slot = row_in_slot(table, values, nulls);
  TM_FailureData failure;
  compat::IndexUpdate indexes;
  TM_Result result = compat::tuple_update(table->heap, &target, slot, GetCurrentCommandId(true),
                                          wait, &failure, &indexes);
  if (result == TM_Ok) index_new_version(table, indexes);
  return result;
}

static Write written(TM_Result result) {
  switch (result) {
    case TM_Ok: return Write::kDone;
    case TM_BeingModified: return Write::kBusy;
    default: return Write::kChanged;
  }
}

void table_update(Table* table, ItemPointer tid, const Datum* values, const bool* nulls) {
  if (update_version(table, tid, values, nulls, true) != TM_Ok) raise_concurrent_write(table);
}

Write table_try_update(Table* table, ItemPointer tid, const Datum* values, const bool* nulls) {
  auto update = [&](bool wait) { return update_version(table, tid, values, nulls, wait); };
  TransactionId holder;
  return written(write_version(table->heap, tid, update, &holder));
}

Write table_try_delete(Table* table, ItemPointer tid) {
  auto remove = [&](bool wait) {
    TM_FailureData failure;
    return table_tuple_delete(table->heap, tid, GetCurrentCommandId(true), InvalidSnapshot,
                              InvalidSnapshot, wait, &failure, false);
  };
  TransactionId holder;
  TM_Result result = write_version(table->heap, tid, remove, &holder);
  if (result == TM_Ok) table->wrote = true;
  return written(result);
}

}  // namespace idempotency
