// Every difference between the PostgreSQL versions this library supports (15, 17, 18
// and 19) that the code meets, in one place: the rest of src/pg calls these and
// never tests PG_VERSION_NUM itself.
#pragma once

#include "pg/common/postgres.hpp"

extern "C" {
#include "access/genam.h"
#include "access/tableam.h"
#include "access/transam.h"
#include "catalog/pg_proc.h"
#include "catalog/pg_tablespace.h"
#include "executor/executor.h"
#include "storage/lmgr.h"
#include "storage/proc.h"
#include "utils/acl.h"
#include "utils/backend_status.h"
#include "utils/builtins.h"
#if PG_VERSION_NUM >= 160000
#include "nodes/miscnodes.h"
#endif
}

namespace idempotency::compat {

// 18 added instrumentation of index scans (none here).
inline IndexScanDesc index_beginscan(Relation heap, Relation index, Snapshot snapshot, int nkeys) {
#if PG_VERSION_NUM >= 180000
  return ::index_beginscan(heap, index, snapshot, nullptr, nkeys, 0);
#else
  return ::index_beginscan(heap, index, snapshot, nkeys, 0);
#endif
}

// 16 added summarizing (BRIN) indexes, whose entries a HOT update still adds: with
// only_summarizing, just those.
inline List* insert_index_tuples(ResultRelInfo* result_rel, TupleTableSlot* slot, EState* estate,
                                 bool update, bool no_dup_err, bool* conflict, List* arbiters,
                                 bool only_summarizing) {
#if PG_VERSION_NUM >= 160000
  return ExecInsertIndexTuples(result_rel, slot, estate, update, no_dup_err, conflict, arbiters,
                               only_summarizing);
#else
  (void)only_summarizing;  // 15 has no summarizing indexes: only a non-HOT update comes here
  return ExecInsertIndexTuples(result_rel, slot, estate, update, no_dup_err, conflict, arbiters);
#endif
}

// 17 added an index access method's cleanup after inserts (BRIN's), which
// ExecCloseIndices calls; before, there is none.
inline void index_insert_cleanup(Relation index, IndexInfo* info) {
#if PG_VERSION_NUM >= 170000
  ::index_insert_cleanup(index, info);
#else
  (void)index;
  (void)info;
#endif
}

// Which index entries an update needs: none (HOT), all, or (16+) only summarizing ones.
enum class IndexUpdate { kNone, kAll, kSummarizing };

// `wait` false: a row another transaction is writing is TM_BeingModified (so is one this
// transaction locked: a locked row is updated with `wait` true, which then cannot wait).
inline TM_Result tuple_update(Relation heap, ItemPointer tid, TupleTableSlot* slot,
                              CommandId command, bool wait, TM_FailureData* failure,
                              IndexUpdate* indexes) {
  LockTupleMode lock_mode;
#if PG_VERSION_NUM >= 160000
  TU_UpdateIndexes update = TU_None;
  TM_Result result = table_tuple_update(heap, tid, slot, command, InvalidSnapshot, InvalidSnapshot,
                                        wait, failure, &lock_mode, &update);
  *indexes = update == TU_All           ? IndexUpdate::kAll
             : update == TU_Summarizing ? IndexUpdate::kSummarizing
                                        : IndexUpdate::kNone;
#else
  bool update = false;
  TM_Result result = table_tuple_update(heap, tid, slot, command, InvalidSnapshot, InvalidSnapshot,
                                        wait, failure, &lock_mode, &update);
  *indexes = update ? IndexUpdate::kAll : IndexUpdate::kNone;
#endif
  return result;
}

// 18 can log a lock not obtained; these polls fail often on purpose, so they do not.
inline bool conditional_xact_lock_wait(TransactionId xid) {
#if PG_VERSION_NUM >= 180000
  return ConditionalXactLockTableWait(xid, false);
#else
  return ConditionalXactLockTableWait(xid);
#endif
}

// This backend's slot among MaxBackends, from 0: MyBackendId (1-based) became
// MyProcNumber (0-based) in 17.
inline int backend_slot() {
#if PG_VERSION_NUM >= 170000
  return MyProcNumber;
#else
  return MyBackendId - 1;
#endif
}

// The i-th (1-based) entry of this backend's snapshot of backend statuses; renamed in 16.
inline LocalPgBackendStatus* local_backend_status(int i) {
#if PG_VERSION_NUM >= 160000
  return pgstat_get_local_beentry_by_index(i);
#else
  return pgstat_fetch_stat_local_beentry(i);
#endif
}

// Whether `user` may create objects in `tablespace`; the per-kind ACL checks became
// object_aclcheck in 16.
inline bool may_create_in_tablespace(Oid tablespace, Oid user) {
#if PG_VERSION_NUM >= 160000
  return object_aclcheck(TableSpaceRelationId, tablespace, user, ACL_CREATE) == ACLCHECK_OK;
#else
  return pg_tablespace_aclcheck(tablespace, user, ACL_CREATE) == ACLCHECK_OK;
#endif
}

// Whether `user` may execute `function`; object_aclcheck in 16 too.
inline bool may_execute(Oid function, Oid user) {
#if PG_VERSION_NUM >= 160000
  return object_aclcheck(ProcedureRelationId, function, user, ACL_EXECUTE) == ACLCHECK_OK;
#else
  return pg_proc_aclcheck(function, user, ACL_EXECUTE) == ACLCHECK_OK;
#endif
}

// Whether `value` (of the domain's base type) passes the domain's constraints, without an
// error when it does not: 17 added domain_check_safe. Before, every value is taken as
// passing (Citus, the one caller, runs on 17 and 18 only). `extra` caches the domain's
// constraints between calls (NULL at first), in `context`.
inline bool domain_accepts(Datum value, Oid domain, void** extra, MemoryContext context) {
#if PG_VERSION_NUM >= 170000
  ErrorSaveContext refused = {T_ErrorSaveContext};
  return domain_check_safe(value, false, domain, extra, context, reinterpret_cast<Node*>(&refused));
#else
  (void)value;
  (void)domain;
  (void)extra;
  (void)context;
  return true;
#endif
}

}  // namespace idempotency::compat
