// The claim and finish decisions of the SPEC, as pure functions of what the store
// saw and the clock. No PostgreSQL here: the glue reads a row, asks, and acts.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace idempotency {

// PostgreSQL TimestampTz: microseconds since 2000-01-01 UTC.
using Micros = std::int64_t;

// Stored as a "char" in idempotency.keys.state.
enum class KeyState : char {
  kPending = 'p',
  kCompleted = 'c',
  kFailed = 'f',
  kAbandoned = 'a',
};

// The SQL-visible name of a state ("pending", "completed", ...).
const char* state_name(KeyState state);
// Parses the stored "char"; false for anything else.
bool parse_state(char stored, KeyState* state);

// What the store saw of the one row version of an identity.
struct StoredRow {
  KeyState state = KeyState::kPending;
  std::int32_t attempt = 1;
  Micros expires_at = 0;
  std::optional<Micros> lease_expires_at;  // set while a lease claim holds it
  std::optional<std::string_view> fingerprint;
  bool written_by_other_in_progress = false;  // xmin or xmax of a running transaction
  // The calling transaction made the pending claim this row holds (in-transaction
  // or with a lease), as opposed to merely writing it later (a checkpoint).
  bool claimed_by_this_transaction = false;
};

// A row is live until it expires, and beyond that while a lease still holds it.
bool is_live(const StoredRow& row, Micros now);

enum class ClaimAction {
  kInsert,          // rule 1: no row: claim as attempt 1
  kReplaceExpired,  // rule 1: the row expired: claim afresh over it
  kWait,            // rule 4: another transaction is writing the row
  kMismatch,        // rule 2: IK001
  kReplay,          // rule 3
  kInProgress,      // rule 5: a live lease holds it
  kTakeOver,        // rule 6: abandoned or stale: attempt + 1
  kDuplicate,       // rule 7: this transaction already holds it
};

// Rules in the SPEC's order 7, 4, 1, 2, 3, 5, 6. `row` is null when none exists.
ClaimAction decide_claim(const StoredRow* row, std::optional<std::string_view> fingerprint,
                         Micros now);

enum class FinishAction {
  kApply,       // the caller holds the pending claim
  kWait,        // another transaction is writing the row (then IK005)
  kClaimLost,   // IK003
  kNotClaimed,  // IK004
};

// Whether the caller may complete, fail, release or checkpoint the row.
FinishAction decide_finish(const StoredRow* row, std::optional<std::int32_t> attempt, Micros now);

}  // namespace idempotency
