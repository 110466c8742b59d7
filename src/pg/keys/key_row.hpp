// A key's row of idempotency.keys as Datums, its identity, and the translation to
// and from the core's plain StoredRow: the one place where the glue turns stored
// values into the data the state machine (src/core/key_state.hpp) decides on.
#pragma once

#include <type_traits>

#include "core/key_state.hpp"
#include "pg/common/postgres.hpp"

extern "C" {
#include "utils/palloc.h"
}

namespace idempotency {

// Attribute numbers of idempotency.keys, as the install script creates it.
enum KeysColumn {
  kRole = 1,
  kAttempt,
  kFirstClaimedAt,
  kExpiresAt,
  kReapSlot,
  kScope,
  kKey,
  kFingerprint,
  kLease,
  kCheckpoint,
  kCheckpointData,
  kLeaseExpiresAt,
  kState,
  kResponse,
  kRoute,  // idempotency.routed_keys only: the key's routing value (Citus)
};
constexpr int kKeysColumns = kResponse;  // idempotency.keys
constexpr int kRowColumns = kRoute;      // idempotency.routed_keys: the same and the route

// What the library expects of each column (the store checks the table against it).
struct KeyColumn {
  const char* name;
  Oid type;  // InvalidOid: the extension's own idem_key
  bool byval;
  int16 length;
};
extern const KeyColumn kKeyColumns[kKeysColumns];

// A key's routing value in a distributed store: a value of the business table's
// distribution-column type (docs/design-citus.md). `type` InvalidOid: none given.
struct Route {
  Datum value;
  Oid type;
  int16 length;
  bool byval;

  bool given() const { return OidIsValid(type); }
};

// (role, scope, key): who owns a key and what it is; with a distributed store, also
// where it lives (the route is not part of its identity: one key, one route).
struct Identity {
  Oid role;
  text* scope;
  struct varlena* key;
  Route route;
};

// One row of idempotency.keys (or routed_keys) as plain datums, indexed by
// KeysColumn - 1; the route is NULL in a row of idempotency.keys.
struct KeyRow {
  Datum values[kRowColumns];
  bool isnull[kRowColumns];
  Route route_type;  // how to copy the route (its value unused)

  Datum get(KeysColumn c) const { return values[c - 1]; }
  bool null(KeysColumn c) const { return isnull[c - 1]; }
  void set(KeysColumn c, Datum d) { values[c - 1] = d, isnull[c - 1] = false; }
  void clear(KeysColumn c) { values[c - 1] = 0, isnull[c - 1] = true; }
};

// The row of a new key: its identity, route and reap slot; every other column NULL.
KeyRow identity_row(const Identity& id);
// The row as the core sees it (ERRCODE_DATA_CORRUPTED for an unknown state).
void read_row(const KeyRow& row, StoredRow* view);
// Sets every column the core decides from `next`.
void write_row(const StoredRow& next, KeyRow* row);
// A copy of `row` whose values live in `context`.
KeyRow* copy_row_into(const KeyRow& row, MemoryContext context);
// The same for a decided row and for an identity.
StoredRow copy_stored_row(const StoredRow& row, MemoryContext context);
Identity copy_identity(const Identity& id, MemoryContext context);
// Whether the row's route is `route` (a row without one has no other route).
bool same_route(const KeyRow& row, const Route& route);

// Kept on the glue's stack across calls that can ereport: no destructor to skip.
static_assert(std::is_trivially_destructible_v<KeyRow>);
static_assert(std::is_trivially_destructible_v<Identity>);
static_assert(std::is_trivially_destructible_v<StoredRow>);

// Handles of SQL values for the core, and back.
inline Opaque opaque(Datum value) { return static_cast<Opaque>(value); }
inline Datum datum(Opaque value) { return static_cast<Datum>(value); }

// The key's slot in the reaper's index (idempotency.keys.reap_slot), 0 to 15.
constexpr int16 kReapSlots = 16;
int16 reap_slot(const Identity& id);

}  // namespace idempotency
