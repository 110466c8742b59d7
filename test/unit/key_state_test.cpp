// The claim rules are checked in their order (own claim, writer in progress, free,
// fingerprint mismatch, finished, live lease, takeover: the contract's 7, 4, 1, 2, 3,
// 5, 6; docs/reference.md): each test
// below shows its rule, then that it wins over every rule checked after it.
#include <gtest/gtest.h>

#include <optional>
#include <string_view>

#include "core/key_state.hpp"

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

// A version the calling transaction wrote (or its claim not yet written).
StoredRow written_here(StoredRow row) {
  row.written_by_this_transaction = true;
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

TEST(DecideClaim, Rule1NotForARowThisTransactionWrotePastItsWindow) {
  // The calling transaction is in progress: what it wrote is live until it ends, so
  // its window cannot pass inside it (never claimed twice, idem_once true once).
  EXPECT_EQ(claim(written_here(expired(committed(KeyState::kCompleted)))), ClaimAction::kReplay);
  EXPECT_EQ(claim(written_here(expired(committed(KeyState::kFailed)))), ClaimAction::kReplay);
  EXPECT_EQ(
      claim(written_here(expired(fingerprinted(committed(KeyState::kCompleted)))), kFingerprintB),
      ClaimAction::kMismatch);
  // Abandoned or stale (a lease claim it checkpointed, marked by its own idem_reap):
  // taken over, attempt + 1 and the checkpoint kept, not replaced as if absent.
  EXPECT_EQ(claim(written_here(expired(committed(KeyState::kAbandoned)))), ClaimAction::kTakeOver);
  EXPECT_EQ(claim(written_here(expired(with_lease(committed(KeyState::kPending), kNow - 1)))),
            ClaimAction::kTakeOver);
  // Its own pending claim stays rule 7.
  EXPECT_EQ(claim(own(written_here(expired(committed(KeyState::kPending))))),
            ClaimAction::kDuplicate);
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

TEST(DecideFinish, ARowThisTransactionFinishedStaysFinishedPastItsWindow) {
  // Claim lost ("already completed in this transaction"), not "not claimed".
  for (KeyState state : {KeyState::kCompleted, KeyState::kFailed}) {
    StoredRow row = written_here(expired(committed(state)));
    EXPECT_EQ(finish(row, std::nullopt), FinishAction::kClaimLost) << state_name(state);
    EXPECT_EQ(finish(row, 1), FinishAction::kClaimLost) << state_name(state);
  }
  EXPECT_EQ(finish(own(written_here(expired(committed(KeyState::kPending)))), std::nullopt),
            FinishAction::kApply);
}

// Liveness and states -------------------------------------------------------

TEST(IsLive, WhateverItsWindowWhileATransactionInProgressWroteIt) {
  for (KeyState state : kAllStates) {
    EXPECT_TRUE(is_live(written_here(expired(committed(state))), kNow)) << state_name(state);
    EXPECT_TRUE(is_live(being_written(expired(committed(state))), kNow)) << state_name(state);
    EXPECT_FALSE(is_reapable(written_here(expired(committed(state))), kNow)) << state_name(state);
  }
  // What idem_abandoned lists does not change when the window passes inside it.
  StoredRow stale = written_here(with_lease(committed(KeyState::kPending), kNow - 1));
  EXPECT_TRUE(is_abandoned(stale, kNow));
  EXPECT_TRUE(is_abandoned(expired(stale), kNow));
  // A claim's row is the claiming transaction's.
  EXPECT_TRUE(claim_fresh(ClaimTerms{}, kNow).written_by_this_transaction);
  EXPECT_TRUE(
      claim_take_over(committed(KeyState::kAbandoned), ClaimTerms{}).written_by_this_transaction);
}

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

// Transitions ----------------------------------------------------------------

constexpr Opaque kLease = 0x1000, kPoint = 0x2000, kData = 0x3000, kResponse = 0x4000;

ClaimTerms in_transaction(std::optional<Fingerprint> fingerprint = std::nullopt) {
  ClaimTerms terms;
  terms.fingerprint = fingerprint;
  terms.expires_at = kNow + 10 * kMinute;
  return terms;
}

ClaimTerms leased(Micros lease_end) {
  ClaimTerms terms = in_transaction();
  terms.lease = kLease;
  terms.lease_end = lease_end;
  return terms;
}

TEST(ClaimFresh, PendingFirstAttemptOwnedByTheCaller) {
  StoredRow row = claim_fresh(in_transaction(Fingerprint{"fp", 0x77}), kNow);
  EXPECT_EQ(row.state, KeyState::kPending);
  EXPECT_EQ(row.attempt, 1);
  EXPECT_EQ(row.first_claimed_at, kNow);
  EXPECT_EQ(row.expires_at, kNow + 10 * kMinute);
  EXPECT_EQ(row.fingerprint, std::optional<std::string_view>("fp"));
  EXPECT_EQ(row.fingerprint_value, 0x77u);
  EXPECT_FALSE(row.lease_expires_at);
  EXPECT_EQ(row.lease, 0u);
  EXPECT_TRUE(row.claimed_by_this_transaction);
  EXPECT_TRUE(is_own_open_claim(row));
}

TEST(ClaimFresh, ALeaseLongerThanTheWindowStretchesIt) {
  StoredRow row = claim_fresh(leased(kNow + 20 * kMinute), kNow);
  EXPECT_EQ(row.lease, kLease);
  EXPECT_EQ(row.lease_expires_at, std::optional<Micros>(kNow + 20 * kMinute));
  EXPECT_EQ(row.expires_at, kNow + 20 * kMinute);
  EXPECT_FALSE(is_own_open_claim(row));  // a lease claim may commit pending
  StoredRow shorter = claim_fresh(leased(kNow + kMinute), kNow);
  EXPECT_EQ(shorter.expires_at, kNow + 10 * kMinute);
}

TEST(ClaimTakeOver, NextAttemptKeepsCheckpointAndFingerprint) {
  StoredRow stored = fingerprinted(committed(KeyState::kAbandoned));
  stored.attempt = 3;
  stored.checkpoint = kPoint;
  stored.checkpoint_data = kData;
  stored.lease = kLease;
  StoredRow row = claim_take_over(stored, in_transaction(Fingerprint{"other", 0x99}));
  EXPECT_EQ(row.state, KeyState::kPending);
  EXPECT_EQ(row.attempt, 4);
  EXPECT_EQ(row.checkpoint, kPoint);
  EXPECT_EQ(row.checkpoint_data, kData);
  EXPECT_EQ(row.fingerprint, kFingerprintA);  // the stored one stays
  EXPECT_EQ(row.lease, 0u);                   // now held in-transaction
  EXPECT_FALSE(row.lease_expires_at);
}

TEST(ClaimTakeOver, AGivenFingerprintIsStoredWhenNoneWas) {
  StoredRow row = claim_take_over(committed(KeyState::kAbandoned), leased(kNow + kMinute * 2));
  EXPECT_FALSE(row.fingerprint);
  row = claim_take_over(committed(KeyState::kAbandoned), in_transaction(Fingerprint{"fp", 5}));
  EXPECT_EQ(row.fingerprint, std::optional<std::string_view>("fp"));
  EXPECT_EQ(row.fingerprint_value, 5u);
}

TEST(Finish, CompleteAndFailStoreTheResponseAndDropTheLease) {
  StoredRow claim = claim_fresh(leased(kNow + kMinute), kNow);
  StoredRow done = complete(claim, kResponse);
  EXPECT_EQ(done.state, KeyState::kCompleted);
  EXPECT_EQ(done.response, kResponse);
  EXPECT_EQ(done.lease, 0u);
  EXPECT_FALSE(done.lease_expires_at);
  EXPECT_EQ(done.attempt, claim.attempt);
  StoredRow failed = fail(claim, 0);
  EXPECT_EQ(failed.state, KeyState::kFailed);
  EXPECT_EQ(failed.response, 0u);
}

TEST(Finish, CheckpointRenewsOnlyALeaseAndStretchesTheWindow) {
  StoredRow lease_claim = claim_fresh(leased(kNow + kMinute), kNow);
  StoredRow renewed = checkpoint(lease_claim, kPoint, kData, kNow + 30 * kMinute);
  EXPECT_EQ(renewed.checkpoint, kPoint);
  EXPECT_EQ(renewed.checkpoint_data, kData);
  EXPECT_EQ(renewed.lease_expires_at, std::optional<Micros>(kNow + 30 * kMinute));
  EXPECT_EQ(renewed.expires_at, kNow + 30 * kMinute);
  StoredRow plain = checkpoint(claim_fresh(in_transaction(), kNow), kPoint, 0, kNow + kMinute);
  EXPECT_FALSE(plain.lease_expires_at);
  EXPECT_EQ(plain.expires_at, kNow + 10 * kMinute);
}

TEST(Reaper, ReapsWhatIsNotLiveAndAbandonsStaleLeases) {
  EXPECT_FALSE(is_reapable(committed(KeyState::kCompleted), kNow));
  EXPECT_TRUE(is_reapable(expired(committed(KeyState::kCompleted)), kNow));
  // Past its window but with a live lease: kept.
  EXPECT_FALSE(
      is_reapable(with_lease(expired(committed(KeyState::kPending)), kNow + kMinute), kNow));
  StoredRow stale = with_lease(committed(KeyState::kPending), kNow - kMinute);
  stale.lease = kLease;
  EXPECT_TRUE(is_stale(stale, kNow));
  EXPECT_TRUE(is_abandoned(stale, kNow));
  EXPECT_FALSE(is_stale(with_lease(committed(KeyState::kPending), kNow + kMinute), kNow));
  EXPECT_FALSE(is_stale(with_lease(committed(KeyState::kCompleted), kNow - kMinute), kNow));
  StoredRow abandoned = abandon(stale);
  EXPECT_EQ(abandoned.state, KeyState::kAbandoned);
  EXPECT_FALSE(abandoned.lease_expires_at);
  EXPECT_EQ(abandoned.lease, kLease);  // still found by idem_abandoned's index
  EXPECT_TRUE(is_abandoned(abandoned, kNow));
  EXPECT_FALSE(is_abandoned(expired(abandoned), kNow));
  EXPECT_EQ(decide_claim(&abandoned, kNoFingerprint, kNow), ClaimAction::kTakeOver);
}

}  // namespace
}  // namespace idempotency
