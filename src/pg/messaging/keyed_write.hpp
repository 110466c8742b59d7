// The one loop of messaging's writes by a unique key (an event id, an aggregate's
// counter, an applied entity), as KeyLoop is for keys. The entry point runs it and
// decides what to write; the loop never calls back up:
//
//   KeyedLoop loop(&table, index, keys, nkeys, lock, deadline);
//   bool found;
//   while (loop.next(&found)) loop.apply(the write decided from found);
//   if (loop.timed_out()) ... (IK005)
//
// next() takes the key's brief lock and looks at its row, waiting (bounded, in the
// lock queue) for another transaction writing it; apply() writes and lets the lock go.
// The row written stays this transaction's until it ends: a dirty look by anyone else
// sees it as being written and waits. No lock outlives the call, so a transaction may
// write any number of keys. The brief lock is never held while waiting for another
// transaction: it is let go first, and taken again to look again. So a loop that must
// write a second key under the first one's lock (an event id's event with its
// aggregate's seq) runs the second one with kReturnBusy and waits outside with
// wait_for().
#pragma once

#include "pg/common/table.hpp"

extern "C" {
#include "storage/lock.h"
}

namespace idempotency {

struct KeyedWrite {
  enum Kind { kNone, kInsert, kUpdate };
  Kind kind = kNone;
  const Datum* values = nullptr;
  const bool* nulls = nullptr;
};

class KeyedLoop {
 public:
  // kReturnBusy: instead of waiting for another transaction, the loop ends; busy()
  // then says so and holder() is that transaction.
  enum Waits { kWait, kReturnBusy };
  KeyedLoop(Table* table, Oid index, ScanKey keys, int nkeys, const LOCKTAG& lock,
            TimestampTz deadline, Waits waits = kWait)
      : table_(table),
        index_(index),
        keys_(keys),
        nkeys_(nkeys),
        lock_(lock),
        deadline_(deadline),
        waits_(waits) {}
  // Under the key's brief lock, whether its row is there (then in table->slot); false
  // once the call is over.
  bool next(bool* found);
  // Writes what was decided on the last look (an update replaces that version, unless
  // it changed meanwhile: then next() looks again); the values must not point into the
  // slot.
  void apply(const KeyedWrite& write);
  // Instead of apply(): lets the lock go and waits for `holder` (another key's busy
  // holder) until the deadline; next() then looks again.
  void wait_for(TransactionId holder);
  bool timed_out() const { return state_ == kTimedOut; }
  bool busy() const { return state_ == kBusy; }
  TransactionId holder() const { return holder_; }

 private:
  enum State { kLooking, kDone, kTimedOut, kBusy };
  // Lets the lock go, then waits for `holder` (or, with none to wait for, a short
  // sleep), unless the loop returns it.
  void wait_unlocked(TransactionId holder);
  Table* table_;
  Oid index_;
  ScanKey keys_;
  int nkeys_;
  LOCKTAG lock_;
  TimestampTz deadline_;
  Waits waits_;
  State state_ = kLooking;
  TransactionId holder_ = InvalidTransactionId;
  ItemPointerData tid_{};
  long sleep_us_ = 50;
};

}  // namespace idempotency
