// Module entry: settings, transaction callbacks, the utility hook and, when preloaded,
// the reaper.
#include "pg/keys/error_hints.hpp"
#include "pg/common/errors.hpp"
#include "pg/common/guc.hpp"
#include "pg/module/shmem.hpp"
#include "pg/worker/worker.hpp"
#include "pg/keys/xact.hpp"

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
