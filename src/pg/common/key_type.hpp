// The idem_key type: a varlena holding the key's stored form (src/core/key.hpp): a
// canonical UUID in 17 bytes, any other key as typed.
#pragma once

#include "pg/common/postgres.hpp"

namespace idempotency {

// Raises 22P02 with a message that says what is wrong unless the bytes form a key.
void ensure_valid_key(const char* data, size_t length);

// A new idem_key (palloc'd in the current context) for the given characters, validated.
struct varlena* make_key(const char* data, size_t length);

// A new random (version 4) UUID as a key, lowercase and hyphenated.
struct varlena* random_uuid_key();

// A key's characters, palloc'd: as a C string, or as text.
char* key_cstring(const struct varlena* key);
text* key_text(const struct varlena* key);

}  // namespace idempotency
