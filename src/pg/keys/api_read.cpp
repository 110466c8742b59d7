// idem_lookup and idem_abandoned: reading keys. Plain MVCC reads, so both work in a
// read-only transaction and on a hot standby.
#include "pg/citus/twin_privilege.hpp"
#include "pg/keys/arguments.hpp"
#include "pg/keys/driver.hpp"
#include "pg/citus/citus_forward.hpp"
#include "pg/citus/citus_meta.hpp"
#include "pg/common/errors.hpp"
#include "pg/common/guc.hpp"

extern "C" {
#include "catalog/pg_collation.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/snapmgr.h"
#include "utils/tuplestore.h"
}

namespace idempotency {

static Datum lookup(FunctionCallInfo fcinfo) {
  Identity id = identity_arguments(fcinfo, 2);
  InitMaterializedSRF(fcinfo, 0);
  ReturnSetInfo* rsinfo = reinterpret_cast<ReturnSetInfo*>(fcinfo->resultinfo);
  if (key_elsewhere(&id, fcinfo)) {
    citus_forward_rows(fcinfo, 2, id.route.value, id.route.type, rsinfo->setResult,
                       rsinfo->setDesc);
    return (Datum)0;
  }

  KeyStore store;
  store_open(&store, store_for_key(&id), false);
  Probe probe;
  probe_key(&store, id, GetActiveSnapshot(), &probe);
  if (probe.found && is_live(probe.view, GetCurrentTimestamp())) {
    const StoredRow& row = probe.view;  // (an unwritten claim's too)
    Datum values[8] = {CStringGetTextDatum(state_name(row.state)),
                       datum(row.response),
                       Int32GetDatum(row.attempt),
                       datum(row.checkpoint),
                       datum(row.checkpoint_data),
                       TimestampTzGetDatum(row.first_claimed_at),
                       TimestampTzGetDatum(row.expires_at),
                       TimestampTzGetDatum(row.lease_expires_at.value_or(0))};
    bool nulls[8] = {
        false, row.response == 0,    false, row.checkpoint == 0, row.checkpoint_data == 0, false,
        false, !row.lease_expires_at};
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

// On the coordinator of a distributed store, the role's abandoned claims on every
// node: idem_abandoned(node_only => true) run on each through Citus as the calling
// role, oldest first. A node that does not answer is an error, not an empty answer:
// a recovery job must not conclude that nothing is abandoned.
static void abandoned_in_cluster(FunctionCallInfo fcinfo, text* scope, int32 max_rows,
                                 ReturnSetInfo* rsinfo) {
  const char* schema =
      quote_identifier(get_namespace_name(get_func_namespace(fcinfo->flinfo->fn_oid)));
  const char* per_node = psprintf(
      "SELECT coalesce(pg_catalog.json_agg(a), '[]') "
      "FROM %s.idem_abandoned(%s, %d, node_only => true) a",
      schema, scope == nullptr ? "NULL" : quote_literal_cstr(text_to_cstring(scope)), max_rows);
  const char* query = psprintf(
      "SELECT a.scope, a.key::%s.idem_key, a.attempt, a.checkpoint, a.checkpoint_data, "
      "a.first_claimed_at, r.success, r.node, r.result "
      "FROM (SELECT n.nodename || ':' || n.nodeport AS node, r.success, r.result "
      "      FROM run_command_on_all_nodes($1) r JOIN pg_dist_node n USING (nodeid)) r "
      "LEFT JOIN LATERAL json_to_recordset(CASE WHEN r.success THEN r.result::json END) "
      "  AS a(scope text, key text, attempt integer, checkpoint text, checkpoint_data jsonb, "
      "       first_claimed_at timestamptz) ON true "
      "ORDER BY a.first_claimed_at NULLS LAST",
      schema);
  Oid type = TEXTOID;
  Datum argument = CStringGetTextDatum(per_node);
  SPI_connect();
  int level = pin_search_path();
  if (SPI_execute_with_args(query, 1, &type, &argument, nullptr, true, 0) != SPI_OK_SELECT)
    elog(ERROR, "idem_abandoned could not ask the nodes");
  restore_search_path(level);
  int32 returned = 0;
  for (uint64 i = 0; i < SPI_processed; i++) {
    Datum values[9];
    bool nulls[9];
    heap_deform_tuple(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, values, nulls);
    if (!DatumGetBool(values[6]))
      ereport(ERROR, errcode(ERRCODE_CONNECTION_FAILURE),
              errmsg("idem_abandoned: node %s did not answer", TextDatumGetCString(values[7])),
              errdetail("%s", TextDatumGetCString(values[8])));
    if (nulls[0] || returned == max_rows) continue;  // a node with none; or enough
    tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
    returned++;
  }
  SPI_finish();
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
  bool node_only = PG_NARGS() > 2 && !PG_ARGISNULL(2) && PG_GETARG_BOOL(2);  // (1.3)
  if (!node_only && OidIsValid(distributed_store()) && citus_is_coordinator()) {
    abandoned_in_cluster(fcinfo, scope, max_rows, rsinfo);
    return (Datum)0;
  }

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

IDEM_TWINNED_SQL_FUNCTION(idem_lookup, lookup)
IDEM_SQL_FUNCTION(idem_abandoned, abandoned)
