// idem_complete, idem_fail, idem_release, idem_checkpoint and idem_forget: finishing
// a key. Each checks its arguments, then the driver looks at the key (waiting for
// another transaction's unwritten claim too) and the core (decide_finish, complete,
// fail, checkpoint) decides.
#include "pg/citus/twin_privilege.hpp"
#include "pg/citus/citus_forward.hpp"
#include "pg/keys/arguments.hpp"
#include "pg/keys/driver.hpp"
#include "pg/common/errors.hpp"
#include "pg/keys/xact.hpp"

extern "C" {
#include "miscadmin.h"
#include "tcop/utility.h"
}

namespace idempotency {

enum class Finish { kComplete, kFail, kRelease, kCheckpoint };

struct FinishRequest {
  Identity id;
  std::optional<int32_t> attempt;
  Finish kind;
  Opaque data;   // response, error or checkpoint data; 0 for NULL
  Opaque point;  // idem_checkpoint
};

static_assert(std::is_trivially_destructible_v<FinishRequest>);

// The row that finishing `probe` leaves; a release leaves none.
static StoredRow finished_row(const FinishRequest& request, const Probe& probe, TimestampTz now) {
  const StoredRow& claim = probe.view;
  switch (request.kind) {
    case Finish::kComplete: return complete(claim, request.data);
    case Finish::kFail: return fail(claim, request.data);
    case Finish::kCheckpoint: {
      std::optional<Micros> renewed;  // by the lease's original length
      if (claim.lease != 0) renewed = plus(now, DatumGetIntervalP(datum(claim.lease)));
      return checkpoint(claim, request.point, request.data, renewed);
    }
    case Finish::kRelease: break;
  }
  return claim;
}

static Step finish_step(const FinishRequest& request, const Probe& probe, TimestampTz now) {
  Step step;
  switch (decide_finish(probe.found ? &probe.view : nullptr, request.attempt, now)) {
    case FinishAction::kWait: step.kind = Step::kWait; return step;
    case FinishAction::kClaimLost: raise_claim_lost(request.id, probe, request.attempt);
    case FinishAction::kNotClaimed: raise_not_claimed(request.id);
    case FinishAction::kApply: break;
  }
  if (request.kind == Finish::kRelease) {
    step.kind = probe.unwritten ? Step::kDropUnwritten : Step::kDelete;
    return step;
  }
  step.kind = probe.unwritten ? Step::kWriteUnwritten : Step::kUpdate;
  step.row = finished_row(request, probe, now);
  return step;
}

// The route is the last argument.
static void finish(FunctionCallInfo fcinfo, FinishRequest& request, const char* function) {
  PreventCommandIfReadOnly(function);
  if (key_elsewhere(&request.id, fcinfo)) {
    bool isnull;
    (void)citus_forward(fcinfo, PG_NARGS() - 1, request.id.route.value, request.id.route.type,
                        &isnull);
    if (request.kind != Finish::kCheckpoint) note_forwarded_finish(request.id);
    return;
  }
  KeyStore store;
  store_open(&store, store_for_key(&request.id), true);
  Probe probe;
  KeyLoop loop(&store, request.id, default_wait_deadline(GetCurrentTimestamp()),
               Start::kLookAbsentWaits);
  while (loop.next(&probe)) loop.apply(finish_step(request, probe, GetCurrentTimestamp()));
  if (loop.timed_out()) raise_in_progress(request.id);
  store_close(&store);
  if (request.kind != Finish::kCheckpoint && is_own_open_claim(probe.view)) note_claim_finished();
}

// The attempt, then the route (1.3): the last two arguments.
static FinishRequest finish_arguments(FunctionCallInfo fcinfo, Finish kind, int attempt_arg) {
  return FinishRequest{identity_arguments(fcinfo, attempt_arg + 1),
                       attempt_argument(fcinfo, attempt_arg), kind, 0, 0};
}

// A stored value argument (a response, an error or checkpoint data), size-checked.
static Opaque stored_argument(FunctionCallInfo fcinfo, int n, const char* what) {
  if (PG_ARGISNULL(n)) return 0;
  check_stored_size(PG_GETARG_DATUM(n), what);
  return opaque(PG_GETARG_DATUM(n));
}

static Datum complete_or_fail(FunctionCallInfo fcinfo, Finish kind) {
  FinishRequest request = finish_arguments(fcinfo, kind, 3);
  request.data = stored_argument(fcinfo, 2, kind == Finish::kComplete ? "response" : "error");
  finish(fcinfo, request, kind == Finish::kComplete ? "idem_complete()" : "idem_fail()");
  PG_RETURN_VOID();
}

static Datum complete_key(FunctionCallInfo fcinfo) {
  return complete_or_fail(fcinfo, Finish::kComplete);
}
static Datum fail_key(FunctionCallInfo fcinfo) { return complete_or_fail(fcinfo, Finish::kFail); }

static Datum release_key(FunctionCallInfo fcinfo) {
  FinishRequest request = finish_arguments(fcinfo, Finish::kRelease, 2);
  finish(fcinfo, request, "idem_release()");
  PG_RETURN_VOID();
}

static Datum checkpoint_key(FunctionCallInfo fcinfo) {
  FinishRequest request = finish_arguments(fcinfo, Finish::kCheckpoint, 4);
  require_argument(fcinfo, 2, "point");
  request.point = stored_argument(fcinfo, 2, "checkpoint");
  request.data = stored_argument(fcinfo, 3, "checkpoint data");
  finish(fcinfo, request, "idem_checkpoint()");
  PG_RETURN_VOID();
}

// Removes the key whatever its state; true if there was a live one.
static Datum forget(FunctionCallInfo fcinfo) {
  Identity id = identity_arguments(fcinfo, 2);
  PreventCommandIfReadOnly("idem_forget()");
  if (key_elsewhere(&id, fcinfo)) {
    bool isnull;
    Datum forgot = citus_forward(fcinfo, 2, id.route.value, id.route.type, &isnull);
    note_forwarded_finish(id);
    return forgot;
  }
  KeyStore store;
  store_open(&store, store_for_key(&id), true);
  Probe probe;
  Step step;
  KeyLoop loop(&store, id, default_wait_deadline(GetCurrentTimestamp()), Start::kLookAbsentWaits);
  while (loop.next(&probe)) {
    step = Step{};
    if (!probe.found)
      step.kind = Step::kStop;
    else if (probe.unwritten)  // nothing stored yet: drop the claim
      step.kind = Step::kDropUnwritten;
    else
      step.kind = probe.view.written_by_other_in_progress ? Step::kWait : Step::kDelete;
    loop.apply(step);
  }
  if (loop.timed_out()) raise_in_progress(id);
  store_close(&store);
  if (step.kind == Step::kStop) PG_RETURN_BOOL(false);
  if (is_own_open_claim(probe.view)) note_claim_finished();
  PG_RETURN_BOOL(is_live(probe.view, GetCurrentTimestamp()));  // (an unwritten claim is)
}

}  // namespace idempotency

using namespace idempotency;

IDEM_TWINNED_SQL_FUNCTION(idem_complete, complete_key)
IDEM_TWINNED_SQL_FUNCTION(idem_fail, fail_key)
IDEM_TWINNED_SQL_FUNCTION(idem_release, release_key)
IDEM_TWINNED_SQL_FUNCTION(idem_checkpoint, checkpoint_key)
IDEM_TWINNED_SQL_FUNCTION(idem_forget, forget)
