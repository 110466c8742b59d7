// Direct table and index access to idempotency.keys: no SPI, no planning, no
// subtransaction. Waits on other writers are polled, never queued, so a claim can
// give up after `wait` without aborting its transaction.
#include "pg/store.hpp"

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

// Catalog identity of the store, looked up once per backend and forgotten when the
// relcache says the table changed (DROP EXTENSION, ALTER EXTENSION UPDATE, for one).
struct StoreOids {
  Oid heap;
  Oid index;          // keys_pkey (role, scope, key)
  Oid expires_index;  // keys_expires_at_idx (reap_slot, expires_at)
  Oid lease_index;    // keys_lease_expires_at_idx, partial: leased rows only
  Oid leased_index;   // keys_leased_idx (role, first_claimed_at), partial: lease claims (1.1)
  Oid secret;         // idempotency.lock_secret (1.1)
  RegProcedure key_eq;
};
static StoreOids cached_oids;

// The identity locks' hash key, read once per backend after the OIDs.
static LockSecret cached_secret;
static bool secret_loaded;

static void forget_oids(Datum, Oid relid) {
  if (relid == InvalidOid || relid == cached_oids.heap || relid == cached_oids.index ||
      relid == cached_oids.expires_index || relid == cached_oids.lease_index ||
      relid == cached_oids.leased_index || relid == cached_oids.secret) {
    cached_oids = StoreOids{};
    secret_loaded = false;
  }
}

// A library must never write columns it does not know (an older library against a
// newer schema): refuse unless the table has exactly the expected columns.
static void check_layout(Oid heap) {
  Relation rel = table_open(heap, AccessShareLock);
  TupleDesc desc = RelationGetDescr(rel);
  int natts = desc->natts;
  const char* problem = nullptr;
  for (int i = 0; i < Max(natts, kKeysColumns) && problem == nullptr; i++) {
    if (i >= natts || i >= kKeysColumns) {
      problem = psprintf("It has %d columns; this library expects %d.", natts, kKeysColumns);
      break;
    }
    Form_pg_attribute att = TupleDescAttr(desc, i);
    const KeyColumn& want = kKeyColumns[i];
    if (att->attisdropped) {
      problem = psprintf("Column %d was dropped; this library expects \"%s\".", i + 1, want.name);
      break;
    }
    bool type_ok = OidIsValid(want.type) ? att->atttypid == want.type
                                         : strcmp(format_type_be(att->atttypid), "idem_key") == 0;
    if (strcmp(NameStr(att->attname), want.name) != 0 || !type_ok)
      problem = psprintf("Column %d is \"%s\" of type %s; this library expects \"%s\".", i + 1,
                         NameStr(att->attname), format_type_be(att->atttypid), want.name);
  }
  table_close(rel, AccessShareLock);
  if (problem != nullptr)
    ereport(ERROR, errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
            errmsg("idempotency.keys does not have the columns this library expects"),
            errdetail_internal("%s", problem),
            errhint("Install the idempotency library that matches the extension's version, "
                    "then run ALTER EXTENSION idempotency UPDATE."));
}

static const StoreOids& store_oids() {
  static bool callback_registered = false;
  if (OidIsValid(cached_oids.heap)) return cached_oids;
  if (!callback_registered) {
    CacheRegisterRelcacheCallback(forget_oids, 0);
    callback_registered = true;
  }
  Oid schema = get_namespace_oid("idempotency", true);
  auto relation = [schema](const char* name) {
    return OidIsValid(schema) ? get_relname_relid(name, schema) : InvalidOid;
  };
  StoreOids oids{relation("keys"),        relation("keys_pkey"),
                 relation("keys_expires_at_idx"), relation("keys_lease_expires_at_idx"),
                 relation("keys_leased_idx"),     relation("lock_secret"),
                 InvalidOid};
  if (!OidIsValid(oids.heap) || !OidIsValid(oids.index) || !OidIsValid(oids.expires_index) ||
      !OidIsValid(oids.lease_index))
    ereport(ERROR, errcode(ERRCODE_UNDEFINED_TABLE),
            errmsg("the idempotency key store does not exist in this database"),
            errhint("Run CREATE EXTENSION idempotency."));
  check_layout(oids.heap);
  // The key column's equality function, as the index's operator family defines it.
  Relation index_rel = index_open(oids.index, AccessShareLock);
  const int key_column = 2;  // 0-based in the index (role, scope, key)
  Oid opfamily = index_rel->rd_opfamily[key_column];
  Oid keytype = index_rel->rd_opcintype[key_column];
  index_close(index_rel, AccessShareLock);
  Oid eq = get_opfamily_member(opfamily, keytype, keytype, BTEqualStrategyNumber);
  oids.key_eq = get_opcode(eq);
  cached_oids = oids;
  return cached_oids;
}

