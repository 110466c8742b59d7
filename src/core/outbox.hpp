// Messaging's rules, as pure functions: an outbox event's states and what a relay may
// do with it, the per-aggregate gate of a relay's batch, an aggregate's next seq, and
// idem_apply_version's decision. No PostgreSQL here (see key_state.hpp).
#pragma once

#include <cstdint>
#include <optional>

#include "core/key_state.hpp"

namespace idempotency {

// Stored as a "char" in idempotency.outbox.state.
enum class EventState : char {
  kPending = 'p',    // waiting for a relay, or leased to one (lease_expires_at ahead)
  kDelivered = 'd',  // acknowledged; removed after idempotency.outbox_retention
  kDead = 'x',       // a dead letter: blocks nothing until idem_outbox_retry
};

bool parse_event_state(char stored, EventState* state) noexcept;

// What the rules read and change of an event.
struct OutboxEvent {
  EventState state = EventState::kPending;
  std::int32_t attempt = 0;                // how often it was handed out
  std::optional<Micros> lease_expires_at;  // set once handed out (the last lease)
  std::optional<Micros> delivered_at;
  bool leased_to_caller = false;  // its relay is the one asking
  // Emitted by the calling transaction, so not committed: a relay in the same
  // transaction must not publish what may still roll back.
  bool emitted_here = false;
  // The calling transaction (or a subtransaction of it that did not roll back) wrote
  // this version: emitted, leased, settled or requeued it.
  bool written_by_this_transaction = false;
};

// Pending and not held by a live lease: a relay may take it.
bool is_ready(const OutboxEvent& event, Micros now) noexcept;
// Handed out to the calling relay until `lease_end`, attempt + 1.
OutboxEvent lease(const OutboxEvent& ready, Micros lease_end) noexcept;

// Whether an ack or dead from the calling relay counts: the event is pending and was
// last handed out to it. A lease that ran out still counts until another relay takes
// the event; then the late relay's ack is ignored (the event is delivered again).
bool may_settle(const OutboxEvent& event) noexcept;
OutboxEvent deliver(const OutboxEvent& leased, Micros now) noexcept;
OutboxEvent bury(const OutboxEvent& leased) noexcept;
// A dead letter back to pending, keeping its seq, position and attempt count.
bool may_requeue(const OutboxEvent& event) noexcept;
OutboxEvent requeue(const OutboxEvent& dead) noexcept;
// Whether the worker removes the event: delivered at least `retention` ago, and not
// by the calling transaction (a pass never removes what a transaction in progress
// wrote; idem_reap in that transaction leaves it too).
bool is_removable(const OutboxEvent& event, Micros now, Micros retention) noexcept;

// The gate of one relay batch. The relay reads pending events in emission order,
// in which each aggregate's events come in seq order (a later one cannot commit
// before an earlier one: its emitter waited for the earlier one's transaction), so
// the first pending event seen of an aggregate is the earliest one not delivered or
// dead. An aggregate's event goes into the batch only if every earlier pending one
// did.
enum class AggregateSeen {
  kNotYet,     // no earlier pending event of its aggregate in this scan
  kHandedOut,  // every earlier one went into this batch
  kBlocked,    // an earlier one is leased elsewhere (or locked): wait for it
};
enum class Admission { kHandOut, kBlock, kSkip };
// `lockable`: the glue could lock the row without waiting (another relay is not
// taking it right now). Events without an aggregate pass kNotYet.
Admission admit(const OutboxEvent& event, AggregateSeen seen, bool lockable, Micros now) noexcept;
// Whether locking the event's row could let admit hand it out (else admit decides
// without the lock: the glue need not take it).
bool worth_locking(const OutboxEvent& event, AggregateSeen seen, Micros now) noexcept;
// What the aggregate is after `admission`.
AggregateSeen after(Admission admission, AggregateSeen seen) noexcept;

// An aggregate's next event number: 1, 2, 3, ... with no gap (the caller holds the
// aggregate's lock and read `last` after taking it).
std::int64_t next_seq(std::optional<std::int64_t> last) noexcept;

// The position of an aggregate's next event in a shard of a distributed outbox, whose
// events a relay takes in position order: the node's sequence (`drawn`) numbers them,
// but after a move the shard's new node may number lower than its old one did, so the
// aggregate's events keep their seq order by never going below its last position.
std::int64_t next_position(std::optional<std::int64_t> last, std::int64_t drawn) noexcept;

// An entity's record in idempotency.applied_versions: the last version applied.
struct AppliedRecord {
  std::int64_t version = 0;
  Micros expires_at = 0;  // ttl after its last change
  // The calling transaction (or a subtransaction of it that did not roll back) wrote
  // this version of the record.
  bool written_by_this_transaction = false;
};

// Live as a key's row is (key_state.hpp): until it expires, and whatever its
// expires_at while the calling transaction, in progress, wrote it (a record another
// transaction is writing is waited for before anything is decided). An expired record
// is forgotten, reaped yet or not.
bool is_live(const AppliedRecord& record, Micros now) noexcept;
// Whether the worker (or idem_reap) deletes the record.
bool is_reapable(const AppliedRecord& record, Micros now) noexcept;
// idem_apply_version: apply `version` only if it is above the one a live record holds
// (`record` null: none is stored).
bool should_apply(const AppliedRecord* record, std::int64_t version, Micros now) noexcept;

}  // namespace idempotency
