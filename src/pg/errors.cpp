#include "pg/errors.hpp"

namespace idempotency {

void raise_pending(const PendingError& error) {
  ereport(ERROR, errcode(error.sqlstate), errmsg("%s", error.message));
  pg_unreachable();
}

}  // namespace idempotency
