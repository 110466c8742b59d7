// Direct access to the messaging tables (idempotency.outbox, outbox_aggregates,
// applied_versions): rows read through an index with a given snapshot, locked
// (without queueing, or waiting in the queue for their holder), inserted, updated and
// deleted with their index entries. No SPI, no planning. It reads and writes what it
// is told: the rules are in src/core/outbox.hpp, asked by the api_* files and the
// reaper.
#pragma once

#include <type_traits>

#include "pg/common/function_ref.hpp"
#include "pg/common/postgres.hpp"

extern "C" {
#include "access/genam.h"
#include "access/tableam.h"
#include "nodes/execnodes.h"
#include "utils/rel.h"
#include "utils/timestamp.h"
}

namespace idempotency {

// A column the library expects: its name and type (InvalidOid: the extension's own
// type named `extension_type`, idem_key unless given).
struct ColumnSpec {
  const char* name;
  Oid type;
  const char* extension_type = "idem_key";
};

// 55000 unless the table has exactly these columns, in this order: a library must
// never write columns it does not know (an older library against a newer schema).
void check_columns(Oid heap, const ColumnSpec* columns, int count);

// One table for a call (open_relations keeps it open for the transaction).
struct Table {
  Relation heap;
  TupleTableSlot* slot;        // the row last read or locked
  TupleTableSlot* write_slot;  // the row being written
  bool wrote;
};

static_assert(std::is_trivially_destructible_v<Table>);

void open_table(Table* table, Oid heap, bool for_write);
// After writes, makes them visible to the rest of the transaction.
void close_table(Table* table);

// A scan of an index of the table; each row found is in table->slot.
struct IndexCursor {
  Relation index;
  IndexScanDesc scan;
};

void cursor_open(Table* table, IndexCursor* cursor, Oid index, Snapshot snapshot, ScanKey keys,
                 int nkeys);
bool cursor_next(Table* table, IndexCursor* cursor);
void cursor_close(IndexCursor* cursor);
// The first row matching `keys` through `index` (a unique one: the row), in the slot.
bool table_find(Table* table, Oid index, Snapshot snapshot, ScanKey keys, int nkeys);

// The equality function of `index`'s column `column` (0-based), for scan keys.
RegProcedure index_equality(Oid index, int column);

// The row's values (1-based attribute numbers), valid while the slot holds it.
Datum column(Table* table, int attnum, bool* isnull);

// How one row version looks to a dirty snapshot (judged under its buffer's lock);
// for the key store's probe too.
struct VersionLook {
  bool visible;               // live, or being written by a transaction in progress
  ItemPointerData successor;  // valid when an update moved the row to another version
  TransactionId updater;      // that update's transaction
};
// `by_index`: the version came from an index scan, which returns its HOT successors
// itself (only a successor with index entries of its own is given); else it was
// reached by following a chain, and every successor is given.
VersionLook look_at_version(HeapTuple tuple, Buffer buffer, Snapshot dirty, bool by_index);
// A scan can pass the place where an update puts the new version's index entry just
// before the update inserts it, and reach the old version just after the update
// commits: the row would seem gone. True, with the successor in `slot`, when the
// chain of versions ends in one the dirty snapshot sees; the chain goes on through
// HOT updates too (an expired key's claim moves the row to a new entry, its
// completion then updates it in place).
bool follow_update_chain(Relation heap, VersionLook look, Snapshot dirty, TupleTableSlot* slot);

// What a look at a row by a unique key found: its live version, or the version
// another transaction in progress is writing (then `writer`, to wait for). The row
// is in the table's slot.
struct Look {
  bool found;
  ItemPointerData tid;
  TransactionId writer;
};
Look table_look(Table* table, Oid index, ScanKey keys, int nkeys);

enum class Lock {
  kLocked,  // locked; the slot holds its newest version
  kBusy,    // another transaction is writing or locking it
  kGone,    // deleted
};
// Locks the row's newest version for update without waiting.
Lock table_lock(Table* table, ItemPointer tid);
// The same, while it is busy waiting in the queue for the transaction that holds it
// (waits.hpp: the deadlock detector sees it) until `deadline`, then kBusy.
Lock table_lock_waiting(Table* table, ItemPointer tid, TimestampTz deadline);
// The other transaction in progress that writes or locks the version at `tid`, to
// wait for (waits.hpp's wait_for_writer); invalid if none does any more: its holder
// just ended, or only this transaction holds it (a lock of its own, SELECT ... FOR
// UPDATE by hand: waiting for itself would never end). For the key store too.
TransactionId version_holder(Relation heap, ItemPointer tid);
inline TransactionId table_holder(Table* table, ItemPointer tid) {
  return version_holder(table->heap, tid);
}

// An update or delete of the version at `tid`, `write(wait)`, made without waiting.
// If that finds the version busy with no other holder (version_holder), the version is
// locked for update without waiting and written again waiting, which then goes over
// this transaction's own lock and cannot wait: a row the transaction locked itself is
// written at once, as an UPDATE would. TM_BeingModified: another transaction holds it,
// *holder (invalid if it ended meanwhile: look again). No slot of the caller's is used.
TM_Result write_version(Relation heap, ItemPointer tid, FunctionRef<TM_Result(bool wait)> write,
                        TransactionId* holder);

// Writes with index entries. A unique violation (a row made by hand outside the
// functions) raises 23505.
void table_insert(Table* table, const Datum* values, const bool* nulls);
// Updates a row this transaction locked (or may write: no one else can).
void table_update(Table* table, ItemPointer tid, const Datum* values, const bool* nulls);
// Updates the version at `tid` unless another transaction is writing or locking it
// (kBusy; not one only this transaction locked) or it is no longer the newest (kChanged:
// updated or deleted since it was read). kDone means the version decided on was the
// newest: no lock needed first, one write instead of two.
enum class Write { kDone, kBusy, kChanged };
Write table_try_update(Table* table, ItemPointer tid, const Datum* values, const bool* nulls);
// The same for a delete.
Write table_try_delete(Table* table, ItemPointer tid);

}  // namespace idempotency
