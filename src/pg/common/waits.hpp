// Waits for other transactions, bounded by a deadline. A wait that cannot end at once
// sleeps in PostgreSQL's lock queue, as a row lock's wait does, so that the deadlock
// detector sees it: a cycle of waits (through keys, aggregates, event ids, entities
// or ordinary locks) ends with 40P01 for one of its transactions after
// deadlock_timeout. Running out at the deadline ends only the wait, not the caller's
// transaction; lock_timeout, statement_timeout and query cancel end it as any lock
// wait (55P03, 57014).
#pragma once

#include "pg/common/postgres.hpp"

extern "C" {
#include "storage/lock.h"
}

namespace idempotency {

// Until the transaction `writer` ends (true) or the deadline passes (false). An
// invalid `writer` (a row lock without an updater) is polled once: true.
bool wait_for_writer(TransactionId writer, TimestampTz deadline);

// Who keeps a lock that lock_waiting takes: the top-level transaction (until released
// or the transaction ends), or the transaction or subtransaction running the caller,
// whose abort lets it go.
enum class LockKeeper { kTransaction, kSubtransaction };

// Takes `tag` in ExclusiveLock for `keeper`, waiting in the queue until the deadline
// (false if it passes). Waiters are granted the lock in the queue's order and keep it:
// a waiter that only waited until the lock was free and then tried again without
// queueing could lose it to the next waiter, each time, so that with two or more
// waiters the lock passed from waiter to waiter and no one took it (on a busy machine
// for seconds; issue 41).
bool lock_waiting(const LOCKTAG& tag, TimestampTz deadline,
                  LockKeeper keeper = LockKeeper::kTransaction);
// Lets go of a lock lock_waiting took for `keeper`.
void unlock(const LOCKTAG& tag, LockKeeper keeper);

// One sleep of a polled wait, backing off; false once `deadline` has passed. For waits
// no transaction could be part of a cycle through (say a row still busy with no other
// transaction in progress to wait for: its holder just ended, or it is this one's).
bool sleep_before_retry(long* sleep_us, TimestampTz deadline);

}  // namespace idempotency
