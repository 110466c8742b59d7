// The reaper. A launcher, connected to no database, lists the databases every
// naptime and starts one short-lived worker per database (at most
// idempotency.max_workers at once). A worker connects, leaves at once if the
// extension is not installed there, else deletes expired keys and marks stale
// leases abandoned in batches of short transactions, and exits: no connection
// outlives its pass. DROP DATABASE and the other commands that need a database to
// themselves pause it and stop its worker first (utility hook).
#include "pg/worker.hpp"

#include <csignal>

#include "pg/errors.hpp"
#include "pg/guc.hpp"
#include "pg/reaper_pass.hpp"

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
#include "storage/backendid.h"
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

// Entries are kept for databases with the extension, and for a database while a
// worker checks it; the table does not fill with databases without the extension.
constexpr int kMaxDatabases = 128;

struct DatabaseState {
  Oid database;      // InvalidOid: a free entry
  pid_t worker_pid;  // the worker serving it now, or 0
  int64 reaped_total;
  int64 reclaimed_total;
  TimestampTz last_reap_at;
  int64 last_reap_ms;
};

struct SharedState {
  slock_t mutex;
  pid_t launcher_pid;
  int unserved;  // workers turned away by a full table, for the launcher to report
  DatabaseState databases[kMaxDatabases];
  // The database each backend's command needs to itself, by MyBackendId - 1: one
  // slot per backend, so that a pause can always be recorded.
  Oid paused[FLEXIBLE_ARRAY_MEMBER];
};

static Size shared_size() {
  return add_size(offsetof(SharedState, paused), mul_size(MaxBackends, sizeof(Oid)));
}

static SharedState* shared;  // null unless the library was preloaded
static ProcessUtility_hook_type previous_process_utility;

// The entry for `database`, made if `create`; null if absent or the table is full.
// Call with the mutex held.
static DatabaseState* database_entry(Oid database, bool create) {
  DatabaseState* free_entry = nullptr;
  for (DatabaseState& entry : shared->databases) {
    if (entry.database == database) return &entry;
    if (free_entry == nullptr && entry.database == InvalidOid) free_entry = &entry;
  }
  if (!create || free_entry == nullptr) return nullptr;
  *free_entry = DatabaseState{};
  free_entry->database = database;
  return free_entry;
}

// ---------------------------------------------------------------------------
// Shared memory
// ---------------------------------------------------------------------------

Size worker_state_size() { return shared_size(); }

void attach_worker_state(void* memory, bool initialize) {
  shared = static_cast<SharedState*>(memory);
  if (initialize) {
    memset(shared, 0, shared_size());
    SpinLockInit(&shared->mutex);
  }
}

bool reaper_stats(ReaperStats* stats) {
  if (shared == nullptr) return false;
  *stats = ReaperStats{};
  SpinLockAcquire(&shared->mutex);
  stats->worker_pid = shared->launcher_pid;
  if (DatabaseState* entry = database_entry(MyDatabaseId, false)) {
    stats->reaped_total = entry->reaped_total;
    stats->reclaimed_total = entry->reclaimed_total;
    stats->last_reap_at = entry->last_reap_at;
    stats->last_reap_ms = entry->last_reap_ms;
  }
  SpinLockRelease(&shared->mutex);
  return true;
}

static void record_pass(const PassResult& result, TimestampTz now) {
  if (shared == nullptr) return;
  SpinLockAcquire(&shared->mutex);
  if (DatabaseState* entry = database_entry(MyDatabaseId, true)) {
    entry->reaped_total += result.deleted;
    entry->reclaimed_total += result.abandoned;
    entry->last_reap_at = now;
    entry->last_reap_ms = result.ms;
  }
  SpinLockRelease(&shared->mutex);
}

// ---------------------------------------------------------------------------
// One pass over the current database
// ---------------------------------------------------------------------------

enum class Sweep { kExpired, kDroppedRoles, kStale };

