// The key store: the only code that reads and writes idempotency.keys. It reads and
// writes what it is told; the decisions are in src/core/decision.hpp.
#pragma once

#include "core/decision.hpp"
#include "pg/postgres.hpp"

extern "C" {
#include "access/genam.h"
#include "access/tableam.h"
#include "nodes/execnodes.h"
#include "utils/rel.h"
#include "utils/timestamp.h"
}

namespace idempotency {

// Attribute numbers of idempotency.keys, as the install script creates it.
enum KeysColumn {
  kRole = 1,
  kAttempt,
  kFirstClaimedAt,
  kExpiresAt,
  kReapSlot,
  kScope,
  kKey,
  kFingerprint,
  kLease,
  kCheckpoint,
  kCheckpointData,
  kLeaseExpiresAt,
  kState,
  kResponse,
};
constexpr int kKeysColumns = kResponse;

// (role, scope, key): who owns a key and what it is.
struct Identity {
  Oid role;
  text* scope;
  struct varlena* key;
};

// One row of idempotency.keys as plain datums, indexed by KeysColumn - 1.
struct KeyRow {
  Datum values[kKeysColumns];
  bool isnull[kKeysColumns];

  Datum get(KeysColumn c) const { return values[c - 1]; }
  bool null(KeysColumn c) const { return isnull[c - 1]; }
  void set(KeysColumn c, Datum d) { values[c - 1] = d, isnull[c - 1] = false; }
  void clear(KeysColumn c) { values[c - 1] = 0, isnull[c - 1] = true; }
};

// The open table and index for one call. Executor state for writes is made lazily,
// so a replay opens no more than the index it reads.
struct KeyStore {
  MemoryContext context;  // the opener's: what is made lazily lives as long as the store
  Relation heap;
  Relation index;
  TupleTableSlot* read_slot;
  EState* estate;
  ResultRelInfo* result_rel;
  TupleTableSlot* write_slot;
  List* arbiters;  // the primary key, for speculative insertion
  bool wrote;
};

// What a probe saw.
struct Probe {
  bool found;
  bool unwritten;  // this transaction's in-transaction claim, its row not yet written
  bool written_here;  // this transaction wrote the version found
  ItemPointerData tid;
  TransactionId writer;  // another running transaction writing this row version
  KeyRow row;            // copied into the caller's memory context
  StoredRow view;        // the same row for the decision functions
};

// Opens the store for reading (idem_lookup) or writing.
void store_open(KeyStore* store, bool for_write);
// Closes it; after writes, makes them visible to the rest of the transaction.
void store_close(KeyStore* store);

// Finds the identity's row version. With a null snapshot the probe sees what other
// transactions are writing (a dirty snapshot) and, under REPEATABLE READ or
// SERIALIZABLE, raises 40001 for a committed row the transaction cannot see.
void store_probe(KeyStore* store, const Identity& id, Snapshot snapshot, Probe* probe);

// Inserts a row unless the primary key already holds one of its identity (then
// false: probe again). The caller holds the identity's lock and has seen no row.
bool store_insert(KeyStore* store, KeyRow* row);

// The key of the identity locks' hash, generated at install (idempotency.lock_secret);
// size 0 in a database whose extension is still at 1.0.
struct LockSecret {
  unsigned char bytes[32];
  size_t size;
};
LockSecret store_lock_secret();

// The key's slot in the reaper's index (idempotency.keys.reap_slot).
int16 reap_slot(const Identity& id);

// A copy of `row` whose values live in `context`.
KeyRow* store_copy_row(KeyStore* store, const KeyRow& row, MemoryContext context);
// The row as the decision functions see it.
void store_view_row(const KeyRow& row, StoredRow* view);

// Outcome of an update or delete of a probed row.
enum class WriteResult { kDone, kBusy, kChanged };

// kBusy: another transaction is writing the row (its xid in *writer); kChanged: the
// row changed since the probe (probe again; 40001 under REPEATABLE READ).
WriteResult store_update(KeyStore* store, ItemPointer tid, KeyRow* row, TransactionId* writer);
WriteResult store_delete(KeyStore* store, ItemPointer tid, TransactionId* writer);

// Expiry, for the reaper and idem_reap: each scans with `snapshot`, acts on at
// most max_rows rows, skips rows other transactions are writing, and returns how
// many rows it changed.
// Deletes rows whose dedup window has passed and that are not live (core is_live),
// from `position` on, which it advances: the next batch of a pass then starts where
// this one stopped, not again at index entries of rows already deleted (they stay
// until vacuum, and while an older snapshot is open each costs a heap visit).
struct ReapPosition {
  int16 slot = 0;               // reap_slot
  TimestampTz from = DT_NOBEGIN;  // expires_at in that slot
};
int64 store_reap_expired(KeyStore* store, Snapshot snapshot, TimestampTz now, int64 max_rows,
                         ReapPosition* position);
// Marks pending claims whose lease ran out abandoned.
int64 store_abandon_stale(KeyStore* store, Snapshot snapshot, TimestampTz now, int64 max_rows);
// Counts pending claims whose lease ran out (the reaper's next work), up to max_rows.
int64 store_count_stale_leases(KeyStore* store, Snapshot snapshot, TimestampTz now,
                               int64 max_rows);
// Deletes the rows of roles that no longer exist.
int64 store_reap_dropped_roles(KeyStore* store, Snapshot snapshot, int64 max_rows);

// Polls until the transaction ends (true) or the deadline passes (false), without
// joining a lock queue; query cancel and statement_timeout interrupt it.
bool wait_for_writer(TransactionId writer, TimestampTz deadline);
// One sleep of such a polled wait, backing off; false once `deadline` has passed.
bool sleep_before_retry(long* sleep_us, TimestampTz deadline);

// Every row of the table in index order for one role (the dropped-role sweep); read
// each with index_getnext_slot into store->read_slot, then store_read_slot.
IndexScanDesc store_begin_role_scan(KeyStore* store, Oid role, Snapshot snapshot);
// The role's lease claims (pending, stale or abandoned), oldest first: idem_abandoned
// reads these and not the role's other keys. Null in a database still at 1.0.
IndexScanDesc store_begin_leased_scan(KeyStore* store, Oid role, Snapshot snapshot);
// Ends either scan.
void store_end_scan(KeyStore* store, IndexScanDesc scan);
void store_read_slot(TupleTableSlot* slot, KeyRow* row, StoredRow* view);

}  // namespace idempotency
