#include "pg/keys/driver.hpp"

#include "pg/common/errors.hpp"
#include "pg/keys/identity_lock.hpp"
#include "pg/common/key_type.hpp"
#include "pg/common/waits.hpp"
#include "pg/keys/xact.hpp"

extern "C" {
#include "miscadmin.h"
#include "utils/builtins.h"
}

namespace idempotency {

// A key is one (role, scope, key): stored with one route, it is not another route's.
[[noreturn]] static void raise_other_route(const Identity& id) {
  ereport(ERROR, errcode(ERRCODE_INVALID_PARAMETER_VALUE),
          errmsg("idempotency key \"%s\" in scope \"%s\" is stored with another routing value",
                 key_cstring(id.key), text_to_cstring(id.scope)),
          errhint("Pass the routing value the key was first claimed with, or use another key."));
}

void probe_key(KeyStore* store, const Identity& id, Snapshot snapshot, Probe* probe) {
  const UnwrittenClaim* claim = unwritten_claim(id);
  if (claim == nullptr) {
    store_probe(store, id, snapshot, probe);
    probe->view.claimed_by_this_transaction = probe->found && claimed_here(*probe, id);
  } else {  // nothing stored yet: the key's identity, and the row decided for it
    *probe = Probe{};
    probe->found = probe->unwritten = true;
    probe->row = identity_row(claim->id);
    probe->view = claim->row;
    probe->view.written_by_this_transaction = probe->view.claimed_by_this_transaction = true;
  }
  if (probe->found && !same_route(probe->row, id.route)) raise_other_route(id);
}

const IdentityLock& CallLock::get() {
  if (!computed) lock = identity_lock(*id, store_lock_secret());
  computed = true;
  return lock;
}

bool CallLock::take(TimestampTz deadline) {
  held = held || hold_identity_lock(get(), deadline);
  return held;
}

void CallLock::release() {
  if (held) release_identity_lock(lock);
  held = false;
}

static void raise_row_in_the_way(const Identity& id) {
  ereport(ERROR, errcode(ERRCODE_IDEM_CLAIM_LOST),
          errmsg("claim on idempotency key \"%s\" in scope \"%s\" was lost", key_cstring(id.key),
                 text_to_cstring(id.scope)),
          errdetail("Another row of the key was stored while the claim was held."));
}

KeyLoop::KeyLoop(KeyStore* store, const Identity& id, TimestampTz deadline, Start start)
    : store_(store),
      id_(&id),
      deadline_(deadline),
      start_(start),
      state_(start == Start::kInsertFirst && unwritten_claim(id) == nullptr ? kFirst : kLooking),
      lock_{&id, false, false, {}},
      inserts_(insert_count(id)) {}

bool KeyLoop::next(Probe* probe) {
  probe_ = probe;
  if (state_ == kFirst) {  // a key expected to be new: decide on no row first
    *probe = Probe{};
    return true;
  }
  if (state_ != kLooking) return false;
  CHECK_FOR_INTERRUPTS();
  inserts_before_ = inserts_seen(inserts_);
  probe_key(store_, *id_, nullptr, probe);
  if (!probe->found && start_ == Start::kLookAbsentWaits && !lock_.held) {
    if (!lock_.take(deadline_)) {
      state_ = kTimedOut;
      return false;
    }
    probe_key(store_, *id_, nullptr, probe);  // what the lock's holder left
    lock_.release();
  }
  return true;
}

void KeyLoop::apply(const Step& step) {
  if (state_ == kFirst) {
    state_ = kLooking;
    if (step.kind == Step::kInsert && insert_first(step)) state_ = kDone;
    return;
  }
  write(step);
}

// The one place where a decision becomes a row of the store: the row the core decided
// on, over the identity columns of the row looked at (or, for a key's first row, of
// the key).
KeyRow KeyLoop::stored_row(const Step& step) const {
  KeyRow row = probe_->found ? probe_->row : identity_row(*id_);
  write_row(step.row, &row);
  return row;
}

// Inserts the row of a key expected to be new, under the identity lock; false (still
// holding the lock) when a row of the key is there, to be looked at.
bool KeyLoop::insert_first(const Step& step) {
  if (!lock_.take(deadline_)) {
    state_ = kTimedOut;
    return false;
  }
  KeyRow row = stored_row(step);
  if (!store_insert(store_, &row, OnConflict::kBackOut)) return false;
  note_insert(inserts_);
  lock_.release();
  return true;
}

void KeyLoop::write(const Step& step) {
  bool first_row = step.kind == Step::kInsert || step.kind == Step::kKeepUnwritten;
  if (!first_row) lock_.release();
  TransactionId writer = probe_->writer;
  KeyRow row;
  WriteResult written = WriteResult::kBusy;
  switch (step.kind) {
    case Step::kStop: state_ = kDone; return;
    case Step::kWait: break;
    case Step::kInsert:
    case Step::kKeepUnwritten:
      // A key's first row is inserted only under its lock, and after looking again if
      // the lock's last holder may have inserted the row meanwhile.
      if (!lock_.held) {
        if (!lock_.take(deadline_)) {
          state_ = kTimedOut;
          return;
        }
        if (inserted_since(inserts_, inserts_before_)) return;  // look again
      }
      if (step.kind == Step::kKeepUnwritten) {
        remember_unwritten_claim(*id_, step.row, lock_.get());  // keeps the lock
        state_ = kDone;
        return;
      }
      // A unique index holds a row the probe did not see: let go and look again.
      row = stored_row(step);
      written = store_insert(store_, &row, OnConflict::kBackOut) ? WriteResult::kDone
                                                                 : WriteResult::kChanged;
      if (written == WriteResult::kDone) note_insert(inserts_);
      lock_.release();
      // Under the lock, only a unique index of the user's on other columns can hold a
      // row that the primary key's probe cannot find: poll it out, never spin.
      if (written == WriteResult::kChanged && !probe_->found &&
          !sleep_before_retry(&unexplained_sleep_us_, deadline_)) {
        state_ = kTimedOut;
        return;
      }
      break;
    case Step::kWriteUnwritten:
      // The claim holds the lock and saw no row: only a row written outside the
      // functions (a hand-made INSERT) can be in the way, and then the claim fails.
      row = stored_row(step);
      if (!store_insert(store_, &row, OnConflict::kReport)) raise_row_in_the_way(*id_);
      note_insert(inserts_);
      note_unwritten_claim_written(*id_);
      state_ = kDone;
      return;
    case Step::kDropUnwritten:
      note_unwritten_claim_written(*id_);
      state_ = kDone;
      return;
    case Step::kUpdate:
      row = stored_row(step);
      written = store_update(store_, &probe_->tid, &row, &writer);
      break;
    case Step::kDelete: written = store_delete(store_, &probe_->tid, &writer); break;
  }
  if (written == WriteResult::kDone)
    state_ = kDone;
  else if (written == WriteResult::kBusy && !wait_for_writer(writer, deadline_))
    state_ = kTimedOut;
}

}  // namespace idempotency
