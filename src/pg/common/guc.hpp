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

}  // namespace idempotency
