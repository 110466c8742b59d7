#include "pg/common/waits.hpp"

#include "pg/common/compat.hpp"

extern "C" {
#include "access/xact.h"
#include "miscadmin.h"
#include "storage/latch.h"
#include "storage/lmgr.h"
#include "storage/proc.h"
#include "utils/elog.h"
#include "utils/resowner.h"
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

namespace {

// What to wait for in the queue: a transaction's end, or a lock.
struct QueuedWait {
  TransactionId writer;  // valid: wait for it to end
  const LOCKTAG* tag;    // else this lock,
  ResourceOwner keeper;  // taken for this owner (the caller's, not the wait's subtransaction's)
};

void wait_now(const QueuedWait& wait) {
  if (TransactionIdIsValid(wait.writer)) {
    XactLockTableWait(wait.writer, nullptr, nullptr, XLTW_None);
    return;
  }
  CurrentResourceOwner = wait.keeper;  // the caller's owner is restored after
  (void)LockAcquire(wait.tag, ExclusiveLock, false, false);
}

ResourceOwner keeper_owner(LockKeeper keeper) {
  return keeper == LockKeeper::kTransaction ? TopTransactionResourceOwner
                                            : CurTransactionResourceOwner;
}

// Runs the wait with lock_timeout lowered to the time left, inside a subtransaction:
// the lock timeout's error then ends the subtransaction, not the caller's. Any other
// error (40P01, the caller's own lock_timeout, a cancel) goes on up once the
// subtransaction is gone. Plain data only on this stack: PG_TRY longjmps.
bool wait_in_queue(const QueuedWait& wait, TimestampTz deadline) {
  long left_ms = (deadline - GetCurrentTimestamp()) / 1000;
  if (left_ms <= 0) return false;
  int caller_lock_timeout = LockTimeout;
  bool deadline_first = caller_lock_timeout == 0 || left_ms < caller_lock_timeout;
  MemoryContext caller_context = CurrentMemoryContext;
  ResourceOwner caller_owner = CurrentResourceOwner;
  bool waited = false;
  BeginInternalSubTransaction(nullptr);
  MemoryContextSwitchTo(caller_context);
  PG_TRY();
  {
    if (deadline_first) LockTimeout = static_cast<int>(Min(left_ms, INT_MAX));
    wait_now(wait);
    LockTimeout = caller_lock_timeout;
    CurrentResourceOwner = caller_owner;
    ReleaseCurrentSubTransaction();
    waited = true;
  }
  PG_CATCH();
  {
    LockTimeout = caller_lock_timeout;
    MemoryContextSwitchTo(caller_context);
    ErrorData* error = CopyErrorData();
    FlushErrorState();
    RollbackAndReleaseCurrentSubTransaction();
    MemoryContextSwitchTo(caller_context);
    CurrentResourceOwner = caller_owner;
    if (!deadline_first || error->sqlerrcode != ERRCODE_LOCK_NOT_AVAILABLE) ReThrowError(error);
    FreeErrorData(error);
  }
  PG_END_TRY();
  MemoryContextSwitchTo(caller_context);
  CurrentResourceOwner = caller_owner;
  return waited;
}

}  // namespace

bool wait_for_writer(TransactionId writer, TimestampTz deadline) {
  if (!TransactionIdIsValid(writer)) {
    long sleep_us = 50;  // only a row lock without an updater: look again soon
    return sleep_before_retry(&sleep_us, deadline);
  }
  if (compat::conditional_xact_lock_wait(writer)) return true;
  return wait_in_queue(QueuedWait{writer, nullptr, nullptr}, deadline);
}

bool lock_waiting(const LOCKTAG& tag, TimestampTz deadline, LockKeeper keeper) {
  ResourceOwner owner = keeper_owner(keeper);  // before the wait's subtransaction
  ResourceOwner caller_owner = CurrentResourceOwner;
  CurrentResourceOwner = owner;
  bool taken = LockAcquire(&tag, ExclusiveLock, false, true) != LOCKACQUIRE_NOT_AVAIL;
  CurrentResourceOwner = caller_owner;
  return taken || wait_in_queue(QueuedWait{InvalidTransactionId, &tag, owner}, deadline);
}

void unlock(const LOCKTAG& tag, LockKeeper keeper) {
  ResourceOwner caller_owner = CurrentResourceOwner;
  CurrentResourceOwner = keeper_owner(keeper);
  LockRelease(&tag, ExclusiveLock, false);
  CurrentResourceOwner = caller_owner;
}

}  // namespace idempotency
