#include "pg/keys/identity_lock.hpp"

#include <memory>
#include <string>

#include "core/sha256.hpp"
#include "pg/common/waits.hpp"

extern "C" {
#include "common/hashfn.h"
#include "miscadmin.h"
#include "utils/resowner.h"
}

namespace idempotency {

// Advisory locks use 1 and 2 in the last field of their tag; 3 marks these.
constexpr uint16 kIdentityLockSpace = 3;
// Slots of insert counts; identities share them by hash, which only costs a repeated
// probe when two of a slot are inserted at once.
constexpr uint32 kInsertSlots = 4096;

static pg_atomic_uint64* insert_counts;

static std::string_view bytes_of(const struct varlena* value) {
  return std::string_view(VARDATA_ANY(value), VARSIZE_ANY_EXHDR(value));
}

// HMAC-SHA256 keyed with the store's secret, its first 8 bytes. The key's blocks are
// hashed once per backend and secret, not per lock. Never destroyed: a static
// destructor would run at exit, after OpenSSL's own cleanup.
static uint64 keyed_hash(std::initializer_list<std::string_view> parts, const LockSecret& secret) {
  static HmacSha256* keyed = nullptr;
  static LockSecret keyed_with{};
  if (keyed == nullptr || memcmp(&keyed_with, &secret, sizeof(secret)) != 0) {
    auto next = std::make_unique<HmacSha256>(
        std::string_view(reinterpret_cast<const char*>(secret.bytes), secret.size));
    delete keyed;
    keyed = next.release();
    keyed_with = secret;
  }
  Digest digest = (*keyed)(parts);
  uint64 hash;
  memcpy(&hash, digest.data(), sizeof(hash));
  return hash;
}

// A keyed hash: pg_locks shows the tag to every role, so without the secret any role
// could test a guessed key of another role for a claim in flight, or craft a key
// whose lock collides with another role's and make its claims wait.
static uint64 identity_hash(const Identity& id, const LockSecret& secret) {
  std::string_view scope = bytes_of(reinterpret_cast<const struct varlena*>(id.scope));
  uint32 scope_length = scope.size();  // keeps ("ab", "c") and ("a", "bc") apart
  return keyed_hash(
      {std::string_view(reinterpret_cast<const char*>(&id.role), sizeof(id.role)),
       std::string_view(reinterpret_cast<const char*>(&scope_length), sizeof(scope_length)), scope,
       bytes_of(id.key)},
      secret);
}

// The unkeyed hash of 1.0: the lock of a database still at 1.0 (no secret, until
// ALTER EXTENSION idempotency UPDATE), and the slot of the insert counts.
static uint64 unkeyed_identity_hash(const Identity& id) {
  auto hash_text = [](std::string_view value, uint64 seed) {
    return hash_bytes_extended(reinterpret_cast<const unsigned char*>(value.data()), value.size(),
                               seed);
  };
  uint64 hash = hash_text(bytes_of(reinterpret_cast<const struct varlena*>(id.scope)), id.role);
  return hash_combine64(hash, hash_text(bytes_of(id.key), 0));
}

IdentityLock identity_lock(const Identity& id, const LockSecret& secret) {
  uint64 hash = secret.size > 0 ? identity_hash(id, secret) : unkeyed_identity_hash(id);
  IdentityLock lock;
  SET_LOCKTAG_ADVISORY(lock.tag, MyDatabaseId, static_cast<uint32>(hash >> 32),
                       static_cast<uint32>(hash), kIdentityLockSpace);
  return lock;
}

// The transaction holds the lock, not the statement or subtransaction that took it,
// so that a later statement can release it; xact.cpp releases the locks that an
// aborted subtransaction took.
bool lock_identity(const IdentityLock& lock, TimestampTz deadline) {
  return lock_waiting(lock.tag, deadline);
}

void unlock_identity(const IdentityLock& lock) { unlock(lock.tag, LockKeeper::kTransaction); }

LOCKTAG messaging_lock(MessagingLock kind, std::initializer_list<std::string_view> parts,
                       const LockSecret& secret) {
  // Each part after its length, so that no two lists of parts hash the same bytes; the
  // kind first, so that no two kinds share a tag.
  std::string framed(1, static_cast<char>(kind));
  for (std::string_view part : parts) {
    uint32 length = part.size();
    framed.append(reinterpret_cast<const char*>(&length), sizeof(length));
    framed.append(part);
  }
  uint64 hash = keyed_hash({framed}, secret);
  LOCKTAG tag;
  SET_LOCKTAG_ADVISORY(tag, MyDatabaseId, static_cast<uint32>(hash >> 32),
                       static_cast<uint32>(hash), static_cast<uint16>(kind));
  return tag;
}

// Taken for the transaction or subtransaction running the call, so that an error's
// abort of it lets it go, and in the queue's order (lock_waiting).
bool lock_briefly(const LOCKTAG& tag, TimestampTz deadline) {
  return lock_waiting(tag, deadline, LockKeeper::kSubtransaction);
}

void unlock_briefly(const LOCKTAG& tag) { unlock(tag, LockKeeper::kSubtransaction); }

InsertCount insert_count(const Identity& id) {
  if (insert_counts == nullptr) return InsertCount{nullptr};
  return InsertCount{&insert_counts[unkeyed_identity_hash(id) % kInsertSlots]};
}

uint64 inserts_seen(InsertCount count) {
  if (count.counter == nullptr) return 0;
  uint64 seen = pg_atomic_read_u64(count.counter);
  pg_read_barrier();  // before the probe's reads
  return seen;
}

// An insert counted after `before` was read happened under the lock while this
// transaction waited for it, so the lock's handover orders it before this read.
bool inserted_since(InsertCount count, uint64 before) {
  return count.counter == nullptr || pg_atomic_read_u64(count.counter) != before;
}

void note_insert(InsertCount count) {
  if (count.counter != nullptr) pg_atomic_fetch_add_u64(count.counter, 1);
}

Size insert_counts_size() { return kInsertSlots * sizeof(pg_atomic_uint64); }

void attach_insert_counts(void* memory, bool initialize) {
  auto counts = static_cast<pg_atomic_uint64*>(memory);
  if (initialize)
    for (uint32 i = 0; i < kInsertSlots; i++) pg_atomic_init_u64(&counts[i], 0);
  insert_counts = counts;
}

}  // namespace idempotency
