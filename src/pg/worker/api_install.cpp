// idem_install_notice: called by the update script that CREATE EXTENSION and ALTER
// EXTENSION ... UPDATE run last, so that installing on a server that did not preload
// the library says, once, that nothing will reap there by itself.
#include "pg/common/errors.hpp"
#include "pg/worker/worker_state.hpp"

extern "C" {
#include "access/xact.h"
}

namespace idempotency {

// The subtransaction level that asked for the notice, or 0. An extension script runs
// with client_min_messages raised to WARNING, so the NOTICE waits for the commit,
// and goes if the CREATE or ALTER is rolled back.
static int pending_level = 0;

static void send_notice(XactEvent event, void*) {
  if (pending_level == 0) return;
  bool commit = event == XACT_EVENT_PRE_COMMIT;
  if (!commit && event != XACT_EVENT_ABORT && event != XACT_EVENT_PRE_PREPARE) return;
  pending_level = 0;
  if (commit)
    ereport(NOTICE,
            errmsg("idempotency is not in shared_preload_libraries: no background worker "
                   "reaps expired keys or reclaims stale leases in this database"),
            errhint("Set shared_preload_libraries = 'idempotency' and restart the server, "
                    "or schedule SELECT idem_reap(); in each database."));
}

// A released savepoint hands the notice to its parent; a rolled-back one drops it.
static void follow_savepoints(SubXactEvent event, SubTransactionId, SubTransactionId, void*) {
  int level = GetCurrentTransactionNestLevel();
  if (pending_level < level) return;
  if (event == SUBXACT_EVENT_COMMIT_SUB) pending_level = level - 1;
  if (event == SUBXACT_EVENT_ABORT_SUB) pending_level = 0;
}

static Datum install_notice(FunctionCallInfo) {
  static bool registered = false;
  // Shared state exists only when the library was loaded at server start.
  if (worker_state_ready()) PG_RETURN_VOID();
  if (!registered) {
    RegisterXactCallback(send_notice, nullptr);
    RegisterSubXactCallback(follow_savepoints, nullptr);
    registered = true;
  }
  if (pending_level == 0) pending_level = GetCurrentTransactionNestLevel();
  PG_RETURN_VOID();
}

}  // namespace idempotency

using namespace idempotency;

IDEM_SQL_FUNCTION(idem_install_notice, install_notice)
