// The one loop of every function that acts on one key (claims, idem_once, finishes,
// idem_forget): look at the key (probe), ask the caller what to do (the caller asks
// the core), take the identity lock for a key's first row, write, and wait (polled,
// bounded) for a row another transaction is writing; then look again.
#pragma once

#include <type_traits>

#include "pg/common/function_ref.hpp"
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
  KeyRow row;
};

enum class Driven {
  kDone,      // a step stopped, or its write succeeded
  kTimedOut,  // waiting for another transaction (or its identity lock) ran out
};

using Decide = FunctionRef<Step(const Probe& probe, TimestampTz now)>;

// What this transaction's unwritten claim, or else the store, holds for `id`.
void probe_key(KeyStore* store, const Identity& id, Snapshot snapshot, Probe* probe);

// How the loop starts.
enum class Start {
  kLook,             // look at the key first (a claim)
  kLookAbsentWaits,  // the same, and finding no row also waits for the identity lock, so
                     // that another transaction's unwritten claim counts as a row it is
                     // writing (finishes, forget)
  kInsertFirst,      // a key expected to be new: insert what `decide` makes of no row,
                     // under the identity lock, and look only if the primary key holds
                     // a row of it (one descent of the index instead of two; a row
                     // found costs an insertion taken back)
};

// Runs the loop until a step stops or its write succeeds (kDone, with the last look
// in *probe and what was done in *step), or a wait runs out (kTimedOut; *probe shows
// the row waited for, or nothing when only the identity lock was).
Driven drive(KeyStore* store, const Identity& id, TimestampTz deadline, Start start, Decide decide,
             Probe* probe, Step* step);

static_assert(std::is_trivially_destructible_v<Step>);
static_assert(std::is_trivially_destructible_v<Probe>);
static_assert(std::is_trivially_destructible_v<Decide>);

}  // namespace idempotency
