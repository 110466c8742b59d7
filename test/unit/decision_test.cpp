// The claim rules are checked in the SPEC's order 7, 4, 1, 2, 3, 5, 6: each test
// below shows its rule, then that it wins over every rule checked after it.
#include <gtest/gtest.h>

#include <optional>
#include <string_view>

#include "core/decision.hpp"

namespace idempotency {
namespace {

constexpr Micros kNow = 800'000'000'000'000;  // some day in 2025
constexpr Micros kMinute = 60'000'000;

constexpr KeyState kAllStates[] = {KeyState::kPending, KeyState::kCompleted, KeyState::kFailed,
                                   KeyState::kAbandoned};

const std::optional<std::string_view> kNoFingerprint;
const std::optional<std::string_view> kFingerprintA = std::string_view("fingerprint-a");
const std::optional<std::string_view> kFingerprintB = std::string_view("fingerprint-b");

// A committed, live row of another transaction.
StoredRow committed(KeyState state) {
  StoredRow row;
  row.state = state;
  row.attempt = 1;
  row.expires_at = kNow + kMinute;
  return row;
}

StoredRow with_lease(StoredRow row, Micros lease_expires_at) {
  row.lease_expires_at = lease_expires_at;
  return row;
}

StoredRow expired(StoredRow row) {
  row.expires_at = kNow - kMinute;
  return row;
}

StoredRow fingerprinted(StoredRow row) {
  row.fingerprint = kFingerprintA;
  return row;
}

StoredRow own(StoredRow row) {
  row.claimed_by_this_transaction = true;
  return row;
}

StoredRow being_written(StoredRow row) {
  row.written_by_other_in_progress = true;
  return row;
}

ClaimAction claim(const StoredRow& row,
                  std::optional<std::string_view> fingerprint = kNoFingerprint) {
  return decide_claim(&row, fingerprint, kNow);
}

// Rule 7 ------------------------------------------------------------------

TEST(DecideClaim, Rule7PendingClaimOfThisTransactionIsDuplicate) {
  StoredRow row = own(committed(KeyState::kPending));
  EXPECT_EQ(claim(row), ClaimAction::kDuplicate);
  EXPECT_EQ(claim(with_lease(row, kNow + kMinute)), ClaimAction::kDuplicate);
}

TEST(DecideClaim, Rule7WinsOverEveryLaterRule) {
  StoredRow row = own(committed(KeyState::kPending));
  EXPECT_EQ(claim(being_written(row)), ClaimAction::kDuplicate);                 // 4
  EXPECT_EQ(claim(expired(row)), ClaimAction::kDuplicate);                       // 1
  EXPECT_EQ(claim(fingerprinted(row), kFingerprintB), ClaimAction::kDuplicate);  // 2
  EXPECT_EQ(claim(with_lease(row, kNow + kMinute)), ClaimAction::kDuplicate);    // 5
  EXPECT_EQ(claim(with_lease(row, kNow - kMinute)), ClaimAction::kDuplicate);    // 6
}

TEST(DecideClaim, Rule7OnlyForPendingRows) {
  // Finished in this same transaction: a replay, as for anyone else.
  EXPECT_EQ(claim(own(committed(KeyState::kCompleted))), ClaimAction::kReplay);
  EXPECT_EQ(claim(own(committed(KeyState::kFailed))), ClaimAction::kReplay);
  EXPECT_EQ(claim(own(committed(KeyState::kAbandoned))), ClaimAction::kTakeOver);
}

// Rule 4 ------------------------------------------------------------------

TEST(DecideClaim, Rule4AnotherTransactionWritingTheRowIsWaitedFor) {
  for (KeyState state : kAllStates)
    EXPECT_EQ(claim(being_written(committed(state))), ClaimAction::kWait) << state_name(state);
}

TEST(DecideClaim, Rule4WinsOverEveryLaterRule) {
  // A row written by a transaction in progress is live whatever its expires_at.
  EXPECT_EQ(claim(being_written(expired(committed(KeyState::kCompleted)))), ClaimAction::kWait);
  EXPECT_EQ(claim(being_written(fingerprinted(committed(KeyState::kCompleted))), kFingerprintB),
            ClaimAction::kWait);
  EXPECT_EQ(claim(being_written(committed(KeyState::kCompleted))), ClaimAction::kWait);
  EXPECT_EQ(claim(being_written(with_lease(committed(KeyState::kPending), kNow + kMinute))),
            ClaimAction::kWait);
  EXPECT_EQ(claim(being_written(committed(KeyState::kAbandoned))), ClaimAction::kWait);
}

// Rule 1 ------------------------------------------------------------------

TEST(DecideClaim, Rule1NoRowIsInserted) {
  EXPECT_EQ(decide_claim(nullptr, kNoFingerprint, kNow), ClaimAction::kInsert);
  EXPECT_EQ(decide_claim(nullptr, kFingerprintA, kNow), ClaimAction::kInsert);
}

TEST(DecideClaim, Rule1ExpiredRowIsReplacedWhateverItsState) {
  for (KeyState state : kAllStates)
    EXPECT_EQ(claim(expired(committed(state))), ClaimAction::kReplaceExpired) << state_name(state);
  EXPECT_EQ(claim(expired(with_lease(committed(KeyState::kPending), kNow - 1))),
            ClaimAction::kReplaceExpired);
}

TEST(DecideClaim, Rule1WinsOverEveryLaterRule) {
  // An expired row's fingerprint is not checked (2), nor replayed (3), nor taken over (6).
  EXPECT_EQ(claim(expired(fingerprinted(committed(KeyState::kCompleted))), kFingerprintB),
            ClaimAction::kReplaceExpired);
  EXPECT_EQ(claim(expired(committed(KeyState::kFailed))), ClaimAction::kReplaceExpired);
  EXPECT_EQ(claim(expired(committed(KeyState::kAbandoned))), ClaimAction::kReplaceExpired);
}

TEST(DecideClaim, Rule1ExpiryBoundary) {
  StoredRow row = committed(KeyState::kCompleted);
  row.expires_at = kNow + 1;
  EXPECT_EQ(claim(row), ClaimAction::kReplay);
  row.expires_at = kNow - 1;
  EXPECT_EQ(claim(row), ClaimAction::kReplaceExpired);
}

TEST(DecideClaim, Rule1LiveLeaseKeepsAnExpiredRowLive) {
  StoredRow row = expired(with_lease(committed(KeyState::kPending), kNow + kMinute));
  EXPECT_EQ(claim(row), ClaimAction::kInProgress);
  // Only a pending row's lease counts.
  row.state = KeyState::kCompleted;
  EXPECT_EQ(claim(row), ClaimAction::kReplaceExpired);
}

// Rule 2 ------------------------------------------------------------------

TEST(DecideClaim, Rule2DifferentFingerprintIsAMismatchWhateverTheState) {
  for (KeyState state : kAllStates) {
    StoredRow row = fingerprinted(committed(state));
    EXPECT_EQ(claim(row, kFingerprintB), ClaimAction::kMismatch) << state_name(state);
  }
}

TEST(DecideClaim, Rule2NeedsTwoFingerprintsThatDiffer) {
  StoredRow row = fingerprinted(committed(KeyState::kCompleted));
  EXPECT_EQ(claim(row, kFingerprintA), ClaimAction::kReplay);
  EXPECT_EQ(claim(row, kNoFingerprint), ClaimAction::kReplay);
  EXPECT_EQ(claim(committed(KeyState::kCompleted), kFingerprintB), ClaimAction::kReplay);
  // Compared as bytes, a prefix is different.
  EXPECT_EQ(claim(row, std::string_view("fingerprint-")), ClaimAction::kMismatch);
}

TEST(DecideClaim, Rule2WinsOverEveryLaterRule) {
  EXPECT_EQ(claim(fingerprinted(committed(KeyState::kFailed)), kFingerprintB),
            ClaimAction::kMismatch);  // 3
  EXPECT_EQ(claim(fingerprinted(with_lease(committed(KeyState::kPending), kNow + kMinute)),
                  kFingerprintB),
            ClaimAction::kMismatch);  // 5
  EXPECT_EQ(claim(fingerprinted(with_lease(committed(KeyState::kPending), kNow - kMinute)),
                  kFingerprintB),
            ClaimAction::kMismatch);  // 6
}

// Rule 3 ------------------------------------------------------------------

TEST(DecideClaim, Rule3FinishedKeysReplay) {
  EXPECT_EQ(claim(committed(KeyState::kCompleted)), ClaimAction::kReplay);
  EXPECT_EQ(claim(committed(KeyState::kFailed)), ClaimAction::kReplay);
  EXPECT_EQ(claim(fingerprinted(committed(KeyState::kCompleted)), kFingerprintA),
            ClaimAction::kReplay);
}

TEST(DecideClaim, Rule3WinsOverALeaseLeftOnAFinishedRow) {
  EXPECT_EQ(claim(with_lease(committed(KeyState::kCompleted), kNow + kMinute)),
            ClaimAction::kReplay);
  EXPECT_EQ(claim(with_lease(committed(KeyState::kFailed), kNow - kMinute)), ClaimAction::kReplay);
}

// Rule 5 ------------------------------------------------------------------

TEST(DecideClaim, Rule5LiveLeaseIsInProgress) {
  EXPECT_EQ(claim(with_lease(committed(KeyState::kPending), kNow + kMinute)),
            ClaimAction::kInProgress);
  EXPECT_EQ(claim(with_lease(committed(KeyState::kPending), kNow + 1)), ClaimAction::kInProgress);
  EXPECT_EQ(
      claim(fingerprinted(with_lease(committed(KeyState::kPending), kNow + 1)), kFingerprintA),
      ClaimAction::kInProgress);
}

TEST(DecideClaim, Rule5OnlyForPendingRows) {
  // An abandoned row is taken over even if a lease time is left on it.
  EXPECT_EQ(claim(with_lease(committed(KeyState::kAbandoned), kNow + kMinute)),
            ClaimAction::kTakeOver);
  EXPECT_EQ(claim(with_lease(committed(KeyState::kPending), kNow + kMinute)),
            ClaimAction::kInProgress);
}

// Rule 6 ------------------------------------------------------------------

TEST(DecideClaim, Rule6AbandonedOrStaleIsTakenOver) {
  EXPECT_EQ(claim(committed(KeyState::kAbandoned)), ClaimAction::kTakeOver);
  EXPECT_EQ(claim(with_lease(committed(KeyState::kPending), kNow - 1)), ClaimAction::kTakeOver);
  EXPECT_EQ(claim(with_lease(committed(KeyState::kPending), kNow)), ClaimAction::kTakeOver);
  // A committed pending row without a lease cannot come from a claim; it is stale.
  EXPECT_EQ(claim(committed(KeyState::kPending)), ClaimAction::kTakeOver);
  // The fingerprint matches or one side has none.
  EXPECT_EQ(claim(fingerprinted(committed(KeyState::kAbandoned)), kFingerprintA),
            ClaimAction::kTakeOver);
  EXPECT_EQ(claim(committed(KeyState::kAbandoned), kFingerprintB), ClaimAction::kTakeOver);
}

// Finishing ---------------------------------------------------------------

FinishAction finish(const StoredRow& row, std::optional<std::int32_t> attempt) {
  return decide_finish(&row, attempt, kNow);
}

TEST(DecideFinish, ApplyToTheCallersOwnClaimWithOrWithoutItsAttempt) {
  StoredRow row = own(committed(KeyState::kPending));
  EXPECT_EQ(finish(row, std::nullopt), FinishAction::kApply);
  EXPECT_EQ(finish(row, 1), FinishAction::kApply);
  // A lease claim made in this transaction, and one past a tiny ttl.
  EXPECT_EQ(finish(with_lease(row, kNow + kMinute), std::nullopt), FinishAction::kApply);
  EXPECT_EQ(finish(expired(row), std::nullopt), FinishAction::kApply);
}

TEST(DecideFinish, ApplyToACommittedLeaseClaimWithItsCurrentAttempt) {
  StoredRow row = with_lease(committed(KeyState::kPending), kNow + kMinute);
  row.attempt = 3;
  EXPECT_EQ(finish(row, 3), FinishAction::kApply);
  // Its lease ran out, but nobody took it over or marked it abandoned yet.
  EXPECT_EQ(finish(with_lease(row, kNow - kMinute), 3), FinishAction::kApply);
}

TEST(DecideFinish, WaitForAnotherTransactionWritingTheRow) {
  for (KeyState state : kAllStates) {
    StoredRow row = being_written(committed(state));
    EXPECT_EQ(finish(row, std::nullopt), FinishAction::kWait) << state_name(state);
    EXPECT_EQ(finish(row, 1), FinishAction::kWait) << state_name(state);
    EXPECT_EQ(finish(expired(row), 1), FinishAction::kWait) << state_name(state);
  }
}

TEST(DecideFinish, ClaimLostForAWrongOrMissingAttempt) {
  EXPECT_EQ(finish(own(committed(KeyState::kPending)), 2), FinishAction::kClaimLost);
  StoredRow lease = with_lease(committed(KeyState::kPending), kNow + kMinute);
  lease.attempt = 2;
  EXPECT_EQ(finish(lease, std::nullopt), FinishAction::kClaimLost);
  EXPECT_EQ(finish(lease, 1), FinishAction::kClaimLost);
  EXPECT_EQ(finish(lease, 3), FinishAction::kClaimLost);
}

TEST(DecideFinish, ClaimLostWhenTheKeyIsNotPending) {
  for (KeyState state : {KeyState::kCompleted, KeyState::kFailed, KeyState::kAbandoned}) {
    EXPECT_EQ(finish(committed(state), std::nullopt), FinishAction::kClaimLost)
        << state_name(state);
    EXPECT_EQ(finish(committed(state), 1), FinishAction::kClaimLost) << state_name(state);
    EXPECT_EQ(finish(own(committed(state)), std::nullopt), FinishAction::kClaimLost)
        << state_name(state);
  }
}

TEST(DecideFinish, ClaimLostWhenAnAttemptIsGivenForAKeyGoneOrExpired) {
  EXPECT_EQ(decide_finish(nullptr, 1, kNow), FinishAction::kClaimLost);
  EXPECT_EQ(finish(expired(committed(KeyState::kCompleted)), 1), FinishAction::kClaimLost);
  EXPECT_EQ(finish(expired(with_lease(committed(KeyState::kPending), kNow - 1)), 1),
            FinishAction::kClaimLost);
}

TEST(DecideFinish, NotClaimedWithoutAnAttemptForAKeyGoneOrExpired) {
  EXPECT_EQ(decide_finish(nullptr, std::nullopt, kNow), FinishAction::kNotClaimed);
  for (KeyState state : kAllStates)
    EXPECT_EQ(finish(expired(committed(state)), std::nullopt), FinishAction::kNotClaimed)
        << state_name(state);
}

// Liveness and states -------------------------------------------------------

TEST(IsLive, UntilExpiryOrWhileAPendingLeaseHolds) {
  EXPECT_TRUE(is_live(committed(KeyState::kCompleted), kNow));
  EXPECT_FALSE(is_live(expired(committed(KeyState::kCompleted)), kNow));
  EXPECT_TRUE(is_live(expired(with_lease(committed(KeyState::kPending), kNow + 1)), kNow));
  EXPECT_FALSE(is_live(expired(with_lease(committed(KeyState::kPending), kNow - 1)), kNow));
  EXPECT_FALSE(is_live(expired(with_lease(committed(KeyState::kAbandoned), kNow + 1)), kNow));
}

TEST(KeyStates, NamesAndStoredCharacters) {
  const struct {
    char stored;
    KeyState state;
    const char* name;
  } cases[] = {{'p', KeyState::kPending, "pending"},
               {'c', KeyState::kCompleted, "completed"},
               {'f', KeyState::kFailed, "failed"},
               {'a', KeyState::kAbandoned, "abandoned"}};
  for (const auto& c : cases) {
    KeyState state = KeyState::kPending;
    ASSERT_TRUE(parse_state(c.stored, &state)) << c.stored;
    EXPECT_EQ(state, c.state);
    EXPECT_STREQ(state_name(state), c.name);
  }
  KeyState untouched = KeyState::kFailed;
  for (char stored : {'x', 'P', '\0', 'e'}) {
    EXPECT_FALSE(parse_state(stored, &untouched)) << stored;
    EXPECT_EQ(untouched, KeyState::kFailed);
  }
}

}  // namespace
}  // namespace idempotency
