// What one reaper pass does in the current database, for the background worker and
// idem_reap: the store finds the rows, the core (is_reapable, is_stale, abandon)
// decides, and rows other transactions are writing are skipped, never waited for.
#pragma once

#include "pg/keys/store.hpp"

namespace idempotency {

// Deletes rows whose dedup window has passed and that are not live, from `position`
// on (see ReapPosition); at most max_rows. Returns how many it deleted.
int64 sweep_expired(KeyStore* store, Snapshot snapshot, TimestampTz now, int64 max_rows,
                    ReapPosition* position);
// Deletes the rows of roles that no longer exist; at most max_rows.
int64 sweep_dropped_roles(KeyStore* store, Snapshot snapshot, int64 max_rows);
// Marks pending claims whose lease ran out abandoned; at most max_rows.
int64 sweep_stale(KeyStore* store, Snapshot snapshot, TimestampTz now, int64 max_rows);
// Store `n` of messaging, as local_stores numbers the key stores: 0 the node-local
// tables, then this node's shards of routed_applied_versions, then its shards of
// routed_outbox (a distributed store): removes delivered outbox events older than
// idempotency.outbox_retention and applied versions (idem_apply_version) that expired
// or whose role no longer exists; at most max_rows, into *deleted. Rows being written
// are skipped. False when there is no store `n` (nothing in a database whose extension
// is still at 1.0).
bool sweep_messaging(int n, Snapshot snapshot, TimestampTz now, int64 max_rows, int64* deleted);
// Counts pending claims whose lease ran out (the reaper's next work), up to max_rows.
int64 count_stale(KeyStore* store, Snapshot snapshot, TimestampTz now, int64 max_rows);

}  // namespace idempotency
