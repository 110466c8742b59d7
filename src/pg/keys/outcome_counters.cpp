#include "pg/keys/outcome_counters.hpp"

extern "C" {
#include "access/xact.h"
#include "miscadmin.h"
#include "port/atomics.h"
#include "storage/spin.h"
#include "utils/syscache.h"
}

namespace idempotency {

// Databases whose backends have answered since server start; an entry of a dropped
// database is taken for another once the table is full.
constexpr int kCountedDatabases = 256;

// One cache line per database, so that databases do not slow each other's adds.
struct alignas(PG_CACHE_LINE_SIZE) DatabaseCounters {
  Oid database;  // InvalidOid: free; set under the mutex, after the counters are zeroed
  pg_atomic_uint64 totals[kAnswerKinds];
};

struct AnswerCounters {
  slock_t mutex;  // taken once per backend, to find or make its database's entry
  DatabaseCounters databases[kCountedDatabases];
};

static AnswerCounters* shared;  // null unless preloaded
// This backend's entry, found once (a backend stays in its database).
static DatabaseCounters* own_entry;
static bool entry_looked_for;  // once: a full table is not searched on every answer

Size answer_counters_size() { return sizeof(AnswerCounters) + PG_CACHE_LINE_SIZE; }

void attach_answer_counters(void* memory, bool initialize) {
  auto aligned = reinterpret_cast<void*>(TYPEALIGN(PG_CACHE_LINE_SIZE, memory));
  shared = static_cast<AnswerCounters*>(aligned);
  if (!initialize) return;
  SpinLockInit(&shared->mutex);
  for (DatabaseCounters& entry : shared->databases) {
    entry.database = InvalidOid;
    for (pg_atomic_uint64& total : entry.totals) pg_atomic_init_u64(&total, 0);
  }
}

// This database's entry, made in a free one if there is none.
static DatabaseCounters* find_entry() {
  DatabaseCounters* entry = nullptr;
  SpinLockAcquire(&shared->mutex);
  DatabaseCounters* free_entry = nullptr;
  for (DatabaseCounters& candidate : shared->databases) {
    if (candidate.database == MyDatabaseId) entry = &candidate;
    if (free_entry == nullptr && candidate.database == InvalidOid) free_entry = &candidate;
  }
  if (entry == nullptr && free_entry != nullptr) {
    for (pg_atomic_uint64& total : free_entry->totals) pg_atomic_write_u64(&total, 0);
    free_entry->database = MyDatabaseId;
    entry = free_entry;
  }
  SpinLockRelease(&shared->mutex);
  return entry;
}

// Frees the entries of dropped databases. The catalog looks run outside the mutex (no
// look may run under a spinlock); needs a transaction.
static void free_dropped_entries() {
  if (!IsTransactionState()) return;
  Oid gone[kCountedDatabases];
  int ngone = 0;
  for (DatabaseCounters& entry : shared->databases) {
    Oid database = entry.database;  // a plain 4-byte read
    if (OidIsValid(database) && !SearchSysCacheExists1(DATABASEOID, ObjectIdGetDatum(database)))
      gone[ngone++] = database;
  }
  SpinLockAcquire(&shared->mutex);
  for (int i = 0; i < ngone; i++)
    for (DatabaseCounters& entry : shared->databases)
      if (entry.database == gone[i]) entry.database = InvalidOid;
  SpinLockRelease(&shared->mutex);
}

static DatabaseCounters* entry_for_backend() {
  if (entry_looked_for || shared == nullptr || !OidIsValid(MyDatabaseId)) return own_entry;
  entry_looked_for = true;
  own_entry = find_entry();
  if (own_entry == nullptr) {
    free_dropped_entries();
    own_entry = find_entry();
  }
  return own_entry;
}

void count_answer(Answer answer) {
  if (DatabaseCounters* entry = entry_for_backend())
    pg_atomic_fetch_add_u64(&entry->totals[static_cast<int>(answer)], 1);
}

bool answer_totals(int64 totals[kAnswerKinds]) {
  DatabaseCounters* entry = entry_for_backend();
  if (entry == nullptr) return false;
  for (int i = 0; i < kAnswerKinds; i++)
    totals[i] = static_cast<int64>(pg_atomic_read_u64(&entry->totals[i]));
  return true;
}

}  // namespace idempotency
