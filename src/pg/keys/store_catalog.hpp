// The store's catalog identity, for the store's own files (store.cpp,
// store_scans.cpp), and the lock secret (callers reach it through store.hpp).
#pragma once

#include "pg/citus/citus_meta.hpp"
#include "pg/keys/key_row.hpp"

extern "C" {
#include "executor/tuptable.h"
}

namespace idempotency {

// A key store's table and indexes: idempotency.keys, or one shard (on this node) of
// idempotency.routed_keys, the distributed store (docs/design-citus.md), whose
// relations are named as Citus names a shard's: routed_keys_<shardid>, ...
struct StoreOids {
  Oid heap;
  Oid index;          // keys_pkey (role, scope, key[, route])
  Oid expires_index;  // keys_expires_at_idx (reap_slot, expires_at)
  Oid lease_index;    // keys_lease_expires_at_idx, partial: leased rows only
  Oid leased_index;   // keys_leased_idx (role, first_claimed_at), partial: lease claims (1.1)
  Oid secret;         // idempotency.lock_secret (1.1)
  RegProcedure key_eq;
  int64 shardid;  // 0: idempotency.keys
};

// idempotency.keys' OIDs, looked up on first use (checking the table's columns) and
// kept until a relcache invalidation of any of them. Opening a relation accepts
// invalidations: copy what you need before.
const StoreOids& store_oids();

// The distributed store, idempotency.routed_keys, or InvalidOid when the store is not
// distributed (idem_distribute makes it). Cached with store_oids; a cached "none" is
// forgotten on any relcache invalidation, so that the table's creation is noticed.
Oid distributed_store();

// The store a call on key `id` reads and writes, and the route's type filled in:
// - not distributed: idempotency.keys (a route given: 55000);
// - distributed: the shard of routed_keys that holds id.route, when it is on this
//   node, locked against moves as Citus locks its own writes to it (citus_lock_route);
//   no route given: 22023; a route of another type: coerced as an implicit cast
//   would, else 42804; the shard on another node: IK006. Never idempotency.keys.
StoreOids store_for_key(Identity* id);

// Whether the call `fcinfo` on key `id` runs on another node: the store is distributed
// and the shard of id.route (coerced as store_for_key does, and locked against moves
// until the transaction ends) is not on this node, and Citus can take the call there
// (citus_may_forward). The caller then forwards it (citus_forward) instead of opening
// a store; otherwise store_for_key opens the store or says why it cannot.
bool key_elsewhere(Identity* id, FunctionCallInfo fcinfo);

// The shard of the extension's distributed table `table` (routed_keys or one
// co-located with it) that holds `route`, which becomes a value of the distribution
// column's type as in store_for_key (else 42804), locked against moves until the
// transaction ends (citus_lock_route). IK006 where this node has no Citus metadata.
CitusRoute routed_shard(Oid table, Route* route);

// Every store on this node that holds keys, for scans (the reaper, idem_reap,
// idem_stats, idem_abandoned): idempotency.keys, then routed_keys' local shards.
// In the current memory context; returns how many.
int local_stores(StoreOids** stores);

// The key of the identity locks' hash, generated at install (idempotency.lock_secret);
// size 0 in a database whose extension is still at 1.0.
struct LockSecret {
  unsigned char bytes[32];
  size_t size;
};
LockSecret store_lock_secret();

// The row version in a store's slot: its values copied into the current memory
// context, and the core's view of it, with whether this transaction wrote it.
void read_slot_row(TupleTableSlot* slot, KeyRow* row, StoredRow* view);

}  // namespace idempotency
