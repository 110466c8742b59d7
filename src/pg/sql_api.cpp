// SQL entry points for claiming, finishing and reading keys. Each checks its
// arguments, asks src/core/decision what to do with what the store saw, and tells
// the store to do it; a row written by another running transaction is waited for
// (polled, bounded) and then looked at again.
#include <optional>

#include "core/key.hpp"
#include "pg/errors.hpp"
#include "pg/guc.hpp"
#include "pg/identity_lock.hpp"
#include "pg/key_type.hpp"
#include "pg/store.hpp"
#include "pg/xact.hpp"

extern "C" {
#include "access/detoast.h"
#include "access/htup_details.h"
#include "catalog/pg_collation.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "tcop/utility.h"
#include "utils/builtins.h"
#include "utils/jsonb.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"
#include "utils/tuplestore.h"
}

namespace idempotency {

// ---------------------------------------------------------------------------
// Arguments
// ---------------------------------------------------------------------------

static void require_argument(FunctionCallInfo fcinfo, int n, const char* name) {
  if (PG_ARGISNULL(n))
    ereport(ERROR, errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED), errmsg("%s must not be null", name));
}

// Arguments 0 and 1 of every key function: (scope text, key idem_key).
static Identity identity_arguments(FunctionCallInfo fcinfo) {
  require_argument(fcinfo, 0, "scope");
  require_argument(fcinfo, 1, "key");
  text* scope = PG_GETARG_TEXT_PP(0);
  size_t length = VARSIZE_ANY_EXHDR(scope);
  if (length == 0)
    ereport(ERROR, errcode(ERRCODE_INVALID_PARAMETER_VALUE), errmsg("scope must not be empty"));
  if (length > kMaxScopeBytes)
    ereport(ERROR, errcode(ERRCODE_INVALID_PARAMETER_VALUE),
            errmsg("scope is %zu bytes long, at most %zu are allowed", length, kMaxScopeBytes));
  return Identity{GetUserId(), scope, PG_GETARG_VARLENA_PP(1)};
}

static std::optional<int32_t> attempt_argument(FunctionCallInfo fcinfo, int n) {
  if (PG_ARGISNULL(n)) return std::nullopt;
  return PG_GETARG_INT32(n);
}

static TimestampTz plus(TimestampTz t, Interval* span) {
  return DatumGetTimestampTz(
      DirectFunctionCall2(timestamptz_pl_interval, TimestampTzGetDatum(t), PointerGetDatum(span)));
}

static Interval* micros_interval(int64 micros) {
  Interval* span = static_cast<Interval*>(palloc0(sizeof(Interval)));
  span->time = micros;
  return span;
}

// The dedup window of a key created now (NULL: idempotency.default_ttl).
static Interval* ttl_argument(FunctionCallInfo fcinfo, int n, TimestampTz now) {
  if (PG_ARGISNULL(n))
    return micros_interval(static_cast<int64>(settings.default_ttl_s) * USECS_PER_SEC);
  Interval* ttl = PG_GETARG_INTERVAL_P(n);
  if (plus(now, ttl) <= now)
    ereport(ERROR, errcode(ERRCODE_INVALID_PARAMETER_VALUE), errmsg("ttl must be positive"));
  return ttl;
}

static Interval* lease_argument(FunctionCallInfo fcinfo, int n, TimestampTz now, Interval* ttl) {
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

// When a wait for another writer gives up (NULL: idempotency.wait_timeout).
static TimestampTz default_wait_deadline(TimestampTz now) {
  return now + static_cast<int64>(settings.wait_timeout_ms) * 1000;
}

static TimestampTz wait_deadline(FunctionCallInfo fcinfo, int n, TimestampTz now) {
  if (PG_ARGISNULL(n)) return default_wait_deadline(now);
  TimestampTz end = plus(now, PG_GETARG_INTERVAL_P(n));
  if (end < now)
    ereport(ERROR, errcode(ERRCODE_INVALID_PARAMETER_VALUE), errmsg("wait must not be negative"));
  return end;
}

static std::optional<std::string_view> fingerprint_argument(FunctionCallInfo fcinfo, int n) {
  if (PG_ARGISNULL(n)) return std::nullopt;
  bytea* fingerprint = PG_GETARG_BYTEA_PP(n);
  size_t length = VARSIZE_ANY_EXHDR(fingerprint);
  if (length > 64)
    ereport(ERROR, errcode(ERRCODE_INVALID_PARAMETER_VALUE),
            errmsg("fingerprint is %zu bytes long, at most 64 are allowed", length),
            errhint("Pass a digest of the request, such as idem_fingerprint(...)."));
  return std::string_view(VARDATA_ANY(fingerprint), length);
}

static void check_stored_size(Datum value, const char* what) {
  Size size = toast_raw_datum_size(value) - VARHDRSZ;
  if (size > static_cast<Size>(settings.max_response_bytes))
    ereport(ERROR, errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED), errmsg("%s is too large", what),
            errdetail("It is %zu bytes; idempotency.max_response_size is %d bytes.", size,
                      settings.max_response_bytes));
}

