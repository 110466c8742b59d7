// A key function's call forwarded to the node of its shard through Citus: see
// citus_forward.hpp. The slow path of a call made where its shard is not: one SQL
// statement, planned each time with its values as parameters, which the planner turns
// into the constants Citus delegates on (planner/function_call_delegation.c: a
// parameter left in the call makes it retry the planning without one, or give up).
#include "pg/citus/citus_forward.hpp"
#include "pg/common/errors.hpp"
#include "pg/common/guc.hpp"

extern "C" {
#include "access/htup_details.h"
#include "catalog/pg_proc.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "lib/stringinfo.h"
#include "nodes/value.h"
#include "parser/parse_func.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"
}

namespace idempotency {

namespace {

constexpr const char kTwinSuffix[] = "_routed";

bool is_twin(const char* name) {
  size_t length = strlen(name), suffix = strlen(kTwinSuffix);
  return length > suffix && strcmp(name + length - suffix, kTwinSuffix) == 0;
}

// A twin's call: "SELECT <columns> FROM <schema>.<function>_routed($1, ..., $n) r" and
// its arguments. Run as a one-shot plan (SPI_execute_with_args), the arguments reach
// the planner as constants: user text stays data, never part of the SQL.
struct TwinCall {
  char* sql;
  int nargs;
  Oid* types;
  Datum* values;
  char* nulls;  // SPI's: 'n' for NULL
};

TwinCall twin_call(FunctionCallInfo fcinfo, int route_arg, Datum route, Oid route_type,
                   const char* columns, const NullableDatum* args) {
  if (args == nullptr) args = fcinfo->args;
  Oid function = fcinfo->flinfo->fn_oid;
  HeapTuple tuple = SearchSysCache1(PROCOID, ObjectIdGetDatum(function));
  if (!HeapTupleIsValid(tuple)) elog(ERROR, "cache lookup failed for function %u", function);
  auto proc = reinterpret_cast<Form_pg_proc>(GETSTRUCT(tuple));
  char* schema = get_namespace_name(proc->pronamespace);
  char* twin = psprintf("%s%s", NameStr(proc->proname), kTwinSuffix);
  if (!OidIsValid(
          LookupFuncName(list_make2(makeString(schema), makeString(twin)), -1, nullptr, true)))
    ereport(ERROR, errcode(ERRCODE_IDEM_NOT_LOCAL),
            errmsg("the key's shard is on another node, and %s.%s, which takes the call there, "
                   "does not exist",
                   schema, twin),
            errdetail("idem_distribute makes it from version 1.4 on."),
            errhint("Run ALTER EXTENSION idempotency UPDATE on the coordinator."));
  TwinCall call;
  call.nargs = Max(proc->pronargs, route_arg + 1) + 1;  // and the wait_timeout
  call.types = static_cast<Oid*>(palloc(sizeof(Oid) * call.nargs));
  call.values = static_cast<Datum*>(palloc(sizeof(Datum) * call.nargs));
  call.nulls = static_cast<char*>(palloc(call.nargs));
  StringInfoData sql;
  initStringInfo(&sql);
  appendStringInfo(&sql, "SELECT %s FROM %s.%s(", columns, quote_identifier(schema),
                   quote_identifier(twin));
  for (int i = 0; i < call.nargs - 1; i++) {
    bool is_route = i == route_arg;
    call.types[i] = is_route ? route_type : proc->proargtypes.values[i];
    call.values[i] = is_route ? route : args[i].value;
    call.nulls[i] = !is_route && args[i].isnull ? 'n' : ' ';
    appendStringInfo(&sql, "%s$%d", i > 0 ? ", " : "", i + 1);
  }
  int last = call.nargs - 1;
  call.types[last] = INT4OID;
  call.values[last] = Int32GetDatum(settings.wait_timeout_ms);
  call.nulls[last] = ' ';
  appendStringInfo(&sql, ", $%d) r", last + 1);
  call.sql = sql.data;
  ReleaseSysCache(tuple);
  return call;
}

void run(const TwinCall& call) {
  if (SPI_execute_with_args(call.sql, call.nargs, call.types, call.values, call.nulls, false, 0) !=
      SPI_OK_SELECT)
    elog(ERROR, "forwarding a call through Citus failed: %s", call.sql);
}

}  // namespace

void citus_twin_settings(FunctionCallInfo fcinfo, int route_arg) {
  int n = route_arg + 1;
  if (PG_NARGS() <= n || PG_ARGISNULL(n) || PG_GETARG_INT32(n) == settings.wait_timeout_ms) return;
  (void)set_config_option("idempotency.wait_timeout", psprintf("%d", PG_GETARG_INT32(n)),
                          PGC_USERSET, PGC_S_SESSION, GUC_ACTION_LOCAL, true, 0, false);
}

bool citus_may_forward(FunctionCallInfo fcinfo) {
  if (application_name != nullptr && strncmp(application_name, "citus_internal", 14) == 0)
    return false;
  char* name = get_func_name(fcinfo->flinfo->fn_oid);
  return name != nullptr && !is_twin(name);
}

Datum citus_forward(FunctionCallInfo fcinfo, int route_arg, Datum route, Oid route_type,
                    bool* isnull, const NullableDatum* args) {
  TwinCall call = twin_call(fcinfo, route_arg, route, route_type, "r", args);
  SPI_connect();
  run(call);
  if (SPI_processed != 1)
    elog(ERROR, "forwarding a call through Citus returned " UINT64_FORMAT " rows", SPI_processed);
  Form_pg_attribute column = TupleDescAttr(SPI_tuptable->tupdesc, 0);
  Datum result = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, isnull);
  if (!*isnull) result = SPI_datumTransfer(result, column->attbyval, column->attlen);
  SPI_finish();
  return result;
}

