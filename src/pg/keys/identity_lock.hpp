// The identity lock: one transaction at a time may find an identity without a row
// and claim it. Every row of an identity is inserted by a transaction holding the
// lock, and an in-transaction claim of a key without a row holds it until the row is
// written, instead of writing a pending row first.
#pragma once

#include <initializer_list>
#include <string_view>
#include <type_traits>

#include "pg/keys/key_row.hpp"
#include "pg/keys/store.hpp"

extern "C" {
#include "port/atomics.h"
#include "storage/lock.h"
}

namespace idempotency {

struct IdentityLock {
  LOCKTAG tag;  // an advisory lock tag of its own kind (objsubid 3)
};

static_assert(std::is_trivially_destructible_v<IdentityLock>);

// The lock of `id`, its tag a hash keyed with the store's secret (store_lock_secret).
IdentityLock identity_lock(const Identity& id, const LockSecret& secret);

// Waited for in the lock queue until `deadline` (false if it passes; see waits.hpp).
// The transaction holds it until released or the transaction ends; take it through
// xact.hpp's hold_identity_lock, which records it.
bool lock_identity(const IdentityLock& lock, TimestampTz deadline);
void unlock_identity(const IdentityLock& lock);

// The locks of messaging's rows (an event id, an aggregate's counter, an applied
// entity), keyed like the identity locks, so pg_locks shows nothing a role could
// guess. Each is held only while one call looks for its row and, finding none,
// inserts it (src/pg/keyed_write.hpp); the row itself then makes others wait.
enum class MessagingLock : uint16 { kAggregate = 4, kEventId = 5, kAppliedEntity = 6 };
LOCKTAG messaging_lock(MessagingLock kind, std::initializer_list<std::string_view> parts,
                       const LockSecret& secret);
// Waited for in the queue until `deadline` (false if it passes; see waits.hpp), for
// the call, which releases it (or an error's abort does). A holder never waits for
// another transaction while it holds one (only, briefly, for a second such lock).
bool lock_briefly(const LOCKTAG& tag, TimestampTz deadline);
void unlock_briefly(const LOCKTAG& tag);

// Rows inserted under identity locks, counted per slot in shared memory (when
// preloaded). A probe that found no row needs repeating once the lock is held, unless
// no row was inserted under a lock of its slot since before the probe.
struct InsertCount {
  pg_atomic_uint64* counter;  // null unless preloaded: then always look again
};
// The slot of `id`, by an unkeyed hash: a crafted collision only costs a second look.
InsertCount insert_count(const Identity& id);
uint64 inserts_seen(InsertCount count);  // read before the probe
bool inserted_since(InsertCount count, uint64 before);
// Called after inserting a row while holding the identity's lock.
void note_insert(InsertCount count);

// Shared memory of the insert counts, for shmem.cpp.
Size insert_counts_size();
void attach_insert_counts(void* memory, bool initialize);

}  // namespace idempotency
