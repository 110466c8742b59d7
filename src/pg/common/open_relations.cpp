#include "pg/common/open_relations.hpp"

#include "pg/common/compat.hpp"

extern "C" {
#include "catalog/namespace.h"
#include "access/genam.h"
#include "access/relation.h"
#include "access/xact.h"
#include "catalog/index.h"
#include "catalog/pg_am.h"
#include "executor/executor.h"
#include "optimizer/optimizer.h"
#include "storage/lmgr.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/builtins.h"
#include "utils/resowner.h"
}

namespace idempotency {

namespace {

struct Entry {
  Oid oid;
  Oid replaced;  // the OID asked for, when it named an index REINDEX CONCURRENTLY replaced
  LOCKMODE mode;
  Relation relation;
  IndexWriter writer;          // estate null until the first write
  SubTransactionId opened_in;  // the subtransaction that opened it or made its writer
};

// In a child of TopTransactionContext; null when the transaction has opened nothing.
MemoryContext context = nullptr;
List* entries = NIL;

// Runs `open` in the cache's memory, with the top-level transaction owning what it
// opens and locks. An error leaves both switched: the abort that follows resets them.
template <typename Open>
void as_transaction(Open open) {
  if (context == nullptr)
    context = AllocSetContextCreate(TopTransactionContext, "idempotency open relations",
                                    ALLOCSET_SMALL_SIZES);
  MemoryContext caller_context = MemoryContextSwitchTo(context);
  ResourceOwner caller_owner = CurrentResourceOwner;
  CurrentResourceOwner = TopTransactionResourceOwner;
  open();
  CurrentResourceOwner = caller_owner;
  MemoryContextSwitchTo(caller_context);
}

Entry* find(Oid oid) {
  ListCell* cell;
  foreach (cell, entries) {
    auto entry = static_cast<Entry*>(lfirst(cell));
    if (entry->oid == oid || entry->replaced == oid) return entry;
  }
  return nullptr;
}

// What inserting into a table's indexes needs to know of them (key columns,
// uniqueness, the partial indexes' predicates compiled), described once per session
// instead of once per transaction; dropped when the relcache says the table or one of
// its indexes changed. Only where every index is a B-tree on plain columns: other
// access methods may keep state of their own in the description, and an index
// expression's compiled form is made at the first insert in the executor state's
// memory, which the transaction frees; such a table is described per transaction.
struct IndexDescriptions {
  MemoryContext context;  // holds all of it
  Oid heap;
  List* indexes;      // their OIDs, in RelationGetIndexList's order
  IndexInfo** infos;  // one per index
  bool valid;         // false once invalidated; freed when no writer can use it
};

List* described = NIL;  // of IndexDescriptions*, in CacheMemoryContext

void forget_descriptions(Datum, Oid relid) {
  ListCell* cell;
  foreach (cell, described) {
    auto d = static_cast<IndexDescriptions*>(lfirst(cell));
    if (relid == InvalidOid || relid == d->heap || list_member_oid(d->indexes, relid))
      d->valid = false;
  }
}

// Frees the invalidated descriptions: called when the transaction's writers are gone.
void free_stale_descriptions() {
  ListCell* cell;
  foreach (cell, described) {
    auto d = static_cast<IndexDescriptions*>(lfirst(cell));
    if (d->valid) continue;
    described = foreach_delete_current(described, cell);
    MemoryContextDelete(d->context);
  }
}

// `index`'s description as ExecOpenIndices(..., true) builds it, its predicate compiled
// as ExecInsertIndexTuples would compile it at the first insert.
IndexInfo* describe(Relation index) {
  IndexInfo* info = BuildIndexInfo(index);
  if (info->ii_Unique && !index->rd_index->indisexclusion) BuildSpeculativeIndexInfo(index, info);
  if (info->ii_Predicate != NIL)
    info->ii_PredicateState = ExecInitQual(
        reinterpret_cast<List*>(expression_planner(reinterpret_cast<Expr*>(info->ii_Predicate))),
        nullptr);
  return info;
}

bool describable_for_session(Relation index) {
  if (index->rd_rel->relam != BTREE_AM_OID) return false;
  for (int i = 0; i < index->rd_index->indnatts; i++)
    if (index->rd_index->indkey.values[i] == 0) return false;  // an expression
  return true;
}

IndexDescriptions* valid_descriptions(Oid heap, List* indexes) {
  ListCell* cell;
  foreach (cell, described) {
    auto d = static_cast<IndexDescriptions*>(lfirst(cell));
    if (d->valid && d->heap == heap && equal(d->indexes, indexes)) return d;
  }
  return nullptr;
}

// Opens `heap`'s indexes for inserting into them, as ExecOpenIndices(result_rel, true)
// does, with their descriptions kept for the session where they can be. Each index
// is counted in ri_NumIndices as soon as it is open, so that an error part way (a
// lock_timeout on the third index) leaves nothing open that closing does not close.
void open_indexes(ResultRelInfo* result_rel) {
  Relation heap = result_rel->ri_RelationDesc;
  List* indexes = RelationGetIndexList(heap);
  int count = list_length(indexes);
  if (count == 0) return;
  auto relations = static_cast<Relation*>(palloc0(count * sizeof(Relation)));
  result_rel->ri_IndexRelationDescs = relations;
  for (int i = 0; i < count; i++) {
    relations[i] = index_open(list_nth_oid(indexes, i), RowExclusiveLock);
    result_rel->ri_NumIndices = i + 1;
  }
  IndexDescriptions* known = valid_descriptions(RelationGetRelid(heap), indexes);
  if (known != nullptr) {
    result_rel->ri_IndexRelationInfo = known->infos;
    list_free(indexes);
    return;
  }
  bool for_session = true;
  for (int i = 0; i < count; i++) for_session &= describable_for_session(relations[i]);
  // Otherwise described in the transaction's memory, the caller's.
  MemoryContext own =
      for_session ? AllocSetContextCreate(CacheMemoryContext, "idempotency index descriptions",
                                          ALLOCSET_SMALL_SIZES)
                  : CurrentMemoryContext;
  MemoryContext caller_context = MemoryContextSwitchTo(own);
  auto infos = static_cast<IndexInfo**>(palloc(count * sizeof(IndexInfo*)));
  for (int i = 0; i < count; i++) infos[i] = describe(relations[i]);
  if (for_session) {
    on_relcache_invalidation(forget_descriptions);
    auto d = static_cast<IndexDescriptions*>(palloc(sizeof(IndexDescriptions)));
    *d = IndexDescriptions{own, RelationGetRelid(heap), list_copy(indexes), infos, true};
    MemoryContextSwitchTo(CacheMemoryContext);
    described = lappend(described, d);
  }
  MemoryContextSwitchTo(caller_context);
  result_rel->ri_IndexRelationInfo = infos;
  list_free(indexes);
}

// Closes what open_indexes opened, also when it stopped part way (no descriptions yet).
// ExecCloseIndices releases each index's lock; at commit they are left to the end of
// the transaction instead, which releases all its locks at once (a lock released one
// at a time here cost about 1,000 instructions, see docs/performance.md).
void close_indexes(ResultRelInfo* result_rel, bool keep_locks) {
  if (result_rel->ri_IndexRelationInfo == nullptr) {
    for (int i = 0; i < result_rel->ri_NumIndices; i++)
      index_close(result_rel->ri_IndexRelationDescs[i], NoLock);
    return;
  }
  if (!keep_locks) return ExecCloseIndices(result_rel);
  for (int i = 0; i < result_rel->ri_NumIndices; i++) {  // ExecCloseIndices but for the lock
    compat::index_insert_cleanup(result_rel->ri_IndexRelationDescs[i],
                                 result_rel->ri_IndexRelationInfo[i]);
    index_close(result_rel->ri_IndexRelationDescs[i], NoLock);
    result_rel->ri_IndexRelationDescs[i] = nullptr;
  }
}

}  // namespace

// The catalogs cache OIDs looked up by name. REINDEX CONCURRENTLY moves an index's name
// to the new index (the old one becomes <name>_ccold) and drops the old one, so a
// cached OID can be gone once its lock is granted: the relation meant is then the one
// now of the name it was looked up by. The last kNamed look-ups are kept for that.
namespace {
constexpr int kNamed = 64;
struct NamedRelation {
  Oid oid;
  NameData name;  // a copy: shards' names are made at run time
};
NamedRelation named[kNamed];
int named_next = 0;

const char* looked_up_as(Oid oid) {
  for (const NamedRelation& n : named)
    if (n.oid == oid) return NameStr(n.name);
  return nullptr;
}
}  // namespace

constexpr int kRelcacheCallbacks = 8;
static void (*relcache_callbacks[kRelcacheCallbacks])(Datum, Oid);
static int relcache_callback_count;

static void call_relcache_callbacks(Datum arg, Oid relid) {
  for (int i = 0; i < relcache_callback_count; i++) relcache_callbacks[i](arg, relid);
}

void on_relcache_invalidation(void (*callback)(Datum, Oid)) {
  for (int i = 0; i < relcache_callback_count; i++)
    if (relcache_callbacks[i] == callback) return;
  if (relcache_callback_count == kRelcacheCallbacks)
    elog(ERROR, "out of the idempotency library's relcache callback slots");
  if (relcache_callback_count == 0) CacheRegisterRelcacheCallback(call_relcache_callbacks, 0);
  relcache_callbacks[relcache_callback_count++] = callback;
}

Oid extension_relation(const char* name) {
  Oid schema = get_namespace_oid("idempotency", true);
  Oid oid = OidIsValid(schema) ? get_relname_relid(name, schema) : InvalidOid;
  if (OidIsValid(oid) && looked_up_as(oid) == nullptr) {
    NameData copy;  // `name` may be a slot's own, the one overwritten next
    namestrcpy(&copy, name);
    named[named_next] = NamedRelation{oid, copy};
    named_next = (named_next + 1) % kNamed;
  }
  return oid;
}

Relation open_current(Oid oid, LOCKMODE mode, Oid* opened) {
  for (;;) {
    Relation relation = try_relation_open(oid, mode);
    const char* name = looked_up_as(oid);
    // Swapped out but not yet dropped: no longer valid, and soon not ready for
    // inserts either, so a scan of it could miss new keys.
    bool swapped_out = relation != nullptr && relation->rd_index != nullptr &&
                       !relation->rd_index->indisvalid && name != nullptr &&
                       extension_relation(name) != oid;
    if (relation != nullptr && !swapped_out) {
      *opened = oid;
      return relation;
    }
    if (swapped_out) relation_close(relation, mode);
    Oid current = name == nullptr ? InvalidOid : extension_relation(name);
    if (!OidIsValid(current) || current == oid)
      ereport(ERROR, errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
              errmsg("a relation of the idempotency extension was dropped while in use"),
              errdetail("Relation %u no longer exists.", oid), errhint("Retry the transaction."));
    oid = current;
  }
}

Relation open_for_transaction(Oid oid, LOCKMODE mode) {
  Entry* entry = find(oid);
  if (entry != nullptr && entry->mode >= mode) return entry->relation;
  as_transaction([&] {
    if (entry != nullptr) {  // opened to read, now written
      LockRelationOid(entry->oid, mode);
      entry->mode = mode;
      return;
    }
    Oid opened;
    Relation relation = open_current(oid, mode, &opened);
    entry = static_cast<Entry*>(palloc0(sizeof(Entry)));
    *entry = Entry{opened, opened == oid ? InvalidOid : oid, mode, relation,
                   {},     GetCurrentSubTransactionId()};
    entries = lappend(entries, entry);
  });
  return entry->relation;
}

IndexWriter index_writer_for_transaction(Relation heap) {
  Entry* entry = find(RelationGetRelid(heap));
  Assert(entry != nullptr && entry->mode >= RowExclusiveLock);
  if (entry->writer.estate == nullptr) {
    as_transaction([&] {
      IndexWriter writer;
      writer.estate = CreateExecutorState();
      writer.result_rel = makeNode(ResultRelInfo);
      InitResultRelInfo(writer.result_rel, heap, 0, nullptr, 0);
      entry->writer = writer;  // before opening the indexes: closing finds what opened
      entry->opened_in = GetCurrentSubTransactionId();
      open_indexes(writer.result_rel);
    });
  }
  return entry->writer;
}

void close_transaction_relations(IndexLocks index_locks) {
  if (context == nullptr) return;
  ResourceOwner caller_owner = CurrentResourceOwner;
  CurrentResourceOwner = TopTransactionResourceOwner;
  ListCell* cell;
  foreach (cell, entries) {
    auto entry = static_cast<Entry*>(lfirst(cell));
    if (entry->writer.estate != nullptr) {
      close_indexes(entry->writer.result_rel, index_locks == IndexLocks::kKeepToTransactionEnd);
      FreeExecutorState(entry->writer.estate);
    }
    relation_close(entry->relation, NoLock);  // locks are held until the transaction ends
  }
  CurrentResourceOwner = caller_owner;
  forget_transaction_relations();
}

void close_relations_of_aborted_subtransaction(SubTransactionId aborted) {
  ListCell* cell;
  foreach (cell, entries) {
    if (static_cast<Entry*>(lfirst(cell))->opened_in >= aborted) {
      close_transaction_relations();
      return;
    }
  }
}

void forget_transaction_relations() {
  if (context != nullptr) MemoryContextDelete(context);
  context = nullptr;
  entries = NIL;
  free_stale_descriptions();
}

}  // namespace idempotency
