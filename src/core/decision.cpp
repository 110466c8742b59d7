#include "core/decision.hpp"

namespace idempotency {

const char* state_name(KeyState state) {
  switch (state) {
    case KeyState::kPending: return "pending";
    case KeyState::kCompleted: return "completed";
    case KeyState::kFailed: return "failed";
    case KeyState::kAbandoned: return "abandoned";
  }
  return "unknown";
}

bool parse_state(char stored, KeyState* state) {
  switch (stored) {
    case 'p':
    case 'c':
    case 'f':
    case 'a': *state = static_cast<KeyState>(stored); return true;
    default: return false;
  }
}

static bool lease_is_live(const StoredRow& row, Micros now) {
  return row.state == KeyState::kPending && row.lease_expires_at && *row.lease_expires_at > now;
}

bool is_live(const StoredRow& row, Micros now) {
  return row.expires_at > now || lease_is_live(row, now);
}

ClaimAction decide_claim(const StoredRow* row, std::optional<std::string_view> fingerprint,
                         Micros now) {
  if (row == nullptr) return ClaimAction::kInsert;
  if (row->state == KeyState::kPending && row->claimed_by_this_transaction)
    return ClaimAction::kDuplicate;
  if (row->written_by_other_in_progress) return ClaimAction::kWait;
  if (!is_live(*row, now)) return ClaimAction::kReplaceExpired;
  if (row->fingerprint && fingerprint && *row->fingerprint != *fingerprint)
    return ClaimAction::kMismatch;
  switch (row->state) {
    case KeyState::kCompleted:
    case KeyState::kFailed: return ClaimAction::kReplay;
    case KeyState::kPending:
      // A committed pending row without a lease cannot come from a claim (IK002
      // forbids it); should one be restored from elsewhere, it is stale.
      return lease_is_live(*row, now) ? ClaimAction::kInProgress : ClaimAction::kTakeOver;
    case KeyState::kAbandoned: return ClaimAction::kTakeOver;
  }
  return ClaimAction::kTakeOver;
}

FinishAction decide_finish(const StoredRow* row, std::optional<std::int32_t> attempt, Micros now) {
  if (row != nullptr && row->written_by_other_in_progress) return FinishAction::kWait;
  // The calling transaction's own claim stays its own even past a tiny ttl.
  if (row != nullptr && row->state == KeyState::kPending && row->claimed_by_this_transaction)
    return (!attempt || *attempt == row->attempt) ? FinishAction::kApply : FinishAction::kClaimLost;
  if (row == nullptr || !is_live(*row, now))
    return attempt ? FinishAction::kClaimLost : FinishAction::kNotClaimed;
  if (row->state != KeyState::kPending) return FinishAction::kClaimLost;
  // A committed lease claim: only the holder of the current attempt may finish it.
  return (attempt && *attempt == row->attempt) ? FinishAction::kApply : FinishAction::kClaimLost;
}

}  // namespace idempotency