static int64 sweep_once(Sweep sweep, int64 max_rows, ReapPosition* position) {
  KeyStore store;
  store_open(&store, true);
  Snapshot snapshot = RegisterSnapshot(GetLatestSnapshot());
  TimestampTz now = GetCurrentTimestamp();
  int64 changed = 0;
  switch (sweep) {
    case Sweep::kExpired:
      changed = sweep_expired(&store, snapshot, now, max_rows, position);
      break;
    case Sweep::kDroppedRoles:
      changed = sweep_dropped_roles(&store, snapshot, max_rows);
      break;
    case Sweep::kStale: changed = sweep_stale(&store, snapshot, now, max_rows); break;
  }
  UnregisterSnapshot(snapshot);
  store_close(&store);
  return changed;
}

// Whether a client backend other than this process is running a statement.
static bool clients_running() {
  int backends = pgstat_fetch_stat_numbackends();
  for (int i = 1; i <= backends; i++) {
    LocalPgBackendStatus* local = pgstat_fetch_stat_local_beentry(i);
    if (local == nullptr) continue;
    const PgBackendStatus& backend = local->backendStatus;
    if (backend.st_backendType == B_BACKEND && backend.st_procpid != MyProcPid &&
        backend.st_state == STATE_RUNNING)
      return true;
  }
  return false;
}

// Batches of short transactions until a batch finds less than a full batch to do.
// While clients are running statements, the worker rests kBusyRestFactor times as
// long as each batch took: deletions are WAL-heavy (a full-page image of each heap
// page after a checkpoint) and the clients' commits would queue behind them. On an
// idle server the batches follow one another at full speed.
static int64 sweep_in_batches(Sweep sweep) {
  constexpr int64 kBusyRestFactor = 4;
  int64 total = 0;
  ReapPosition position;
  for (;;) {
    int64 batch = settings.reaper_batch_size;
    TimestampTz started = GetCurrentTimestamp();
    StartTransactionCommand();
    int64 changed = sweep_once(sweep, batch, &position);
    bool busy = clients_running();
    CommitTransactionCommand();
    total += changed;
    CHECK_FOR_INTERRUPTS();
    if (changed < batch) return total;
    if (busy) {
      long rest_ms = (GetCurrentTimestamp() - started) * kBusyRestFactor / 1000;
      (void)WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH, Max(rest_ms, 1),
                      PG_WAIT_EXTENSION);
      ResetLatch(MyLatch);
      CHECK_FOR_INTERRUPTS();
    }
  }
}

PassResult reap_current_database(bool own_transactions, int64 max_rows) {
  TimestampTz started = GetCurrentTimestamp();
  PassResult result{};
  if (own_transactions) {
    result.deleted = sweep_in_batches(Sweep::kExpired) + sweep_in_batches(Sweep::kDroppedRoles);
    result.abandoned = sweep_in_batches(Sweep::kStale);
  } else {
    ReapPosition position;
    result.deleted = sweep_once(Sweep::kExpired, max_rows, &position);
    CommandCounterIncrement();
    result.deleted += sweep_once(Sweep::kDroppedRoles, max_rows - result.deleted, &position);
    CommandCounterIncrement();
    result.abandoned = sweep_once(Sweep::kStale, PG_INT64_MAX, &position);
  }
  TimestampTz now = GetCurrentTimestamp();
  result.ms = (now - started) / 1000;
  record_pass(result, now);
  return result;
}

// ---------------------------------------------------------------------------
// The per-database worker
// ---------------------------------------------------------------------------

// Set when this worker finds no extension: its entry is freed as it leaves.
static bool extension_missing = false;

static void forget_worker(int, Datum database) {
  SpinLockAcquire(&shared->mutex);
  DatabaseState* entry = database_entry(DatumGetObjectId(database), false);
  if (entry != nullptr && entry->worker_pid == MyProcPid) {
    entry->worker_pid = 0;
    if (extension_missing) *entry = DatabaseState{};
  }
  SpinLockRelease(&shared->mutex);
}

