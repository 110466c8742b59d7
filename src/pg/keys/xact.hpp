// The calling transaction's in-transaction claims, and IK002 at COMMIT and PREPARE.
#pragma once

#include "pg/keys/store.hpp"

namespace idempotency {

// Remembers a claim this transaction made (in-transaction, or with a lease) in the
// store `store` until the transaction ends.
void remember_claim(const Identity& id, bool lease, const StoreOids& store);

// Remembers an in-transaction claim this transaction made on another node through
// Citus (citus_forward), so that COMMIT and PREPARE raise IK002 here while it is
// pending (before Citus commits that node, whose own check would come back as XX000).
// `schema`: the extension's, where the key functions' twins are.
void remember_forwarded_claim(const Identity& id, Oid schema);
// Notes that a finish forwarded through Citus (complete, fail, release, forget) took
// the forwarded claim on `id` out of pending.
void note_forwarded_finish(const Identity& id);

// Whether this transaction made a lease claim on `id` (rare, so a scan will do).
bool made_lease_claim(const Identity& id);

// The last lease claim this transaction made, or null.
const Identity* last_lease_claim();

// Whether the probed row is a pending claim this transaction made (in-transaction or
// with a lease), as opposed to one it merely wrote (a lease holder's checkpoint).
bool claimed_here(const Probe& probe, const Identity& id);

// In-transaction claims of keys that had no row are not written when made: the claim
// holds the identity lock instead, and its finish inserts the finished row, one write
// where a pending row and its update would be two. At most this many at a time; more
// claims are written when made.
constexpr int kMaxUnwrittenClaims = 32;

// Takes the identity lock (polled until `deadline`, false if it passes) and records
// it, so that an error caught in a savepoint cannot leave it held; the transaction
// holds it until release_identity_lock, or as an unwritten claim's lock.
bool hold_identity_lock(const struct IdentityLock& lock, TimestampTz deadline);
void release_identity_lock(const struct IdentityLock& lock);

// Whether another claim may be left unwritten.
bool can_leave_claim_unwritten();
// An unwritten claim: the key's identity and the row the core decided on.
struct UnwrittenClaim {
  Identity id;
  StoredRow row;
};
// Remembers `row` (copied) as the unwritten row of this transaction's claim on `id`,
// which keeps holding the identity lock `lock` (taken with hold_identity_lock);
// remember_claim is called as for any claim.
void remember_unwritten_claim(const Identity& id, const StoredRow& row,
                              const struct IdentityLock& lock);
// This transaction's unwritten claim on `id`, or null.
const UnwrittenClaim* unwritten_claim(const Identity& id);
// Notes that a finish wrote (or, releasing it, dropped) the claim's row. In the
// subtransaction that made the claim that is final, and the identity lock goes;
// deeper, a rollback makes the claim unwritten again, so the lock stays until the
// savepoint is released into the claim's subtransaction.
void note_unwritten_claim_written(const Identity& id);

// Notes that a finishing call (complete, fail, release, forget) took one of this
// transaction's in-transaction claims out of pending.
void note_claim_finished();

// Registers the transaction callbacks; once per backend.
void install_transaction_callbacks();

}  // namespace idempotency
