// Messaging's rules (src/core/outbox.hpp): an event's states and what a relay may do
// with it, the per-aggregate gate of a relay batch, seq numbering and apply-by-version.
#include <gtest/gtest.h>

#include <optional>
#include <vector>

#include "core/outbox.hpp"

namespace idempotency {
namespace {

constexpr Micros kNow = 800'000'000'000'000;
constexpr Micros kSecond = 1'000'000;

OutboxEvent pending() { return OutboxEvent{}; }

OutboxEvent leased(Micros lease_end, bool to_caller) {
  OutboxEvent event = lease(pending(), lease_end);
  event.leased_to_caller = to_caller;
  return event;
}

TEST(EventState, ParsesOnlyTheStoredLetters) {
  EventState state;
  EXPECT_TRUE(parse_event_state('p', &state));
  EXPECT_EQ(state, EventState::kPending);
  EXPECT_TRUE(parse_event_state('d', &state));
  EXPECT_EQ(state, EventState::kDelivered);
  EXPECT_TRUE(parse_event_state('x', &state));
  EXPECT_EQ(state, EventState::kDead);
  EXPECT_FALSE(parse_event_state('c', &state));
}

TEST(Ready, PendingWithoutLiveLease) {
  EXPECT_TRUE(is_ready(pending(), kNow));
  EXPECT_FALSE(is_ready(leased(kNow + kSecond, false), kNow));
  EXPECT_TRUE(is_ready(leased(kNow, false), kNow));  // ran out exactly now
  EXPECT_TRUE(is_ready(leased(kNow - kSecond, true), kNow));
  EXPECT_FALSE(is_ready(deliver(leased(kNow + kSecond, true), kNow), kNow));
  EXPECT_FALSE(is_ready(bury(leased(kNow + kSecond, true)), kNow));
}

TEST(Lease, CountsAttemptsAndSetsTheEnd) {
  OutboxEvent first = lease(pending(), kNow + kSecond);
  EXPECT_EQ(first.attempt, 1);
  EXPECT_EQ(first.lease_expires_at, kNow + kSecond);
  EXPECT_TRUE(first.leased_to_caller);
  OutboxEvent second = lease(first, kNow + 2 * kSecond);  // after the first ran out
  EXPECT_EQ(second.attempt, 2);
  EXPECT_EQ(second.state, EventState::kPending);
}

TEST(Settle, OnlyTheRelayThatHoldsTheEventAcks) {
  EXPECT_TRUE(may_settle(leased(kNow + kSecond, true)));
  EXPECT_FALSE(may_settle(leased(kNow + kSecond, false)));      // another relay's lease
  EXPECT_TRUE(may_settle(leased(kNow - kSecond, true)));        // ran out, nobody took it
  EXPECT_FALSE(may_settle(pending()));                          // never handed out
  EXPECT_FALSE(may_settle(deliver(leased(kNow, true), kNow)));  // a second ack
  EXPECT_FALSE(may_settle(bury(leased(kNow, true))));
}

TEST(Settle, DeliverAndBury) {
  OutboxEvent delivered = deliver(leased(kNow + kSecond, true), kNow);
  EXPECT_EQ(delivered.state, EventState::kDelivered);
  EXPECT_EQ(delivered.delivered_at, kNow);
  EXPECT_FALSE(delivered.lease_expires_at);
  OutboxEvent dead = bury(leased(kNow + kSecond, true));
  EXPECT_EQ(dead.state, EventState::kDead);
  EXPECT_EQ(dead.attempt, 1);
}

TEST(Requeue, OnlyDeadLettersKeepingTheirAttempts) {
  OutboxEvent dead = bury(leased(kNow + kSecond, true));
  EXPECT_TRUE(may_requeue(dead));
  EXPECT_FALSE(may_requeue(pending()));
  EXPECT_FALSE(may_requeue(deliver(leased(kNow, true), kNow)));
  OutboxEvent again = requeue(dead);
  EXPECT_EQ(again.state, EventState::kPending);
  EXPECT_EQ(again.attempt, 1);
  EXPECT_TRUE(is_ready(again, kNow));
}

TEST(Removal, OnlyDeliveredEventsPastTheRetention) {
  OutboxEvent delivered = deliver(leased(kNow, true), kNow - 10 * kSecond);
  EXPECT_TRUE(is_removable(delivered, kNow, 0));
  EXPECT_TRUE(is_removable(delivered, kNow, 10 * kSecond));
  EXPECT_FALSE(is_removable(delivered, kNow, 11 * kSecond));
  EXPECT_FALSE(is_removable(pending(), kNow, 0));
  EXPECT_FALSE(is_removable(bury(leased(kNow, true)), kNow, 0));
  EXPECT_FALSE(is_removable(leased(kNow - 100 * kSecond, false), kNow, 0));
  // Not one the calling transaction delivered (idem_reap in it).
  OutboxEvent delivered_here = delivered;
  delivered_here.written_by_this_transaction = true;
  EXPECT_FALSE(is_removable(delivered_here, kNow, 0));
}

// One relay's scan of an aggregate's pending events, in seq order: which go into
// the batch.
std::vector<bool> batch(const std::vector<OutboxEvent>& events, const std::vector<bool>& lockable) {
  std::vector<bool> handed_out;
  AggregateSeen seen = AggregateSeen::kNotYet;
  for (size_t i = 0; i < events.size(); i++) {
    Admission admission = admit(events[i], seen, lockable[i], kNow);
    seen = after(admission, seen);
    handed_out.push_back(admission == Admission::kHandOut);
  }
  return handed_out;
}

TEST(Gate, ConsecutiveReadyEventsGoTogether) {
  EXPECT_EQ(batch({pending(), pending(), pending()}, {true, true, true}),
            (std::vector<bool>{true, true, true}));
}

TEST(Gate, AnEventLeasedElsewhereBlocksTheRest) {
  EXPECT_EQ(batch({leased(kNow + kSecond, false), pending(), pending()}, {true, true, true}),
            (std::vector<bool>{false, false, false}));
  EXPECT_EQ(batch({pending(), leased(kNow + kSecond, false), pending()}, {true, true, true}),
            (std::vector<bool>{true, false, false}));
}

TEST(Gate, ARowAnotherRelayIsLockingBlocksTheRest) {
  EXPECT_EQ(batch({pending(), pending(), pending()}, {true, false, true}),
            (std::vector<bool>{true, false, false}));
}

TEST(Gate, ADeliveredOrDeadVersionFoundAfterLockingBlocksNothing) {
  OutboxEvent acked = deliver(leased(kNow, false), kNow);
  OutboxEvent dead = bury(leased(kNow, false));
  EXPECT_EQ(batch({acked, dead, pending()}, {true, true, true}),
            (std::vector<bool>{false, false, true}));
}

TEST(Gate, AnEventOfTheCallingTransactionIsNotCommittedSoNotHandedOut) {
  OutboxEvent own = pending();
  own.emitted_here = true;
  EXPECT_EQ(batch({own, pending()}, {true, true}), (std::vector<bool>{false, false}));
}

TEST(Gate, AnExpiredLeaseIsHandedOutAgain) {
  EXPECT_EQ(batch({leased(kNow - kSecond, false), pending()}, {true, true}),
            (std::vector<bool>{true, true}));
}

TEST(Gate, OnlyAnEventAdmitCouldHandOutIsWorthLocking) {
  EXPECT_TRUE(worth_locking(pending(), AggregateSeen::kNotYet, kNow));
  EXPECT_TRUE(worth_locking(pending(), AggregateSeen::kHandedOut, kNow));
  EXPECT_FALSE(worth_locking(pending(), AggregateSeen::kBlocked, kNow));
  EXPECT_FALSE(worth_locking(leased(kNow + kSecond, false), AggregateSeen::kNotYet, kNow));
  OutboxEvent own = pending();
  own.emitted_here = true;
  EXPECT_FALSE(worth_locking(own, AggregateSeen::kNotYet, kNow));
  // Whatever it says, admit without the lock never hands out.
  for (AggregateSeen seen :
       {AggregateSeen::kNotYet, AggregateSeen::kHandedOut, AggregateSeen::kBlocked})
    EXPECT_NE(admit(pending(), seen, false, kNow), Admission::kHandOut);
}

TEST(Seq, StartsAtOneWithoutGaps) {
  EXPECT_EQ(next_seq(std::nullopt), 1);
  EXPECT_EQ(next_seq(1), 2);
  EXPECT_EQ(next_seq(41), 42);
}

TEST(Position, FollowsTheNodeUnlessItIsBehindTheAggregate) {
  EXPECT_EQ(next_position(std::nullopt, 7), 7);
  EXPECT_EQ(next_position(5, 7), 7);
  // A shard moved to a node whose sequence is behind: after the aggregate's last event.
  EXPECT_EQ(next_position(1000, 7), 1001);
  EXPECT_EQ(next_position(7, 7), 8);
}

AppliedRecord record(std::int64_t version, Micros expires_at = kNow + kSecond) {
  return AppliedRecord{version, expires_at, false};
}

AppliedRecord written_here(AppliedRecord record) {
  record.written_by_this_transaction = true;
  return record;
}

TEST(ApplyVersion, OnlyAboveTheLastApplied) {
  EXPECT_TRUE(should_apply(nullptr, 1, kNow));
  EXPECT_TRUE(should_apply(nullptr, -5, kNow));
  AppliedRecord three = record(3);
  EXPECT_TRUE(should_apply(&three, 4, kNow));
  EXPECT_FALSE(should_apply(&three, 3, kNow));
  EXPECT_FALSE(should_apply(&three, 2, kNow));
}

TEST(ApplyVersion, AnExpiredRecordIsForgotten) {
  for (Micros expires_at : {kNow, kNow - kSecond}) {
    AppliedRecord expired = record(10, expires_at);
    EXPECT_FALSE(is_live(expired, kNow));
    EXPECT_TRUE(is_reapable(expired, kNow));
    EXPECT_TRUE(should_apply(&expired, 3, kNow));
    EXPECT_TRUE(should_apply(&expired, 10, kNow));
  }
  EXPECT_FALSE(is_reapable(record(10), kNow));
}

TEST(ApplyVersion, ARecordThisTransactionWroteStaysPastItsWindow) {
  // The calling transaction is in progress: what it recorded is live until it ends,
  // so a duplicate or older message is still skipped, and idem_reap leaves it.
  AppliedRecord own = written_here(record(10, kNow - kSecond));
  EXPECT_TRUE(is_live(own, kNow));
  EXPECT_FALSE(is_reapable(own, kNow));
  EXPECT_FALSE(should_apply(&own, 3, kNow));
  EXPECT_FALSE(should_apply(&own, 10, kNow));
  EXPECT_TRUE(should_apply(&own, 11, kNow));
}

}  // namespace
}  // namespace idempotency
