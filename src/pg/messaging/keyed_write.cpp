#include "pg/messaging/keyed_write.hpp"

#include "pg/common/waits.hpp"
#include "pg/keys/identity_lock.hpp"

extern "C" {
#include "miscadmin.h"
}

namespace idempotency {

bool KeyedLoop::next(bool* found) {
  while (state_ == kLooking) {
    CHECK_FOR_INTERRUPTS();
    if (!lock_briefly(lock_, deadline_)) break;
    Look look = table_look(table_, index_, keys_, nkeys_);
    if (!look.found || !TransactionIdIsValid(look.writer)) {
      *found = look.found;
      tid_ = look.tid;
      return true;
    }
    unlock_briefly(lock_);
    if (!wait_for_writer(look.writer, deadline_)) break;
  }
  if (state_ == kLooking) state_ = kTimedOut;
  return false;
}

void KeyedLoop::apply(const KeyedWrite& write) {
  // Others update the row only under this lock, but the reaper deletes expired applied
  // versions without it: it may hold or have deleted the row.
  Write written = Write::kDone;
  if (write.kind == KeyedWrite::kInsert) table_insert(table_, write.values, write.nulls);
  if (write.kind == KeyedWrite::kUpdate)
    written = table_try_update(table_, &tid_, write.values, write.nulls);
  unlock_briefly(lock_);
  if (written == Write::kDone)
    state_ = kDone;
  else if (written == Write::kBusy && !sleep_before_retry(&sleep_us_, deadline_))
    state_ = kTimedOut;
}

}  // namespace idempotency
