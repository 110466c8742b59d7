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

// Takes `tag` in ExclusiveLock for the top-level transaction, waiting in the queue
// until the deadline (false if it passes).
bool lock_waiting(const LOCKTAG& tag, TimestampTz deadline);

// Waits in the queue until `tag` could be taken in ExclusiveLock (true) or the
// deadline passes (false); takes nothing: the caller tries again without queueing.
bool wait_until_free(const LOCKTAG& tag, TimestampTz deadline);

// One sleep of a polled wait, backing off; false once `deadline` has passed. For waits
// no transaction could be part of a cycle through (say a row still busy with no other
// transaction in progress to wait for: its holder just ended, or it is this one's).
bool sleep_before_retry(long* sleep_us, TimestampTz deadline);

}  // namespace idempotency
