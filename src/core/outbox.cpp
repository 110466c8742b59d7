#include "core/outbox.hpp"

namespace idempotency {

bool parse_event_state(char stored, EventState* state) noexcept {
  switch (stored) {
    case 'p': *state = EventState::kPending; return true;
    case 'd': *state = EventState::kDelivered; return true;
    case 'x': *state = EventState::kDead; return true;
    default: return false;
  }
}

bool is_ready(const OutboxEvent& event, Micros now) noexcept {
  return event.state == EventState::kPending &&
         (!event.lease_expires_at || *event.lease_expires_at <= now);
}

OutboxEvent lease(const OutboxEvent& ready, Micros lease_end) noexcept {
  OutboxEvent next = ready;
  next.attempt = ready.attempt + 1;
  next.lease_expires_at = lease_end;
  next.leased_to_caller = true;
  return next;
}

bool may_settle(const OutboxEvent& event) noexcept {
  return event.state == EventState::kPending && event.lease_expires_at && event.leased_to_caller;
}

OutboxEvent deliver(const OutboxEvent& leased, Micros now) noexcept {
  OutboxEvent next = leased;
  next.state = EventState::kDelivered;
  next.delivered_at = now;
  next.lease_expires_at.reset();
  return next;
}

OutboxEvent bury(const OutboxEvent& leased) noexcept {
  OutboxEvent next = leased;
  next.state = EventState::kDead;
  next.lease_expires_at.reset();
  return next;
}

bool may_requeue(const OutboxEvent& event) noexcept { return event.state == EventState::kDead; }

OutboxEvent requeue(const OutboxEvent& dead) noexcept {
  OutboxEvent next = dead;
  next.state = EventState::kPending;
  next.lease_expires_at.reset();
  next.leased_to_caller = false;
  return next;
}

bool is_removable(const OutboxEvent& event, Micros now, Micros retention) noexcept {
  return event.state == EventState::kDelivered && event.delivered_at &&
         *event.delivered_at <= now - retention && !event.written_by_this_transaction;
}

Admission admit(const OutboxEvent& event, AggregateSeen seen, bool lockable, Micros now) noexcept {
  if (seen == AggregateSeen::kBlocked) return Admission::kSkip;
  if (event.state != EventState::kPending) return Admission::kSkip;
  if (lockable && is_ready(event, now) && !event.emitted_here) return Admission::kHandOut;
  return Admission::kBlock;
}

bool worth_locking(const OutboxEvent& event, AggregateSeen seen, Micros now) noexcept {
  return seen != AggregateSeen::kBlocked && is_ready(event, now) && !event.emitted_here;
}

AggregateSeen after(Admission admission, AggregateSeen seen) noexcept {
  switch (admission) {
    case Admission::kHandOut: return AggregateSeen::kHandedOut;
    case Admission::kBlock: return AggregateSeen::kBlocked;
    case Admission::kSkip: return seen;
  }
  return seen;
}

std::int64_t next_seq(std::optional<std::int64_t> last) noexcept { return last ? *last + 1 : 1; }

std::int64_t next_position(std::optional<std::int64_t> last, std::int64_t drawn) noexcept {
  return last && *last >= drawn ? *last + 1 : drawn;
}

bool is_live(const AppliedRecord& record, Micros now) noexcept {
  return record.written_by_this_transaction || record.expires_at > now;
}

bool is_reapable(const AppliedRecord& record, Micros now) noexcept { return !is_live(record, now); }

bool should_apply(const AppliedRecord* record, std::int64_t version, Micros now) noexcept {
  return record == nullptr || !is_live(*record, now) || version > record->version;
}

}  // namespace idempotency
