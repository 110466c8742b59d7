// The store's catalog identity, for the store's own files (store.cpp,
// store_scans.cpp), and the lock secret (callers reach it through store.hpp).
#pragma once

#include "pg/keys/key_row.hpp"

extern "C" {
#include "executor/tuptable.h"
}

namespace idempotency {

struct StoreOids {
  Oid heap;
  Oid index;          // keys_pkey (role, scope, key)
  Oid expires_index;  // keys_expires_at_idx (reap_slot, expires_at)
  Oid lease_index;    // keys_lease_expires_at_idx, partial: leased rows only
  Oid leased_index;   // keys_leased_idx (role, first_claimed_at), partial: lease claims (1.1)
  Oid secret;         // idempotency.lock_secret (1.1)
  RegProcedure key_eq;
};

// Looked up on first use (checking the table's columns) and kept until a relcache
// invalidation of any of them. Opening a relation accepts invalidations: copy what
// you need before.
const StoreOids& store_oids();

// The key of the identity locks' hash, generated at install (idempotency.lock_secret);
// size 0 in a database whose extension is still at 1.0.
struct LockSecret {
  unsigned char bytes[32];
  size_t size;
};
LockSecret store_lock_secret();

// A row of a store's slot, its values copied into the current memory context.
void copy_slot_row(TupleTableSlot* slot, KeyRow* row);

}  // namespace idempotency
