// The calling transaction's in-transaction claims, and IK002 at COMMIT and PREPARE.
#pragma once

#include "pg/store.hpp"

namespace idempotency {

// Remembers a claim this transaction made (in-transaction, or with a lease) until the
// transaction ends.
void remember_claim(const Identity& id, bool lease);

// Whether this transaction made a lease claim on `id` (rare, so a scan will do).
bool made_lease_claim(const Identity& id);

// Notes that a finishing call (complete, fail, release, forget) took one of this
// transaction's in-transaction claims out of pending.
void note_claim_finished();

// Registers the transaction callbacks; once per backend.
void install_transaction_callbacks();

}  // namespace idempotency
