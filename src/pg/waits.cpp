#include "pg/waits.hpp"

#include "pg/compat.hpp"

extern "C" {
#include "miscadmin.h"
#include "storage/latch.h"
#include "storage/lmgr.h"
#include "utils/wait_event.h"
}

namespace idempotency {

// Short transactions usually end within a millisecond, so the first sleeps are
// short; the backoff caps at 5 ms.
bool sleep_before_retry(long* sleep_us, TimestampTz deadline) {
  TimestampTz now = GetCurrentTimestamp();
  if (now >= deadline) return false;
  long sleep = Min(*sleep_us, deadline - now);
  if (sleep < 1000) {
    pg_usleep(sleep);  // below WaitLatch's millisecond resolution
  } else {
    (void)WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH, sleep / 1000,
                    PG_WAIT_EXTENSION);
    ResetLatch(MyLatch);
  }
  CHECK_FOR_INTERRUPTS();
  *sleep_us = Min(*sleep_us * 2, 5000);
  return true;
}

bool wait_for_writer(TransactionId writer, TimestampTz deadline) {
  long sleep_us = 50;
  for (;;) {
    if (TransactionIdIsValid(writer) && compat::conditional_xact_lock_wait(writer)) return true;
    if (!sleep_before_retry(&sleep_us, deadline)) return false;
    // Only a row lock without an updater leaves no xid to wait for: probe again.
    if (!TransactionIdIsValid(writer)) return true;
  }
}

}  // namespace idempotency
