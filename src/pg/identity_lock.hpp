// The identity lock: one transaction at a time may find an identity without a row
// and claim it. Every row of an identity is inserted by a transaction holding the
// lock, and an in-transaction claim of a key without a row holds it until the row is
// written, instead of writing a pending row first.
#pragma once

#include "pg/store.hpp"

extern "C" {
#include "port/atomics.h"
#include "storage/lock.h"
}

namespace idempotency {

struct IdentityLock {
  LOCKTAG tag;                // an advisory lock tag of its own kind
  pg_atomic_uint64* inserts;  // rows inserted under locks of this slot; null unless preloaded
};

// The lock of `id`, its tag a hash keyed with the store's secret (store_lock_secret).
IdentityLock identity_lock(const Identity& id, const LockSecret& secret);

// Taken without queueing, polled until `deadline` (false if it passes), like every
// wait here. The transaction holds it until released or the transaction ends.
bool lock_identity(const IdentityLock& lock, TimestampTz deadline);
void unlock_identity(const IdentityLock& lock);

// A probe that found no row needs repeating once the lock is held, unless no row was
// inserted under the lock (or one sharing its slot) since before the probe. `before`
// is inserts_seen() read before the probe; true when that is not known.
uint64 inserts_seen(const IdentityLock& lock);
bool inserted_since(const IdentityLock& lock, uint64 before);
// Called after inserting a row while holding the lock.
void note_insert(const IdentityLock& lock);

// Shared memory for the insert counts, when the library is preloaded.
void request_identity_lock_memory();

}  // namespace idempotency
