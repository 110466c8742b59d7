// idem_claim, idem_once and idem_once_many: claiming a key. Each checks its arguments, then
// the driver looks at the key and the core (decide_claim, claim_fresh, claim_take_over)
// decides.
#include "core/batch.hpp"
#include "pg/citus/twin_privilege.hpp"
#include "pg/citus/citus_forward.hpp"
#include "pg/keys/arguments.hpp"
#include "pg/keys/driver.hpp"
#include "pg/keys/outcome_counters.hpp"
#include "pg/common/errors.hpp"
#include "pg/common/guc.hpp"
#include "pg/keys/xact.hpp"

extern "C" {
#include "access/htup_details.h"
#include "access/xact.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "catalog/pg_type.h"
#include "executor/executor.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/typcache.h"
}

namespace idempotency {

struct ClaimRequest {
  Identity id;
  ClaimTerms terms;
  bool in_transaction;  // no lease
  TimestampTz started;
  TimestampTz deadline;
};

static_assert(std::is_trivially_destructible_v<ClaimRequest>);

// The claim's terms: its fingerprint, and its window and lease computed from now.
static ClaimTerms claim_terms(std::optional<Fingerprint> fingerprint, Interval* ttl,
                              Interval* lease, TimestampTz now) {
  ClaimTerms terms;
  terms.fingerprint = fingerprint;
  terms.expires_at = plus(now, ttl);
  if (lease != nullptr) {
    terms.lease = opaque(PointerGetDatum(lease));
    terms.lease_end = plus(now, lease);
  }
  return terms;
}

enum class Outcome { kClaimed, kReplay, kInProgress, kDuplicate };

// `row` is the key's row as this call saw or decided it; null: another transaction's
// claim whose row is not yet written (only its identity lock shows): the first attempt.
static Datum claim_result(FunctionCallInfo fcinfo, Outcome outcome, const StoredRow* row,
                          std::optional<int64> retry_after_us) {
  static const char* const names[] = {"claimed", "replay", "in_progress", "duplicate"};
  // Looked up once per call site, not per call: the claim path runs in every transaction.
  auto desc = static_cast<TupleDesc>(fcinfo->flinfo->fn_extra);
  if (desc == nullptr) {
    // PL/pgSQL makes the call site anew in each transaction: the result type is taken
    // from the call's expression and its description from the type cache, when they
    // can be, rather than by get_call_result_type's look-up of the function.
    Oid type = get_fn_expr_rettype(fcinfo->flinfo);
    MemoryContext old = MemoryContextSwitchTo(fcinfo->flinfo->fn_mcxt);
    if (OidIsValid(type) && type != RECORDOID) {
      desc = lookup_rowtype_tupdesc_copy(type, -1);
    } else {
      TupleDesc looked_up;
      if (get_call_result_type(fcinfo, nullptr, &looked_up) != TYPEFUNC_COMPOSITE)
        elog(ERROR, "idem_claim must return a composite type");
      desc = BlessTupleDesc(CreateTupleDescCopy(looked_up));
    }
    MemoryContextSwitchTo(old);
    fcinfo->flinfo->fn_extra = desc;
  }

  StoredRow unseen;  // attempt 1, nothing else shown
  const StoredRow& shown = row == nullptr ? unseen : *row;
  KeyState state = outcome == Outcome::kReplay ? shown.state : KeyState::kPending;
  bool show_checkpoint = outcome != Outcome::kInProgress;
  Datum values[9] = {};
  bool nulls[9] = {};
  auto set = [&](int i, Opaque value) {
    nulls[i] = value == 0;
    values[i] = datum(value);
  };
  values[0] = CStringGetTextDatum(names[static_cast<int>(outcome)]);
  values[1] = CStringGetTextDatum(state_name(state));
  set(2, outcome == Outcome::kReplay ? shown.response : 0);
  values[3] = Int32GetDatum(shown.attempt);
  set(4, show_checkpoint ? shown.checkpoint : 0);
  set(5, show_checkpoint ? shown.checkpoint_data : 0);
  nulls[6] = !retry_after_us;
  values[6] = retry_after_us ? PointerGetDatum(micros_interval(*retry_after_us)) : 0;
  nulls[7] = nulls[8] = row == nullptr;
  values[7] = TimestampTzGetDatum(shown.first_claimed_at);
  values[8] = TimestampTzGetDatum(shown.expires_at);
  return HeapTupleGetDatum(heap_form_tuple(desc, values, nulls));
}

// After a wait ran out: how long it waited, at least 100 ms.
static int64 waited_us(const ClaimRequest& request) {
  return Max(GetCurrentTimestamp() - request.started, INT64CONST(100000));
}

// The write a claim (or idem_once, completing at once) makes of `action`.
static Step claim_step(ClaimAction action, const ClaimRequest& request, const Probe& probe,
                       TimestampTz now, bool complete_at_once) {
  Step step;
  StoredRow next;
  switch (action) {
    case ClaimAction::kWait: step.kind = Step::kWait; return step;
    case ClaimAction::kInsert:
    case ClaimAction::kReplaceExpired: next = claim_fresh(request.terms, now); break;
    case ClaimAction::kTakeOver: next = claim_take_over(probe.view, request.terms); break;
    default: step.kind = Step::kStop; return step;
  }
  if (complete_at_once) next = complete(next, 0);
  step.row = next;
  if (action != ClaimAction::kInsert)
    step.kind = Step::kUpdate;
  else if (!complete_at_once && request.in_transaction && can_leave_claim_unwritten())
    step.kind = Step::kKeepUnwritten;
  else
    step.kind = Step::kInsert;
  return step;
}

// A NULL ttl or wait forwarded as this session's default, not the other node's:
// idempotency.default_ttl and wait_timeout set here hold there too.
static void forward_defaults(FunctionCallInfo fcinfo, int ttl_arg, Interval* ttl, int wait_arg) {
  NullableDatum* args = fcinfo->args;
  if (args[ttl_arg].isnull) args[ttl_arg] = NullableDatum{PointerGetDatum(ttl), false};
  if (args[wait_arg].isnull)
    args[wait_arg] = NullableDatum{
        PointerGetDatum(micros_interval(static_cast<int64>(settings.wait_timeout_ms) * 1000)),
        false};
}

// On the node of its shard, through Citus; an in-transaction claim made there is
// remembered here too, for IK002 at this transaction's COMMIT.
static Datum forward_claim(FunctionCallInfo fcinfo, const ClaimRequest& request, Interval* ttl) {
  forward_defaults(fcinfo, 3, ttl, 5);
  bool isnull;
  Datum result = citus_forward(fcinfo, 6, request.id.route.value, request.id.route.type, &isnull);
  if (isnull) elog(ERROR, "a claim forwarded through Citus returned NULL");
  bool outcome_null;
  Datum outcome = GetAttributeByNum(DatumGetHeapTupleHeader(result), 1, &outcome_null);
  if (request.in_transaction && !outcome_null &&
      strcmp(TextDatumGetCString(outcome), "claimed") == 0)
    remember_forwarded_claim(request.id, get_func_namespace(fcinfo->flinfo->fn_oid));
  return result;
}

static Datum claim(FunctionCallInfo fcinfo) {
  ClaimRequest request;
  request.id = identity_arguments(fcinfo, 6);
  std::optional<Fingerprint> fingerprint = fingerprint_argument(fcinfo, 2);
  request.started = GetCurrentTimestamp();
  Interval* ttl = ttl_argument(fcinfo, 3, request.started);
  Interval* lease = lease_argument(fcinfo, 4, request.started, ttl);
  request.deadline = wait_deadline(fcinfo, 5, request.started);
  PreventCommandIfReadOnly("idem_claim()");
  request.in_transaction = lease == nullptr;
  if (key_elsewhere(&request.id, fcinfo)) return forward_claim(fcinfo, request, ttl);

  KeyStore store;
  store_open(&store, store_for_key(&request.id), true);
  ClaimAction action = ClaimAction::kInsert;
  Probe probe;
  Step step;
  KeyLoop loop(&store, request.id, request.deadline, Start::kLook);
  while (loop.next(&probe)) {
    TimestampTz now = GetCurrentTimestamp();
    request.terms = claim_terms(fingerprint, ttl, lease, now);  // the window starts now
    action = decide_claim(probe.found ? &probe.view : nullptr,
                          fingerprint ? std::optional(fingerprint->bytes) : std::nullopt, now);
    if (action == ClaimAction::kMismatch) {
      count_answer(Answer::kMismatch);
      raise_mismatch(request.id);
    }
    step = claim_step(action, request, probe, now, false);
    loop.apply(step);
  }
  store_close(&store);

  // Each answer counted once it is final (a wait's retries are not counted); a
  // `duplicate` (this transaction's own claim) is not an answer to a client's retry.
  if (loop.timed_out()) {
    count_answer(Answer::kInProgress);
    return claim_result(fcinfo, Outcome::kInProgress, probe.found ? &probe.view : nullptr,
                        waited_us(request));
  }
  switch (action) {
    case ClaimAction::kDuplicate:
      return claim_result(fcinfo, Outcome::kDuplicate, &probe.view, std::nullopt);
    case ClaimAction::kReplay:
      count_answer(Answer::kReplay);
      return claim_result(fcinfo, Outcome::kReplay, &probe.view, std::nullopt);
    case ClaimAction::kInProgress:
      count_answer(Answer::kInProgress);
      return claim_result(fcinfo, Outcome::kInProgress, &probe.view,
                          *probe.view.lease_expires_at - GetCurrentTimestamp());
    default:
      remember_claim(request.id, !request.in_transaction, store.oids);
      count_answer(Answer::kClaimed);
      return claim_result(fcinfo, Outcome::kClaimed, &step.row, std::nullopt);
  }
}

// Whether this backend's last idem_once inserted its key (or idem_once_many its last
// key). A batch consumer's message ids are new, or, when a batch is delivered again,
// all seen: idem_once inserts first after a key that it inserted, and looks first after
// one that it found. Only in a transaction that already writes (it has a transaction
// id): one whose calls only find their keys writes nothing and takes no transaction
// id, as any replay.
static bool last_once_inserted = false;

// Not in a shard of the distributed store, whose primary key also holds the route:
// it would not stop a second row of the key with another route, which a look finds.
static Start once_start(const KeyStore& store) {
  return last_once_inserted && store.oids.shardid == 0 &&
                 TransactionIdIsValid(GetTopTransactionIdIfAny())
             ? Start::kInsertFirst
             : Start::kLook;
}

// idem_once of one key in an open store: true if it was applied now (claimed and
// completed in one write: a fresh key is inserted already completed). IK005 for a
// live lease, or once the wait for another transaction runs out at the deadline.
static bool once_key(KeyStore* store, ClaimRequest& request, Interval* ttl) {
  Probe probe;
  Step step;
  KeyLoop loop(store, request.id, request.deadline, once_start(*store));
  while (loop.next(&probe)) {
    TimestampTz now = GetCurrentTimestamp();
    request.terms = claim_terms(std::nullopt, ttl, nullptr, now);
    ClaimAction action = decide_claim(probe.found ? &probe.view : nullptr, std::nullopt, now);
    if (action == ClaimAction::kInProgress) {  // a live lease
      count_answer(Answer::kInProgress);
      raise_in_progress(request.id);
    }
    step = claim_step(action, request, probe, now, true);
    loop.apply(step);
  }
  last_once_inserted = !loop.timed_out() && step.kind == Step::kInsert && !probe.found;
  if (loop.timed_out()) {
    count_answer(Answer::kInProgress);
    raise_in_progress(request.id);
  }
  bool applied = step.kind != Step::kStop;
  count_answer(applied ? Answer::kClaimed : Answer::kReplay);
  return applied;
}

static Datum once(FunctionCallInfo fcinfo) {
  ClaimRequest request{};
  request.id = identity_arguments(fcinfo, 4);
  request.started = GetCurrentTimestamp();
  Interval* ttl = ttl_argument(fcinfo, 2, request.started);
  request.deadline = wait_deadline(fcinfo, 3, request.started);
  PreventCommandIfReadOnly("idem_once()");
  if (key_elsewhere(&request.id, fcinfo)) {
    forward_defaults(fcinfo, 2, ttl, 3);
    bool isnull;
    return citus_forward(fcinfo, 4, request.id.route.value, request.id.route.type, &isnull);
  }

  KeyStore store;
  store_open(&store, store_for_key(&request.id), true);
  bool applied = once_key(&store, request, ttl);
  store_close(&store);
  PG_RETURN_BOOL(applied);
}

// idem_once_many's keys: a one-dimensional array (or an empty one) without NULLs.
static ArrayType* keys_argument(FunctionCallInfo fcinfo, int n) {
  require_argument(fcinfo, n, "keys");
  ArrayType* keys = PG_GETARG_ARRAYTYPE_P(n);
  if (array_contains_nulls(keys)) {
    const bits8* bitmap = ARR_NULLBITMAP(keys);  // a clear bit is a NULL
    int position = 0;
    while (bitmap[position / 8] & (1 << (position % 8))) position++;
    if (ARR_NDIM(keys) == 1)
      ereport(ERROR, errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED), errmsg("keys must not contain nulls"),
              errdetail("keys[%d] is null.", ARR_LBOUND(keys)[0] + position));
    ereport(ERROR, errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED), errmsg("keys must not contain nulls"));
  }
  if (ARR_NDIM(keys) > 1)
    ereport(ERROR, errcode(ERRCODE_INVALID_PARAMETER_VALUE),
            errmsg("keys must be a one-dimensional array"),
            errdetail("It has %d dimensions.", ARR_NDIM(keys)));
  return keys;
}

