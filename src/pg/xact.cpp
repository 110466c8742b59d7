// A transaction may not commit while one of its in-transaction claims is pending:
// the key would be stored without its work. The claims are remembered in the order
// made, with a count of those still open (made minus finished) that each savepoint
// saves and its rollback restores. At pre-commit a count of zero proves every claim
// finished; otherwise each claim is looked up again, which also sees a completion
// undone by a rolled-back savepoint.
#include "pg/xact.hpp"

#include "pg/errors.hpp"
#include "pg/identity_lock.hpp"
#include "pg/key_type.hpp"

extern "C" {
#include "access/xact.h"
#include "utils/builtins.h"
#include "utils/memutils.h"
}

namespace idempotency {

struct RememberedClaim {
  SubTransactionId subxact;  // the subtransaction that made it
  Identity id;               // copied into TopTransactionContext
  bool lease;                // a lease claim: may commit pending
};

// An array rather than a List: a batch may claim 100,000 keys, and subtransaction
// ends only look at the tail, where the innermost subtransaction's claims are.
static RememberedClaim* claims;
static int claim_count;
static int claim_capacity;

struct UnwrittenClaim {
  SubTransactionId subxact;     // the subtransaction that made it
  SubTransactionId written_in;  // InvalidSubTransactionId until a finish writes its row
  Identity id;                  // these point into TopTransactionContext
  KeyRow* row;
  IdentityLock lock;            // held
};
static UnwrittenClaim unwritten[kMaxUnwrittenClaims];
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

void remember_claim(const Identity& id, bool lease) {
  claims = grow(claims, claim_count, &claim_capacity);
  MemoryContext old = MemoryContextSwitchTo(TopTransactionContext);
  RememberedClaim& claim = claims[claim_count];
  claim.subxact = GetCurrentSubTransactionId();
  claim.id.role = id.role;
  claim.id.scope = static_cast<text*>(PG_DETOAST_DATUM_COPY(PointerGetDatum(id.scope)));
  claim.id.key = PG_DETOAST_DATUM_COPY(PointerGetDatum(id.key));
  claim.lease = lease;
  claim_count++;
  if (!lease) open_claims++;
  MemoryContextSwitchTo(old);
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

bool can_leave_claim_unwritten() { return unwritten_count < kMaxUnwrittenClaims; }

void remember_unwritten_claim(KeyStore* store, const Identity& id, const KeyRow& row,
                              const IdentityLock& held) {
  KeyRow* kept = store_copy_row(store, row, TopTransactionContext);
  unwritten[unwritten_count++] =
      UnwrittenClaim{GetCurrentSubTransactionId(), InvalidSubTransactionId,
                     Identity{id.role, DatumGetTextPP(kept->get(kScope)),
                              reinterpret_cast<struct varlena*>(DatumGetPointer(kept->get(kKey)))},
                     kept, held};
}

static int find_unwritten(const Identity& id) {
  for (int i = 0; i < unwritten_count; i++)
    if (unwritten[i].written_in == InvalidSubTransactionId && same_identity(unwritten[i].id, id))
      return i;
  return -1;
}

const KeyRow* unwritten_claim(const Identity& id) {
  int i = find_unwritten(id);
  return i < 0 ? nullptr : unwritten[i].row;
}

static void drop_unwritten(int i) { unwritten[i] = unwritten[--unwritten_count]; }

void note_unwritten_claim_written(const Identity& id) {
  int i = find_unwritten(id);
  if (i < 0) return;
  if (GetCurrentTransactionNestLevel() > 1) {
    unwritten[i].written_in = GetCurrentSubTransactionId();
    return;
  }
  unlock_identity(unwritten[i].lock);
  drop_unwritten(i);
}

bool made_lease_claim(const Identity& id) {
  for (int i = claim_count - 1; i >= 0; i--)
    if (claims[i].lease && same_identity(claims[i].id, id)) return true;
  return false;
}

static void forget_claims() {
  claims = nullptr;  // freed with TopTransactionContext
  claim_count = claim_capacity = 0;
  saved_open_claims = nullptr;
  saved_count = saved_capacity = 0;
  open_claims = 0;
  unwritten_count = 0;  // the transaction's end releases the identity locks
}

static void raise_not_finished(const Identity& id) pg_attribute_noreturn();
static void raise_not_finished(const Identity& id) {
  ereport(ERROR, errcode(ERRCODE_IDEM_CLAIM_NOT_FINISHED),
          errmsg("idempotency key \"%s\" in scope \"%s\" was claimed but not finished",
                 key_cstring(id.key), text_to_cstring(id.scope)),
          errdetail("A transaction that claims a key must complete, fail or release it "
                    "before it commits, so the key is never stored without its work."),
          errhint("Call idem_complete, idem_fail or idem_release before COMMIT, or claim "
                  "with a lease for work that must commit before it finishes."));
}

static void check_claims_finished() {
  if (claim_count == 0 || open_claims == 0) return;
  for (int i = 0; i < unwritten_count; i++)
    if (unwritten[i].written_in == InvalidSubTransactionId) raise_not_finished(unwritten[i].id);
  KeyStore store;
  store_open(&store, false);
  for (int i = 0; i < claim_count; i++) {
    Probe probe;
    // A dirty read sees this transaction's latest writes whatever the command id.
    store_probe(&store, claims[i].id, nullptr, &probe);
    if (probe.found && probe.view.state == KeyState::kPending &&
        probe.view.claimed_by_this_transaction && !probe.view.lease_expires_at)
      raise_not_finished(claims[i].id);
  }
  store_close(&store);
}

static void on_transaction_event(XactEvent event, void*) {
  switch (event) {
    case XACT_EVENT_PRE_COMMIT:
    case XACT_EVENT_PRE_PREPARE: check_claims_finished(); break;
    case XACT_EVENT_COMMIT:
    case XACT_EVENT_ABORT:
    case XACT_EVENT_PREPARE:
    case XACT_EVENT_PARALLEL_COMMIT:
    case XACT_EVENT_PARALLEL_ABORT: forget_claims(); break;
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
  if (saved_count > 0) {
    saved_count--;
    if (event == SUBXACT_EVENT_ABORT_SUB) open_claims = saved_open_claims[saved_count];
  }
  // Unwritten claims: made in a rolled-back subtransaction, they are gone with their
  // locks; written in one, they are unwritten again.
  bool abort = event == SUBXACT_EVENT_ABORT_SUB;
  for (int i = unwritten_count - 1; i >= 0; i--) {
    UnwrittenClaim& claim = unwritten[i];
    if (claim.subxact >= mine) {
      if (abort) {
        unlock_identity(claim.lock);
        drop_unwritten(i);
        continue;
      }
      claim.subxact = parent;
    }
    if (claim.written_in != InvalidSubTransactionId && claim.written_in >= mine)
      claim.written_in = abort ? InvalidSubTransactionId : parent;
  }
  while (claim_count > 0 && claims[claim_count - 1].subxact >= mine) {
    if (event == SUBXACT_EVENT_ABORT_SUB) {
      claim_count--;
      continue;
    }
    for (int i = claim_count - 1; i >= 0 && claims[i].subxact >= mine; i--)
      claims[i].subxact = parent;
    break;
  }
}

void install_transaction_callbacks() {
  RegisterXactCallback(on_transaction_event, nullptr);
  RegisterSubXactCallback(on_subtransaction_event, nullptr);
}

}  // namespace idempotency
