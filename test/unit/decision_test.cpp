#include <gtest/gtest.h>

#include "core/decision.hpp"

using namespace idempotency;

namespace {

constexpr Micros kNow = 1'000'000'000;
constexpr Micros kLater = kNow + 60'000'000;
constexpr Micros kEarlier = kNow - 60'000'000;

StoredRow row(KeyState state) {
  StoredRow r;
  r.state = state;
  r.attempt = 1;
  r.expires_at = kLater;
  return r;
}

}  // namespace

TEST(DecideClaim, Rule1AbsentOrExpiredIsClaimed) {
  EXPECT_EQ(decide_claim(nullptr, std::nullopt, kNow), ClaimAction::kInsert);
  StoredRow expired = row(KeyState::kCompleted);
  expired.expires_at = kEarlier;
  expired.fingerprint = "old";
  // An expired row's fingerprint is not checked.
  EXPECT_EQ(decide_claim(&expired, std::string_view("new"), kNow), ClaimAction::kReplaceExpired);
}

TEST(DecideClaim, Rule2MismatchWhateverTheState) {
  for (KeyState state :
       {KeyState::kPending, KeyState::kCompleted, KeyState::kFailed, KeyState::kAbandoned}) {
    StoredRow r = row(state);
    r.fingerprint = "a";
    EXPECT_EQ(decide_claim(&r, std::string_view("b"), kNow), ClaimAction::kMismatch);
    EXPECT_NE(decide_claim(&r, std::string_view("a"), kNow), ClaimAction::kMismatch);
    EXPECT_NE(decide_claim(&r, std::nullopt, kNow), ClaimAction::kMismatch);
  }
  StoredRow unfingerprinted = row(KeyState::kCompleted);
  EXPECT_EQ(decide_claim(&unfingerprinted, std::string_view("b"), kNow), ClaimAction::kReplay);
}

TEST(DecideClaim, Rule3FinishedKeysReplay) {
  StoredRow completed = row(KeyState::kCompleted);
  StoredRow failed = row(KeyState::kFailed);
  EXPECT_EQ(decide_claim(&completed, std::nullopt, kNow), ClaimAction::kReplay);
  EXPECT_EQ(decide_claim(&failed, std::nullopt, kNow), ClaimAction::kReplay);
}

TEST(DecideClaim, Rule4WaitsForAnotherWriterBeforeAnythingButRule7) {
  StoredRow r = row(KeyState::kCompleted);
  r.written_by_other_in_progress = true;
  r.fingerprint = "a";
  EXPECT_EQ(decide_claim(&r, std::string_view("b"), kNow), ClaimAction::kWait);
  r.expires_at = kEarlier;
  EXPECT_EQ(decide_claim(&r, std::nullopt, kNow), ClaimAction::kWait);
}

TEST(DecideClaim, Rule5LiveLeaseIsInProgress) {
  StoredRow r = row(KeyState::kPending);
  r.lease_expires_at = kLater;
  EXPECT_EQ(decide_claim(&r, std::nullopt, kNow), ClaimAction::kInProgress);
  // A live lease keeps the row live past expires_at.
  r.expires_at = kEarlier;
  EXPECT_EQ(decide_claim(&r, std::nullopt, kNow), ClaimAction::kInProgress);
}

TEST(DecideClaim, Rule6AbandonedOrStaleIsTakenOver) {
  StoredRow abandoned = row(KeyState::kAbandoned);
  StoredRow stale = row(KeyState::kPending);
  stale.lease_expires_at = kEarlier;
  EXPECT_EQ(decide_claim(&abandoned, std::nullopt, kNow), ClaimAction::kTakeOver);
  EXPECT_EQ(decide_claim(&stale, std::nullopt, kNow), ClaimAction::kTakeOver);
}

TEST(DecideClaim, Rule7SameTransactionIsDuplicateFirst) {
  StoredRow r = row(KeyState::kPending);
  r.written_by_this_transaction = true;
  r.fingerprint = "a";
  EXPECT_EQ(decide_claim(&r, std::string_view("b"), kNow), ClaimAction::kDuplicate);
  // Completed in this transaction: a replay, not a duplicate.
  StoredRow done = row(KeyState::kCompleted);
  done.written_by_this_transaction = true;
  EXPECT_EQ(decide_claim(&done, std::nullopt, kNow), ClaimAction::kReplay);
}

TEST(DecideFinish, OwnClaimAppliesWithOrWithoutItsAttempt) {
  StoredRow r = row(KeyState::kPending);
  r.written_by_this_transaction = true;
  EXPECT_EQ(decide_finish(&r, std::nullopt, kNow), FinishAction::kApply);
  EXPECT_EQ(decide_finish(&r, 1, kNow), FinishAction::kApply);
  EXPECT_EQ(decide_finish(&r, 2, kNow), FinishAction::kClaimLost);
}

TEST(DecideFinish, CommittedLeaseNeedsTheCurrentAttempt) {
  StoredRow r = row(KeyState::kPending);
  r.attempt = 2;
  r.lease_expires_at = kLater;
  EXPECT_EQ(decide_finish(&r, std::nullopt, kNow), FinishAction::kClaimLost);
  EXPECT_EQ(decide_finish(&r, 1, kNow), FinishAction::kClaimLost);
  EXPECT_EQ(decide_finish(&r, 2, kNow), FinishAction::kApply);
  // Its lease ran out but nobody took it over: the holder may still finish.
  r.lease_expires_at = kEarlier;
  EXPECT_EQ(decide_finish(&r, 2, kNow), FinishAction::kApply);
}

TEST(DecideFinish, NotPendingIsClaimLost) {
  for (KeyState state : {KeyState::kCompleted, KeyState::kFailed, KeyState::kAbandoned}) {
    StoredRow r = row(state);
    EXPECT_EQ(decide_finish(&r, std::nullopt, kNow), FinishAction::kClaimLost);
    EXPECT_EQ(decide_finish(&r, 1, kNow), FinishAction::kClaimLost);
  }
}

TEST(DecideFinish, AbsentIsNotClaimedUnlessAnAttemptWasGiven) {
  EXPECT_EQ(decide_finish(nullptr, std::nullopt, kNow), FinishAction::kNotClaimed);
  EXPECT_EQ(decide_finish(nullptr, 1, kNow), FinishAction::kClaimLost);
  StoredRow expired = row(KeyState::kCompleted);
  expired.expires_at = kEarlier;
  EXPECT_EQ(decide_finish(&expired, std::nullopt, kNow), FinishAction::kNotClaimed);
  EXPECT_EQ(decide_finish(&expired, 1, kNow), FinishAction::kClaimLost);
}

TEST(DecideFinish, AnotherWriterIsWaitedFor) {
  StoredRow r = row(KeyState::kPending);
  r.written_by_other_in_progress = true;
  EXPECT_EQ(decide_finish(&r, std::nullopt, kNow), FinishAction::kWait);
}

TEST(States, NamesAndStoredCharacters) {
  KeyState state;
  ASSERT_TRUE(parse_state('a', &state));
  EXPECT_STREQ(state_name(state), "abandoned");
  EXPECT_FALSE(parse_state('x', &state));
}
