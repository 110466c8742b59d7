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
    if (!lock_briefly(lock_, deadline_)) {
      state_ = kTimedOut;
      break;
    }
    Look look = table_look(table_, index_, keys_, nkeys_);
    if (!look.found || !TransactionIdIsValid(look.writer)) {
      *found = look.found;
      tid_ = look.tid;
      return true;
    }
    wait_unlocked(look.writer);
  }
  return false;
}

void KeyedLoop::apply(const KeyedWrite& write) {
  // Others update the row only under this lock, but the reaper deletes expired applied
  // versions without it, and a user's SELECT ... FOR UPDATE locks it without it.
  Write written = Write::kDone;
  if (write.kind == KeyedWrite::kInsert) table_insert(table_, write.values, write.nulls);
  if (write.kind == KeyedWrite::kUpdate)
    written = table_try_update(table_, &tid_, write.values, write.nulls);
  if (written == Write::kDone) {
    unlock_briefly(lock_);
    state_ = kDone;
  } else if (written == Write::kBusy) {
    wait_unlocked(table_holder(table_, &tid_));
  } else {
    unlock_briefly(lock_);  // changed: look again
  }
}

void KeyedLoop::wait_for(TransactionId holder) { wait_unlocked(holder); }

void KeyedLoop::wait_unlocked(TransactionId holder) {
  unlock_briefly(lock_);
  if (waits_ == kReturnBusy) {
    state_ = kBusy;
    holder_ = holder;
    return;
  }
  // No holder: it ended since (one this transaction locked by hand is written over,
  // write_version); look again after a short sleep, never spin.
  bool waited = TransactionIdIsValid(holder) ? wait_for_writer(holder, deadline_)
                                             : sleep_before_retry(&sleep_us_, deadline_);
  if (!waited) state_ = kTimedOut;
}

}  // namespace idempotency
