// A key's state machine, as pure functions: given the stored row as plain data, the
// request and the clock, the decision (which rule applies) and the next row. No
// PostgreSQL here: the glue converts a row to StoredRow, asks, and writes back what
// it is given. Every rule of docs/reference.md is decided in this file's functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace idempotency {

// PostgreSQL TimestampTz: microseconds since 2000-01-01 UTC.
using Micros = std::int64_t;

// A value the core moves but never reads (a response, a checkpoint, a lease length):
// the glue's handle for it, 0 for NULL.
using Opaque = std::uintptr_t;

// Stored as a "char" in idempotency.keys.state.
enum class KeyState : char {
  kPending = 'p',
  kCompleted = 'c',
  kFailed = 'f',
  kAbandoned = 'a',
};

// The SQL-visible name of a state ("pending", "completed", ...).
const char* state_name(KeyState state) noexcept;
// Parses the stored "char"; false for anything else.
bool parse_state(char stored, KeyState* state) noexcept;

// A fingerprint: its bytes, for comparing, and the glue's handle, for storing.
struct Fingerprint {
  std::string_view bytes;
  Opaque value = 0;
};

// The one row version of an identity as the store saw it (identity columns aside),
// and how it relates to the calling transaction.
struct StoredRow {
  KeyState state = KeyState::kPending;
  std::int32_t attempt = 1;
  Micros first_claimed_at = 0;
  Micros expires_at = 0;
  std::optional<Micros> lease_expires_at;  // set while a lease claim holds it
  std::optional<std::string_view> fingerprint;
  Opaque fingerprint_value = 0;
  Opaque lease = 0;  // the lease's length, kept to renew it
  Opaque checkpoint = 0;
  Opaque checkpoint_data = 0;
  Opaque response = 0;                        // the stored response or error
  bool written_by_other_in_progress = false;  // xmin or xmax of a running transaction
  // The calling transaction (or one of its subtransactions still open or committed
  // into it) wrote this version, or holds it as a claim not yet written.
  bool written_by_this_transaction = false;
  // The calling transaction made the pending claim this row holds (in-transaction
  // or with a lease), as opposed to merely writing it later (a checkpoint).
  bool claimed_by_this_transaction = false;
};

// Liveness: a row is live until it expires; beyond that while it is pending with a
// live lease, and, whatever its expires_at, while a transaction in progress wrote it:
// another one (every decision waits for that first) or the calling one, for which
// the window cannot pass mid-transaction (it replays and finishes what it wrote).
bool is_live(const StoredRow& row, Micros now) noexcept;
// A pending claim this transaction made in-transaction and has not finished.
bool is_own_open_claim(const StoredRow& row) noexcept;
// Abandoned, or pending with a lease that ran out: what idem_abandoned lists.
bool is_abandoned(const StoredRow& row, Micros now) noexcept;

// ---------------------------------------------------------------------------
// Claiming
// ---------------------------------------------------------------------------

enum class ClaimAction {
  kInsert,          // free (rule 1): no row: claim as attempt 1
  kReplaceExpired,  // free (rule 1): the row expired: claim afresh over it
  kWait,            // writer in progress (rule 4): wait for it, look again
  kMismatch,        // fingerprint mismatch (rule 2): IK001
  kReplay,          // finished (rule 3): replay
  kInProgress,      // live lease (rule 5): in_progress
  kTakeOver,        // takeover (rule 6): abandoned or stale: attempt + 1
  kDuplicate,       // own claim (rule 7): this transaction already holds it
};

// The rules in their order: own claim, writer in progress, free, fingerprint
// mismatch, finished, live lease, takeover (the contract's 7, 4, 1, 2, 3, 5, 6; see
// docs/reference.md). `row` is null when none exists.
ClaimAction decide_claim(const StoredRow* row, std::optional<std::string_view> fingerprint,
                         Micros now) noexcept;

// What a claim asks for, with the times the glue computed from its intervals.
struct ClaimTerms {
  std::optional<Fingerprint> fingerprint;
  Micros expires_at = 0;            // now + ttl: the window of a row this claim creates
  Opaque lease = 0;                 // 0: an in-transaction claim
  std::optional<Micros> lease_end;  // now + lease
};

// Rule 1: a new pending row, attempt 1 (also over an expired row, whose old
// fingerprint is not checked).
StoredRow claim_fresh(const ClaimTerms& terms, Micros now) noexcept;
// Rule 6: attempt + 1 on the same row; the checkpoint stays so the new holder can
// resume, and the stored fingerprint stays (or becomes the given one if none).
StoredRow claim_take_over(const StoredRow& stored, const ClaimTerms& terms) noexcept;

// ---------------------------------------------------------------------------
// Finishing
// ---------------------------------------------------------------------------

enum class FinishAction {
  kApply,       // the caller holds the pending claim
  kWait,        // another transaction is writing the row (then IK005)
  kClaimLost,   // IK003
  kNotClaimed,  // IK004
};

// Whether the caller may complete, fail, release or checkpoint the row.
FinishAction decide_finish(const StoredRow* row, std::optional<std::int32_t> attempt,
                           Micros now) noexcept;

// pending -> completed or failed, with the response or error to replay. The lease
// is dropped: the key leaves the lease indexes.
StoredRow complete(const StoredRow& claim, Opaque response) noexcept;
StoredRow fail(const StoredRow& claim, Opaque error) noexcept;
// A recovery point; a lease claim's lease is renewed to `renewed_lease_end` (now +
// the lease's original length), and the dedup window stretched to cover it.
StoredRow checkpoint(const StoredRow& claim, Opaque point, Opaque data,
                     std::optional<Micros> renewed_lease_end) noexcept;
// (idem_release removes the row: no next row.)

// ---------------------------------------------------------------------------
// Expiry and the reaper
// ---------------------------------------------------------------------------

// Whether the reaper deletes the row: its window has passed and it is not live.
bool is_reapable(const StoredRow& row, Micros now) noexcept;
// Whether the reaper marks the row abandoned: pending, its lease ran out.
bool is_stale(const StoredRow& row, Micros now) noexcept;
// pending with a stale lease -> abandoned; it leaves the stale-lease index (the late
// holder is fenced out by its attempt, a retry takes over with the checkpoint).
StoredRow abandon(const StoredRow& stale) noexcept;

}  // namespace idempotency
