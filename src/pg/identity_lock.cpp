#include "pg/identity_lock.hpp"

#include "core/sha256.hpp"

extern "C" {
#include "common/hashfn.h"
#include "miscadmin.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "utils/resowner.h"
}

namespace idempotency {

// Advisory locks use 1 and 2 in the last field of their tag; 3 marks these.
constexpr uint16 kIdentityLockSpace = 3;
// Slots of insert counts; identities share them by hash, which only costs a repeated
// probe when two of a slot are inserted at once.
constexpr uint32 kInsertSlots = 4096;

static pg_atomic_uint64* insert_counts;
static shmem_request_hook_type previous_shmem_request;
static shmem_startup_hook_type previous_shmem_startup;

static std::string_view bytes_of(const struct varlena* value) {
  return std::string_view(VARDATA_ANY(value), VARSIZE_ANY_EXHDR(value));
}

// A keyed hash: pg_locks shows the tag to every role, so without the secret any role
// could test a guessed key of another role for a claim in flight, or craft a key
// whose lock collides with another role's and make its claims wait.
static uint64 identity_hash(const Identity& id, const LockSecret& secret) {
  std::string_view scope = bytes_of(reinterpret_cast<const struct varlena*>(id.scope));
  uint32 scope_length = scope.size();  // keeps ("ab", "c") and ("a", "bc") apart
  Digest digest = hmac_sha256(
      std::string_view(reinterpret_cast<const char*>(secret.bytes), secret.size),
      {std::string_view(reinterpret_cast<const char*>(&id.role), sizeof(id.role)),
       std::string_view(reinterpret_cast<const char*>(&scope_length), sizeof(scope_length)),
       scope, bytes_of(id.key)});
  uint64 hash;
  memcpy(&hash, digest.data(), sizeof(hash));
  return hash;
}

// A database whose extension is still at 1.0 has no secret: the unkeyed hash of 1.0,
// until ALTER EXTENSION idempotency UPDATE.
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
  lock.inserts = insert_counts == nullptr ? nullptr : &insert_counts[hash % kInsertSlots];
  return lock;
}

// The transaction holds the lock, not the statement or subtransaction that took it,
// so that a later statement can release it; xact.cpp releases the locks of claims a
// rolled-back subtransaction made.
static bool acquire_or_release(const LOCKTAG& tag, bool acquire) {
  ResourceOwner statement_owner = CurrentResourceOwner;
  CurrentResourceOwner = TopTransactionResourceOwner;
  bool done = acquire ? LockAcquire(&tag, ExclusiveLock, false, true) != LOCKACQUIRE_NOT_AVAIL
                      : LockRelease(&tag, ExclusiveLock, false);
  CurrentResourceOwner = statement_owner;
  return done;
}

bool lock_identity(const IdentityLock& lock, TimestampTz deadline) {
  long sleep_us = 50;
  while (!acquire_or_release(lock.tag, true))
    if (!sleep_before_retry(&sleep_us, deadline)) return false;
  return true;
}

void unlock_identity(const IdentityLock& lock) { acquire_or_release(lock.tag, false); }

uint64 inserts_seen(const IdentityLock& lock) {
  if (lock.inserts == nullptr) return 0;
  uint64 seen = pg_atomic_read_u64(lock.inserts);
  pg_read_barrier();  // before the probe's reads
  return seen;
}

// An insert counted after `before` was read happened under the lock while this
// transaction waited for it, so the lock's handover orders it before this read.
bool inserted_since(const IdentityLock& lock, uint64 before) {
  return lock.inserts == nullptr || pg_atomic_read_u64(lock.inserts) != before;
}

void note_insert(const IdentityLock& lock) {
  if (lock.inserts != nullptr) pg_atomic_fetch_add_u64(lock.inserts, 1);
}

static void request_memory() {
  if (previous_shmem_request) previous_shmem_request();
  RequestAddinShmemSpace(kInsertSlots * sizeof(pg_atomic_uint64));
}

static void start_memory() {
  if (previous_shmem_startup) previous_shmem_startup();
  LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
  bool found;
  auto counts = static_cast<pg_atomic_uint64*>(ShmemInitStruct(
      "idempotency identity locks", kInsertSlots * sizeof(pg_atomic_uint64), &found));
  if (!found)
    for (uint32 i = 0; i < kInsertSlots; i++) pg_atomic_init_u64(&counts[i], 0);
  insert_counts = counts;
  LWLockRelease(AddinShmemInitLock);
}

void request_identity_lock_memory() {
  previous_shmem_request = shmem_request_hook;
  shmem_request_hook = request_memory;
  previous_shmem_startup = shmem_startup_hook;
  shmem_startup_hook = start_memory;
}

}  // namespace idempotency
