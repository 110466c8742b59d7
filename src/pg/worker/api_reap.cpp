// idem_reap: one reaper pass by hand in the current database, in the caller's
// transaction (for servers that cannot preload the library).
#include "pg/common/errors.hpp"
#include "pg/worker/worker.hpp"

extern "C" {
#include "miscadmin.h"
}

namespace idempotency {

static Datum reap(FunctionCallInfo fcinfo) {
  int64 max_rows = PG_ARGISNULL(0) ? PG_INT64_MAX : PG_GETARG_INT64(0);
  if (max_rows < 0)
    ereport(ERROR, errcode(ERRCODE_INVALID_PARAMETER_VALUE),
            errmsg("max_rows must not be negative"));
  PreventCommandIfReadOnly("idem_reap()");
  PG_RETURN_INT64(reap_current_database(false, max_rows).deleted);
}

}  // namespace idempotency

using namespace idempotency;

IDEM_SQL_FUNCTION(idem_reap, reap)