// ---------------------------------------------------------------------------
// Errors about a key
// ---------------------------------------------------------------------------

static const char* key_text(const Identity& id) { return key_cstring(id.key); }

static void raise_in_progress(const Identity& id) pg_attribute_noreturn();
static void raise_in_progress(const Identity& id) {
  ereport(ERROR, errcode(ERRCODE_IDEM_IN_PROGRESS),
          errmsg("idempotency key \"%s\" in scope \"%s\" is in progress", key_text(id),
                 text_to_cstring(id.scope)),
          errdetail("Another transaction or a live lease holds it."), errhint("Retry later."));
}

static void raise_claim_lost(const Identity& id, const Probe& probe, std::optional<int32_t> attempt)
    pg_attribute_noreturn();
static void raise_claim_lost(const Identity& id, const Probe& probe,
                             std::optional<int32_t> attempt) {
  const StoredRow& row = probe.view;
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
          errdetail_internal("%s", detail));
}

static void raise_not_claimed(const Identity& id) pg_attribute_noreturn();
static void raise_not_claimed(const Identity& id) {
  ereport(ERROR, errcode(ERRCODE_IDEM_NOT_CLAIMED),
          errmsg("idempotency key \"%s\" in scope \"%s\" is not claimed", key_text(id),
                 text_to_cstring(id.scope)),
          errhint("Call idem_claim before finishing a key."));
}

static void raise_mismatch(const Identity& id) pg_attribute_noreturn();
static void raise_mismatch(const Identity& id) {
  ereport(ERROR, errcode(ERRCODE_IDEM_FINGERPRINT_MISMATCH),
          errmsg("idempotency key \"%s\" in scope \"%s\" was used for a different request",
                 key_text(id), text_to_cstring(id.scope)),
          errdetail("The request's fingerprint differs from the one stored with the key."),
          errhint("Use a new idempotency key for a different request."));
}

// ---------------------------------------------------------------------------
// Claiming
// ---------------------------------------------------------------------------

struct ClaimRequest {
  Identity id;
  std::optional<std::string_view> fingerprint;
  Interval* ttl;    // for a row created by this call
  Interval* lease;  // null for an in-transaction claim
  TimestampTz started;
  TimestampTz deadline;
};

static Datum bytes_datum(std::string_view bytes) {
  bytea* value = static_cast<bytea*>(palloc(VARHDRSZ + bytes.size()));
  SET_VARSIZE(value, VARHDRSZ + bytes.size());
  memcpy(VARDATA(value), bytes.data(), bytes.size());
  return PointerGetDatum(value);
}

// Makes `row` held by the request: pending, with or without a lease from now.
static void hold(const ClaimRequest& request, TimestampTz now, KeyRow* row) {
  row->set(kState, CharGetDatum(static_cast<char>(KeyState::kPending)));
  row->clear(kResponse);
  if (request.lease == nullptr) {
    row->clear(kLease);
    row->clear(kLeaseExpiresAt);
    return;
  }
  TimestampTz lease_end = plus(now, request.lease);
  row->set(kLease, PointerGetDatum(request.lease));
  row->set(kLeaseExpiresAt, TimestampTzGetDatum(lease_end));
  if (DatumGetTimestampTz(row->get(kExpiresAt)) < lease_end)
    row->set(kExpiresAt, TimestampTzGetDatum(lease_end));
}

