// The one loop of every function that acts on one key (claims, idem_once, finishes,
// idem_forget). The entry point runs it and asks the core what to do; the loop never
// calls back up:
//
//   KeyLoop loop(&store, id, deadline, Start::kLook);
//   while (loop.next(&probe)) loop.apply(step the core decides from probe);
//   if (loop.timed_out()) ...
//
// next() looks at the key (probe); apply() takes the identity lock for a key's first
// row, writes, and waits (bounded, in the lock queue) for a row another transaction is
// writing; then next() looks again, until a step is done or a wait runs out.
#pragma once

#include <type_traits>

#include "pg/keys/identity_lock.hpp"
#include "pg/keys/key_row.hpp"
#include "pg/keys/store.hpp"

extern "C" {
#include "utils/timestamp.h"
}

namespace idempotency {

// What to do after one look at the key.
struct Step {
  enum Kind {
    kStop,            // decided: nothing (more) to write
    kWait,            // another transaction is writing the row: wait, then look again
    kInsert,          // insert `row` as the key's first row, under the identity lock
    kKeepUnwritten,   // claim a key without a row in-transaction: keep `row`, hold the lock
    kWriteUnwritten,  // insert `row` for this transaction's unwritten claim (its finish)
    kDropUnwritten,   // drop this transaction's unwritten claim (released, forgotten)
    kUpdate,          // replace the version looked at with `row`
    kDelete,          // delete the version looked at
  };
  Kind kind = kStop;
  StoredRow row;  // what the core decided the key's row holds (not for kDelete and kDrop...)
};

// What this transaction's unwritten claim, or else the store, holds for `id`.
void probe_key(KeyStore* store, const Identity& id, Snapshot snapshot, Probe* probe);

// How the loop starts.
enum class Start {
  kLook,             // look at the key first (a claim)
  kLookAbsentWaits,  // the same, and finding no row also waits for the identity lock, so
                     // that another transaction's unwritten claim counts as a row it is
                     // writing (finishes, forget)
  kInsertFirst,      // a key expected to be new: insert the row decided on "no row",
                     // under the identity lock, and look only if the primary key holds
                     // a row of it (one descent of the index instead of two; a row
                     // found costs an insertion taken back)
};

// The identity lock of one call, computed only when needed: most calls (replays)
// never lock, and the tag costs a keyed hash.
struct CallLock {
  const Identity* id;
  bool computed;
  bool held;
  IdentityLock lock;

  const IdentityLock& get();
  bool take(TimestampTz deadline);
  void release();
};

class KeyLoop {
 public:
  KeyLoop(KeyStore* store, const Identity& id, TimestampTz deadline, Start start);
  // The next look at the key, for the caller to decide a step on (with kInsertFirst,
  // the first look is "no row" without looking); false once the call is over.
  bool next(Probe* probe);
  // Carries out the step decided on the last look.
  void apply(const Step& step);
  // Over because a wait ran out (*probe of the last next() shows the row waited for,
  // or nothing when only the identity lock was), not because a step was done.
  bool timed_out() const { return state_ == kTimedOut; }

 private:
  enum State { kFirst, kLooking, kDone, kTimedOut };
  bool insert_first(const Step& step);
  void write(const Step& step);
  KeyRow stored_row(const Step& step) const;

  KeyStore* store_;
  const Identity* id_;
  TimestampTz deadline_;
  Start start_;
  State state_;
  Probe* probe_ = nullptr;
  CallLock lock_;
  InsertCount inserts_;
  uint64 inserts_before_ = 0;
  long unexplained_sleep_us_ = 50;
};

static_assert(std::is_trivially_destructible_v<Step>);
static_assert(std::is_trivially_destructible_v<Probe>);
static_assert(std::is_trivially_destructible_v<KeyLoop>);

}  // namespace idempotency
