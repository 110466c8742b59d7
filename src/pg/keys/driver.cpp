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

void probe_key(KeyStore* store, const Identity& id, Snapshot snapshot, Probe* probe) {
  const KeyRow* row = unwritten_claim(id);
  if (row == nullptr) {
    store_probe(store, id, snapshot, probe);
    probe->view.claimed_by_this_transaction = probe->found && claimed_here(*probe, id);
    return;
  }
  *probe = Probe{};
  probe->found = probe->unwritten = true;
  probe->row = *row;
  read_row(*row, &probe->view);
  probe->view.claimed_by_this_transaction = true;
}

// The identity lock of one call, computed only when needed: most calls (replays)
// never lock, and the tag costs a keyed hash.
struct CallLock {
  const Identity& id;
  bool computed = false;
  bool held = false;
  IdentityLock lock{};

  const IdentityLock& get() {
    if (!computed) lock = identity_lock(id, store_lock_secret());
    computed = true;
    return lock;
  }
  bool take(TimestampTz deadline) {
    held = held || hold_identity_lock(get(), deadline);
    return held;
  }
  void release() {
    if (held) release_identity_lock(lock);
    held = false;
  }
};

static void raise_row_in_the_way(const Identity& id) {
  ereport(ERROR, errcode(ERRCODE_IDEM_CLAIM_LOST),
          errmsg("claim on idempotency key \"%s\" in scope \"%s\" was lost", key_cstring(id.key),
                 text_to_cstring(id.scope)),
          errdetail("Another row of the key was stored while the claim was held."));
}

Driven drive(KeyStore* store, const Identity& id, TimestampTz deadline, Start start, Decide decide,
             Probe* probe, Step* step) {
  CallLock lock{id};
  InsertCount inserts = insert_count(id);
  if (start == Start::kInsertFirst && unwritten_claim(id) == nullptr) {
    *probe = Probe{};
    *step = decide(*probe, GetCurrentTimestamp());
    if (step->kind == Step::kInsert) {
      if (!lock.take(deadline)) return Driven::kTimedOut;
      if (store_insert(store, &step->row, OnConflict::kBackOut)) {
        note_insert(inserts);
        lock.release();
        return Driven::kDone;
      }
      // A row of the key is there: look at it, still holding the lock.
    }
  }
  bool absent_waits = start == Start::kLookAbsentWaits;
  long unexplained_sleep_us = 50;
  for (;;) {
    CHECK_FOR_INTERRUPTS();
    uint64 inserts_before = inserts_seen(inserts);
    probe_key(store, id, nullptr, probe);
    if (!probe->found && absent_waits && !lock.held) {
      if (!lock.take(deadline)) return Driven::kTimedOut;
      probe_key(store, id, nullptr, probe);  // what the lock's holder left
      lock.release();
    }
    *step = decide(*probe, GetCurrentTimestamp());
    bool first_row = step->kind == Step::kInsert || step->kind == Step::kKeepUnwritten;
    if (!first_row) lock.release();
    TransactionId writer = probe->writer;
    WriteResult written = WriteResult::kBusy;
    switch (step->kind) {
      case Step::kStop: return Driven::kDone;
      case Step::kWait: break;
      case Step::kInsert:
      case Step::kKeepUnwritten:
        // A key's first row is inserted only under its lock, and after looking again
        // if the lock's last holder may have inserted the row meanwhile.
        if (!lock.held) {
          if (!lock.take(deadline)) return Driven::kTimedOut;
          if (inserted_since(inserts, inserts_before)) continue;
        }
        if (step->kind == Step::kKeepUnwritten) {
          remember_unwritten_claim(step->row, lock.get());  // keeps the lock
          return Driven::kDone;
        }
        // A unique index holds a row the probe did not see: let go and look again.
        written = store_insert(store, &step->row, OnConflict::kBackOut) ? WriteResult::kDone
                                                                        : WriteResult::kChanged;
        if (written == WriteResult::kDone) note_insert(inserts);
        lock.release();
        // Under the lock, only a unique index of the user's on other columns can hold a
        // row that the primary key's probe cannot find: poll it out, never spin.
        if (written == WriteResult::kChanged && !probe->found &&
            !sleep_before_retry(&unexplained_sleep_us, deadline))
          return Driven::kTimedOut;
        break;
      case Step::kWriteUnwritten:
        // The claim holds the lock and saw no row: only a row written outside the
        // functions (a hand-made INSERT) can be in the way, and then the claim fails.
        if (!store_insert(store, &step->row, OnConflict::kReport)) raise_row_in_the_way(id);
        note_insert(inserts);
        note_unwritten_claim_written(id);
        return Driven::kDone;
      case Step::kDropUnwritten: note_unwritten_claim_written(id); return Driven::kDone;
      case Step::kUpdate: written = store_update(store, &probe->tid, &step->row, &writer); break;
      case Step::kDelete: written = store_delete(store, &probe->tid, &writer); break;
    }
    if (written == WriteResult::kDone) return Driven::kDone;
    if (written == WriteResult::kBusy && !wait_for_writer(writer, deadline))
      return Driven::kTimedOut;
  }
}

}  // namespace idempotency