static KeyRow fresh_claim(const ClaimRequest& request, TimestampTz now) {
  KeyRow row;
  for (int c = 1; c <= kKeysColumns; c++) row.clear(static_cast<KeysColumn>(c));
  row.set(kRole, ObjectIdGetDatum(request.id.role));
  row.set(kScope, PointerGetDatum(request.id.scope));
  row.set(kKey, PointerGetDatum(request.id.key));
  row.set(kAttempt, Int32GetDatum(1));
  row.set(kFirstClaimedAt, TimestampTzGetDatum(now));
  row.set(kExpiresAt, TimestampTzGetDatum(plus(now, request.ttl)));
  row.set(kReapSlot, Int16GetDatum(reap_slot(request.id)));
  if (request.fingerprint) row.set(kFingerprint, bytes_datum(*request.fingerprint));
  hold(request, now, &row);
  return row;
}

// Attempt + 1 on the same row; the checkpoint stays so the new holder can resume.
static KeyRow take_over(const ClaimRequest& request, const KeyRow& stored, TimestampTz now) {
  KeyRow row = stored;
  row.set(kAttempt, Int32GetDatum(DatumGetInt32(stored.get(kAttempt)) + 1));
  if (row.null(kFingerprint) && request.fingerprint)
    row.set(kFingerprint, bytes_datum(*request.fingerprint));
  hold(request, now, &row);
  return row;
}

// What this transaction's unwritten claim, or else the store, holds for `id`.
static void probe_key(KeyStore* store, const Identity& id, Snapshot snapshot, Probe* probe) {
  const KeyRow* row = unwritten_claim(id);
  if (row == nullptr) {
    store_probe(store, id, snapshot, probe);
    probe->view.claimed_by_this_transaction = probe->found && claimed_here(*probe, id);
    return;
  }
  *probe = Probe{};
  probe->found = probe->unwritten = true;
  probe->row = *row;
  store_view_row(*row, &probe->view);
  probe->view.claimed_by_this_transaction = true;
}

enum class Outcome { kClaimed, kReplay, kInProgress, kDuplicate };

static Datum claim_result(FunctionCallInfo fcinfo, Outcome outcome, const KeyRow& row,
                          std::optional<int64> retry_after_us) {
  static const char* const names[] = {"claimed", "replay", "in_progress", "duplicate"};
  // Looked up once per call site, not per call: the claim path runs in every transaction.
  auto desc = static_cast<TupleDesc>(fcinfo->flinfo->fn_extra);
  if (desc == nullptr) {
    TupleDesc looked_up;
    if (get_call_result_type(fcinfo, nullptr, &looked_up) != TYPEFUNC_COMPOSITE)
      elog(ERROR, "idem_claim must return a composite type");
    MemoryContext old = MemoryContextSwitchTo(fcinfo->flinfo->fn_mcxt);
    desc = BlessTupleDesc(CreateTupleDescCopy(looked_up));
    MemoryContextSwitchTo(old);
    fcinfo->flinfo->fn_extra = desc;
  }

  KeyState state = KeyState::kPending;
  if (outcome == Outcome::kReplay) parse_state(DatumGetChar(row.get(kState)), &state);
  bool show_checkpoint = outcome != Outcome::kInProgress;
  Datum values[9] = {};
  bool nulls[9] = {};
  values[0] = CStringGetTextDatum(names[static_cast<int>(outcome)]);
  values[1] = CStringGetTextDatum(state_name(state));
  nulls[2] = outcome != Outcome::kReplay || row.null(kResponse);
  values[2] = nulls[2] ? 0 : row.get(kResponse);
  values[3] = row.get(kAttempt);
  nulls[4] = !show_checkpoint || row.null(kCheckpoint);
  values[4] = nulls[4] ? 0 : row.get(kCheckpoint);
  nulls[5] = !show_checkpoint || row.null(kCheckpointData);
  values[5] = nulls[5] ? 0 : row.get(kCheckpointData);
  nulls[6] = !retry_after_us;
  values[6] = retry_after_us ? PointerGetDatum(micros_interval(*retry_after_us)) : 0;
  nulls[7] = row.null(kFirstClaimedAt);
  values[7] = row.get(kFirstClaimedAt);
  nulls[8] = row.null(kExpiresAt);
  values[8] = row.get(kExpiresAt);
  return HeapTupleGetDatum(heap_form_tuple(desc, values, nulls));
}

// After a wait ran out: how long it waited, at least 100 ms.
static int64 waited_us(const ClaimRequest& request) {
  return Max(GetCurrentTimestamp() - request.started, 100 * 1000);
}