LockSecret store_lock_secret() {
  const StoreOids oids = store_oids();
  if (secret_loaded) return cached_secret;
  LockSecret secret{};
  if (OidIsValid(oids.secret)) {  // absent before ALTER EXTENSION idempotency UPDATE to 1.1
    Relation rel = table_open(oids.secret, AccessShareLock);
    Snapshot snapshot = RegisterSnapshot(GetLatestSnapshot());
    TableScanDesc scan = table_beginscan(rel, snapshot, 0, nullptr);
    HeapTuple tuple = heap_getnext(scan, ForwardScanDirection);
    if (tuple != nullptr) {
      bool isnull;
      Datum value = heap_getattr(tuple, 1, RelationGetDescr(rel), &isnull);
      bytea* bytes = isnull ? nullptr : DatumGetByteaPP(value);
      if (bytes != nullptr && VARSIZE_ANY_EXHDR(bytes) == sizeof(secret.bytes)) {
        memcpy(secret.bytes, VARDATA_ANY(bytes), sizeof(secret.bytes));
        secret.size = sizeof(secret.bytes);
      }
    }
    table_endscan(scan);
    UnregisterSnapshot(snapshot);
    table_close(rel, AccessShareLock);
    if (secret.size == 0)
      ereport(ERROR, errcode(ERRCODE_DATA_CORRUPTED),
              errmsg("idempotency.lock_secret holds no 32-byte secret"));
  }
  // Loaded after the invalidations that opening the table accepted: only now is the
  // cache known to belong to the store of this call.
  if (OidIsValid(cached_oids.heap)) {
    cached_secret = secret;
    secret_loaded = true;
  }
  return secret;
}

void store_open(KeyStore* store, bool for_write) {
  // A copy: opening the table accepts invalidation messages (ANALYZE, VACUUM and
  // autovacuum send them), and forget_oids then clears the cache under a reference.
  const StoreOids oids = store_oids();
  LOCKMODE mode = for_write ? RowExclusiveLock : AccessShareLock;
  *store = KeyStore{};
  store->context = CurrentMemoryContext;
  store->heap = table_open(oids.heap, mode);
  store->index = index_open(oids.index, mode);
  store->read_slot = table_slot_create(store->heap, nullptr);
}

void store_close(KeyStore* store) {
  if (store->estate != nullptr) {
    list_free(store->arbiters);
    ExecCloseIndices(store->result_rel);
    FreeExecutorState(store->estate);
  }
  if (store->write_slot != nullptr) ExecDropSingleTupleTableSlot(store->write_slot);
  ExecDropSingleTupleTableSlot(store->read_slot);
  index_close(store->index, NoLock);
  table_close(store->heap, NoLock);
  // Later calls in the same statement must see (and may update) what this one wrote.
  if (store->wrote) CommandCounterIncrement();
}

static void init_identity_scankeys(const Identity& id, ScanKeyData keys[3]) {
  ScanKeyInit(&keys[0], 1, BTEqualStrategyNumber, F_OIDEQ, ObjectIdGetDatum(id.role));
  ScanKeyEntryInitialize(&keys[1], 0, 2, BTEqualStrategyNumber, InvalidOid, C_COLLATION_OID,
                         F_TEXTEQ, PointerGetDatum(id.scope));
  ScanKeyInit(&keys[2], 3, BTEqualStrategyNumber, store_oids().key_eq, PointerGetDatum(id.key));
}

