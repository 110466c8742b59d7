#include "core/key_state.hpp"

#include <algorithm>

namespace idempotency {

const char* state_name(KeyState state) noexcept {
  switch (state) {
    case KeyState::kPending: return "pending";
    case KeyState::kCompleted: return "completed";
    case KeyState::kFailed: return "failed";
    case KeyState::kAbandoned: return "abandoned";
  }
  return "unknown";
}

bool parse_state(char stored, KeyState* state) noexcept {
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

bool is_live(const StoredRow& row, Micros now) noexcept {
  return row.written_by_this_transaction || row.written_by_other_in_progress ||
         row.expires_at > now || lease_is_live(row, now);
}

bool is_own_open_claim(const StoredRow& row) noexcept {
  return row.state == KeyState::kPending && row.claimed_by_this_transaction &&
         !row.lease_expires_at;
}

bool is_abandoned(const StoredRow& row, Micros now) noexcept {
  if (!is_live(row, now)) return false;
  return row.state == KeyState::kAbandoned || is_stale(row, now);
}

ClaimAction decide_claim(const StoredRow* row, std::optional<std::string_view> fingerprint,
                         Micros now) noexcept {
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

// Pending and held by the claim's terms: with a lease from now, or in-transaction.
static StoredRow held_by(StoredRow row, const ClaimTerms& terms) {
  row.state = KeyState::kPending;
  row.response = 0;
  row.written_by_other_in_progress = false;
  row.written_by_this_transaction = true;
  row.lease = terms.lease;
  row.lease_expires_at.reset();
  if (terms.lease != 0 && terms.lease_end) {
    row.lease_expires_at = terms.lease_end;
    row.expires_at = std::max(row.expires_at, *terms.lease_end);  // the window covers it
  }
  return row;
}

StoredRow claim_fresh(const ClaimTerms& terms, Micros now) noexcept {
  StoredRow row;
  row.attempt = 1;
  row.first_claimed_at = now;
  row.expires_at = terms.expires_at;
  if (terms.fingerprint) {
    row.fingerprint = terms.fingerprint->bytes;
    row.fingerprint_value = terms.fingerprint->value;
  }
  row = held_by(row, terms);
  row.claimed_by_this_transaction = true;
  return row;
}

StoredRow claim_take_over(const StoredRow& stored, const ClaimTerms& terms) noexcept {
  StoredRow row = stored;
  row.attempt = stored.attempt + 1;
  if (!row.fingerprint && terms.fingerprint) {
    row.fingerprint = terms.fingerprint->bytes;
    row.fingerprint_value = terms.fingerprint->value;
  }
  row = held_by(row, terms);
  row.claimed_by_this_transaction = true;
  return row;
}

FinishAction decide_finish(const StoredRow* row, std::optional<std::int32_t> attempt,
                           Micros now) noexcept {
  if (row != nullptr && row->written_by_other_in_progress) return FinishAction::kWait;
  // The calling transaction's own claim: finished without its attempt too.
  if (row != nullptr && row->state == KeyState::kPending && row->claimed_by_this_transaction)
    return (!attempt || *attempt == row->attempt) ? FinishAction::kApply : FinishAction::kClaimLost;
  if (row == nullptr || !is_live(*row, now))
    return attempt ? FinishAction::kClaimLost : FinishAction::kNotClaimed;
  if (row->state != KeyState::kPending) return FinishAction::kClaimLost;
  // A committed lease claim: only the holder of the current attempt may finish it.
  return (attempt && *attempt == row->attempt) ? FinishAction::kApply : FinishAction::kClaimLost;
}

static StoredRow finished(const StoredRow& claim, KeyState state, Opaque response) {
  StoredRow row = claim;
  row.state = state;
  row.response = response;
  row.lease = 0;
  row.lease_expires_at.reset();
  return row;
}

StoredRow complete(const StoredRow& claim, Opaque response) noexcept {
  return finished(claim, KeyState::kCompleted, response);
}

StoredRow fail(const StoredRow& claim, Opaque error) noexcept {
  return finished(claim, KeyState::kFailed, error);
}

StoredRow checkpoint(const StoredRow& claim, Opaque point, Opaque data,
                     std::optional<Micros> renewed_lease_end) noexcept {
  StoredRow row = claim;
  row.checkpoint = point;
  row.checkpoint_data = data;
  if (row.lease != 0 && renewed_lease_end) {
    row.lease_expires_at = renewed_lease_end;
    row.expires_at = std::max(row.expires_at, *renewed_lease_end);
  }
  return row;
}

bool is_reapable(const StoredRow& row, Micros now) noexcept { return !is_live(row, now); }

bool is_stale(const StoredRow& row, Micros now) noexcept {
  return row.state == KeyState::kPending && row.lease_expires_at && *row.lease_expires_at <= now;
}

StoredRow abandon(const StoredRow& stale) noexcept {
  StoredRow row = stale;
  row.state = KeyState::kAbandoned;
  row.lease_expires_at.reset();  // keeps `lease`: idem_abandoned finds it by that
  return row;
}

}  // namespace idempotency
