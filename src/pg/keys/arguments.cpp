#include "pg/keys/arguments.hpp"
#include "pg/citus/citus_forward.hpp"

#include "core/key.hpp"
#include "pg/common/errors.hpp"
#include "pg/common/guc.hpp"
#include "pg/common/key_type.hpp"

extern "C" {
#include "access/detoast.h"
#include "miscadmin.h"
#include "utils/builtins.h"
}

namespace idempotency {

void require_argument(FunctionCallInfo fcinfo, int n, const char* name) {
  if (PG_ARGISNULL(n))
    ereport(ERROR, errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED), errmsg("%s must not be null", name));
}

text* name_argument(FunctionCallInfo fcinfo, int n, const char* name) {
  require_argument(fcinfo, n, name);
  text* value = PG_GETARG_TEXT_PP(n);
  size_t length = VARSIZE_ANY_EXHDR(value);
  if (length == 0)
    ereport(ERROR, errcode(ERRCODE_INVALID_PARAMETER_VALUE), errmsg("%s must not be empty", name));
  if (length > kMaxScopeBytes)
    ereport(ERROR, errcode(ERRCODE_INVALID_PARAMETER_VALUE),
            errmsg("%s is %zu bytes long, at most %zu are allowed", name, length, kMaxScopeBytes));
  return value;
}

Identity identity_arguments(FunctionCallInfo fcinfo, int route_arg) {
  require_argument(fcinfo, 0, "scope");
  require_argument(fcinfo, 1, "key");
  Identity id = scope_arguments(fcinfo, route_arg);
  id.key = PG_GETARG_VARLENA_PP(1);
  return id;
}

Identity scope_arguments(FunctionCallInfo fcinfo, int route_arg) {
  text* scope = name_argument(fcinfo, 0, "scope");
  Identity id{GetUserId(), scope, nullptr, Route{}};
  citus_twin_settings(fcinfo, route_arg);
  if (PG_NARGS() > route_arg && !PG_ARGISNULL(route_arg)) {  // absent before 1.3
    id.route.type = get_fn_expr_argtype(fcinfo->flinfo, route_arg);
    if (!OidIsValid(id.route.type))
      ereport(ERROR, errcode(ERRCODE_INVALID_PARAMETER_VALUE),
              errmsg("could not determine the type of the routing value"));
    id.route.value = PG_GETARG_DATUM(route_arg);
  }
  return id;
}

int32 max_rows_argument(FunctionCallInfo fcinfo, int n) {
  require_argument(fcinfo, n, "max_rows");
  int32 max_rows = PG_GETARG_INT32(n);
  if (max_rows < 0)
    ereport(ERROR, errcode(ERRCODE_INVALID_PARAMETER_VALUE),
            errmsg("max_rows must not be negative"));
  return max_rows;
}

std::optional<int32_t> attempt_argument(FunctionCallInfo fcinfo, int n) {
  if (PG_ARGISNULL(n)) return std::nullopt;
  return PG_GETARG_INT32(n);
}

TimestampTz plus(TimestampTz t, Interval* span) {
  return DatumGetTimestampTz(
      DirectFunctionCall2(timestamptz_pl_interval, TimestampTzGetDatum(t), PointerGetDatum(span)));
}

Interval* micros_interval(int64 micros) {
  Interval* span = static_cast<Interval*>(palloc0(sizeof(Interval)));
  span->time = micros;
  return span;
}

Interval* ttl_argument(FunctionCallInfo fcinfo, int n, TimestampTz now) {
  if (PG_ARGISNULL(n))
    return micros_interval(static_cast<int64>(settings.default_ttl_s) * USECS_PER_SEC);
  Interval* ttl = PG_GETARG_INTERVAL_P(n);
  if (plus(now, ttl) <= now)
    ereport(ERROR, errcode(ERRCODE_INVALID_PARAMETER_VALUE), errmsg("ttl must be positive"));
  return ttl;
}

Interval* lease_argument(FunctionCallInfo fcinfo, int n, TimestampTz now, Interval* ttl) {
  if (PG_ARGISNULL(n)) return nullptr;
  Interval* lease = PG_GETARG_INTERVAL_P(n);
  TimestampTz end = plus(now, lease);
  if (end <= now)
    ereport(ERROR, errcode(ERRCODE_INVALID_PARAMETER_VALUE), errmsg("lease must be positive"));
  if (end > plus(now, ttl))
    ereport(ERROR, errcode(ERRCODE_INVALID_PARAMETER_VALUE),
            errmsg("lease must not be longer than ttl"),
            errdetail("A key's dedup window must cover its lease."));
  return lease;
}

TimestampTz default_wait_deadline(TimestampTz now) {
  return now + static_cast<int64>(settings.wait_timeout_ms) * 1000;
}

