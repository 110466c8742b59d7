// A key function's call forwarded to the node of its shard through Citus: see
// citus_forward.hpp. The slow path of a call made where its shard is not: one SQL
// statement, parsed each time, since Citus delegates only a call whose distribution
// argument is a constant (planner/function_call_delegation.c: a parameter makes it
// retry the planning without one, or give up).
#include "pg/citus/citus_forward.hpp"
#include "pg/common/errors.hpp"

extern "C" {
#include "access/htup_details.h"
#include "catalog/pg_proc.h"
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

// "SELECT <columns> FROM <schema>.<function>_routed(<constants>) r": every argument
// as a literal cast to its type, so that Citus sees constants. Each value goes in
// through quote_literal and comes back through its type's input function, in this
// session and its settings: user text stays data, and the value is the same.
char* twin_call(FunctionCallInfo fcinfo, int route_arg, Datum route, Oid route_type,
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
  StringInfoData sql;
  initStringInfo(&sql);
  appendStringInfo(&sql, "SELECT %s FROM %s.%s(", columns, quote_identifier(schema),
                   quote_identifier(twin));
  for (int i = 0; i < Max(proc->pronargs, route_arg + 1); i++) {
    bool is_route = i == route_arg;
    Oid type = is_route ? route_type : proc->proargtypes.values[i];
    if (i > 0) appendStringInfoString(&sql, ", ");
    if (!is_route && args[i].isnull) {
      appendStringInfo(&sql, "NULL::%s", format_type_be_qualified(type));
      continue;
    }
    Oid output;
    bool varlena;
    getTypeOutputInfo(type, &output, &varlena);
    char* value = OidOutputFunctionCall(output, is_route ? route : args[i].value);
    appendStringInfo(&sql, "%s::%s", quote_literal_cstr(value), format_type_be_qualified(type));
  }
  appendStringInfoString(&sql, ") r");
  ReleaseSysCache(tuple);
  return sql.data;
}

void run(const char* sql) {
  if (SPI_execute(sql, false, 0) != SPI_OK_SELECT)
    elog(ERROR, "forwarding a call through Citus failed: %s", sql);
}

}  // namespace

bool citus_may_forward(FunctionCallInfo fcinfo) {
  if (application_name != nullptr && strncmp(application_name, "citus_internal", 14) == 0)
    return false;
  char* name = get_func_name(fcinfo->flinfo->fn_oid);
  return name != nullptr && !is_twin(name);
}

Datum citus_forward(FunctionCallInfo fcinfo, int route_arg, Datum route, Oid route_type,
                    bool* isnull, const NullableDatum* args) {
  char* sql = twin_call(fcinfo, route_arg, route, route_type, "r", args);
  SPI_connect();
  run(sql);
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
  char* sql = twin_call(fcinfo, route_arg, route, route_type, "*", args);
  SPI_connect();
  run(sql);
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
  Oid output;
  bool varlena;
  getTypeOutputInfo(route_type, &output, &varlena);
  char* sql = psprintf(
      "SELECT state FROM %s.idem_lookup_routed(%s::pg_catalog.text, %s::%s.idem_key, "
      "%s::%s)",
      nsp, quote_literal_cstr(scope), quote_literal_cstr(key), nsp,
      quote_literal_cstr(OidOutputFunctionCall(output, route)),
      format_type_be_qualified(route_type));
  // At COMMIT no statement's snapshot is active any more.
  PushActiveSnapshot(GetTransactionSnapshot());
  SPI_connect();
  run(sql);
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
