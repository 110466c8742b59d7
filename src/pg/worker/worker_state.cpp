#include "pg/worker/worker_state.hpp"

#include "pg/common/compat.hpp"

#include <csignal>

extern "C" {
#include "miscadmin.h"
#include "storage/spin.h"
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
  // The database each backend's command needs to itself, by backend slot: one
  // slot per backend, so that a pause can always be recorded.
  Oid paused[FLEXIBLE_ARRAY_MEMBER];
};

static Size shared_size() {
  return add_size(offsetof(SharedState, paused), mul_size(MaxBackends, sizeof(Oid)));
}

static SharedState* shared;  // null unless the library was preloaded

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
  DatabaseState* entry = database_entry(MyDatabaseId, false);
  if (entry != nullptr) {
    stats->reaped_total = entry->reaped_total;
    stats->reclaimed_total = entry->reclaimed_total;
    stats->last_reap_at = entry->last_reap_at;
    stats->last_reap_ms = entry->last_reap_ms;
  }
  // A worker can serve this database when it holds an entry or the table has room.
  bool room = entry != nullptr;
  for (const DatabaseState& other : shared->databases) room |= other.database == InvalidOid;
  stats->launcher_pid = shared->launcher_pid;
  stats->table_room = room;
  SpinLockRelease(&shared->mutex);
  return true;
}

void record_pass(const PassResult& result, TimestampTz now) {
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

// Set when this worker finds no extension: its entry is freed as it leaves.
static bool extension_missing = false;

void note_extension_missing() { extension_missing = true; }

void forget_worker(int, Datum database) {
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
bool claim_database(Oid database) {
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

// Forgets entries of databases that are gone, so the table does not fill up.
void prune_entries(List* databases) {
  SpinLockAcquire(&shared->mutex);
  for (DatabaseState& entry : shared->databases)
    if (entry.database != InvalidOid && entry.worker_pid == 0 &&
        !list_member_oid(databases, entry.database))
      entry = DatabaseState{};
  SpinLockRelease(&shared->mutex);
}

// Logs that the last pass left databases unserved for a full table: once per pass,
// and at most once a minute.
void report_unserved(TimestampTz now) {
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

// This backend's pause slot.
Oid& own_pause() {
  int slot = compat::backend_slot();
  if (slot < 0 || slot >= MaxBackends)
    elog(ERROR, "backend slot %d out of range for the idempotency reaper", slot);
  return shared->paused[slot];
}

// Pauses `database` and stops its worker. The command itself waits a few seconds
// for other sessions to leave; a paused database gets no new worker.
void pause_database(Oid database) {
  Oid& pause = own_pause();
  pid_t worker = 0;
  SpinLockAcquire(&shared->mutex);
  pause = database;
  if (DatabaseState* entry = database_entry(database, false)) worker = entry->worker_pid;
  SpinLockRelease(&shared->mutex);
  if (worker != 0) kill(worker, SIGTERM);
}

// A pg_on_exit_callback, so that it can run at a FATAL exit too.
void unpause_database(int, Datum) {
  Oid& pause = own_pause();
  SpinLockAcquire(&shared->mutex);
  pause = InvalidOid;
  SpinLockRelease(&shared->mutex);
}

void set_launcher_pid(pid_t pid) {
  SpinLockAcquire(&shared->mutex);
  shared->launcher_pid = pid;
  SpinLockRelease(&shared->mutex);
}

bool worker_state_ready() { return shared != nullptr; }

}  // namespace idempotency
