// The background worker's state in shared memory: an entry per database with the
// extension (the reaper serving it, the figures behind idem_stats), the database each
// backend's command needs to itself (a pause), and the launcher's pid. Used by the
// launcher, the reapers and the utility hook; it calls none of them.
#pragma once

#include "pg/worker/worker.hpp"

extern "C" {
#include "nodes/pg_list.h"
}

namespace idempotency {

// Whether the library was preloaded (else there is no shared state).
bool worker_state_ready();

// The launcher.
void set_launcher_pid(pid_t pid);
// Forgets entries of databases that are gone, so the table does not fill up.
void prune_entries(List* databases);
// Logs that the last pass left databases unserved for a full table: once per pass,
// and at most once a minute.
void report_unserved(TimestampTz now);

// A reaper. Registers this process as the database's worker unless the database is
// paused or served already, or the table is full (counted for the launcher's log).
bool claim_database(Oid database);
// Its entry is freed as it leaves (it found no extension).
void note_extension_missing();
// A before_shmem_exit callback: the database is no longer being served.
void forget_worker(int, Datum database);
// Adds one pass's figures to the current database's entry.
void record_pass(const PassResult& result, TimestampTz now);

// The utility hook. This backend's pause slot; pausing stops the database's reaper.
Oid& own_pause();
void pause_database(Oid database);
// A pg_on_exit_callback, so that it can run at a FATAL exit too.
void unpause_database(int, Datum);

}  // namespace idempotency
