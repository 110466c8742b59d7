// The idem_key type: a varlena holding the key's bytes, exactly as typed.
#pragma once

#include "pg/postgres.hpp"

namespace idempotency {

// Raises 22P02 with a message that says what is wrong unless the bytes form a key.
void ensure_valid_key(const char* data, size_t length);

// A new idem_key (palloc'd in the current context) holding the given bytes, validated.
struct varlena* make_key(const char* data, size_t length);

}  // namespace idempotency
