// Waits for other transactions, polled and bounded: no lock queue is joined, so a
// wait can give up at its deadline without aborting the caller's transaction, and
// lock_timeout does not apply (query cancel and statement_timeout do).
#pragma once

#include "pg/postgres.hpp"

extern "C" {
#include "utils/timestamp.h"
}

namespace idempotency {

// Polls until the transaction ends (true) or the deadline passes (false).
bool wait_for_writer(TransactionId writer, TimestampTz deadline);
// One sleep of such a polled wait, backing off; false once `deadline` has passed.
bool sleep_before_retry(long* sleep_us, TimestampTz deadline);

}  // namespace idempotency
