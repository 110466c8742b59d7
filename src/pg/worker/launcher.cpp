// The launcher: connected to no database, it lists the connectable databases every
// naptime and starts one short-lived reaper per database (at most
// idempotency.max_workers at once). Its states are written down in src/pg/README.md.
#include "pg/common/errors.hpp"
#include "pg/common/guc.hpp"
#include "pg/worker/worker.hpp"
#include "pg/worker/worker_state.hpp"

extern "C" {
#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "access/xact.h"
#include "catalog/pg_database.h"
#include "commands/dbcommands.h"
#include "commands/defrem.h"
#include "commands/extension.h"
#include "commands/tablespace.h"
#include "miscadmin.h"
#include "nodes/parsenodes.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/lwlock.h"
#include "storage/proc.h"
#include "storage/shmem.h"
#include "storage/spin.h"
#include "tcop/utility.h"
#include "utils/acl.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"
}

namespace idempotency {

// The databases of pg_database as lists of OIDs in `context`: all of them in *existing,
// and in *servable those a reaper can serve (connectable, not templates).
static void list_databases(MemoryContext context, List** existing, List** servable) {
  *existing = *servable = NIL;
  StartTransactionCommand();
  Relation rel = table_open(DatabaseRelationId, AccessShareLock);
  TableScanDesc scan = table_beginscan_catalog(rel, 0, nullptr);
  HeapTuple tuple;
  while ((tuple = heap_getnext(scan, ForwardScanDirection)) != nullptr) {
    Form_pg_database form = reinterpret_cast<Form_pg_database>(GETSTRUCT(tuple));
    bool can_serve = !form->datistemplate && form->datallowconn && !database_is_invalid_form(form);
    MemoryContext old = MemoryContextSwitchTo(context);
    *existing = lappend_oid(*existing, form->oid);
    if (can_serve) *servable = lappend_oid(*servable, form->oid);
    MemoryContextSwitchTo(old);
  }
  table_endscan(scan);
  table_close(rel, AccessShareLock);
  CommitTransactionCommand();
}

static BackgroundWorkerHandle* start_reaper(Oid database) {
  BackgroundWorker worker = {};
  snprintf(worker.bgw_name, BGW_MAXLEN, "idempotency reaper for database %u", database);
  snprintf(worker.bgw_type, BGW_MAXLEN, "idempotency reaper");
  snprintf(worker.bgw_library_name, BGW_MAXLEN, "idempotency");
  snprintf(worker.bgw_function_name, BGW_MAXLEN, "idem_reaper_main");
  worker.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
  worker.bgw_start_time = BgWorkerStart_RecoveryFinished;
  worker.bgw_restart_time = BGW_NEVER_RESTART;
  worker.bgw_main_arg = ObjectIdGetDatum(database);
  worker.bgw_notify_pid = MyProcPid;
  BackgroundWorkerHandle* handle = nullptr;
  if (!RegisterDynamicBackgroundWorker(&worker, &handle)) {
    ereport(LOG, errmsg("idempotency launcher could not start a reaper: no free worker slot"),
            errhint("Raise max_worker_processes."));
    return nullptr;
  }
  return handle;
}

// idem_stats reports no worker while no launcher runs (between a crash and its restart).
static void forget_launcher(int, Datum) { set_launcher_pid(0); }

static void launcher_main(Datum) {
  pqsignal(SIGHUP, SignalHandlerForConfigReload);
  pqsignal(SIGTERM, die);
  BackgroundWorkerUnblockSignals();
  BackgroundWorkerInitializeConnection(nullptr, nullptr, 0);
  set_launcher_pid(MyProcPid);
  before_shmem_exit(forget_launcher, 0);

  MemoryContext pass_context =
      AllocSetContextCreate(TopMemoryContext, "idempotency launcher pass", ALLOCSET_DEFAULT_SIZES);
  BackgroundWorkerHandle* running[64] = {};
  List* pending = NIL;
  TimestampTz last_pass = 0;
  for (;;) {
    CHECK_FOR_INTERRUPTS();
    if (ConfigReloadPending) {
      ConfigReloadPending = false;
      ProcessConfigFile(PGC_SIGHUP);
    }
    int busy = 0;
    for (BackgroundWorkerHandle*& handle : running) {
      pid_t pid;
      if (handle != nullptr && GetBackgroundWorkerPid(handle, &pid) == BGWH_STOPPED) {
        pfree(handle);
        handle = nullptr;
      }
      busy += handle != nullptr;
    }
    // Computed each time, so a reloaded naptime applies to the pass being waited for.
    TimestampTz next_pass = last_pass + static_cast<int64>(settings.reaper_naptime_ms) * 1000;
    TimestampTz now = GetCurrentTimestamp();
    if (pending == NIL && busy == 0 && now >= next_pass) {
      MemoryContextReset(pass_context);
      report_unserved(now);
      List* existing;
      list_databases(pass_context, &existing, &pending);
      // Only a dropped database's entry goes: the counters of a database that is not
      // served (a template, or passes switched off) count since server start.
      prune_entries(existing);
      if (!settings.reaper_enabled) pending = NIL;
      last_pass = now;
      next_pass = now + static_cast<int64>(settings.reaper_naptime_ms) * 1000;
    }
    for (BackgroundWorkerHandle*& handle : running) {
      if (pending == NIL || busy >= settings.max_workers) break;
      if (handle != nullptr) continue;
      Oid database = linitial_oid(pending);
      pending = list_delete_first(pending);
      MemoryContext old = MemoryContextSwitchTo(TopMemoryContext);
      handle = start_reaper(database);
      MemoryContextSwitchTo(old);
      busy += handle != nullptr;
    }
    // Woken by a worker's exit (bgw_notify_pid), a reload or the next pass.
    long timeout_ms = Max(1, TimestampDifferenceMilliseconds(GetCurrentTimestamp(), next_pass));
    (void)WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH, timeout_ms,
                    PG_WAIT_EXTENSION);
    ResetLatch(MyLatch);
  }
}

void register_background_worker() {
  // Not while pg_upgrade runs the server (-b, binary upgrade), as autovacuum does not:
  // it starts each cluster to read or restore the schema, and the new one again after
  // moving the data files, and nothing may change the store in between.
  if (IsBinaryUpgrade) return;
  BackgroundWorker launcher = {};
  snprintf(launcher.bgw_name, BGW_MAXLEN, "idempotency launcher");
  snprintf(launcher.bgw_type, BGW_MAXLEN, "idempotency launcher");
  snprintf(launcher.bgw_library_name, BGW_MAXLEN, "idempotency");
  snprintf(launcher.bgw_function_name, BGW_MAXLEN, "idem_launcher_main");
  launcher.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
  // Never on a standby: it starts when recovery ends, at promotion.
  launcher.bgw_start_time = BgWorkerStart_RecoveryFinished;
  launcher.bgw_restart_time = 1;
  RegisterBackgroundWorker(&launcher);
}

}  // namespace idempotency

extern "C" {
PGDLLEXPORT void idem_launcher_main(Datum argument);
void idem_launcher_main(Datum argument) {
  idempotency::guarded([argument] { idempotency::launcher_main(argument); });
}
}
