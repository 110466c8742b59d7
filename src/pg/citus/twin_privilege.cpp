// A twin's caller is checked against the public function's grants: see
// twin_privilege.hpp.
#include "pg/citus/twin_privilege.hpp"

#include "pg/common/compat.hpp"

extern "C" {
#include "access/htup_details.h"
#include "catalog/dependency.h"
#include "catalog/pg_proc.h"
#include "catalog/pg_type.h"
#include "commands/extension.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/hsearch.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/syscache.h"
}

namespace idempotency {

namespace {

constexpr const char kTwinSuffix[] = "_routed";

// What a function called through one of the twinned C entries is.
constexpr Oid kNotATwin = InvalidOid;
constexpr Oid kServesNothing = ~static_cast<Oid>(0);  // a twin without its public function

struct ServedEntry {
  Oid function;  // the function called
  Oid served;    // the public function it serves, kNotATwin or kServesNothing
};

// function -> served, for this backend, forgotten at any change of pg_proc (a function
// made, dropped or renamed): a lookup by name and signature is made once per function.
HTAB* served_functions;
bool served_stale;

void forget_served(Datum, int, uint32) { served_stale = true; }

// The public function the twin `twin` serves (see check_twin_caller), kNotATwin, or
// kServesNothing.
Oid lookup_served(Oid twin) {
  HeapTuple tuple = SearchSysCache1(PROCOID, ObjectIdGetDatum(twin));
  if (!HeapTupleIsValid(tuple)) return kNotATwin;
  auto proc = reinterpret_cast<Form_pg_proc>(GETSTRUCT(tuple));
  const char* name = NameStr(proc->proname);
  size_t length = strlen(name), suffix = strlen(kTwinSuffix);
  // A twin: <function>_routed(<arguments>, route, wait_timeout_ms).
  if (length <= suffix || strcmp(name + length - suffix, kTwinSuffix) != 0 || proc->pronargs < 2) {
    ReleaseSysCache(tuple);
    return kNotATwin;
  }
  char served_name[NAMEDATALEN];
  strlcpy(served_name, name, length - suffix + 1);
  Oid schema = proc->pronamespace;
  int before_route = proc->pronargs - 2;
  Oid types[FUNC_MAX_ARGS];
  memcpy(types, proc->proargtypes.values, sizeof(Oid) * before_route);
  ReleaseSysCache(tuple);
  Oid extension = get_extension_oid("idempotency", true);
  // The key functions' public forms end in route "any"; the relay's have no route.
  for (int count : {before_route + 1, before_route}) {
    types[before_route] = ANYOID;
    Oid served =
        GetSysCacheOid3(PROCNAMEARGSNSP, Anum_pg_proc_oid, CStringGetDatum(served_name),
                        PointerGetDatum(buildoidvector(types, count)), ObjectIdGetDatum(schema));
    if (OidIsValid(served) && OidIsValid(extension) &&
        getExtensionOfObject(ProcedureRelationId, served) == extension)
      return served;
  }
  return kServesNothing;
}

Oid served_by(Oid function) {
  if (served_functions == nullptr || served_stale) {
    static bool registered = false;
    if (!registered) {
      CacheRegisterSyscacheCallback(PROCOID, forget_served, 0);
      registered = true;
    }
    if (served_functions != nullptr) hash_destroy(served_functions);
    HASHCTL control{};
    control.keysize = sizeof(Oid);
    control.entrysize = sizeof(ServedEntry);
    control.hcxt = TopMemoryContext;
    served_functions = hash_create("idempotency twins' public functions", 32, &control,
                                   HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
    served_stale = false;
  }
  auto entry =
      static_cast<ServedEntry*>(hash_search(served_functions, &function, HASH_FIND, nullptr));
  if (entry != nullptr) return entry->served;
  // The lookup may accept invalidations: insert after it (a change meanwhile marks the
  // table stale, and the next call looks again).
  Oid served = lookup_served(function);
  entry = static_cast<ServedEntry*>(hash_search(served_functions, &function, HASH_ENTER, nullptr));
  entry->served = served;
  return served;
}

}  // namespace

void check_twin_caller(FunctionCallInfo fcinfo) {
  if (fcinfo->flinfo == nullptr || !OidIsValid(fcinfo->flinfo->fn_oid)) return;
  Oid function = fcinfo->flinfo->fn_oid;
  Oid served = served_by(function);
  if (served == kNotATwin) return;
  if (served == kServesNothing) {
    char* twin = get_func_name(function);
    ereport(ERROR, errcode(ERRCODE_UNDEFINED_FUNCTION),
            errmsg("the function that %s serves does not exist", twin),
            errdetail("%s runs the extension idempotency's function of the same name without "
                      "\"_routed\" for its caller, and is allowed to whoever may execute that "
                      "function.",
                      twin),
            errhint("Run ALTER EXTENSION idempotency UPDATE on the coordinator."));
  }
  if (!compat::may_execute(served, GetUserId()))
    ereport(ERROR, errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
            errmsg("permission denied for function %s", get_func_name(served)),
            errdetail("%s runs %s for its caller, who may not execute %s.", get_func_name(function),
                      get_func_name(served), get_func_name(served)));
}

}  // namespace idempotency