void citus_forward_rows(FunctionCallInfo fcinfo, int route_arg, Datum route, Oid route_type,
                        Tuplestorestate* rows, TupleDesc desc, const NullableDatum* args) {
  TwinCall call = twin_call(fcinfo, route_arg, route, route_type, "*", args);
  SPI_connect();
  run(call);
  Datum* values = static_cast<Datum*>(palloc(sizeof(Datum) * desc->natts));
  bool* nulls = static_cast<bool*>(palloc(sizeof(bool) * desc->natts));
  for (uint64 i = 0; i < SPI_processed; i++) {
    heap_deform_tuple(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, values, nulls);
    tuplestore_putvalues(rows, desc, values, nulls);
  }
  SPI_finish();
}

const char* citus_forwarded_state(Oid schema, const char* scope, const char* key, Datum route,
                                  Oid route_type) {
  const char* nsp = quote_identifier(get_namespace_name(schema));
  Oid key_type = GetSysCacheOid2(TYPENAMENSP, Anum_pg_type_oid, CStringGetDatum("idem_key"),
                                 ObjectIdGetDatum(schema));
  Oid key_input, key_ioparam;
  getTypeInputInfo(key_type, &key_input, &key_ioparam);
  TwinCall call;
  call.sql = psprintf("SELECT state FROM %s.idem_lookup_routed($1, $2, $3, $4)", nsp);
  call.nargs = 4;
  Oid types[] = {TEXTOID, key_type, route_type, INT4OID};
  Datum values[] = {CStringGetTextDatum(scope),
                    OidInputFunctionCall(key_input, const_cast<char*>(key), key_ioparam, -1), route,
                    Int32GetDatum(settings.wait_timeout_ms)};
  char nulls[] = "    ";
  call.types = types;
  call.values = values;
  call.nulls = nulls;
  // At COMMIT no statement's snapshot is active any more.
  PushActiveSnapshot(GetTransactionSnapshot());
  SPI_connect();
  run(call);
  const char* state = nullptr;
  if (SPI_processed > 0) {
    char* value = SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1);
    if (value != nullptr) state = MemoryContextStrdup(TopTransactionContext, value);
  }
  SPI_finish();
  PopActiveSnapshot();
  return state;
}

}  // namespace idempotency
