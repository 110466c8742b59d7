// The messaging tables' catalog identity (1.1): OIDs of idempotency.outbox,
// outbox_aggregates, applied_versions, their indexes and the position sequence, and
// their columns. Looked up and checked on first use, forgotten on a relcache
// invalidation of any of them, as the key store's (store_catalog.hpp).
#pragma once

#include "pg/common/postgres.hpp"

namespace idempotency {

// Attribute numbers of idempotency.outbox.
namespace outbox_column {
enum : int {
  kEventId = 1,
  kPosition,
  kTopic,
  kAggregate,
  kSeq,
  kPayload,
  kHeaders,
  kEmittedAt,
  kState,
  kAttempt,
  kRelay,
  kLeaseExpiresAt,
  kDeliveredAt,
  kReason,
};
constexpr int kCount = kReason;
}  // namespace outbox_column

// Of idempotency.outbox_aggregates.
// In a shard of routed_outbox_aggregates, then the route and the position of the
// aggregate's last event (a shard's own order: docs/design-citus.md section 9).
namespace aggregate_column {
enum : int { kTopic = 1, kAggregate, kLastSeq, kRoute, kLastPosition };
constexpr int kCount = kLastSeq;
constexpr int kRoutedCount = kLastPosition;
}  // namespace aggregate_column

// Of idempotency.applied_versions.
namespace applied_column {
enum : int { kRole = 1, kExpiresAt, kVersion, kScope, kEntity };
constexpr int kCount = kEntity;
}  // namespace applied_column

struct MessagingOids {
  Oid outbox;
  Oid outbox_pkey;       // (event_id)
  Oid outbox_pending;    // (position) WHERE state = 'p'
  Oid outbox_dead;       // (position) WHERE state = 'x'
  Oid outbox_delivered;  // (delivered_at) WHERE state = 'd'
  Oid aggregates;
  Oid aggregates_pkey;  // (topic, aggregate)
  Oid applied;
  Oid applied_pkey;     // (role, scope, entity)
  Oid applied_expires;  // (expires_at)
  Oid position;         // the sequence
  RegProcedure key_eq;  // idem_key equality, as outbox_pkey's operator family has it
};

// Where a messaging call that takes a routing value (idem_emit, idem_apply_version)
// writes: the node-local tables, or with a distributed store (idem_distribute) the
// shards on this node of the routed copies co-located with the business table,
// idempotency.routed_outbox, routed_outbox_aggregates and routed_applied_versions,
// whose rows end with the route (one more column; their unique indexes end with it).
struct MessagingTarget {
  MessagingOids oids;  // node-local tables, or the route's shards (position: the
                       // node's own sequence either way)
  bool routed;         // the shards: each row and unique look-up also has the route
  Datum route;         // the routing value, of the distribution column's type
  RegProcedure outbox_route_eq, aggregates_route_eq, applied_route_eq;
};

// For a call whose argument `route_arg` is the routing value ("any", NULL when not
// given): false when the route's shard is on another node and Citus can take the call
// there (citus_may_forward): the caller forwards it with *route (citus_forward);
// otherwise true and *target filled in. Errors: a route without a distributed store
// 55000; a distributed store without a route 22023; a route of another type 42804;
// the routed tables missing (a store distributed with 1.3) 55000; the shard on
// another node when Citus cannot take the call there IK006.
struct Route;  // pg/keys/key_row.hpp
bool messaging_target(FunctionCallInfo fcinfo, int route_arg, const char* function,
                      MessagingTarget* target, Route* route);

// This node's shards of idempotency.routed_applied_versions (a distributed store),
// for the reaper: heap, primary key and expires_at index of each, in the current
// memory context; returns how many (none when the store is not distributed).
struct AppliedShard {
  Oid applied;
  Oid applied_pkey;
  Oid applied_expires;
};
int local_applied_shards(AppliedShard** shards);

// Likewise this node's shards of idempotency.routed_outbox, for the reaper and
// idem_stats: heap and the three partial indexes by state of each.
struct OutboxShard {
  Oid outbox;
  Oid outbox_pending;    // (position) WHERE state = 'p'
  Oid outbox_dead;       // (position) WHERE state = 'x'
  Oid outbox_delivered;  // (delivered_at) WHERE state = 'd'
};
int local_outbox_shards(OutboxShard** shards);

// The messaging tables, or null when the database's extension is still at 1.0. A
// copy: opening a relation accepts invalidations, which clear the cache.
bool messaging_oids(MessagingOids* oids);
// The same, raising 55000 (run ALTER EXTENSION idempotency UPDATE) when absent.
MessagingOids required_messaging_oids();
// With a distributed key store (idem_distribute), idempotency.routed_outbox, where
// events emitted with a routing value are (55000 when a store distributed with 1.3 has
// no messaging tables yet); InvalidOid with a node-local store.
Oid routed_outbox();

}  // namespace idempotency
