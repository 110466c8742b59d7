// idem_apply_version: whether a consumer applies a version of an entity (the core's
// should_apply), recorded in idempotency.applied_versions in the calling transaction.
// One call at a time per (role, scope, entity): the record this transaction writes
// is its own until it ends (keyed_write.hpp), so the next call waits and sees it.
#include "core/outbox.hpp"
#include "pg/citus/twin_privilege.hpp"
#include "pg/citus/citus_forward.hpp"
#include "pg/keys/arguments.hpp"
#include "pg/keys/key_row.hpp"
#include "pg/common/errors.hpp"
#include "pg/keys/identity_lock.hpp"
#include "pg/messaging/keyed_write.hpp"
#include "pg/messaging/messaging_catalog.hpp"
#include "pg/messaging/outbox_row.hpp"
#include "pg/common/table.hpp"

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

  MessagingTarget target;
  Route route;
  if (!messaging_target(fcinfo, 4, "idem_apply_version", &target, &route)) {
    // A NULL ttl forwarded as this session's default, not the other node's.
    fcinfo->args[3] = NullableDatum{PointerGetDatum(ttl), false};
    bool isnull;
    return citus_forward(fcinfo, 4, route.value, route.type, &isnull);
  }
  const MessagingOids& oids = target.oids;
  Oid role = GetUserId();
  Table applied;
  open_table(&applied, oids.applied, true);
  ScanKeyData keys[4];
  ScanKeyInit(&keys[0], 1, BTEqualStrategyNumber, F_OIDEQ, ObjectIdGetDatum(role));
  ScanKeyEntryInitialize(&keys[1], 0, 2, BTEqualStrategyNumber, InvalidOid, C_COLLATION_OID,
                         F_TEXTEQ, PointerGetDatum(scope));
  ScanKeyEntryInitialize(&keys[2], 0, 3, BTEqualStrategyNumber, InvalidOid, C_COLLATION_OID,
                         F_TEXTEQ, PointerGetDatum(entity));
  namespace col = applied_column;
  // In a shard of routed_applied_versions, the entity's record is (role, scope,
  // entity, route)'s.
  if (target.routed)
    ScanKeyInit(&keys[3], 4, BTEqualStrategyNumber, target.applied_route_eq,  // pkey's 4th
                target.route);
  Datum values[col::kCount + 1] = {ObjectIdGetDatum(role),  TimestampTzGetDatum(plus(now, ttl)),
                                   Int64GetDatum(version),  PointerGetDatum(scope),
                                   PointerGetDatum(entity), target.route};
  bool nulls[col::kCount + 1] = {};
  bool apply = false;
  LOCKTAG lock =
      messaging_lock(MessagingLock::kAppliedEntity,
                     {std::string_view(reinterpret_cast<const char*>(&role), sizeof(role)),
                      bytes_of(scope), bytes_of(entity)},
                     store_lock_secret());
  KeyedLoop loop(&applied, oids.applied_pkey, keys, target.routed ? 4 : 3, lock,
                 default_wait_deadline(now));
  bool found;
  while (loop.next(&found)) {
    AppliedRecord record;
    if (found) record = read_applied(&applied);  // with whether this transaction wrote it
    apply = should_apply(found ? &record : nullptr, version, now);
    KeyedWrite write{found ? KeyedWrite::kUpdate : KeyedWrite::kInsert, values, nulls};
    loop.apply(apply ? write : KeyedWrite{});
  }
  if (loop.timed_out()) raise_apply_in_progress(scope, entity);
  close_table(&applied);
  PG_RETURN_BOOL(apply);
}

}  // namespace idempotency

using namespace idempotency;

IDEM_TWINNED_SQL_FUNCTION(idem_apply_version, apply_version)
