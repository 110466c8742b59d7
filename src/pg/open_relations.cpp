#include "pg/open_relations.hpp"

extern "C" {
#include "access/relation.h"
#include "executor/executor.h"
#include "storage/lmgr.h"
#include "utils/memutils.h"
#include "utils/resowner.h"
}

namespace idempotency {

namespace {

struct Entry {
  Oid oid;
  LOCKMODE mode;
  Relation relation;
  IndexWriter writer;  // estate null until the first write
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
    if (entry->oid == oid) return entry;
  }
  return nullptr;
}

}  // namespace

Relation open_for_transaction(Oid oid, LOCKMODE mode) {
  Entry* entry = find(oid);
  if (entry != nullptr && entry->mode >= mode) return entry->relation;
  as_transaction([&] {
    if (entry != nullptr) {  // opened to read, now written
      LockRelationOid(oid, mode);
      entry->mode = mode;
      return;
    }
    Relation relation = relation_open(oid, mode);
    entry = static_cast<Entry*>(palloc0(sizeof(Entry)));
    *entry = Entry{oid, mode, relation, {}};
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
      ExecOpenIndices(writer.result_rel, true);
      entry->writer = writer;
    });
  }
  return entry->writer;
}

void close_transaction_relations() {
  if (context == nullptr) return;
  ResourceOwner caller_owner = CurrentResourceOwner;
  CurrentResourceOwner = TopTransactionResourceOwner;
  ListCell* cell;
  foreach (cell, entries) {
    auto entry = static_cast<Entry*>(lfirst(cell));
    if (entry->writer.estate != nullptr) {
      ExecCloseIndices(entry->writer.result_rel);
      FreeExecutorState(entry->writer.estate);
    }
    relation_close(entry->relation, NoLock);  // locks are held until the transaction ends
  }
  CurrentResourceOwner = caller_owner;
  forget_transaction_relations();
}

void forget_transaction_relations() {
  if (context != nullptr) MemoryContextDelete(context);
  context = nullptr;
  entries = NIL;
}

}  // namespace idempotency