// Whether a backend's command needs `database` to itself. Call with the mutex held.
static bool database_paused(Oid database) {
  for (int i = 0; i < MaxBackends; i++)
    if (shared->paused[i] == database) return true;
  return false;
}

// Registers this process as the database's worker unless the database is paused or
// served already, or the table is full (counted for the launcher's log).
static bool claim_database(Oid database) {
  bool ours = false;
  SpinLockAcquire(&shared->mutex);
  if (!database_paused(database)) {
    DatabaseState* entry = database_entry(database, true);
    if (entry == nullptr) shared->unserved++;
    ours = entry != nullptr && entry->worker_pid == 0;
    if (ours) entry->worker_pid = MyProcPid;
  }
  SpinLockRelease(&shared->mutex);
  return ours;
}

static void reaper_main(Datum argument) {
  Oid database = DatumGetObjectId(argument);
  pqsignal(SIGHUP, SignalHandlerForConfigReload);
  pqsignal(SIGTERM, die);
  BackgroundWorkerUnblockSignals();
  if (!claim_database(database)) proc_exit(0);
  before_shmem_exit(forget_worker, ObjectIdGetDatum(database));
  BackgroundWorkerInitializeConnectionByOid(database, InvalidOid, 0);

  StartTransactionCommand();
  extension_missing = !OidIsValid(get_extension_oid("idempotency", true));
  CommitTransactionCommand();
  if (extension_missing) proc_exit(0);

  pgstat_report_activity(STATE_RUNNING, "reaping expired idempotency keys");
  PassResult result = reap_current_database(true, 0);
  if (result.deleted > 0 || result.abandoned > 0)
    elog(DEBUG1, "idempotency reaper deleted %lld keys and abandoned %lld stale claims in %lld ms",
         static_cast<long long>(result.deleted), static_cast<long long>(result.abandoned),
         static_cast<long long>(result.ms));
  proc_exit(0);
}

// ---------------------------------------------------------------------------
// The launcher
// ---------------------------------------------------------------------------

// Connectable, non-template databases, as a list of OIDs in `context`.
static List* list_databases(MemoryContext context) {
  List* databases = NIL;
  StartTransactionCommand();
  Relation rel = table_open(DatabaseRelationId, AccessShareLock);
  TableScanDesc scan = table_beginscan_catalog(rel, 0, nullptr);
  HeapTuple tuple;
  while ((tuple = heap_getnext(scan, ForwardScanDirection)) != nullptr) {
    Form_pg_database form = reinterpret_cast<Form_pg_database>(GETSTRUCT(tuple));
    if (form->datistemplate || !form->datallowconn || database_is_invalid_form(form)) continue;
    MemoryContext old = MemoryContextSwitchTo(context);
    databases = lappend_oid(databases, form->oid);
    MemoryContextSwitchTo(old);
  }
  table_endscan(scan);
  table_close(rel, AccessShareLock);
  CommitTransactionCommand();
  return databases;
}

// Forgets entries of databases that are gone, so the table does not fill up.
static void prune_entries(List* databases) {
  SpinLockAcquire(&shared->mutex);
  for (DatabaseState& entry : shared->databases)
    if (entry.database != InvalidOid && entry.worker_pid == 0 &&
        !list_member_oid(databases, entry.database))
      entry = DatabaseState{};
  SpinLockRelease(&shared->mutex);
}

