// The library's shared memory: one request hook and one startup hook for all of it,
// chained to the hooks of libraries loaded before (as pg_stat_statements does). Only
// a preloaded library has shared memory.
#pragma once

#include "pg/common/postgres.hpp"

namespace idempotency {

// From _PG_init while shared_preload_libraries is processed.
void install_shared_memory_hooks();

}  // namespace idempotency