// What another transaction's claim shows while only its identity lock does: the
// first attempt, its row not yet written.
static KeyRow claim_not_yet_written() {
  KeyRow row;
  for (int c = 1; c <= kKeysColumns; c++) row.clear(static_cast<KeysColumn>(c));
  row.set(kAttempt, Int32GetDatum(1));
  return row;
}

// A key's first row is inserted only under its identity lock, and after looking again
// if the lock's last holder may have inserted the row meanwhile. Claims and
// idem_once hold the lock exactly while their decision is to insert.
struct InsertLock {
  IdentityLock lock;
  bool held;
  uint64 inserts_before;  // read before each look at the key
};

enum class InsertLockStep { kGo, kLookAgain, kTimedOut };

static InsertLock insert_lock(const Identity& id) {
  return InsertLock{identity_lock(id, store_lock_secret()), false, 0};
}

static void before_look(InsertLock* insert) { insert->inserts_before = inserts_seen(insert->lock); }

static void release_lock(InsertLock* insert) {
  if (insert->held) release_identity_lock(insert->lock);
  insert->held = false;
}

static InsertLockStep hold_for(ClaimAction action, InsertLock* insert, TimestampTz deadline) {
  if (action != ClaimAction::kInsert) {
    release_lock(insert);
    return InsertLockStep::kGo;
  }
  if (insert->held) return InsertLockStep::kGo;
  if (!hold_identity_lock(insert->lock, deadline)) return InsertLockStep::kTimedOut;
  insert->held = true;
  return inserted_since(insert->lock, insert->inserts_before) ? InsertLockStep::kLookAgain
                                                              : InsertLockStep::kGo;
}

// Inserts a key's first row under its lock. False when the primary key found a row
// the probe did not see: the lock is let go and the caller looks again.
static bool insert_first_row(KeyStore* store, KeyRow* row, InsertLock* insert) {
  bool inserted = store_insert(store, row);
  if (inserted) note_insert(insert->lock);
  release_lock(insert);
  return inserted;
}

static Datum claim_with(FunctionCallInfo fcinfo, KeyStore* store, const ClaimRequest& request) {
  InsertLock insert = insert_lock(request.id);
  for (;;) {
    CHECK_FOR_INTERRUPTS();
    before_look(&insert);
    Probe probe;
    probe_key(store, request.id, nullptr, &probe);
    TimestampTz now = GetCurrentTimestamp();
    ClaimAction action =
        decide_claim(probe.found ? &probe.view : nullptr, request.fingerprint, now);
    InsertLockStep step = hold_for(action, &insert, request.deadline);
    if (step == InsertLockStep::kTimedOut)
      return claim_result(fcinfo, Outcome::kInProgress, claim_not_yet_written(),
                          waited_us(request));
    if (step == InsertLockStep::kLookAgain) continue;
    TransactionId writer = probe.writer;
    KeyRow row;
    WriteResult written = WriteResult::kDone;
    switch (action) {
      case ClaimAction::kDuplicate:
        return claim_result(fcinfo, Outcome::kDuplicate, probe.row, std::nullopt);
      case ClaimAction::kMismatch: raise_mismatch(request.id);
      case ClaimAction::kReplay:
        return claim_result(fcinfo, Outcome::kReplay, probe.row, std::nullopt);
      case ClaimAction::kInProgress:
        return claim_result(fcinfo, Outcome::kInProgress, probe.row,
                            *probe.view.lease_expires_at - now);
      case ClaimAction::kWait: written = WriteResult::kBusy; break;
      case ClaimAction::kInsert:
        row = fresh_claim(request, now);
        if (request.lease == nullptr && can_leave_claim_unwritten()) {
          remember_unwritten_claim(store, request.id, row, insert.lock);  // keeps the lock
        } else if (!insert_first_row(store, &row, &insert)) {
          written = WriteResult::kChanged;
        }
        break;
      case ClaimAction::kReplaceExpired:
        row = fresh_claim(request, now);
        written = store_update(store, &probe.tid, &row, &writer);
        break;
      case ClaimAction::kTakeOver:
        row = take_over(request, probe.row, now);
        written = store_update(store, &probe.tid, &row, &writer);
        break;
    }
    if (written == WriteResult::kDone) {
      remember_claim(request.id, request.lease != nullptr);
      return claim_result(fcinfo, Outcome::kClaimed, row, std::nullopt);
    }
    if (written == WriteResult::kBusy && !wait_for_writer(writer, request.deadline))
      return claim_result(fcinfo, Outcome::kInProgress, probe.row, waited_us(request));
  }
}

