// The background reaper: a launcher that serves every database with the extension,
// short-lived per-database workers, the hooks that keep database commands working,
// and the shared counters behind idem_stats.
#pragma once

#include "pg/common/postgres.hpp"

extern "C" {
#include "utils/timestamp.h"
}

namespace idempotency {

// From _PG_init while shared_preload_libraries is processed: the launcher (shared
// memory is shmem.cpp's).
void register_background_worker();
// From _PG_init, preloaded or not (utility_hook.cpp).
void install_utility_hook();

// The launcher's and workers' shared state, for shmem.cpp.
Size worker_state_size();
void attach_worker_state(void* memory, bool initialize);

// Shared figures for the current database; false without the preloaded library.
struct ReaperStats {
  int64 reaped_total;
  int64 reclaimed_total;
  TimestampTz last_reap_at;  // 0 when no pass ran yet
  int64 last_reap_ms;
  pid_t launcher_pid;  // 0 while no launcher runs (a standby, or between restarts)
  bool table_room;     // this database holds an entry of the table, or could get one
};
bool reaper_stats(ReaperStats* stats);

// Rows deleted and claims marked abandoned by one pass.
struct PassResult {
  int64 deleted;
  int64 abandoned;
  int64 ms;  // how long the pass took
};

// One pass in the current database. With own_transactions each batch of
// idempotency.reaper_batch_size rows commits on its own (the worker); without, the
// pass runs in the caller's transaction and stops after max_rows deletions (idem_reap).
PassResult reap_current_database(bool own_transactions, int64 max_rows);

}  // namespace idempotency
