// Who may call a twin (<function>_routed, citus_forward.hpp): exactly who may call the
// public function it serves. The twins are executable by PUBLIC; each call checks, on
// the node where it runs, the caller's EXECUTE privilege on the public function there,
// so a GRANT or REVOKE on the public function is the only one that counts, and no
// copied ACL can drift from it.
#pragma once

#include "pg/common/errors.hpp"

namespace idempotency {

// In a twin's call: refuses (42501, "permission denied for function <public>", as
// PostgreSQL's own check says it) a caller who may not execute the public function.
// That function is the extension's own member named as the twin without "_routed", in
// the twin's schema, with exactly the twin's arguments before the route (and a last
// route "any" where the public function has one): never a same-named function of the
// application. A call of the public function itself passes.
void check_twin_caller(FunctionCallInfo fcinfo);

template <Datum (*Impl)(FunctionCallInfo)>
Datum twin_checked(FunctionCallInfo fcinfo) {
  check_twin_caller(fcinfo);
  return Impl(fcinfo);
}

}  // namespace idempotency

// IDEM_SQL_FUNCTION for a function that has a twin (the same C entry serves both).
#define IDEM_TWINNED_SQL_FUNCTION(name, impl) \
  IDEM_SQL_FUNCTION(name, idempotency::twin_checked<impl>)
