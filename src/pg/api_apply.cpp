// idem_apply_version: whether a consumer applies a version of an entity (the core's
// should_apply), recorded in idempotency.applied_versions in the calling transaction.
// One call at a time per (role, scope, entity): the entity's lock, which the
// transaction keeps until it ends, so the next call sees what this one recorded.
#include "core/outbox.hpp"
#include "pg/arguments.hpp"
#include "pg/errors.hpp"
#include "pg/identity_lock.hpp"
#include "pg/messaging_catalog.hpp"
#include "pg/table.hpp"

extern "C" {
#include "catalog/pg_collation.h"
#include "miscadmin.h"
#include "tcop/utility.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/snapmgr.h"
}

namespace idempotency {

static std::string_view bytes_of(const text* value) {
  return std::string_view(VARDATA_ANY(value), VARSIZE_ANY_EXHDR(value));
}

[[noreturn]] static void raise_apply_in_progress(text* scope, text* entity) {
  ereport(ERROR, errcode(ERRCODE_IDEM_IN_PROGRESS),
          errmsg("entity \"%s\" in scope \"%s\" is being applied by another transaction",
                 text_to_cstring(entity), text_to_cstring(scope)),
          errdetail("It did not end within idempotency.wait_timeout."), errhint("Retry later."));
}

static Datum apply_version(FunctionCallInfo fcinfo) {
  require_argument(fcinfo, 0, "scope");
  require_argument(fcinfo, 1, "entity");
  require_argument(fcinfo, 2, "version");
  text* scope = name_argument(fcinfo, 0, "scope");
  text* entity = name_argument(fcinfo, 1, "entity");
  int64 version = PG_GETARG_INT64(2);
  TimestampTz now = GetCurrentTimestamp();
  Interval* ttl = ttl_argument(fcinfo, 3, now);
  PreventCommandIfReadOnly("idem_apply_version()");

  MessagingOids oids = required_messaging_oids();
  Oid role = GetUserId();
  TimestampTz deadline = default_wait_deadline(now);
  if (!lock_until_transaction_end(
          messaging_lock(MessagingLock::kAppliedEntity,
                         {std::string_view(reinterpret_cast<const char*>(&role), sizeof(role)),
                          bytes_of(scope), bytes_of(entity)},
                         store_lock_secret()),
          deadline))
    raise_apply_in_progress(scope, entity);

  Table applied;
  open_table(&applied, oids.applied, true);
  ScanKeyData keys[3];
  ScanKeyInit(&keys[0], 1, BTEqualStrategyNumber, F_OIDEQ, ObjectIdGetDatum(role));
  ScanKeyEntryInitialize(&keys[1], 0, 2, BTEqualStrategyNumber, InvalidOid, C_COLLATION_OID,
                         F_TEXTEQ, PointerGetDatum(scope));
  ScanKeyEntryInitialize(&keys[2], 0, 3, BTEqualStrategyNumber, InvalidOid, C_COLLATION_OID,
                         F_TEXTEQ, PointerGetDatum(entity));
  // The record, locked: the reaper may be deleting an expired one (then look again).
  Lock lock = Lock::kGone;
  bool found;
  do {
    Snapshot snapshot = RegisterSnapshot(GetLatestSnapshot());
    found = table_find(&applied, oids.applied_pkey, snapshot, keys, 3);
    UnregisterSnapshot(snapshot);
    if (found) lock = table_lock_waiting(&applied, &applied.slot->tts_tid, deadline);
    if (lock == Lock::kBusy) raise_apply_in_progress(scope, entity);
  } while (found && lock == Lock::kGone);

  std::optional<int64> last;
  if (found) {
    bool isnull;
    TimestampTz expires_at =
        DatumGetTimestampTz(column(&applied, applied_column::kExpiresAt, &isnull));
    if (expires_at > now)  // an expired record is forgotten, as an expired key is
      last = DatumGetInt64(column(&applied, applied_column::kVersion, &isnull));
  }
  bool apply = should_apply(last, version);
  if (apply) {
    namespace col = applied_column;
    Datum values[col::kCount];
    bool nulls[col::kCount] = {};
    values[col::kRole - 1] = ObjectIdGetDatum(role);
    values[col::kExpiresAt - 1] = TimestampTzGetDatum(plus(now, ttl));
    values[col::kVersion - 1] = Int64GetDatum(version);
    values[col::kScope - 1] = PointerGetDatum(scope);
    values[col::kEntity - 1] = PointerGetDatum(entity);
    if (found) {
      ItemPointerData tid = applied.slot->tts_tid;
      table_update(&applied, &tid, values, nulls);
    } else {
      table_insert(&applied, values, nulls);
    }
  }
  close_table(&applied);
  PG_RETURN_BOOL(apply);
}

}  // namespace idempotency

using namespace idempotency;

IDEM_SQL_FUNCTION(idem_apply_version, apply_version)
