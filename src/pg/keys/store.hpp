// The key store: the only code that reads and writes idempotency.keys. It reads and
// writes what it is told and decides nothing: the decisions are in
// src/core/key_state.hpp, asked by the driver (claims and finishes) and the reaper.
#pragma once

#include <type_traits>

#include "core/key_state.hpp"
#include "pg/keys/key_row.hpp"
#include "pg/keys/store_catalog.hpp"
#include "pg/common/postgres.hpp"

extern "C" {
#include "access/genam.h"
#include "access/tableam.h"
#include "nodes/execnodes.h"
#include "utils/rel.h"
#include "utils/timestamp.h"
}

namespace idempotency {

// The table and primary key for one call (open_relations keeps them open for the
// transaction). Executor state for writes is made on the first write, so a replay
// opens no more than the index it reads.
struct KeyStore {
  StoreOids oids;         // idempotency.keys, or one local shard of routed_keys
  MemoryContext context;  // the opener's: what is made lazily lives as long as the store
  Relation heap;
  Relation index;
  TupleTableSlot* read_slot;
  TupleTableSlot* write_slot;  // made on the first write
  bool wrote;
};

// What a probe saw.
struct Probe {
  bool found;
  bool unwritten;  // this transaction's in-transaction claim, its row not yet written
  ItemPointerData tid;
  TransactionId writer;  // another running transaction writing this row version
  KeyRow row;            // copied into the caller's memory context
  StoredRow view;        // the same row for the decision functions (with who wrote it)
};

static_assert(std::is_trivially_destructible_v<KeyStore>);

// Opens the store `oids` names (store_for_key, local_stores) for reading
// (idem_lookup) or writing.
void store_open(KeyStore* store, const StoreOids& oids, bool for_write);
// Closes it; after writes, makes them visible to the rest of the transaction.
void store_close(KeyStore* store);

// Finds the identity's row version. With a null snapshot the probe sees what other
// transactions are writing (a dirty snapshot) and, under REPEATABLE READ or
// SERIALIZABLE, raises 40001 for a committed row the transaction cannot see.
void store_probe(KeyStore* store, const Identity& id, Snapshot snapshot, Probe* probe);

// Inserts a row unless a unique index already holds one like it (then false). The caller holds the
// identity's lock and has seen no row. On a conflict, kBackOut takes the row back (the caller
// probes again); kReport leaves it, for a caller that then raises an error (cheaper: no speculative
// insertion).
enum class OnConflict { kBackOut, kReport };
bool store_insert(KeyStore* store, const KeyRow* row, OnConflict on_conflict);

// Outcome of an update or delete of a probed row.
enum class WriteResult { kDone, kBusy, kChanged };

// kBusy: another transaction is writing or locking the row (its xid in *writer, invalid
// if it ended meanwhile; a row only this transaction locked is written over its own
// lock, common/table.hpp's write_version); kChanged: the
// row changed since the probe (probe again; 40001 under REPEATABLE READ).
WriteResult store_update(KeyStore* store, ItemPointer tid, const KeyRow* row,
                         TransactionId* writer);
WriteResult store_delete(KeyStore* store, ItemPointer tid, TransactionId* writer);

// Scans for the reaper, idem_reap, idem_stats and idem_abandoned. Each visits rows
// with `snapshot`, a copy of each row alive only during its visit, and stops after
// max_rows rows the visitor counted (it returns true for those); it returns that count.
using RowVisitor = bool (*)(KeyStore* store, KeyRow* row, const StoredRow& view, ItemPointer tid,
                            void* context);

// Every row, in table order (idem_stats on a small table).
int64 store_scan_table(KeyStore* store, Snapshot snapshot, RowVisitor visit, void* context);
// Rows whose dedup window has passed (the expiry index, expires_at <= now), from
// `position` on, which it advances: the next batch of a pass then starts where this
// one stopped, not again at index entries of rows already deleted (they stay until
// vacuum, and while an older snapshot is open each costs a heap visit).
struct ReapPosition {
  int16 slot = 0;                 // reap_slot
  TimestampTz from = DT_NOBEGIN;  // expires_at in that slot
};
int64 store_scan_expired(KeyStore* store, Snapshot snapshot, TimestampTz now, int64 max_rows,
                         ReapPosition* position, RowVisitor visit, void* context);
// Lease claims whose lease ended by `now` (the lease index).
int64 store_scan_lease_ends(KeyStore* store, Snapshot snapshot, TimestampTz now, int64 max_rows,
                            RowVisitor visit, void* context);
// The first role after `after` that has keys, or InvalidOid (a loose scan of the
// primary key: one probe per role).
Oid store_next_role(KeyStore* store, Snapshot snapshot, Oid after);
// Every row of one role, in primary key order.
int64 store_scan_role(KeyStore* store, Snapshot snapshot, Oid role, int64 max_rows,
                      RowVisitor visit, void* context);
// The role's lease claims (pending, stale or abandoned), oldest first, through
// keys_leased_idx; false (nothing visited) in a database still at 1.0, which lacks it.
bool store_scan_leased(KeyStore* store, Snapshot snapshot, Oid role, int64 max_rows,
                       RowVisitor visit, void* context);

}  // namespace idempotency