static Datum claim(FunctionCallInfo fcinfo) {
  ClaimRequest request;
  request.id = identity_arguments(fcinfo);
  request.fingerprint = fingerprint_argument(fcinfo, 2);
  request.started = GetCurrentTimestamp();
  request.ttl = ttl_argument(fcinfo, 3, request.started);
  request.lease = lease_argument(fcinfo, 4, request.started, request.ttl);
  request.deadline = wait_deadline(fcinfo, 5, request.started);
  PreventCommandIfReadOnly("idem_claim()");

  KeyStore store;
  store_open(&store, true);
  Datum result = claim_with(fcinfo, &store, request);
  store_close(&store);
  return result;
}

// ---------------------------------------------------------------------------
// Finishing
// ---------------------------------------------------------------------------

enum class Finish { kComplete, kFail, kRelease, kCheckpoint };

// A claim this transaction made in-transaction and has not finished yet.
static bool is_own_open_claim(const StoredRow& view) {
  return view.state == KeyState::kPending && view.claimed_by_this_transaction &&
         !view.lease_expires_at;
}

struct FinishRequest {
  Identity id;
  std::optional<int32_t> attempt;
  Finish kind;
  Datum data;  // response, error or checkpoint data
  bool data_null;
  text* point;  // idem_checkpoint
};

static void apply_finish(const FinishRequest& request, TimestampTz now, KeyRow* row) {
  switch (request.kind) {
    case Finish::kComplete:
    case Finish::kFail:
      row->set(kState,
               CharGetDatum(static_cast<char>(
                   request.kind == Finish::kComplete ? KeyState::kCompleted : KeyState::kFailed)));
      if (request.data_null)
        row->clear(kResponse);
      else
        row->set(kResponse, request.data);
      // Out of the lease index and of idem_abandoned's index (keys_leased_idx).
      row->clear(kLease);
      row->clear(kLeaseExpiresAt);
      break;
    case Finish::kCheckpoint:
      row->set(kCheckpoint, PointerGetDatum(request.point));
      if (request.data_null)
        row->clear(kCheckpointData);
      else
        row->set(kCheckpointData, request.data);
      if (!row->null(kLease)) {  // renew by the lease's original length
        TimestampTz lease_end = plus(now, DatumGetIntervalP(row->get(kLease)));
        row->set(kLeaseExpiresAt, TimestampTzGetDatum(lease_end));
        if (DatumGetTimestampTz(row->get(kExpiresAt)) < lease_end)
          row->set(kExpiresAt, TimestampTzGetDatum(lease_end));
      }
      break;
    case Finish::kRelease: break;
  }
}

// The first write of an unwritten claim's row, already finished (a release writes
// nothing).
static void write_unwritten_claim(KeyStore* store, const FinishRequest& request, TimestampTz now,
                                  KeyRow row) {
  if (request.kind != Finish::kRelease) {
    apply_finish(request, now, &row);
    // The claim's lock is still held and its probe saw no row, so only a row written
    // outside the functions (a hand-made INSERT) can be in the way.
    if (!store_insert(store, &row))
      ereport(ERROR, errcode(ERRCODE_IDEM_CLAIM_LOST),
              errmsg("claim on idempotency key \"%s\" in scope \"%s\" was lost",
                     key_text(request.id), text_to_cstring(request.id.scope)),
              errdetail("Another row of the key was stored while the claim was held."));
    note_insert(identity_lock(request.id, store_lock_secret()));
  }
  note_unwritten_claim_written(request.id);
}

// Another transaction's in-transaction claim of a key without a row holds only the
// key's identity lock and stores nothing until it finishes. A finish or idem_forget
// that finds no row waits for that lock as for any writer (rule 4) and looks again
// while holding it; false when the wait ran out.
static bool look_again_under_identity_lock(KeyStore* store, const Identity& id,
                                           TimestampTz deadline, Probe* probe) {
  IdentityLock lock = identity_lock(id, store_lock_secret());
  if (!hold_identity_lock(lock, deadline)) return false;
  probe_key(store, id, nullptr, probe);
  release_identity_lock(lock);
  return true;
}

