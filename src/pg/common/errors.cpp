#include "pg/common/errors.hpp"

namespace idempotency {

// At the throw site's file, line and function where the exception carried them (as
// ereport would have reported them there), else here.
void raise_pending(const PendingError& error) {
  if (error.site.file == nullptr)
    ereport(ERROR, errcode(error.sqlstate), errmsg("%s", error.message));
  if (errstart(ERROR, TEXTDOMAIN)) {
    errcode(error.sqlstate);
    errmsg("%s", error.message);
    errfinish(error.site.file, error.site.line, error.site.function);
  }
  pg_unreachable();
}

}  // namespace idempotency
