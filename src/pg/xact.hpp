// The calling transaction's in-transaction claims, and IK002 at COMMIT and PREPARE.
#pragma once

#include "pg/store.hpp"

namespace idempotency {

// Remembers an in-transaction claim until the transaction ends.
void remember_claim(const Identity& id);

// Notes that a finishing call (complete, fail, release, forget) took one of this
// transaction's in-transaction claims out of pending.
void note_claim_finished();

// Registers the transaction callbacks; once per backend.
void install_transaction_callbacks();

}  // namespace idempotency