// idem_once of each key in array order, in one call: the arguments are checked and the
// store opened once. The keys are taken in the order order_batch gives (src/core/batch),
// each distinct key once; an error (IK005) fails the call, and its abort takes back what
// the call wrote before it, so nothing of it is stored.
static Datum once_many(FunctionCallInfo fcinfo) {
  ArrayType* keys = keys_argument(fcinfo, 1);
  ClaimRequest request{};
  request.id = scope_arguments(fcinfo, 4);
  request.started = GetCurrentTimestamp();
  Interval* ttl = ttl_argument(fcinfo, 2, request.started);
  request.deadline = wait_deadline(fcinfo, 3, request.started);  // for the whole call
  PreventCommandIfReadOnly("idem_once_many()");

  Datum* elements;
  int count;
  deconstruct_array(keys, ARR_ELEMTYPE(keys), -1, false, TYPALIGN_INT, &elements, nullptr, &count);
  if (count == 0) PG_RETURN_ARRAYTYPE_P(construct_empty_array(BOOLOID));
  if (key_elsewhere(&request.id, fcinfo)) {
    forward_defaults(fcinfo, 2, ttl, 3);
    bool isnull;
    return citus_forward(fcinfo, 4, request.id.route.value, request.id.route.type, &isnull);
  }

  auto stored = static_cast<std::string_view*>(palloc(count * sizeof(std::string_view)));
  for (int i = 0; i < count; i++) {
    auto key = reinterpret_cast<struct varlena*>(DatumGetPointer(elements[i]));
    stored[i] = std::string_view(VARDATA_ANY(key), VARSIZE_ANY_EXHDR(key));
  }
  auto order = static_cast<int*>(palloc(count * sizeof(int)));
  auto first = static_cast<int*>(palloc(count * sizeof(int)));
  int distinct = order_batch(stored, count, order, first);

  KeyStore store;
  store_open(&store, store_for_key(&request.id), true);
  // What one key's look and write allocate is freed before the next key's.
  MemoryContext call = CurrentMemoryContext;
  MemoryContext per_key = AllocSetContextCreate(call, "idem_once_many key", ALLOCSET_DEFAULT_SIZES);
  // False where no key is decided: at every repeat of a key after its first position.
  auto applied = static_cast<Datum*>(palloc0(count * sizeof(Datum)));
  for (int j = 0; j < distinct; j++) {
    CHECK_FOR_INTERRUPTS();  // a key inserted first is never looked at, which would check
    int position = order[j];
    request.id.key = reinterpret_cast<struct varlena*>(DatumGetPointer(elements[position]));
    MemoryContextSwitchTo(per_key);
    applied[position] = BoolGetDatum(once_key(&store, request, ttl));
    MemoryContextSwitchTo(call);
    MemoryContextReset(per_key);
  }
  store_close(&store);
  MemoryContextDelete(per_key);

  int lower_bound = ARR_LBOUND(keys)[0];  // applied[i] answers keys[i]
  PG_RETURN_ARRAYTYPE_P(construct_md_array(applied, nullptr, 1, &count, &lower_bound, BOOLOID, 1,
                                           true, TYPALIGN_CHAR));
}

}  // namespace idempotency

using namespace idempotency;

IDEM_TWINNED_SQL_FUNCTION(idem_claim, claim)
IDEM_TWINNED_SQL_FUNCTION(idem_once, once)
IDEM_TWINNED_SQL_FUNCTION(idem_once_many, once_many)
