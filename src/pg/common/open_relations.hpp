// The library's tables and indexes, opened once per transaction: a transaction that
// claims, completes and emits opens each relation, and builds the executor state that
// inserts index entries (the partial indexes' predicates compiled), once instead of
// once per call. They belong to the top-level transaction, not to a subtransaction
// that could roll back under them; they are closed before it commits or prepares and
// before any utility command (TRUNCATE, ALTER TABLE or DROP of one of them must not
// find it open), before the abort of a subtransaction that opened them (which may
// undo what they describe), and forgotten when it aborts, whose cleanup releases them. What
// writing an index entry needs to know of each index is kept for the session, until
// the relcache reports a change to the table or the index.
#pragma once

#include "pg/common/postgres.hpp"

extern "C" {
#include "nodes/execnodes.h"
#include "storage/lockdefs.h"
}

namespace idempotency {

// The table or index `relation`, locked at least in `mode` until the transaction ends.
Relation open_for_transaction(Oid relation, LOCKMODE mode);

// Executor state to insert index entries into the indexes of `heap` (opened with
// open_for_transaction for writing), with the unique indexes ready to be arbiters.
// The caller resets its per-tuple memory after each use.
struct IndexWriter {
  EState* estate;
  ResultRelInfo* result_rel;
};
IndexWriter index_writer_for_transaction(Relation heap);

// Calls `callback` on every relcache invalidation, as CacheRegisterRelcacheCallback
// would, through one registration for the whole library: a backend has 10 such slots
// for all its libraries (inval.c MAX_RELCACHE_CALLBACKS), and Citus takes most of them.
// A callback given again is not added twice.
void on_relcache_invalidation(void (*callback)(Datum, Oid));

// The OID of the extension's relation `name` in schema idempotency, or InvalidOid;
// remembered with (a copy of) its name, for open_current.
Oid extension_relation(const char* name);

// `oid` locked in `mode`, or if a REINDEX CONCURRENTLY replaced that index since its
// OID was cached (by extension_relation), the index now of its name (*opened says
// which). For relations not kept open for the transaction too (the reaper's scans,
// idem_stats).
Relation open_current(Oid oid, LOCKMODE mode, Oid* opened);

// Closes them all (before commit, prepare and utility commands). The locks of the
// tables are held until the transaction ends; those of the indexes are released, as
// the executor releases them after a statement, except at commit (kKeepToTransactionEnd),
// where the transaction's end that follows releases them with all its others, cheaper.
enum class IndexLocks { kRelease, kKeepToTransactionEnd };
void close_transaction_relations(IndexLocks index_locks = IndexLocks::kRelease);
// Closes them all if any was opened, or got its index writer, in the subtransaction
// `aborted` or one below it: what they describe may have been undone with it (an
// index created or dropped, a TRUNCATE's new files), so the next call opens afresh.
void close_relations_of_aborted_subtransaction(SubTransactionId aborted);
// Forgets them (at abort, which releases them with the transaction's resources).
void forget_transaction_relations();

}  // namespace idempotency