// Logs that the last pass left databases unserved for a full table: once per pass,
// and at most once a minute.
static void report_unserved(TimestampTz now) {
  static TimestampTz last_report = 0;
  SpinLockAcquire(&shared->mutex);
  int unserved = shared->unserved;
  shared->unserved = 0;
  SpinLockRelease(&shared->mutex);
  if (unserved == 0 || !TimestampDifferenceExceeds(last_report, now, 60 * 1000)) return;
  last_report = now;
  ereport(LOG,
          errmsg_plural("idempotency reaper could not serve %d database in its last pass",
                        "idempotency reaper could not serve %d databases in its last pass",
                        unserved, unserved),
          errdetail("It keeps state for at most %d databases with the extension.", kMaxDatabases),
          errhint("Drop the extension where it is not used, or call idem_reap() in the "
                  "databases the reaper does not serve."));
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

static void launcher_main(Datum) {
  pqsignal(SIGHUP, SignalHandlerForConfigReload);
  pqsignal(SIGTERM, die);
  BackgroundWorkerUnblockSignals();
  BackgroundWorkerInitializeConnection(nullptr, nullptr, 0);
  SpinLockAcquire(&shared->mutex);
  shared->launcher_pid = MyProcPid;
  SpinLockRelease(&shared->mutex);

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
      pending = settings.reaper_enabled ? list_databases(pass_context) : NIL;
      prune_entries(pending);
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

// ---------------------------------------------------------------------------
// Database commands that need the database to themselves
// ---------------------------------------------------------------------------

// What a command that needs a database to itself does with it.
enum class Use { kDrop, kRename, kMove, kCopy };

// The string value of option `name`, or null.
static const char* option_string(List* options, const char* name) {
  ListCell* cell;
  foreach (cell, options) {
    DefElem* option = lfirst_node(DefElem, cell);
    if (strcmp(option->defname, name) == 0 && option->arg != nullptr) return defGetString(option);
  }
  return nullptr;
}

// Whether the command passes the checks dbcommands.c makes before it waits for the
// database's sessions to leave. `argument`: the new name, the tablespace, or the new
// database's name for kCopy.
static bool command_will_wait(Form_pg_database database, Use use, const char* argument) {
  Oid user = GetUserId();
  bool owner = has_privs_of_role(user, database->datdba);  // true for a superuser
  switch (use) {
    case Use::kDrop: return owner;
    case Use::kRename:
      return owner && have_createdb_privilege() && !OidIsValid(get_database_oid(argument, true));
    case Use::kMove: {
      Oid tablespace = get_tablespace_oid(argument, true);
      return owner && OidIsValid(tablespace) && tablespace != database->dattablespace &&
             pg_tablespace_aclcheck(tablespace, user, ACL_CREATE) == ACLCHECK_OK;
    }
    case Use::kCopy:
      return have_createdb_privilege() && (database->datistemplate || owner) &&
             !OidIsValid(get_database_oid(argument, true));
  }
  return false;
}

// The database a DROP, RENAME, SET TABLESPACE or CREATE ... TEMPLATE needs alone, if
// the command will get as far as waiting for it. Any other statement, and one that
// will fail a permission check, leaves the worker alone: an unprivileged role
// looping one must not stop the reaper.
static Oid database_needed_alone(Node* statement) {
  const char* name = nullptr;
  const char* argument = nullptr;
  Use use = Use::kDrop;
  switch (nodeTag(statement)) {
    case T_DropdbStmt: name = castNode(DropdbStmt, statement)->dbname; break;
    case T_AlterDatabaseStmt: {
      AlterDatabaseStmt* alter = castNode(AlterDatabaseStmt, statement);
      argument = option_string(alter->options, "tablespace");
      if (argument != nullptr) name = alter->dbname;  // no other option needs it alone
      use = Use::kMove;
      break;
    }
    case T_RenameStmt: {
      RenameStmt* rename = castNode(RenameStmt, statement);
      if (rename->renameType == OBJECT_DATABASE) name = rename->subname;
      argument = rename->newname;
      use = Use::kRename;
      break;
    }
    case T_CreatedbStmt: {
      CreatedbStmt* create = castNode(CreatedbStmt, statement);
      name = option_string(create->options, "template");
      argument = create->dbname;
      use = Use::kCopy;
      break;
    }
    default: break;
  }
  Oid database = name == nullptr ? InvalidOid : get_database_oid(name, true);
  // On the current database each of these commands fails: this session is in it.
  if (!OidIsValid(database) || database == MyDatabaseId) return InvalidOid;
  HeapTuple tuple = SearchSysCache1(DATABASEOID, ObjectIdGetDatum(database));
  if (!HeapTupleIsValid(tuple)) return InvalidOid;
  bool waits =
      command_will_wait(reinterpret_cast<Form_pg_database>(GETSTRUCT(tuple)), use, argument);
  ReleaseSysCache(tuple);
  return waits ? database : InvalidOid;
}

// This backend's pause slot.
static Oid& own_pause() {
  if (MyBackendId < 1 || MyBackendId > MaxBackends)
    elog(ERROR, "backend id %d out of range for the idempotency reaper", MyBackendId);
  return shared->paused[MyBackendId - 1];
}

// Pauses `database` and stops its worker. The command itself waits a few seconds
// for other sessions to leave; a paused database gets no new worker.
static void pause_database(Oid database) {
  Oid& pause = own_pause();
  pid_t worker = 0;
  SpinLockAcquire(&shared->mutex);
  pause = database;
  if (DatabaseState* entry = database_entry(database, false)) worker = entry->worker_pid;
  SpinLockRelease(&shared->mutex);
  if (worker != 0) kill(worker, SIGTERM);
}

// A pg_on_exit_callback, so that it can run at a FATAL exit too.
static void unpause_database(int, Datum) {
  Oid& pause = own_pause();
  SpinLockAcquire(&shared->mutex);
  pause = InvalidOid;
  SpinLockRelease(&shared->mutex);
}

static void run_utility(PlannedStmt* statement, const char* query, bool read_only_tree,
                        ProcessUtilityContext context, ParamListInfo params,
                        QueryEnvironment* environment, DestReceiver* destination,
                        QueryCompletion* completion) {
  if (previous_process_utility)
    previous_process_utility(statement, query, read_only_tree, context, params, environment,
                             destination, completion);
  else
    standard_ProcessUtility(statement, query, read_only_tree, context, params, environment,
                            destination, completion);
}

static void process_utility(PlannedStmt* statement, const char* query, bool read_only_tree,
                            ProcessUtilityContext context, ParamListInfo params,
                            QueryEnvironment* environment, DestReceiver* destination,
                            QueryCompletion* completion) {
  Oid database = shared != nullptr ? database_needed_alone(statement->utilityStmt) : InvalidOid;
  // One pause per session: a nested command (PostgreSQL's own have none) runs under
  // the outer one's.
  if (!OidIsValid(database) || OidIsValid(own_pause())) {
    run_utility(statement, query, read_only_tree, context, params, environment, destination,
                completion);
    return;
  }
  pause_database(database);
  // Not PG_FINALLY: a FATAL exit (pg_terminate_backend while the command waits for
  // the database's sessions) skips it and would leave the database paused for good.
  PG_ENSURE_ERROR_CLEANUP(unpause_database, 0);
  {
    run_utility(statement, query, read_only_tree, context, params, environment, destination,
                completion);
  }
  PG_END_ENSURE_ERROR_CLEANUP(unpause_database, 0);
  unpause_database(0, 0);
}

void register_background_worker() {
  previous_process_utility = ProcessUtility_hook;
  ProcessUtility_hook = process_utility;

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

// Background worker entry points: plain C, called by the postmaster's children.
extern "C" {
PGDLLEXPORT void idem_launcher_main(Datum argument);
PGDLLEXPORT void idem_reaper_main(Datum argument);
void idem_launcher_main(Datum argument) { idempotency::launcher_main(argument); }
void idem_reaper_main(Datum argument) { idempotency::reaper_main(argument); }
}
