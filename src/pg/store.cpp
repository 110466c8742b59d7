// Direct table and index access to idempotency.keys: no SPI, no planning, no
// subtransaction. Waits on other writers are polled, never queued, so a claim can
// give up after `wait` without aborting its transaction.
#include "pg/store.hpp"

#include <optional>

#include "pg/identity_lock.hpp"
#include "pg/xact.hpp"

extern "C" {
#include "access/genam.h"
#include "access/heapam.h"
#include "access/relation.h"
#include "access/table.h"
#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_collation.h"
#include "common/hashfn.h"
#include "executor/executor.h"
#include "miscadmin.h"
#include "storage/latch.h"
#include "storage/lmgr.h"
#include "utils/datum.h"
#include "utils/fmgroids.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"
#include "utils/wait_event.h"
}

namespace idempotency {

// Catalog identity of the store, looked up once per backend and forgotten when the
// relcache says the table changed (DROP EXTENSION, for one).
struct StoreOids {
  Oid heap;
  Oid index;          // keys_pkey (role, scope, key)
  Oid expires_index;  // keys_expires_at_idx (reap_slot, expires_at)
  Oid lease_index;    // keys_lease_expires_at_idx, partial: leased rows only
  RegProcedure key_eq;
};
static StoreOids cached_oids;

static void forget_oids(Datum, Oid relid) {
  if (relid == InvalidOid || relid == cached_oids.heap || relid == cached_oids.index ||
      relid == cached_oids.expires_index || relid == cached_oids.lease_index)
    cached_oids = StoreOids{};
}

static const StoreOids& store_oids() {
  static bool callback_registered = false;
  if (OidIsValid(cached_oids.heap)) return cached_oids;
  if (!callback_registered) {
    CacheRegisterRelcacheCallback(forget_oids, 0);
    callback_registered = true;
  }
  Oid schema = get_namespace_oid("idempotency", true);
  Oid heap = OidIsValid(schema) ? get_relname_relid("keys", schema) : InvalidOid;
  Oid index = OidIsValid(schema) ? get_relname_relid("keys_pkey", schema) : InvalidOid;
  Oid expires_index =
      OidIsValid(schema) ? get_relname_relid("keys_expires_at_idx", schema) : InvalidOid;
  Oid lease_index =
      OidIsValid(schema) ? get_relname_relid("keys_lease_expires_at_idx", schema) : InvalidOid;
  if (!OidIsValid(heap) || !OidIsValid(index) || !OidIsValid(expires_index) ||
      !OidIsValid(lease_index))
    ereport(ERROR, errcode(ERRCODE_UNDEFINED_TABLE),
            errmsg("the idempotency key store does not exist in this database"),
            errhint("Run CREATE EXTENSION idempotency."));
  // The key column's equality function, as the index's operator family defines it.
  Relation index_rel = index_open(index, AccessShareLock);
  const int key_column = 2;  // 0-based in the index (role, scope, key)
  Oid opfamily = index_rel->rd_opfamily[key_column];
  Oid keytype = index_rel->rd_opcintype[key_column];
  index_close(index_rel, AccessShareLock);
  Oid eq = get_opfamily_member(opfamily, keytype, keytype, BTEqualStrategyNumber);
  cached_oids = StoreOids{heap, index, expires_index, lease_index, get_opcode(eq)};
  return cached_oids;
}

void store_open(KeyStore* store, bool for_write) {
  // A copy: opening the table accepts invalidation messages (ANALYZE, VACUUM and
  // autovacuum send them), and forget_oids then clears the cache under a reference.
  const StoreOids oids = store_oids();
  LOCKMODE mode = for_write ? RowExclusiveLock : AccessShareLock;
  *store = KeyStore{};
  store->heap = table_open(oids.heap, mode);
  store->index = index_open(oids.index, mode);
  store->read_slot = table_slot_create(store->heap, nullptr);
}

void store_close(KeyStore* store) {
  if (store->estate != nullptr) {
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
  TupleDesc desc = slot->tts_tupleDescriptor;
  slot_getallattrs(slot);
  for (int i = 0; i < kKeysColumns; i++) {
    row->isnull[i] = slot->tts_isnull[i];
    Form_pg_attribute att = TupleDescAttr(desc, i);
    row->values[i] =
        row->isnull[i] ? 0 : datumCopy(slot->tts_values[i], att->attbyval, att->attlen);
  }
}

static void fill_view(const KeyRow& row, StoredRow* view) {
  if (!parse_state(DatumGetChar(row.get(kState)), &view->state))
    ereport(ERROR, errcode(ERRCODE_DATA_CORRUPTED),
            errmsg("idempotency.keys holds a row with an unknown state \"%c\"",
                   DatumGetChar(row.get(kState))));
  view->attempt = DatumGetInt32(row.get(kAttempt));
  view->expires_at = DatumGetTimestampTz(row.get(kExpiresAt));
  if (!row.null(kLeaseExpiresAt))
    view->lease_expires_at = DatumGetTimestampTz(row.get(kLeaseExpiresAt));
  if (!row.null(kFingerprint)) {
    bytea* fp = DatumGetByteaPP(row.get(kFingerprint));
    view->fingerprint = std::string_view(VARDATA_ANY(fp), VARSIZE_ANY_EXHDR(fp));
  }
}

void store_probe(KeyStore* store, const Identity& id, Snapshot snapshot, Probe* probe) {
  SnapshotData dirty;
  bool dirty_read = snapshot == nullptr;
  if (dirty_read) {
    InitDirtySnapshot(dirty);
    snapshot = &dirty;
  }
  ScanKeyData keys[3];
  init_identity_scankeys(id, keys);

  *probe = Probe{};
  IndexScanDesc scan = index_beginscan(store->heap, store->index, snapshot, 3, 0);
  index_rescan(scan, keys, 3, nullptr, 0);
  TupleTableSlot* slot = store->read_slot;
  // At most one version of an identity is committed and live. A dirty read may also
  // see the versions another transaction is writing: report the newest of those, so
  // an in_progress result shows the attempt that holds the key.
  while (index_getnext_slot(scan, ForwardScanDirection, slot)) {
    bool should_free;
    HeapTuple tuple = ExecFetchSlotHeapTuple(slot, false, &should_free);
    TransactionId xmin = HeapTupleHeaderGetXmin(tuple->t_data);
    TransactionId writer = InvalidTransactionId;
    if (dirty_read) writer = TransactionIdIsValid(dirty.xmin) ? dirty.xmin : dirty.xmax;
    bool being_inserted = dirty_read && TransactionIdIsValid(dirty.xmin);
    if (!probe->found || being_inserted) {
      probe->found = true;
      probe->tid = slot->tts_tid;
      probe->writer = writer;
      probe->view = StoredRow{};
      probe->view.written_by_other_in_progress = TransactionIdIsValid(writer);
      bool written_here = TransactionIdIsCurrentTransactionId(xmin);
      // As ON CONFLICT does: acting on a row the transaction snapshot cannot see
      // would break REPEATABLE READ.
      if (dirty_read && !probe->view.written_by_other_in_progress && !written_here &&
          IsolationUsesXactSnapshot() &&
          !table_tuple_satisfies_snapshot(store->heap, slot, GetTransactionSnapshot()))
        ereport(ERROR, errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
                errmsg("could not serialize access due to concurrent update"),
                errdetail("Another transaction committed this idempotency key after this "
                          "transaction's snapshot was taken."));
      copy_row(slot, &probe->row);
      fill_view(probe->row, &probe->view);
      // Written here is not always claimed here: a lease holder's checkpoint writes too.
      probe->view.claimed_by_this_transaction =
          written_here && probe->view.state == KeyState::kPending &&
          (!probe->view.lease_expires_at || made_lease_claim(id));
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
  store->estate = CreateExecutorState();
  store->result_rel = makeNode(ResultRelInfo);
  InitResultRelInfo(store->result_rel, store->heap, 0, nullptr, 0);
  ExecOpenIndices(store->result_rel, true);
}

static TupleTableSlot* store_row_in_slot(KeyStore* store, const KeyRow* row) {
  if (store->write_slot == nullptr) store->write_slot = table_slot_create(store->heap, nullptr);
  TupleTableSlot* slot = store->write_slot;
  ExecClearTuple(slot);
  memcpy(slot->tts_values, row->values, sizeof(row->values));
  memcpy(slot->tts_isnull, row->isnull, sizeof(row->isnull));
  ExecStoreVirtualTuple(slot);
  return slot;
}

void store_insert(KeyStore* store, KeyRow* row, const IdentityLock& held) {
  ensure_executor(store);
  TupleTableSlot* slot = store_row_in_slot(store, row);
  table_tuple_insert(store->heap, slot, GetCurrentCommandId(true), 0, nullptr);
  list_free(
      ExecInsertIndexTuples(store->result_rel, slot, store->estate, false, false, nullptr, NIL));
  ResetPerTupleExprContext(store->estate);
  store->wrote = true;
  note_insert(held);
}

KeyRow* store_copy_row(KeyStore* store, const KeyRow& row, MemoryContext context) {
  MemoryContext old = MemoryContextSwitchTo(context);
  KeyRow* copy = static_cast<KeyRow*>(palloc(sizeof(KeyRow)));
  TupleDesc desc = RelationGetDescr(store->heap);
  for (int i = 0; i < kKeysColumns; i++) {
    Form_pg_attribute att = TupleDescAttr(desc, i);
    copy->isnull[i] = row.isnull[i];
    copy->values[i] = row.isnull[i] ? 0 : datumCopy(row.values[i], att->attbyval, att->attlen);
  }
  MemoryContextSwitchTo(old);
  return copy;
}

void store_view_row(const KeyRow& row, StoredRow* view) {
  *view = StoredRow{};
  fill_view(row, view);
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

constexpr int16 kReapSlots = 16;

int16 reap_slot(const Identity& id) {
  return hash_bytes(reinterpret_cast<const unsigned char*>(VARDATA_ANY(id.key)),
                    VARSIZE_ANY_EXHDR(id.key)) %
         kReapSlots;
}

// Scans `index_oid` for entries from `from` to `bound` in its timestamp column (after
// a first column equal to `prefix`, if given) and calls act(row, view, tid) on each;
// act returns whether the row counts (it changed it, or it matched). Stops after
// max_rows of those.
template <typename Act>
static int64 scan_up_to(KeyStore* store, Oid index_oid, LOCKMODE mode, Snapshot snapshot,
                        std::optional<int16> prefix, TimestampTz from, TimestampTz bound,
                        int64 max_rows, Act act) {
  Relation index = index_open(index_oid, mode);
  ScanKeyData keys[3];
  int nkeys = 0;
  if (prefix)
    ScanKeyInit(&keys[nkeys++], 1, BTEqualStrategyNumber, F_INT2EQ, Int16GetDatum(*prefix));
  AttrNumber column = nkeys + 1;
  if (from != DT_NOBEGIN)
    ScanKeyInit(&keys[nkeys++], column, BTGreaterEqualStrategyNumber, F_TIMESTAMPTZ_GE,
                TimestampTzGetDatum(from));
  ScanKeyInit(&keys[nkeys++], column, BTLessEqualStrategyNumber, F_TIMESTAMPTZ_LE,
              TimestampTzGetDatum(bound));
  IndexScanDesc scan = index_beginscan(store->heap, index, snapshot, nkeys, 0);
  index_rescan(scan, keys, nkeys, nullptr, 0);
  int64 changed = 0;
  while (changed < max_rows && index_getnext_slot(scan, ForwardScanDirection, store->read_slot)) {
    KeyRow row;
    StoredRow view;
    ItemPointerData tid = store->read_slot->tts_tid;
    store_read_slot(store->read_slot, &row, &view);
    if (act(&row, view, &tid)) changed++;
    CHECK_FOR_INTERRUPTS();
  }
  index_endscan(scan);
  index_close(index, NoLock);
  ExecClearTuple(store->read_slot);
  return changed;
}

int64 store_reap_expired(KeyStore* store, Snapshot snapshot, TimestampTz now, int64 max_rows,
                         ReapPosition* position) {
  int64 deleted = 0;
  while (position->slot < kReapSlots) {
    deleted += scan_up_to(store, store_oids().expires_index, RowExclusiveLock, snapshot,
                          position->slot, position->from, now, max_rows - deleted,
                          [&](KeyRow*, const StoredRow& view, ItemPointer tid) {
                            position->from = view.expires_at;
                            TransactionId writer;
                            return !is_live(view, now) &&
                                   store_delete(store, tid, &writer) == WriteResult::kDone;
                          });
    if (deleted >= max_rows) break;
    *position = ReapPosition{static_cast<int16>(position->slot + 1), DT_NOBEGIN};
  }
  return deleted;
}

int64 store_abandon_stale(KeyStore* store, Snapshot snapshot, TimestampTz now, int64 max_rows) {
  return scan_up_to(store, store_oids().lease_index, RowExclusiveLock, snapshot, std::nullopt,
                    DT_NOBEGIN, now, max_rows,
                    [&](KeyRow* row, const StoredRow& view, ItemPointer tid) {
                      if (view.state != KeyState::kPending) return false;
                      row->set(kState, CharGetDatum(static_cast<char>(KeyState::kAbandoned)));
                      row->clear(kLeaseExpiresAt);  // leaves the partial lease index
                      TransactionId writer;
                      return store_update(store, tid, row, &writer) == WriteResult::kDone;
                    });
}

int64 store_count_stale_leases(KeyStore* store, Snapshot snapshot, TimestampTz now,
                               int64 max_rows) {
  return scan_up_to(store, store_oids().lease_index, AccessShareLock, snapshot, std::nullopt,
                    DT_NOBEGIN, now, max_rows,
                    [](KeyRow*, const StoredRow& view, ItemPointer) {
                      return view.state == KeyState::kPending;
                    });
}

// A loose scan of the primary key: one probe per role, and a delete run for each
// role that no longer exists.
int64 store_reap_dropped_roles(KeyStore* store, Snapshot snapshot, int64 max_rows) {
  int64 deleted = 0;
  Oid after = InvalidOid;
  while (deleted < max_rows) {
    CHECK_FOR_INTERRUPTS();  // a SIGTERM must not wait for a long sweep
    ScanKeyData key;
    ScanKeyInit(&key, 1, BTGreaterStrategyNumber, F_OIDGT, ObjectIdGetDatum(after));
    IndexScanDesc scan = index_beginscan(store->heap, store->index, snapshot, 1, 0);
    index_rescan(scan, &key, 1, nullptr, 0);
    bool found = index_getnext_slot(scan, ForwardScanDirection, store->read_slot);
    bool isnull;
    Oid role =
        found ? DatumGetObjectId(slot_getattr(store->read_slot, kRole, &isnull)) : InvalidOid;
    index_endscan(scan);
    if (!OidIsValid(role)) break;
    after = role;
    if (SearchSysCacheExists1(AUTHOID, ObjectIdGetDatum(role))) continue;
    IndexScanDesc rows = store_begin_role_scan(store, role, snapshot);
    while (deleted < max_rows && index_getnext_slot(rows, ForwardScanDirection, store->read_slot)) {
      CHECK_FOR_INTERRUPTS();
      ItemPointerData tid = store->read_slot->tts_tid;
      TransactionId writer;
      if (store_delete(store, &tid, &writer) == WriteResult::kDone) deleted++;
    }
    index_endscan(rows);
  }
  ExecClearTuple(store->read_slot);
  return deleted;
}

// Short transactions usually end within a millisecond, so the first sleeps are
// short; the backoff caps at 5 ms.
bool sleep_before_retry(long* sleep_us, TimestampTz deadline) {
  TimestampTz now = GetCurrentTimestamp();
  if (now >= deadline) return false;
  long sleep = Min(*sleep_us, deadline - now);
  if (sleep < 1000) {
    pg_usleep(sleep);  // below WaitLatch's millisecond resolution
  } else {
    (void)WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH, sleep / 1000,
                    PG_WAIT_EXTENSION);
    ResetLatch(MyLatch);
  }
  CHECK_FOR_INTERRUPTS();
  *sleep_us = Min(*sleep_us * 2, 5000);
  return true;
}

bool wait_for_writer(TransactionId writer, TimestampTz deadline) {
  long sleep_us = 50;
  for (;;) {
    if (TransactionIdIsValid(writer) && ConditionalXactLockTableWait(writer)) return true;
    if (!sleep_before_retry(&sleep_us, deadline)) return false;
    // Only a row lock without an updater leaves no xid to wait for: probe again.
    if (!TransactionIdIsValid(writer)) return true;
  }
}

void store_read_slot(TupleTableSlot* slot, KeyRow* row, StoredRow* view) {
  copy_row(slot, row);
  *view = StoredRow{};
  fill_view(*row, view);
}

IndexScanDesc store_begin_role_scan(KeyStore* store, Oid role, Snapshot snapshot) {
  ScanKeyData key;
  ScanKeyInit(&key, 1, BTEqualStrategyNumber, F_OIDEQ, ObjectIdGetDatum(role));
  IndexScanDesc scan = index_beginscan(store->heap, store->index, snapshot, 1, 0);
  index_rescan(scan, &key, 1, nullptr, 0);
  return scan;
}

}  // namespace idempotency
