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
namespace aggregate_column {
enum : int { kTopic = 1, kAggregate, kLastSeq };
constexpr int kCount = kLastSeq;
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

// The messaging tables, or null when the database's extension is still at 1.0. A
// copy: opening a relation accepts invalidations, which clear the cache.
bool messaging_oids(MessagingOids* oids);
// The same, raising 55000 (run ALTER EXTENSION idempotency UPDATE) when absent.
MessagingOids required_messaging_oids();
// 0A000 when the key store is distributed with Citus (idem_distribute): the outbox
// and applied versions are still node-local tables, so an event emitted or a version
// applied in a delegated call would be stored where the relay or a retry routed
// elsewhere does not look (docs/design-citus.md, section 9).
void refuse_with_distributed_store(const char* function);

}  // namespace idempotency