static void finish(const FinishRequest& request, const char* function) {
  PreventCommandIfReadOnly(function);
  KeyStore store;
  store_open(&store, true);
  TimestampTz deadline = default_wait_deadline(GetCurrentTimestamp());
  for (;;) {
    CHECK_FOR_INTERRUPTS();
    Probe probe;
    probe_key(&store, request.id, nullptr, &probe);
    if (!probe.found && !look_again_under_identity_lock(&store, request.id, deadline, &probe))
      raise_in_progress(request.id);
    TimestampTz now = GetCurrentTimestamp();
    TransactionId writer = probe.writer;
    WriteResult written = WriteResult::kBusy;
    switch (decide_finish(probe.found ? &probe.view : nullptr, request.attempt, now)) {
      case FinishAction::kWait: break;
      case FinishAction::kClaimLost: raise_claim_lost(request.id, probe, request.attempt);
      case FinishAction::kNotClaimed: raise_not_claimed(request.id);
      case FinishAction::kApply:
        if (probe.unwritten) {
          write_unwritten_claim(&store, request, now, probe.row);
          written = WriteResult::kDone;
        } else if (request.kind == Finish::kRelease) {
          written = store_delete(&store, &probe.tid, &writer);
        } else {
          KeyRow row = probe.row;
          apply_finish(request, now, &row);
          written = store_update(&store, &probe.tid, &row, &writer);
        }
        break;
    }
    if (written == WriteResult::kDone) {
      if (request.kind != Finish::kCheckpoint && is_own_open_claim(probe.view))
        note_claim_finished();
      break;
    }
    if (written == WriteResult::kBusy && !wait_for_writer(writer, deadline))
      raise_in_progress(request.id);
  }
  store_close(&store);
}

static FinishRequest finish_arguments(FunctionCallInfo fcinfo, Finish kind, int attempt_arg) {
  FinishRequest request{
      identity_arguments(fcinfo), attempt_argument(fcinfo, attempt_arg), kind, 0, true, nullptr};
  return request;
}

static Datum complete_or_fail(FunctionCallInfo fcinfo, Finish kind) {
  FinishRequest request = finish_arguments(fcinfo, kind, 3);
  request.data_null = PG_ARGISNULL(2);
  if (!request.data_null) {
    request.data = PG_GETARG_DATUM(2);
    check_stored_size(request.data, kind == Finish::kComplete ? "response" : "error");
  }
  finish(request, kind == Finish::kComplete ? "idem_complete()" : "idem_fail()");
  PG_RETURN_VOID();
}

static Datum complete(FunctionCallInfo fcinfo) {
  return complete_or_fail(fcinfo, Finish::kComplete);
}
static Datum fail(FunctionCallInfo fcinfo) { return complete_or_fail(fcinfo, Finish::kFail); }

static Datum release(FunctionCallInfo fcinfo) {
  finish(finish_arguments(fcinfo, Finish::kRelease, 2), "idem_release()");
  PG_RETURN_VOID();
}

static Datum checkpoint(FunctionCallInfo fcinfo) {
  FinishRequest request = finish_arguments(fcinfo, Finish::kCheckpoint, 4);
  require_argument(fcinfo, 2, "point");
  request.point = PG_GETARG_TEXT_PP(2);
  check_stored_size(PointerGetDatum(request.point), "checkpoint");
  request.data_null = PG_ARGISNULL(3);
  if (!request.data_null) {
    request.data = PG_GETARG_DATUM(3);
    check_stored_size(request.data, "checkpoint data");
  }
  finish(request, "idem_checkpoint()");
  PG_RETURN_VOID();
}

// ---------------------------------------------------------------------------
// idem_once and idem_forget
// ---------------------------------------------------------------------------

