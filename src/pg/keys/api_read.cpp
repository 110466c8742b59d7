// idem_lookup and idem_abandoned: reading keys. Plain MVCC reads, so both work in a
// read-only transaction and on a hot standby.
#include "pg/keys/arguments.hpp"
#include "pg/keys/driver.hpp"
#include "pg/common/errors.hpp"

extern "C" {
#include "catalog/pg_collation.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/snapmgr.h"
#include "utils/tuplestore.h"
}

namespace idempotency {

static Datum lookup(FunctionCallInfo fcinfo) {
  Identity id = identity_arguments(fcinfo, 2);
  InitMaterializedSRF(fcinfo, 0);
  ReturnSetInfo* rsinfo = reinterpret_cast<ReturnSetInfo*>(fcinfo->resultinfo);

  KeyStore store;
  store_open(&store, store_for_key(&id), false);
  Probe probe;
  probe_key(&store, id, GetActiveSnapshot(), &probe);
  if (probe.found && is_live(probe.view, GetCurrentTimestamp())) {
    const KeyRow& row = probe.row;
    Datum values[8] = {CStringGetTextDatum(state_name(probe.view.state)),
                       row.get(kResponse),
                       row.get(kAttempt),
                       row.get(kCheckpoint),
                       row.get(kCheckpointData),
                       row.get(kFirstClaimedAt),
                       row.get(kExpiresAt),
                       row.get(kLeaseExpiresAt)};
    bool nulls[8] = {false,
                     row.null(kResponse),
                     false,
                     row.null(kCheckpoint),
                     row.null(kCheckpointData),
                     false,
                     false,
                     row.null(kLeaseExpiresAt)};
    tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
  }
  store_close(&store);
  return (Datum)0;
}

// The abandoned and stale claims idem_abandoned found, in the caller's memory.
struct AbandonedClaims {
  text* scope;  // null: every scope
  TimestampTz now;
  MemoryContext context;
  List* rows;  // of KeyRow*
};

static bool collect_abandoned(KeyStore*, KeyRow* row, const StoredRow& view, ItemPointer,
                              void* context) {
  auto found = static_cast<AbandonedClaims*>(context);
  if (!is_abandoned(view, found->now)) return false;
  if (found->scope != nullptr &&
      !DatumGetBool(DirectFunctionCall2Coll(texteq, C_COLLATION_OID, PointerGetDatum(found->scope),
                                            row->get(kScope))))
    return false;
  KeyRow* kept = copy_row_into(*row, found->context);
  MemoryContext caller = MemoryContextSwitchTo(found->context);
  found->rows = lappend(found->rows, kept);
  MemoryContextSwitchTo(caller);
  return true;
}

static int oldest_first(const ListCell* a, const ListCell* b) {
  TimestampTz ta = DatumGetTimestampTz(static_cast<KeyRow*>(lfirst(a))->get(kFirstClaimedAt));
  TimestampTz tb = DatumGetTimestampTz(static_cast<KeyRow*>(lfirst(b))->get(kFirstClaimedAt));
  return (ta > tb) - (ta < tb);
}

// The role's abandoned and stale claims, oldest first, for a recovery job that
// resumes them from their checkpoints. keys_leased_idx holds only lease claims, in
// (role, first_claimed_at) order: the scan reads the role's pending, stale and
// abandoned lease claims and stops after max_rows. A database still at 1.0 lacks
// it: then all the role's keys are read and sorted.
static Datum abandoned(FunctionCallInfo fcinfo) {
  text* scope = PG_ARGISNULL(0) ? nullptr : PG_GETARG_TEXT_PP(0);
  int32 max_rows = max_rows_argument(fcinfo, 1);
  InitMaterializedSRF(fcinfo, 0);
  ReturnSetInfo* rsinfo = reinterpret_cast<ReturnSetInfo*>(fcinfo->resultinfo);

  AbandonedClaims found{scope, GetCurrentTimestamp(), CurrentMemoryContext, NIL};
  StoreOids* stores;
  int nstores = local_stores(&stores);
  for (int s = 0; s < nstores; s++) {  // this node's keys, and its shards' of routed_keys
    KeyStore store;
    store_open(&store, stores[s], false);
    if (!store_scan_leased(&store, GetActiveSnapshot(), GetUserId(), max_rows, collect_abandoned,
                           &found))
      store_scan_role(&store, GetActiveSnapshot(), GetUserId(), PG_INT64_MAX, collect_abandoned,
                      &found);
    store_close(&store);
  }
  list_sort(found.rows, oldest_first);

  for (int i = 0; i < list_length(found.rows) && i < max_rows; i++) {
    const KeyRow& row = *static_cast<KeyRow*>(list_nth(found.rows, i));
    Datum values[6] = {row.get(kScope),          row.get(kKey),
                       row.get(kAttempt),        row.get(kCheckpoint),
                       row.get(kCheckpointData), row.get(kFirstClaimedAt)};
    bool nulls[6] = {false, false, false, row.null(kCheckpoint), row.null(kCheckpointData), false};
    tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
  }
  return (Datum)0;
}

}  // namespace idempotency

using namespace idempotency;

IDEM_SQL_FUNCTION(idem_lookup, lookup)
IDEM_SQL_FUNCTION(idem_abandoned, abandoned)
