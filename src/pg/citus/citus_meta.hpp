// What the extension reads of Citus's metadata (docs/design-citus.md): Citus's catalog
// tables, read with PostgreSQL's own catalog access. No Citus header, library or SQL
// function is used, and where Citus is not installed in the database nothing is read.
// References are to Citus 14.0.1's source.
#pragma once

#include "pg/common/postgres.hpp"

namespace idempotency {

// Whether `relid` is a Citus table on this node: a row of pg_catalog.pg_dist_partition
// (include/distributed/pg_dist_partition.h:22-45, logicalrelid first), found through
// its index on logicalrelid. False where that catalog does not exist.
bool citus_table(Oid relid);

// Where a value of a hash-distributed table's distribution column lives.
struct CitusRoute {
  int64 shardid;
  int shard_index;    // its place among the table's shards sorted by hash range
  uint32 colocation;  // the table's co-location group
  int32 group;        // the group of (one of) its placements
  bool local;         // a placement of it is on this node's group
};

// The shard of `value` (of type `value_type`, which must be the distribution column's)
// in the hash-distributed Citus table `relid`: its hash by the type's standard hash
// function and the column's collation, as Citus hashes it
// (metadata/metadata_cache.c:1869-1878, utils/shardinterval_utils.c:260-269), then the
// shard whose range holds it (binary search: ranges need not be uniform after a split).
// From a per-backend cache of pg_dist_partition, pg_dist_shard, pg_dist_placement and
// pg_dist_local_group, dropped on a relcache invalidation of the table (Citus sends one
// for every change of its shards or placements: metadata_cache.c:3903, :3980, :5636),
// of pg_dist_local_group or of pg_dist_node. No SQL, no catalog access on a hit.
// ERROR 22023 unless `relid` is a hash-distributed Citus table; 42804 when
// `value_type` is not the column's type.
CitusRoute citus_route(Oid relid, Datum value, Oid value_type);

// citus_route, ordered with shard moves, splits and the rebalancer as Citus orders its
// own writes to the shard: a ShareLock, until the end of the transaction, on the
// co-location group's shard metadata lock (utils/resource_lock.c:488-518,
// include/distributed/resource_lock.h:44, :72-78), which they take in ExclusiveLock
// before copying or catching up (operations/shard_transfer.c:1508-1545). Then a fresh
// look at the metadata, since a move that held the lock has changed it by now.
CitusRoute citus_lock_route(Oid relid, Datum value, Oid value_type);

// Whether this node is a Citus coordinator (its group is 0: pg_dist_local_group).
bool citus_is_coordinator();

// Whether Citus is in shared_preload_libraries, without which it does not run (its
// _PG_init refuses: shared_library_init.c). No catalog access.
bool citus_preloaded();

// The distribution column of a hash-distributed table (from the same cache, so no
// catalog access on a hit); false, and nothing filled in, when `relid` is not one.
struct CitusColumn {
  Oid type;
  int16 length;
  bool byval;
};
bool citus_column(Oid relid, CitusColumn* column);

// One value of the distribution column of hash-distributed table `relid` for each of
// its shards that may hold something for the relay, in shard order (the shards sorted by
// hash range), and the shards' ids, in the current memory context; returns how many.
// Citus routes a call by a value, not a shard, so this is how a call is sent to every
// shard (the relay's). A value passes the column's domain constraints, if any: Citus
// checks them at both ends of a delegated call. Tried first: "0", "1", ... ("0", "-1",
// "1", ... for a signed number; a uuid: ...-000000000000, ...-000000000001) through the
// input function of the column's (base) type, kept per backend until the shards change;
// for a shard none of them reaches (a domain's check refused them), the route of one of
// its waiting events, read on its node by idempotency.shard_routes (1.5); a shard with
// none is left out. ERROR 0A000 for a column type outside the numeric and string
// categories and uuid (or a domain over one), or when a shard has no value and
// idempotency.shard_routes does not exist yet.
int citus_shard_values(Oid relid, Datum** values, int64** shardids);

// The shards of a hash-distributed table with a placement on this node, in the
// current memory context; returns how many. None where `relid` is not distributed.
int citus_local_shards(Oid relid, int64** shardids);

// The address of the node holding `shardid` ("host:port"), for messages; "another node"
// when unknown.
const char* citus_shard_node(int64 shardid);

}  // namespace idempotency
