// The per-database reaper: a short-lived worker the launcher starts for one
// database. It connects unless the database is paused, leaves at once if the
// extension is not installed there, else runs one pass in batches of short
// transactions (src/pg/reaper_pass decides row by row) and exits: no connection
// outlives its pass. Also the pass of idem_reap, in the caller's transaction.
#include "pg/common/compat.hpp"
#include "pg/common/errors.hpp"
#include "pg/common/guc.hpp"
#include "pg/worker/reaper_pass.hpp"
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

enum class Sweep { kExpired, kDroppedRoles, kStale, kMessaging };

// One batch over the `n`th store of this node (local_stores: idempotency.keys, then
// its shards of the distributed store); false when there is no such store. Shard
// moves need no lock here: what a batch deletes or abandons has expired or gone
// stale, and a change lost with a moved shard's old copy is made again on the new one.
static bool sweep_once(Sweep sweep, int n, int64 max_rows, ReapPosition* position,
                       int64* changed_out) {
  *changed_out = 0;
  if (sweep == Sweep::kMessaging) {
    Snapshot snapshot = RegisterSnapshot(GetLatestSnapshot());
    bool found = sweep_messaging(n, snapshot, GetCurrentTimestamp(), max_rows, changed_out);
    UnregisterSnapshot(snapshot);
    return found;
  }
  StoreOids* stores;
  if (n >= local_stores(&stores)) return false;
  KeyStore store;
  store_open(&store, stores[n], true);
  Snapshot snapshot = RegisterSnapshot(GetLatestSnapshot());
  TimestampTz now = GetCurrentTimestamp();
  int64 changed = 0;
  switch (sweep) {
    case Sweep::kExpired: changed = sweep_expired(&store, snapshot, now, max_rows, position); break;
    case Sweep::kDroppedRoles: changed = sweep_dropped_roles(&store, snapshot, max_rows); break;
    case Sweep::kStale: changed = sweep_stale(&store, snapshot, now, max_rows); break;
    case Sweep::kMessaging: break;
  }
  UnregisterSnapshot(snapshot);
  store_close(&store);
  *changed_out = changed;
  return true;
}

// Whether a client backend other than this process is running a statement.
static bool clients_running() {
  int backends = pgstat_fetch_stat_numbackends();
  for (int i = 1; i <= backends; i++) {
    LocalPgBackendStatus* local = compat::local_backend_status(i);
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
// long as each batch took, so that it works a tenth of the time: deletions are
// WAL-heavy (a full-page image of each heap page after a checkpoint), and on a busy
// server every moment the worker works is taken from the clients. On an idle server
// the batches follow one another at full speed.
static int64 sweep_in_batches(Sweep sweep) {
  constexpr int64 kBusyRestFactor = 9;
  int64 total = 0;
  int n = 0;  // the store
  ReapPosition position;
  for (;;) {
    int64 batch = settings.reaper_batch_size;
    TimestampTz started = GetCurrentTimestamp();
    StartTransactionCommand();
    int64 changed;
    bool swept = sweep_once(sweep, n, batch, &position, &changed);
    bool busy = clients_running();
    CommitTransactionCommand();
    total += changed;
    CHECK_FOR_INTERRUPTS();
    if (!swept) return total;
    if (changed < batch) {  // this store is done: the next one
      n++;
      position = ReapPosition{};
      continue;
    }
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
    result.deleted = sweep_in_batches(Sweep::kExpired) + sweep_in_batches(Sweep::kDroppedRoles) +
                     sweep_in_batches(Sweep::kMessaging);
    result.abandoned = sweep_in_batches(Sweep::kStale);
  } else {
    // Every store in turn, within the caller's max_rows.
    auto sweep_all = [](Sweep sweep, int64 limit) {
      int64 total = 0, changed;
      ReapPosition position;
      for (int n = 0; total < limit && sweep_once(sweep, n, limit - total, &position, &changed);
           n++) {
        total += changed;
        position = ReapPosition{};
        CommandCounterIncrement();
      }
      return total;
    };
    result.deleted = sweep_all(Sweep::kExpired, max_rows);
    result.deleted += sweep_all(Sweep::kDroppedRoles, max_rows - result.deleted);
    result.abandoned = sweep_all(Sweep::kStale, PG_INT64_MAX);
    result.deleted += sweep_all(Sweep::kMessaging, max_rows - result.deleted);
  }
  TimestampTz now = GetCurrentTimestamp();
  result.ms = (now - started) / 1000;
  record_pass(result, now);
  return result;
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
  bool installed = OidIsValid(get_extension_oid("idempotency", true));
  CommitTransactionCommand();
  if (!installed) {
    note_extension_missing();  // its entry is freed as it leaves
    proc_exit(0);
  }

  pgstat_report_activity(STATE_RUNNING, "reaping expired idempotency keys");
  PassResult result = reap_current_database(true, 0);
  if (result.deleted > 0 || result.abandoned > 0)
    elog(DEBUG1, "idempotency reaper deleted %lld keys and abandoned %lld stale claims in %lld ms",
         static_cast<long long>(result.deleted), static_cast<long long>(result.abandoned),
         static_cast<long long>(result.ms));
  proc_exit(0);
}

}  // namespace idempotency

extern "C" {
PGDLLEXPORT void idem_reaper_main(Datum argument);
void idem_reaper_main(Datum argument) {
  idempotency::guarded([argument] { idempotency::reaper_main(argument); });
}
}
