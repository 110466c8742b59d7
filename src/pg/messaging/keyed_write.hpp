// The one loop of messaging's writes by a unique key (an event id, an aggregate's
// counter, an applied entity), as the driver's for keys: under the key's brief lock,
// look at its row; wait (polled, bounded) for another transaction writing it, then
// look again; else ask the caller what to write and write it. The row written stays
// this transaction's until it ends: a dirty look by anyone else sees it as being
// written and waits. No lock outlives the call, so a transaction may write any
// number of keys.
#pragma once

#include "pg/common/function_ref.hpp"
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

// found: the key's row is in table->slot (an update replaces that version, unless it
// changed meanwhile: then the loop looks again). The values written must not point
// into it.
using DecideWrite = FunctionRef<KeyedWrite(bool found)>;

// False when a wait ran out (the caller raises IK005).
bool write_keyed(Table* table, Oid index, ScanKey keys, int nkeys, const LOCKTAG& lock,
                 TimestampTz deadline, DecideWrite decide);

}  // namespace idempotency