TimestampTz wait_deadline(FunctionCallInfo fcinfo, int n, TimestampTz now) {
  if (PG_ARGISNULL(n)) return default_wait_deadline(now);
  TimestampTz end = plus(now, PG_GETARG_INTERVAL_P(n));
  if (end < now)
    ereport(ERROR, errcode(ERRCODE_INVALID_PARAMETER_VALUE), errmsg("wait must not be negative"));
  return end;
}

std::optional<Fingerprint> fingerprint_argument(FunctionCallInfo fcinfo, int n) {
  if (PG_ARGISNULL(n)) return std::nullopt;
  bytea* fingerprint = PG_GETARG_BYTEA_PP(n);
  size_t length = VARSIZE_ANY_EXHDR(fingerprint);
  if (length > 64)
    ereport(ERROR, errcode(ERRCODE_INVALID_PARAMETER_VALUE),
            errmsg("fingerprint is %zu bytes long, at most 64 are allowed", length),
            errhint("Pass a digest of the request, such as idem_fingerprint(...)."));
  return Fingerprint{std::string_view(VARDATA_ANY(fingerprint), length),
                     opaque(PointerGetDatum(fingerprint))};
}

void check_stored_size(Datum value, const char* what) {
  Size size = toast_raw_datum_size(value) - VARHDRSZ;
  if (size > static_cast<Size>(settings.max_response_bytes))
    ereport(ERROR, errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED), errmsg("%s is too large", what),
            errdetail("It is %zu bytes; idempotency.max_response_size is %d bytes.", size,
                      settings.max_response_bytes));
}

void check_combined_size(Datum first, Datum second, const char* what) {
  Size size = toast_raw_datum_size(first) - VARHDRSZ;
  if (second != 0) size += toast_raw_datum_size(second) - VARHDRSZ;
  if (size > static_cast<Size>(settings.max_response_bytes))
    ereport(ERROR, errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED), errmsg("%s are too large", what),
            errdetail("They are %zu bytes together; idempotency.max_response_size is %d bytes.",
                      size, settings.max_response_bytes));
}

static const char* key_text(const Identity& id) { return key_cstring(id.key); }

void raise_in_progress(const Identity& id) {
  ereport(ERROR, errcode(ERRCODE_IDEM_IN_PROGRESS),
          errmsg("idempotency key \"%s\" in scope \"%s\" is in progress", key_text(id),
                 text_to_cstring(id.scope)),
          errdetail("Another transaction or a live lease holds it."), errhint("Retry later."));
}

void raise_claim_lost(const Identity& id, const Probe& probe, std::optional<int32_t> attempt) {
  const StoredRow& row = probe.view;
  if (probe.found && row.written_by_this_transaction && row.state != KeyState::kPending)
    ereport(ERROR, errcode(ERRCODE_IDEM_CLAIM_LOST),
            errmsg("idempotency key \"%s\" in scope \"%s\" was already %s in this transaction",
                   key_text(id), text_to_cstring(id.scope), state_name(row.state)),
            errdetail("A claim is finished once; its stored result is kept as it is."),
            errhint("Call idem_complete or idem_fail once per claim, after the business write."));
  const char* detail;
  if (!probe.found || !is_live(row, GetCurrentTimestamp()))
    detail = psprintf("The key no longer exists or has expired.");
  else if (row.state != KeyState::kPending)
    detail = psprintf("The key is %s.", state_name(row.state));
  else if (!attempt)
    detail = psprintf("A committed lease claim is finished only by passing its attempt (%d).",
                      row.attempt);
  else
    detail = psprintf("Attempt %d holds the key, not attempt %d.", row.attempt, *attempt);
  ereport(ERROR, errcode(ERRCODE_IDEM_CLAIM_LOST),
          errmsg("claim on idempotency key \"%s\" in scope \"%s\" was lost", key_text(id),
                 text_to_cstring(id.scope)),
          errdetail("%s", detail));
}

void raise_not_claimed(const Identity& id) {
  ereport(ERROR, errcode(ERRCODE_IDEM_NOT_CLAIMED),
          errmsg("idempotency key \"%s\" in scope \"%s\" is not claimed", key_text(id),
                 text_to_cstring(id.scope)),
          errhint("Call idem_claim before finishing a key."));
}

void raise_mismatch(const Identity& id) {
  ereport(ERROR, errcode(ERRCODE_IDEM_FINGERPRINT_MISMATCH),
          errmsg("idempotency key \"%s\" in scope \"%s\" was used for a different request",
                 key_text(id), text_to_cstring(id.scope)),
          errdetail("The request's fingerprint differs from the one stored with the key."),
          errhint("Use a new idempotency key for a different request."));
}

}  // namespace idempotency
