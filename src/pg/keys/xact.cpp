// A transaction may not commit while one of its in-transaction claims is pending:
// the key would be stored without its work. The claims are remembered in the order
// made, with a count of those still open (made minus finished) that each savepoint
// saves and its rollback restores. At pre-commit a count of zero proves every claim
// finished; otherwise each claim is looked up again, which also sees a completion
// undone by a rolled-back savepoint.
#include "pg/keys/xact.hpp"

#include "pg/citus/citus_forward.hpp"
#include "pg/common/errors.hpp"
#include "pg/keys/identity_lock.hpp"
#include "pg/common/key_type.hpp"
#include "pg/common/open_relations.hpp"

extern "C" {
#include "access/xact.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/memutils.h"
}

namespace idempotency {

struct RememberedClaim {
  SubTransactionId subxact;  // the subtransaction that made it
  Identity id;               // copied into TopTransactionContext
  bool lease;                // a lease claim: may commit pending
  StoreOids store;           // where it is (a shard of the distributed store)
  // Made on another node through Citus (citus_forward): that node's transaction knows
  // it, this one only what it forwarded. The subtransaction of the forwarded finish
  // that took it out of pending, else InvalidSubTransactionId.
  bool forwarded;
  SubTransactionId finished_in;
  Oid schema;  // of the twins it was forwarded through
};

// An array rather than a List: a batch may claim 100,000 keys, and subtransaction
// ends only look at the tail, where the innermost subtransaction's claims are.
static RememberedClaim* claims;
static int claim_count;
static int claim_capacity;
static int forwarded_count;  // of them, forwarded

// The identity locks this transaction holds, each recorded as soon as it is taken
// (nothing that can fail lies between), so that a subtransaction that aborts, with an
// error caught by a savepoint or an EXCEPTION block, releases the locks it took. A
// lock is held either for one call's insert decision or by an unwritten claim.
struct HeldLock {
  SubTransactionId subxact;  // the subtransaction that holds it
  IdentityLock lock;
  // An unwritten claim (claim != nullptr), in TopTransactionContext.
  UnwrittenClaim* claim;
  SubTransactionId written_in;  // InvalidSubTransactionId until a finish writes its row
};
// The unwritten claims, and at most one lock of a call in progress.
constexpr int kMaxHeldLocks = kMaxUnwrittenClaims + 1;
static HeldLock held[kMaxHeldLocks];
static int held_count;
static int unwritten_count;

static int64 open_claims;
// open_claims as each open subtransaction found it, innermost last.
static int64* saved_open_claims;
static int saved_count;
static int saved_capacity;

// Appends to an array in TopTransactionContext, doubling it when full.
template <typename T>
static T* grow(T* array, int count, int* capacity) {
  if (count < *capacity) return array;
  *capacity = *capacity == 0 ? 16 : *capacity * 2;
  Size size = *capacity * sizeof(T);
  return static_cast<T*>(array == nullptr ? MemoryContextAlloc(TopTransactionContext, size)
                                          : repalloc(array, size));
}

void remember_claim(const Identity& id, bool lease, const StoreOids& store) {
  claims = grow(claims, claim_count, &claim_capacity);
  claims[claim_count++] = RememberedClaim{GetCurrentSubTransactionId(),
                                          copy_identity(id, TopTransactionContext),
                                          lease,
                                          store,
                                          false,
                                          InvalidSubTransactionId,
                                          InvalidOid};
  if (!lease) open_claims++;
}

void remember_forwarded_claim(const Identity& id, Oid schema) {
  claims = grow(claims, claim_count, &claim_capacity);
  claims[claim_count++] = RememberedClaim{GetCurrentSubTransactionId(),
                                          copy_identity(id, TopTransactionContext),
                                          false,
                                          StoreOids{},
                                          true,
                                          InvalidSubTransactionId,
                                          schema};
  forwarded_count++;
}

void note_claim_finished() { open_claims--; }

static bool same_bytes(const struct varlena* a, const struct varlena* b) {
  return VARSIZE_ANY_EXHDR(a) == VARSIZE_ANY_EXHDR(b) &&
         memcmp(VARDATA_ANY(a), VARDATA_ANY(b), VARSIZE_ANY_EXHDR(a)) == 0;
}

static bool same_identity(const Identity& a, const Identity& b) {
  return a.role == b.role &&
         same_bytes(reinterpret_cast<struct varlena*>(a.scope),
                    reinterpret_cast<struct varlena*>(b.scope)) &&
         same_bytes(a.key, b.key);
}

void note_forwarded_finish(const Identity& id) {
  for (int i = claim_count - 1; i >= 0 && forwarded_count > 0; i--)
    if (claims[i].forwarded && claims[i].finished_in == InvalidSubTransactionId &&
        same_identity(claims[i].id, id)) {
      claims[i].finished_in = GetCurrentSubTransactionId();
      return;
    }
}

bool hold_identity_lock(const IdentityLock& lock, TimestampTz deadline) {
  if (held_count == kMaxHeldLocks) elog(ERROR, "too many idempotency identity locks held");
  if (!lock_identity(lock, deadline)) return false;
  held[held_count++] =
      HeldLock{GetCurrentSubTransactionId(), lock, nullptr, InvalidSubTransactionId};
  return true;
}

static bool same_lock(const IdentityLock& a, const IdentityLock& b) {
  return memcmp(&a.tag, &b.tag, sizeof(LOCKTAG)) == 0;
}

static void drop_held(int i) {
  unlock_identity(held[i].lock);
  if (held[i].claim != nullptr) unwritten_count--;
  held[i] = held[--held_count];
}

void release_identity_lock(const IdentityLock& lock) {
  for (int i = held_count - 1; i >= 0; i--)
    if (held[i].claim == nullptr && same_lock(held[i].lock, lock)) return drop_held(i);
}

bool can_leave_claim_unwritten() { return unwritten_count < kMaxUnwrittenClaims; }

void remember_unwritten_claim(const Identity& id, const StoredRow& row, const IdentityLock& lock) {
  for (int i = held_count - 1; i >= 0; i--) {
    HeldLock& entry = held[i];
    if (entry.claim != nullptr || !same_lock(entry.lock, lock)) continue;
    auto kept = static_cast<UnwrittenClaim*>(
        MemoryContextAlloc(TopTransactionContext, sizeof(UnwrittenClaim)));
    *kept = UnwrittenClaim{copy_identity(id, TopTransactionContext),
                           copy_stored_row(row, TopTransactionContext)};
    entry.claim = kept;
    unwritten_count++;
    return;
  }
  elog(ERROR, "an unwritten idempotency claim must hold its identity lock");
}

static int find_unwritten(const Identity& id) {
  for (int i = 0; i < held_count; i++)
    if (held[i].claim != nullptr && held[i].written_in == InvalidSubTransactionId &&
        same_identity(held[i].claim->id, id))
      return i;
  return -1;
}

const UnwrittenClaim* unwritten_claim(const Identity& id) {
  int i = find_unwritten(id);
  return i < 0 ? nullptr : held[i].claim;
}

// Written in the subtransaction that made the claim, the row can only be undone
// together with the claim: the lock has done its work and its slot is free again.
// Written deeper, a rollback to a savepoint between them makes the claim unwritten
// again, so the lock stays until that savepoint is released into the claim's level.
static void drop_if_written_at_its_level(int i) {
  if (held[i].claim != nullptr && held[i].written_in == held[i].subxact) drop_held(i);
}

void note_unwritten_claim_written(const Identity& id) {
  int i = find_unwritten(id);
  if (i < 0) return;
  held[i].written_in = GetCurrentSubTransactionId();
  drop_if_written_at_its_level(i);
}

bool made_lease_claim(const Identity& id) {
  for (int i = claim_count - 1; i >= 0; i--)
    if (claims[i].lease && same_identity(claims[i].id, id)) return true;
  return false;
}

const Identity* last_lease_claim() {
  for (int i = claim_count - 1; i >= 0; i--)
    if (claims[i].lease) return &claims[i].id;
  return nullptr;
}

bool claimed_here(const Probe& probe, const Identity& id) {
  return probe.view.written_by_this_transaction && probe.view.state == KeyState::kPending &&
         (!probe.view.lease_expires_at || made_lease_claim(id));
}

static void forget_claims() {
  claims = nullptr;  // freed with TopTransactionContext
  claim_count = claim_capacity = 0;
  saved_open_claims = nullptr;
  saved_count = saved_capacity = 0;
  open_claims = 0;
  held_count = unwritten_count = 0;  // the transaction's end releases the identity locks
  forwarded_count = 0;
}

[[noreturn]] static void raise_not_finished(const Identity& id);
static void raise_not_finished(const Identity& id) {
  ereport(ERROR, errcode(ERRCODE_IDEM_CLAIM_NOT_FINISHED),
          errmsg("idempotency key \"%s\" in scope \"%s\" was claimed but not finished",
                 key_cstring(id.key), text_to_cstring(id.scope)),
          errdetail("A transaction that claims a key must complete, fail or release it "
                    "before it commits, so the key is never stored without its work."),
          errhint("Call idem_complete, idem_fail or idem_release before COMMIT, or claim "
                  "with a lease for work that must commit before it finishes."));
}

// Raised here, before Citus commits the other node: there the same check fails that
// node's COMMIT, which Citus reports as a WARNING and an XX000 when it commits one node
// in one phase (transaction/transaction_management.c, CoordinatedTransactionCallback).
// A claim no forwarded finish took out of pending may have been finished on its node
// by a function Citus delegated there in this transaction: asked there (as its role
// sees it: a claim made under another role counts as pending).
static void check_forwarded_claims_finished() {
  if (forwarded_count == 0) return;
  for (int i = 0; i < claim_count; i++) {
    const RememberedClaim& claim = claims[i];
    if (!claim.forwarded || claim.finished_in != InvalidSubTransactionId) continue;
    if (claim.id.role != GetUserId()) raise_not_finished(claim.id);
    const char* state =
        citus_forwarded_state(claim.schema, text_to_cstring(claim.id.scope),
                              key_cstring(claim.id.key), claim.id.route.value, claim.id.route.type);
    if (state != nullptr && strcmp(state, "pending") == 0) raise_not_finished(claim.id);
  }
}

static void check_claims_finished() {
  check_forwarded_claims_finished();
  if (claim_count == 0 || open_claims == 0) return;
  for (int i = 0; i < held_count; i++)
    if (held[i].claim != nullptr && held[i].written_in == InvalidSubTransactionId)
      raise_not_finished(held[i].claim->id);
  KeyStore store;
  bool opened = false;
  for (int i = 0; i < claim_count; i++) {
    if (claims[i].forwarded) continue;
    if (!opened || claims[i].store.heap != store.oids.heap) {  // another shard (Citus)
      if (opened) store_close(&store);
      store_open(&store, claims[i].store, false);
      opened = true;
    }
    Probe probe;
    // A dirty read sees this transaction's latest writes whatever the command id.
    store_probe(&store, claims[i].id, nullptr, &probe);
    if (probe.found && claimed_here(probe, claims[i].id) && !probe.view.lease_expires_at)
      raise_not_finished(claims[i].id);
  }
  if (opened) store_close(&store);
}

static void on_transaction_event(XactEvent event, void*) {
  switch (event) {
    case XACT_EVENT_PRE_COMMIT:
      check_claims_finished();
      close_transaction_relations(IndexLocks::kKeepToTransactionEnd);
      break;
    case XACT_EVENT_PRE_PREPARE:
      // A prepared transaction keeps its locks until COMMIT PREPARED: release the
      // indexes' as a statement's executor would.
      check_claims_finished();
      close_transaction_relations();
      break;
    case XACT_EVENT_COMMIT:
    case XACT_EVENT_ABORT:
    case XACT_EVENT_PREPARE:
    case XACT_EVENT_PARALLEL_COMMIT:
    case XACT_EVENT_PARALLEL_ABORT:
      forget_claims();
      forget_transaction_relations();
      break;
    default: break;
  }
}

// A subtransaction's claims go with it when it rolls back, and pass to its parent
// when it commits.
static void on_subtransaction_event(SubXactEvent event, SubTransactionId mine,
                                    SubTransactionId parent, void*) {
  if (event == SUBXACT_EVENT_START_SUB) {
    saved_open_claims = grow(saved_open_claims, saved_count, &saved_capacity);
    saved_open_claims[saved_count++] = open_claims;
    return;
  }
  if (event != SUBXACT_EVENT_ABORT_SUB && event != SUBXACT_EVENT_COMMIT_SUB) return;
  if (event == SUBXACT_EVENT_ABORT_SUB) close_relations_of_aborted_subtransaction(mine);
  if (saved_count > 0) {
    saved_count--;
    if (event == SUBXACT_EVENT_ABORT_SUB) open_claims = saved_open_claims[saved_count];
  }
  // Locks taken in a rolled-back subtransaction go with it (unwritten claims made
  // there too); claims written in one are unwritten again. A committed one hands its
  // locks to its parent.
  bool abort = event == SUBXACT_EVENT_ABORT_SUB;
  for (int i = held_count - 1; i >= 0; i--) {
    HeldLock& entry = held[i];
    if (entry.written_in != InvalidSubTransactionId && entry.written_in >= mine)
      entry.written_in = abort ? InvalidSubTransactionId : parent;
    if (entry.subxact >= mine) {
      if (abort) {
        drop_held(i);
        continue;
      }
      entry.subxact = parent;
    }
    if (!abort) drop_if_written_at_its_level(i);
  }
  // A forwarded finish rolled back leaves its claim pending again (the other node
  // rolls back to the same savepoint: Citus sends it).
  for (int i = claim_count - 1; i >= 0 && forwarded_count > 0; i--)
    if (claims[i].forwarded && claims[i].finished_in != InvalidSubTransactionId &&
        claims[i].finished_in >= mine)
      claims[i].finished_in = abort ? InvalidSubTransactionId : parent;
  while (claim_count > 0 && claims[claim_count - 1].subxact >= mine) {
    if (event == SUBXACT_EVENT_ABORT_SUB) {
      if (claims[claim_count - 1].forwarded) forwarded_count--;
      claim_count--;
      continue;
    }
    for (int i = claim_count - 1; i >= 0 && claims[i].subxact >= mine; i--)
      claims[i].subxact = parent;
    break;
  }
}

void install_transaction_callbacks() {
  RegisterXactCallback(
      [](XactEvent event, void* arg) { guarded([&] { on_transaction_event(event, arg); }); },
      nullptr);
  RegisterSubXactCallback(
      [](SubXactEvent event, SubTransactionId mine, SubTransactionId parent, void* arg) {
        guarded([&] { on_subtransaction_event(event, mine, parent, arg); });
      },
      nullptr);
}

}  // namespace idempotency
