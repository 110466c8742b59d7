// The idempotency.* settings.
#pragma once

namespace idempotency {

struct Settings {
  int default_ttl_s;       // idempotency.default_ttl
  int wait_timeout_ms;     // idempotency.wait_timeout
  int max_response_bytes;  // idempotency.max_response_size
  bool reaper_enabled;     // idempotency.reaper_enabled
  int reaper_naptime_ms;   // idempotency.reaper_naptime
  int reaper_batch_size;   // idempotency.reaper_batch_size
  int max_workers;         // idempotency.max_workers
  int outbox_retention_s;  // idempotency.outbox_retention
};

extern Settings settings;

void define_settings();

// SQL the extension writes and runs through SPI resolves its names with search_path
// = pg_catalog, pg_temp, never the caller's, which could put another role's function,
// operator or relation first. pin_search_path returns the GUC nest level to give
// restore_search_path; an error unwinds it with the (sub)transaction.
int pin_search_path();
void restore_search_path(int level);

}  // namespace idempotency
