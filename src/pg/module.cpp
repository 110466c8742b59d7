// Module entry: settings, transaction callbacks, the utility hook and, when preloaded,
// the reaper.
#include "pg/error_hints.hpp"
#include "pg/errors.hpp"
#include "pg/guc.hpp"
#include "pg/shmem.hpp"
#include "pg/worker.hpp"
#include "pg/xact.hpp"

extern "C" {
#include "miscadmin.h"

PG_MODULE_MAGIC;

void _PG_init(void) {
  idempotency::guarded([] {
    idempotency::define_settings();
    idempotency::install_transaction_callbacks();
    idempotency::install_utility_hook();
    idempotency::install_error_hints();
    // The reaper and the identity locks' insert counts need shared memory, which only
    // a preloaded library can have.
    if (process_shared_preload_libraries_in_progress) {
      idempotency::install_shared_memory_hooks();
      idempotency::register_background_worker();
    }
  });
}
}
