#include "pg/common/guc.hpp"

#include <climits>

#include "pg/common/postgres.hpp"

extern "C" {
#include "utils/guc.h"
}

namespace idempotency {

Settings settings = {24 * 60 * 60, 5000, 1024 * 1024, true, 10000, 10000, 1, 0};

void define_settings() {
  DefineCustomIntVariable("idempotency.default_ttl",
                          "Dedup window of a key when idem_claim is given no ttl.", nullptr,
                          &settings.default_ttl_s, settings.default_ttl_s, 1, INT_MAX, PGC_USERSET,
                          GUC_UNIT_S, nullptr, nullptr, nullptr);
  DefineCustomIntVariable("idempotency.wait_timeout",
                          "How long a claim waits for another transaction writing the same key.",
                          "0 means do not wait.", &settings.wait_timeout_ms,
                          settings.wait_timeout_ms, 0, INT_MAX, PGC_USERSET, GUC_UNIT_MS, nullptr,
                          nullptr, nullptr);
  DefineCustomIntVariable("idempotency.max_response_size",
                          "Largest response, error or checkpoint data a key may store.", nullptr,
                          &settings.max_response_bytes, settings.max_response_bytes, 0, INT_MAX,
                          PGC_USERSET, GUC_UNIT_BYTE, nullptr, nullptr, nullptr);
  DefineCustomBoolVariable("idempotency.reaper_enabled",
                           "Whether the background worker reaps expired keys and stale claims.",
                           nullptr, &settings.reaper_enabled, settings.reaper_enabled, PGC_SIGHUP,
                           0, nullptr, nullptr, nullptr);
  DefineCustomIntVariable("idempotency.reaper_naptime", "Time between the reaper's passes.",
                          nullptr, &settings.reaper_naptime_ms, settings.reaper_naptime_ms, 10,
                          INT_MAX, PGC_SIGHUP, GUC_UNIT_MS, nullptr, nullptr, nullptr);
  DefineCustomIntVariable("idempotency.reaper_batch_size",
                          "Rows the reaper changes per transaction.", nullptr,
                          &settings.reaper_batch_size, settings.reaper_batch_size, 1, INT_MAX,
                          PGC_SIGHUP, 0, nullptr, nullptr, nullptr);
  DefineCustomIntVariable(
      "idempotency.max_workers", "Reaper processes the launcher may run at once.", nullptr,
      &settings.max_workers, settings.max_workers, 1, 64, PGC_SIGHUP, 0, nullptr, nullptr, nullptr);
  DefineCustomIntVariable("idempotency.outbox_retention",
                          "How long delivered outbox events are kept before the worker removes "
                          "them.",
                          nullptr, &settings.outbox_retention_s, settings.outbox_retention_s, 0,
                          INT_MAX, PGC_SIGHUP, GUC_UNIT_S, nullptr, nullptr, nullptr);
  MarkGUCPrefixReserved("idempotency");
}

int pin_search_path() {
  int level = NewGUCNestLevel();
  (void)set_config_option("search_path", "pg_catalog, pg_temp", PGC_USERSET, PGC_S_SESSION,
                          GUC_ACTION_SAVE, true, 0, false);
  return level;
}

void restore_search_path(int level) { AtEOXact_GUC(true, level); }

}  // namespace idempotency