// Claims and completes in one write: a fresh key is inserted already completed.
static Datum once(FunctionCallInfo fcinfo) {
  ClaimRequest request{};
  request.id = identity_arguments(fcinfo);
  request.started = GetCurrentTimestamp();
  request.ttl = ttl_argument(fcinfo, 2, request.started);
  request.deadline = wait_deadline(fcinfo, 3, request.started);
  PreventCommandIfReadOnly("idem_once()");

  KeyStore store;
  store_open(&store, true);
  bool applied = false;
  InsertLock insert = insert_lock(request.id);
  for (;;) {
    CHECK_FOR_INTERRUPTS();
    before_look(&insert);
    Probe probe;
    probe_key(&store, request.id, nullptr, &probe);
    TimestampTz now = GetCurrentTimestamp();
    TransactionId writer = probe.writer;
    KeyRow row;
    WriteResult written = WriteResult::kBusy;
    ClaimAction action = decide_claim(probe.found ? &probe.view : nullptr, std::nullopt, now);
    InsertLockStep step = hold_for(action, &insert, request.deadline);
    if (step == InsertLockStep::kTimedOut) raise_in_progress(request.id);
    if (step == InsertLockStep::kLookAgain) continue;
    switch (action) {
      case ClaimAction::kReplay:
      case ClaimAction::kDuplicate:
      case ClaimAction::kMismatch:  // no fingerprint: cannot happen
        written = WriteResult::kDone;
        break;
      case ClaimAction::kInProgress: raise_in_progress(request.id);
      case ClaimAction::kWait: break;
      case ClaimAction::kInsert:
        row = fresh_claim(request, now);
        row.set(kState, CharGetDatum(static_cast<char>(KeyState::kCompleted)));
        applied = insert_first_row(&store, &row, &insert);
        written = applied ? WriteResult::kDone : WriteResult::kChanged;
        break;
      case ClaimAction::kReplaceExpired:
      case ClaimAction::kTakeOver:
        row = action == ClaimAction::kTakeOver ? take_over(request, probe.row, now)
                                               : fresh_claim(request, now);
        row.set(kState, CharGetDatum(static_cast<char>(KeyState::kCompleted)));
        written = store_update(&store, &probe.tid, &row, &writer);
        applied = written == WriteResult::kDone;
        break;
    }
    if (written == WriteResult::kDone) break;
    if (written == WriteResult::kBusy && !wait_for_writer(writer, request.deadline))
      raise_in_progress(request.id);
  }
  store_close(&store);
  PG_RETURN_BOOL(applied);
}

static Datum forget(FunctionCallInfo fcinfo) {
  Identity id = identity_arguments(fcinfo);
  PreventCommandIfReadOnly("idem_forget()");
  KeyStore store;
  store_open(&store, true);
  TimestampTz deadline = default_wait_deadline(GetCurrentTimestamp());
  bool was_live = false;
  for (;;) {
    CHECK_FOR_INTERRUPTS();
    Probe probe;
    probe_key(&store, id, nullptr, &probe);
    if (!probe.found && !look_again_under_identity_lock(&store, id, deadline, &probe))
      raise_in_progress(id);
    if (!probe.found) break;
    if (probe.unwritten) {  // nothing stored yet: drop the claim
      was_live = true;
      note_unwritten_claim_written(id);
      note_claim_finished();
      break;
    }
    TransactionId writer = probe.writer;
    WriteResult written = WriteResult::kBusy;
    if (!probe.view.written_by_other_in_progress) {
      was_live = is_live(probe.view, GetCurrentTimestamp());
      written = store_delete(&store, &probe.tid, &writer);
    }
    if (written == WriteResult::kDone) {
      if (is_own_open_claim(probe.view)) note_claim_finished();
      break;
    }
    if (written == WriteResult::kBusy && !wait_for_writer(writer, deadline)) raise_in_progress(id);
  }
  store_close(&store);
  PG_RETURN_BOOL(was_live);
}

// ---------------------------------------------------------------------------
// idem_lookup: a plain MVCC read, so it works read-only and on a standby.
// ---------------------------------------------------------------------------

static Datum lookup(FunctionCallInfo fcinfo) {
  Identity id = identity_arguments(fcinfo);
  InitMaterializedSRF(fcinfo, 0);
  ReturnSetInfo* rsinfo = reinterpret_cast<ReturnSetInfo*>(fcinfo->resultinfo);

  KeyStore store;
  store_open(&store, false);
  Probe probe;
  probe_key(&store, id, GetActiveSnapshot(), &probe);
  if (probe.found && is_live(probe.view, GetCurrentTimestamp())) {
    const KeyRow& row = probe.row;
    Datum values[8] = {CStringGetTextDatum(state_name(probe.view.state)),
                       row.get(kResponse),
                       row.get(kAttempt),
                       row.get(kCheckpoint),
                       row.get(kCheckpointData),
                       row.get(kFirstClaimedAt),
                       row.get(kExpiresAt),
                       row.get(kLeaseExpiresAt)};
    bool nulls[8] = {false,
                     row.null(kResponse),
                     false,
                     row.null(kCheckpoint),
                     row.null(kCheckpointData),
                     false,
                     false,
                     row.null(kLeaseExpiresAt)};
    tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
  }
  store_close(&store);
  return (Datum)0;
}

