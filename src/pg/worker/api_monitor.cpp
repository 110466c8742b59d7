// idem_stats: figures for monitoring, quickly whatever the table's size.
#include <optional>

#include "pg/citus/citus_meta.hpp"
#include "pg/common/errors.hpp"
#include "pg/common/guc.hpp"
#include "pg/common/open_relations.hpp"
#include "pg/messaging/messaging_catalog.hpp"
#include "pg/common/table.hpp"
#include "pg/keys/outcome_counters.hpp"
#include "pg/worker/reaper_pass.hpp"
#include "pg/worker/worker.hpp"

extern "C" {
#include "access/heapam.h"
#include "access/htup_details.h"
#include "catalog/pg_database.h"
#include "catalog/pg_statistic.h"
#include "executor/spi.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "storage/bufmgr.h"
#include "tcop/utility.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"
#include "utils/tuplestore.h"
}

namespace idempotency {

// Counts by state. Up to this many pages the table is read and the counts are
// exact; beyond, they come from the planner's statistics (as fresh as the last
// ANALYZE), so idem_stats answers quickly whatever the table's size.
constexpr BlockNumber kExactCountPages = 1000;
// Stale lease claims are counted exactly through the lease index, up to this many:
// a healthy reaper keeps them near zero, and an alert needs no more precision.
constexpr int64 kStaleLeasesCountLimit = 10000;

struct StateCounts {
  double total, pending, completed, failed, abandoned, expired;
};

struct ExactCount {
  StateCounts counts;
  TimestampTz now;
};

static bool count_row(KeyStore*, KeyRow*, const StoredRow& view, ItemPointer, void* context) {
  auto exact = static_cast<ExactCount*>(context);
  StateCounts& counts = exact->counts;
  counts.total++;
  if (!is_live(view, exact->now)) {
    counts.expired++;
    return true;
  }
  switch (view.state) {
    case KeyState::kPending: counts.pending++; break;
    case KeyState::kCompleted: counts.completed++; break;
    case KeyState::kFailed: counts.failed++; break;
    case KeyState::kAbandoned: counts.abandoned++; break;
  }
  return true;
}

static StateCounts count_exactly(KeyStore* store) {
  ExactCount exact{StateCounts{}, GetCurrentTimestamp()};
  store_scan_table(store, GetActiveSnapshot(), count_row, &exact);
  return exact.counts;
}

static StateCounts estimate(KeyStore* store) {
  StateCounts counts{};
  counts.total = Max(store->heap->rd_rel->reltuples, 0);
  HeapTuple stats = SearchSysCache3(STATRELATTINH, ObjectIdGetDatum(RelationGetRelid(store->heap)),
                                    Int16GetDatum(kState), BoolGetDatum(false));
  if (HeapTupleIsValid(stats)) {
    AttStatsSlot slot;
    if (get_attstatsslot(&slot, stats, STATISTIC_KIND_MCV, InvalidOid,
                         ATTSTATSSLOT_VALUES | ATTSTATSSLOT_NUMBERS)) {
      for (int i = 0; i < slot.nvalues; i++) {
        double n = slot.numbers[i] * counts.total;
        switch (DatumGetChar(slot.values[i])) {
          case 'p': counts.pending = n; break;
          case 'c': counts.completed = n; break;
          case 'f': counts.failed = n; break;
          case 'a': counts.abandoned = n; break;
        }
      }
      free_attstatsslot(&slot);
    }
    ReleaseSysCache(stats);
  }
  stats = SearchSysCache3(STATRELATTINH, ObjectIdGetDatum(RelationGetRelid(store->heap)),
                          Int16GetDatum(kExpiresAt), BoolGetDatum(false));
  if (HeapTupleIsValid(stats)) {
    AttStatsSlot slot;
    if (get_attstatsslot(&slot, stats, STATISTIC_KIND_HISTOGRAM, InvalidOid, ATTSTATSSLOT_VALUES) &&
        slot.nvalues > 1) {
      TimestampTz now = GetCurrentTimestamp();
      int below = 0;
      for (int i = 0; i < slot.nvalues; i++) below += DatumGetTimestampTz(slot.values[i]) <= now;
      counts.expired = counts.total * below / slot.nvalues;
      free_attstatsslot(&slot);
    }
    ReleaseSysCache(stats);
  }
  return counts;
}

// Outbox events are counted exactly through their partial index up to this many;
// beyond, the index's size from the last VACUUM or ANALYZE is reported if larger.
constexpr int64 kExactOutboxCount = 10000;

struct OutboxFigures {
  int64 undelivered, dead;
  std::optional<TimestampTz> oldest_undelivered_at;  // the first pending event emitted
};

static int64 count_index(Table* outbox, Oid index, Snapshot snapshot) {
  IndexCursor cursor;
  cursor_open(outbox, &cursor, index, snapshot, nullptr, 0);
  int64 count = 0;
  while (count < kExactOutboxCount && cursor_next(outbox, &cursor)) count++;
  cursor_close(&cursor);
  if (count < kExactOutboxCount) return count;
  Oid opened;  // the index now of that name (REINDEX CONCURRENTLY)
  Relation rel = open_current(index, AccessShareLock, &opened);
  double estimate = rel->rd_rel->reltuples;
  index_close(rel, AccessShareLock);
  return Max(count, static_cast<int64>(estimate));
}

// Adds one outbox table's figures (idempotency.outbox, or a shard of routed_outbox).
static void add_outbox_figures(Oid heap, Oid pending, Oid dead, OutboxFigures* figures) {
  Table outbox;
  open_table(&outbox, heap, false);
  IndexCursor first;
  cursor_open(&outbox, &first, pending, GetActiveSnapshot(), nullptr, 0);
  if (cursor_next(&outbox, &first)) {
    bool isnull;
    TimestampTz emitted = DatumGetTimestampTz(column(&outbox, outbox_column::kEmittedAt, &isnull));
    if (!figures->oldest_undelivered_at || emitted < *figures->oldest_undelivered_at)
      figures->oldest_undelivered_at = emitted;
  }
  cursor_close(&first);
  figures->undelivered += count_index(&outbox, pending, GetActiveSnapshot());
  figures->dead += count_index(&outbox, dead, GetActiveSnapshot());
  close_table(&outbox);
}

// The node-local outbox and this node's shards of a distributed one.
static OutboxFigures outbox_figures(const MessagingOids& oids) {
  OutboxFigures figures{};
  add_outbox_figures(oids.outbox, oids.outbox_pending, oids.outbox_dead, &figures);
  OutboxShard* shards;
  int count = local_outbox_shards(&shards);
  for (int i = 0; i < count; i++)
    add_outbox_figures(shards[i].outbox, shards[i].outbox_pending, shards[i].outbox_dead, &figures);
  return figures;
}

// idem_stats' columns in 1.5: 1.0's twelve, 1.1's three of the outbox, 1.5's answer
// counters and the edition. The library serves each version's result type.
constexpr int kColumns = 20;

// On the coordinator of a distributed store: every node's figures added up, from
// idem_node_stats (which asks each node for idem_stats(node_only => true)). Reaper
// figures are summed too, its latest pass taken; worker_pid is per node only.
static Datum cluster_stats(FunctionCallInfo fcinfo, ReturnSetInfo* rsinfo) {
  // idem_node_stats is in idem_stats' schema; 1.5's adds the answer counters.
  const char* schema =
      quote_identifier(get_namespace_name(get_func_namespace(fcinfo->flinfo->fn_oid)));
  bool answers = rsinfo->setDesc->natts == kColumns;
  const char* query = psprintf(
      "SELECT sum(keys_total)::bigint, sum(pending)::bigint, sum(completed)::bigint, "
      "sum(failed)::bigint, sum(abandoned)::bigint, sum(expired_awaiting_reap)::bigint, "
      "sum(reaped_total)::bigint, sum(reclaimed_total)::bigint, max(last_reap_at), "
      "max(last_reap_ms), NULL::integer, sum(stale_leases)::bigint, "
      "sum(outbox_undelivered)::bigint, sum(outbox_dead)::bigint, "
      "min(outbox_oldest_undelivered_at)%s FROM %s.idem_node_stats()",
      answers ? ", sum(claims_total)::bigint, sum(replays_total)::bigint, "
                "sum(fingerprint_mismatches_total)::bigint, sum(in_progress_total)::bigint, "
                "'native'::text"
              : "",
      schema);
  SPI_connect();
  int level = pin_search_path();
  if (SPI_execute(query, true, 1) != SPI_OK_SELECT || SPI_processed != 1)
    elog(ERROR, "idem_stats could not read idem_node_stats()");
  restore_search_path(level);
  Datum values[kColumns];
  bool nulls[kColumns];
  heap_deform_tuple(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, values, nulls);
  tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
  SPI_finish();
  return (Datum)0;
}

// The launcher's pid if it serves the current database, else 0: it runs, passes are
// enabled, it lists the database (connectable, not a template), and the database
// holds an entry of the shared table or could get one.
static pid_t serving_launcher(const ReaperStats& reaper) {
  if (reaper.launcher_pid == 0 || !settings.reaper_enabled || !reaper.table_room) return 0;
  HeapTuple tuple = SearchSysCache1(DATABASEOID, ObjectIdGetDatum(MyDatabaseId));
  if (!HeapTupleIsValid(tuple)) return 0;
  auto form = reinterpret_cast<Form_pg_database>(GETSTRUCT(tuple));
  bool listed = !form->datistemplate && form->datallowconn;
  ReleaseSysCache(tuple);
  return listed ? reaper.launcher_pid : 0;
}

static Datum stats(FunctionCallInfo fcinfo) {
  InitMaterializedSRF(fcinfo, 0);
  ReturnSetInfo* rsinfo = reinterpret_cast<ReturnSetInfo*>(fcinfo->resultinfo);
  // This node's keys: idempotency.keys and its shards of a distributed store; on the
  // coordinator of a distributed store, every node's.
  bool node_only = PG_NARGS() > 0 && !PG_ARGISNULL(0) && PG_GETARG_BOOL(0);
  if (!node_only && OidIsValid(distributed_store()) && citus_is_coordinator())
    return cluster_stats(fcinfo, rsinfo);
  StateCounts counts{};
  int64 stale_leases = 0;
  StoreOids* stores;
  int nstores = local_stores(&stores);
  for (int s = 0; s < nstores; s++) {
    KeyStore store;
    store_open(&store, stores[s], false);
    StateCounts these = RelationGetNumberOfBlocks(store.heap) <= kExactCountPages
                            ? count_exactly(&store)
                            : estimate(&store);
    counts.total += these.total, counts.pending += these.pending;
    counts.completed += these.completed, counts.failed += these.failed;
    counts.abandoned += these.abandoned, counts.expired += these.expired;
    stale_leases += count_stale(&store, GetActiveSnapshot(), GetCurrentTimestamp(),
                                kStaleLeasesCountLimit - stale_leases);
    store_close(&store);
  }

  ReaperStats reaper;
  bool preloaded = reaper_stats(&reaper);
  Datum values[kColumns] = {
      Int64GetDatum(static_cast<int64>(counts.total)),
      Int64GetDatum(static_cast<int64>(counts.pending)),
      Int64GetDatum(static_cast<int64>(counts.completed)),
      Int64GetDatum(static_cast<int64>(counts.failed)),
      Int64GetDatum(static_cast<int64>(counts.abandoned)),
      Int64GetDatum(static_cast<int64>(counts.expired)),
      Int64GetDatum(reaper.reaped_total),
      Int64GetDatum(reaper.reclaimed_total),
      TimestampTzGetDatum(reaper.last_reap_at),
      Int64GetDatum(reaper.last_reap_ms),
      Int32GetDatum(preloaded ? serving_launcher(reaper) : 0),
      Int64GetDatum(stale_leases),
  };
  bool nulls[kColumns] = {};
  // 1.0's idem_stats has 12 columns; 1.1 adds the outbox's three.
  MessagingOids oids;
  if (rsinfo->setDesc->natts >= 15 && messaging_oids(&oids)) {
    OutboxFigures outbox = outbox_figures(oids);
    values[12] = Int64GetDatum(outbox.undelivered);
    values[13] = Int64GetDatum(outbox.dead);
    nulls[14] = !outbox.oldest_undelivered_at;
    values[14] = TimestampTzGetDatum(outbox.oldest_undelivered_at.value_or(0));
  }
  // 1.5 adds what the key functions answered since server start (NULL unpreloaded).
  if (rsinfo->setDesc->natts == kColumns) {
    int64 answers[kAnswerKinds];
    bool counted = answer_totals(answers);
    for (int i = 0; i < kAnswerKinds; i++) {
      nulls[15 + i] = !counted;
      values[15 + i] = Int64GetDatum(counted ? answers[i] : 0);
    }
    values[19] = CStringGetTextDatum("native");
  }
  nulls[6] = nulls[7] = !preloaded;
  nulls[8] = nulls[9] = !preloaded || reaper.last_reap_at == 0;
  nulls[10] = DatumGetInt32(values[10]) == 0;
  tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
  return (Datum)0;
}

}  // namespace idempotency

using namespace idempotency;

IDEM_SQL_FUNCTION(idem_stats, stats)