static void copy_row(TupleTableSlot* slot, KeyRow* row) {
  slot_getallattrs(slot);
  for (int i = 0; i < kKeysColumns; i++) {
    row->isnull[i] = slot->tts_isnull[i];
    row->values[i] = row->isnull[i] ? 0
                                    : datumCopy(slot->tts_values[i], kKeyColumns[i].byval,
                                                kKeyColumns[i].length);
  }
}

// Visits each row of `scan`, a copy of it alive only while it is visited: a pass over
// a large backlog (idem_reap with no limit) must not hold every row it read.
template <typename Next, typename Seen>
static int64 visit_rows(KeyStore* store, Next next, int64 max_rows, RowVisitor visit,
                        void* context, Seen seen) {
  MemoryContext row_context =
      AllocSetContextCreate(CurrentMemoryContext, "idempotency scan row", ALLOCSET_SMALL_SIZES);
  int64 counted = 0;
  while (counted < max_rows && next(store->read_slot)) {
    MemoryContext caller = MemoryContextSwitchTo(row_context);
    KeyRow row;
    StoredRow view;
    ItemPointerData tid = store->read_slot->tts_tid;
    copy_row(store->read_slot, &row);
    read_row(row, &view);
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

// How one row version looks to a dirty snapshot, judged under its buffer's lock as
// heap_hot_search_buffer would.
struct VersionLook {
  bool visible;               // live, or being written by a transaction in progress
  ItemPointerData successor;  // valid when an update moved the row to another version
  TransactionId updater;      // that update's transaction
};

static VersionLook look_at_version(HeapTuple tuple, Buffer buffer, Snapshot dirty) {
  VersionLook look{};
  ItemPointerSetInvalid(&look.successor);
  LockBuffer(buffer, BUFFER_LOCK_SHARE);
  look.visible = HeapTupleSatisfiesVisibility(tuple, dirty, buffer);
  HeapTupleHeader header = tuple->t_data;
  // A HOT successor is returned by the same index entry; only a version with index
  // entries of its own needs following.
  if (!look.visible && !(header->t_infomask & HEAP_XMAX_INVALID) &&
      !HEAP_XMAX_IS_LOCKED_ONLY(header->t_infomask) && !HeapTupleHeaderIsSpeculative(header) &&
      !HeapTupleHeaderIsHotUpdated(header) &&
      !ItemPointerEquals(&tuple->t_self, &header->t_ctid)) {
    look.successor = header->t_ctid;
    look.updater = HeapTupleHeaderGetUpdateXid(header);
  }
  LockBuffer(buffer, BUFFER_LOCK_UNLOCK);
  return look;
}

// A scan can pass the place where an update puts the new version's index entry just
// before the update inserts it, and reach the old version just after the update
// commits: the row would seem gone. So a version an update moved away is followed to
// its successor, as EvalPlanQual follows update chains. True, with the successor in
// `slot`, when the chain ends in a version the dirty snapshot sees.
static bool follow_update_chain(Relation heap, VersionLook look, Snapshot dirty,
                                TupleTableSlot* slot) {
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
    look = look_at_version(tuple, buffer, dirty);
    if (look.visible) {
      ExecStorePinnedBufferHeapTuple(tuple, slot, buffer);
      return true;
    }
    ReleaseBuffer(buffer);
  }
  return false;
}

void store_probe(KeyStore* store, const Identity& id, Snapshot snapshot, Probe* probe) {
  SnapshotData dirty;
  bool dirty_read = snapshot == nullptr;
  if (dirty_read) InitDirtySnapshot(dirty);
  ScanKeyData keys[3];
  init_identity_scankeys(id, keys);

  *probe = Probe{};
  // A dirty read scans every version and judges each itself, so that it can follow
  // the ones an update moved away.
  IndexScanDesc scan =
      index_beginscan(store->heap, store->index, dirty_read ? SnapshotAny : snapshot, 3, 0);
  index_rescan(scan, keys, 3, nullptr, 0);
  TupleTableSlot* slot = store->read_slot;
  // At most one version of an identity is committed and live. A dirty read may also
  // see the versions another transaction is writing: report the newest of those, so
  // an in_progress result shows the attempt that holds the key.
  while (index_getnext_slot(scan, ForwardScanDirection, slot)) {
    bool should_free;
    HeapTuple tuple = ExecFetchSlotHeapTuple(slot, false, &should_free);
    if (dirty_read) {
      auto buffered = reinterpret_cast<BufferHeapTupleTableSlot*>(slot);
      VersionLook look = look_at_version(tuple, buffered->buffer, &dirty);
      if (!look.visible) {
        if (!follow_update_chain(store->heap, look, &dirty, slot)) continue;
        tuple = ExecFetchSlotHeapTuple(slot, false, &should_free);
      }
    }
    TransactionId xmin = HeapTupleHeaderGetXmin(tuple->t_data);
    TransactionId writer = InvalidTransactionId;
    if (dirty_read) writer = TransactionIdIsValid(dirty.xmin) ? dirty.xmin : dirty.xmax;
    bool being_inserted = dirty_read && TransactionIdIsValid(dirty.xmin);
    if (!probe->found || being_inserted) {
      probe->found = true;
      probe->tid = slot->tts_tid;
      probe->writer = writer;
      probe->written_here = TransactionIdIsCurrentTransactionId(xmin);
      // As ON CONFLICT does: acting on a row the transaction snapshot cannot see
      // would break REPEATABLE READ.
      if (dirty_read && !TransactionIdIsValid(writer) && !probe->written_here &&
          IsolationUsesXactSnapshot() &&
          !table_tuple_satisfies_snapshot(store->heap, slot, GetTransactionSnapshot()))
        ereport(ERROR, errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
                errmsg("could not serialize access due to concurrent update"),
                errdetail("Another transaction committed this idempotency key after this "
                          "transaction's snapshot was taken."));
      copy_row(slot, &probe->row);
      read_row(probe->row, &probe->view);
      probe->view.written_by_other_in_progress = TransactionIdIsValid(writer);
    }
    // Only a version some other transaction is changing can have a successor.
    if (!TransactionIdIsValid(writer) || being_inserted) break;
  }
  index_endscan(scan);
  ExecClearTuple(slot);
}

// Executor state for index maintenance; a HOT update (a completion) needs none.
static void ensure_executor(KeyStore* store) {
  if (store->estate != nullptr) return;
  MemoryContext caller = MemoryContextSwitchTo(store->context);
  store->estate = CreateExecutorState();
  store->result_rel = makeNode(ResultRelInfo);
  InitResultRelInfo(store->result_rel, store->heap, 0, nullptr, 0);
  ExecOpenIndices(store->result_rel, true);
  store->arbiters = list_make1_oid(RelationGetRelid(store->index));
  MemoryContextSwitchTo(caller);
}

static TupleTableSlot* store_row_in_slot(KeyStore* store, const KeyRow* row) {
  if (store->write_slot == nullptr) {
    MemoryContext caller = MemoryContextSwitchTo(store->context);
    store->write_slot = table_slot_create(store->heap, nullptr);
    MemoryContextSwitchTo(caller);
  }
  TupleTableSlot* slot = store->write_slot;
  ExecClearTuple(slot);
  memcpy(slot->tts_values, row->values, sizeof(row->values));
  memcpy(slot->tts_isnull, row->isnull, sizeof(row->isnull));
  ExecStoreVirtualTuple(slot);
  return slot;
}

// Speculative insertion, as INSERT ... ON CONFLICT does: the primary key is the
// arbiter, so a row of the identity that appeared unseen (whatever wrote it) makes
// this insert back out instead of raising 23505 or waiting in a lock queue.
bool store_insert(KeyStore* store, KeyRow* row) {
  ensure_executor(store);
  TupleTableSlot* slot = store_row_in_slot(store, row);
  TransactionId xid = GetCurrentTransactionId();
  uint32 token = SpeculativeInsertionLockAcquire(xid);
  table_tuple_insert_speculative(store->heap, slot, GetCurrentCommandId(true), 0, nullptr, token);
  bool conflict = false;
  list_free(ExecInsertIndexTuples(store->result_rel, slot, store->estate, false, true, &conflict,
                                  store->arbiters));
  table_tuple_complete_speculative(store->heap, slot, token, !conflict);
  SpeculativeInsertionLockRelease(xid);
  ResetPerTupleExprContext(store->estate);
  store->wrote = true;
  return !conflict;
}

static WriteResult write_result(TM_Result result, const TM_FailureData& failure,
                                TransactionId* writer) {
  switch (result) {
    case TM_Ok: return WriteResult::kDone;
    case TM_BeingModified: *writer = failure.xmax; return WriteResult::kBusy;
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

WriteResult store_update(KeyStore* store, ItemPointer tid, KeyRow* row, TransactionId* writer) {
  TupleTableSlot* slot = store_row_in_slot(store, row);
  TM_FailureData failure;
  LockTupleMode lock_mode;
  bool update_indexes = false;
  TM_Result result =
      table_tuple_update(store->heap, tid, slot, GetCurrentCommandId(true), InvalidSnapshot,
                         InvalidSnapshot, false, &failure, &lock_mode, &update_indexes);
  if (result == TM_Ok) {
    store->wrote = true;
    if (update_indexes) {
      ensure_executor(store);
      list_free(
          ExecInsertIndexTuples(store->result_rel, slot, store->estate, true, false, nullptr, NIL));
      ResetPerTupleExprContext(store->estate);
    }
  }
  return write_result(result, failure, writer);
}

WriteResult store_delete(KeyStore* store, ItemPointer tid, TransactionId* writer) {
  TM_FailureData failure;
  TM_Result result = table_tuple_delete(store->heap, tid, GetCurrentCommandId(true),
                                        InvalidSnapshot, InvalidSnapshot, false, &failure, false);
  if (result == TM_Ok) store->wrote = true;
  return write_result(result, failure, writer);
}

static auto next_in(IndexScanDesc scan) {
  return [scan](TupleTableSlot* slot) {
    return index_getnext_slot(scan, ForwardScanDirection, slot);
  };
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
  IndexScanDesc scan = index_beginscan(store->heap, index, snapshot, nkeys, 0);
  index_rescan(scan, keys, nkeys, nullptr, 0);
  int64 counted = visit_rows(store, next_in(scan), max_rows, visit, context,
                             [&](const StoredRow& view) { *from = view.expires_at; });
  index_endscan(scan);
  return counted;
}

int64 store_scan_expired(KeyStore* store, Snapshot snapshot, TimestampTz now, int64 max_rows,
                         ReapPosition* position, RowVisitor visit, void* context) {
  Relation index = index_open(store_oids().expires_index, RowExclusiveLock);
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
  Relation index = index_open(store_oids().lease_index, AccessShareLock);
  TimestampTz from = DT_NOBEGIN;
  int64 counted = scan_index_range(store, index, snapshot, std::nullopt, &from, now, max_rows,
                                   visit, context);
  index_close(index, NoLock);
  return counted;
}

// A loose scan of the primary key: one probe per role.
Oid store_next_role(KeyStore* store, Snapshot snapshot, Oid after) {
  ScanKeyData key;
  ScanKeyInit(&key, 1, BTGreaterStrategyNumber, F_OIDGT, ObjectIdGetDatum(after));
  IndexScanDesc scan = index_beginscan(store->heap, store->index, snapshot, 1, 0);
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

static int64 scan_role(KeyStore* store, Relation index, Snapshot snapshot, Oid role,
                       int64 max_rows, RowVisitor visit, void* context) {
  ScanKeyData key;
  ScanKeyInit(&key, 1, BTEqualStrategyNumber, F_OIDEQ, ObjectIdGetDatum(role));
  IndexScanDesc scan = index_beginscan(store->heap, index, snapshot, 1, 0);
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
  Oid leased = store_oids().leased_index;
  if (!OidIsValid(leased)) return false;
  Relation index = index_open(leased, AccessShareLock);
  scan_role(store, index, snapshot, role, max_rows, visit, context);
  index_close(index, NoLock);
  return true;
}

}  // namespace idempotency