// ---------------------------------------------------------------------------
// idem_abandoned: the role's abandoned and stale claims, oldest first, for a
// recovery job that resumes them from their checkpoints.
// ---------------------------------------------------------------------------

struct AbandonedClaim {
  TimestampTz first_claimed_at;
  KeyRow row;
};

static int oldest_first(const void* a, const void* b) {
  TimestampTz ta = static_cast<const AbandonedClaim*>(a)->first_claimed_at;
  TimestampTz tb = static_cast<const AbandonedClaim*>(b)->first_claimed_at;
  return (ta > tb) - (ta < tb);
}

static bool is_abandoned(const StoredRow& view, TimestampTz now) {
  if (!is_live(view, now)) return false;
  return view.state == KeyState::kAbandoned ||
         (view.state == KeyState::kPending && view.lease_expires_at &&
          *view.lease_expires_at <= now);
}

static Datum abandoned(FunctionCallInfo fcinfo) {
  text* scope = PG_ARGISNULL(0) ? nullptr : PG_GETARG_TEXT_PP(0);
  require_argument(fcinfo, 1, "max_rows");
  int32 max_rows = PG_GETARG_INT32(1);
  if (max_rows < 0)
    ereport(ERROR, errcode(ERRCODE_INVALID_PARAMETER_VALUE),
            errmsg("max_rows must not be negative"));
  InitMaterializedSRF(fcinfo, 0);
  ReturnSetInfo* rsinfo = reinterpret_cast<ReturnSetInfo*>(fcinfo->resultinfo);

  KeyStore store;
  store_open(&store, false);
  TimestampTz now = GetCurrentTimestamp();
  // keys_leased_idx holds only lease claims, in (role, first_claimed_at) order, so
  // the scan reads the role's pending, stale and abandoned lease claims, oldest first,
  // and stops after max_rows. A database still at 1.0 lacks it: all the role's keys.
  IndexScanDesc scan = store_begin_leased_scan(&store, GetUserId(), GetActiveSnapshot());
  bool ordered = scan != nullptr;
  if (!ordered) scan = store_begin_role_scan(&store, GetUserId(), GetActiveSnapshot());
  int count = 0, capacity = 16;
  AbandonedClaim* found = static_cast<AbandonedClaim*>(palloc(capacity * sizeof(AbandonedClaim)));
  while ((!ordered || count < max_rows) &&
         index_getnext_slot(scan, ForwardScanDirection, store.read_slot)) {
    KeyRow row;
    StoredRow view;
    store_read_slot(store.read_slot, &row, &view);
    if (!is_abandoned(view, now)) continue;
    if (scope != nullptr && !DatumGetBool(DirectFunctionCall2Coll(
                                texteq, C_COLLATION_OID, PointerGetDatum(scope), row.get(kScope))))
      continue;
    if (count == capacity) {
      capacity *= 2;
      found = static_cast<AbandonedClaim*>(repalloc(found, capacity * sizeof(AbandonedClaim)));
    }
    found[count++] = AbandonedClaim{DatumGetTimestampTz(row.get(kFirstClaimedAt)), row};
    CHECK_FOR_INTERRUPTS();
  }
  store_end_scan(&store, scan);
  store_close(&store);

  qsort(found, count, sizeof(AbandonedClaim), oldest_first);
  for (int i = 0; i < count && i < max_rows; i++) {
    const KeyRow& row = found[i].row;
    Datum values[6] = {row.get(kScope),          row.get(kKey),
                       row.get(kAttempt),        row.get(kCheckpoint),
                       row.get(kCheckpointData), row.get(kFirstClaimedAt)};
    bool nulls[6] = {false, false, false, row.null(kCheckpoint), row.null(kCheckpointData), false};
    tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
  }
  return (Datum)0;
}

}  // namespace idempotency

using namespace idempotency;

IDEM_SQL_FUNCTION(idem_claim, claim)
IDEM_SQL_FUNCTION(idem_complete, complete)
IDEM_SQL_FUNCTION(idem_fail, fail)
IDEM_SQL_FUNCTION(idem_release, release)
IDEM_SQL_FUNCTION(idem_checkpoint, checkpoint)
IDEM_SQL_FUNCTION(idem_once, once)
IDEM_SQL_FUNCTION(idem_forget, forget)
IDEM_SQL_FUNCTION(idem_lookup, lookup)
IDEM_SQL_FUNCTION(idem_abandoned, abandoned)
