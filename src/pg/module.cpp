// Module entry: settings, transaction callbacks and, when preloaded, the reaper.
#include "pg/guc.hpp"
#include "pg/worker.hpp"
#include "pg/xact.hpp"

extern "C" {
#include "miscadmin.h"

PG_MODULE_MAGIC;

void _PG_init(void) {
  idempotency::define_settings();
  idempotency::install_transaction_callbacks();
  // The reaper needs shared memory, which only a preloaded library can have.
  if (process_shared_preload_libraries_in_progress) idempotency::register_background_worker();
}
}
