#include "pg/keys/key_row.hpp"

extern "C" {
#include "catalog/pg_type.h"
#include "common/hashfn.h"
#include "utils/datum.h"
#include "utils/timestamp.h"
}

namespace idempotency {

const KeyColumn kKeyColumns[kKeysColumns] = {
    {"role", REGROLEOID, true, 4},
    {"attempt", INT4OID, true, 4},
    {"first_claimed_at", TIMESTAMPTZOID, true, 8},
    {"expires_at", TIMESTAMPTZOID, true, 8},
    {"reap_slot", INT2OID, true, 2},
    {"scope", TEXTOID, false, -1},
    {"key", InvalidOid, false, -1},
    {"fingerprint", BYTEAOID, false, -1},
    {"lease", INTERVALOID, false, 16},
    {"checkpoint", TEXTOID, false, -1},
    {"checkpoint_data", JSONBOID, false, -1},
    {"lease_expires_at", TIMESTAMPTZOID, true, 8},
    {"state", CHAROID, true, 1},
    {"response", JSONBOID, false, -1},
};

int16 reap_slot(const Identity& id) {
  return hash_bytes(reinterpret_cast<const unsigned char*>(VARDATA_ANY(id.key)),
                    VARSIZE_ANY_EXHDR(id.key)) %
         kReapSlots;
}

KeyRow identity_row(const Identity& id) {
  KeyRow row;
  for (int c = 1; c <= kRowColumns; c++) row.clear(static_cast<KeysColumn>(c));
  row.route_type = id.route;
  if (id.route.given()) row.set(kRoute, id.route.value);
  row.set(kRole, ObjectIdGetDatum(id.role));
  row.set(kScope, PointerGetDatum(id.scope));
  row.set(kKey, PointerGetDatum(id.key));
  row.set(kReapSlot, Int16GetDatum(reap_slot(id)));
  return row;
}

StoredRow copy_stored_row(const StoredRow& row, MemoryContext context) {
  MemoryContext caller = MemoryContextSwitchTo(context);
  auto copy = [](Opaque value, bool byval, int16 length) {
    return value == 0 ? 0 : opaque(datumCopy(datum(value), byval, length));
  };
  StoredRow copied = row;
  copied.fingerprint_value = copy(row.fingerprint_value, false, -1);
  if (row.fingerprint) {
    bytea* fp = DatumGetByteaPP(datum(copied.fingerprint_value));
    copied.fingerprint = std::string_view(VARDATA_ANY(fp), VARSIZE_ANY_EXHDR(fp));
  }
  copied.lease = copy(row.lease, false, sizeof(Interval));
  copied.checkpoint = copy(row.checkpoint, false, -1);
  copied.checkpoint_data = copy(row.checkpoint_data, false, -1);
  copied.response = copy(row.response, false, -1);
  MemoryContextSwitchTo(caller);
  return copied;
}

Identity copy_identity(const Identity& id, MemoryContext context) {
  MemoryContext caller = MemoryContextSwitchTo(context);
  Identity copied = id;
  copied.scope = static_cast<text*>(PG_DETOAST_DATUM_COPY(PointerGetDatum(id.scope)));
  copied.key = PG_DETOAST_DATUM_COPY(PointerGetDatum(id.key));
  if (id.route.given())
    copied.route.value = datumCopy(id.route.value, id.route.byval, id.route.length);
  MemoryContextSwitchTo(caller);
  return copied;
}

bool same_route(const KeyRow& row, const Route& route) {
  if (row.null(kRoute) || !route.given()) return true;
  return datumIsEqual(row.get(kRoute), route.value, route.byval, route.length);
}

static Opaque opaque_or_null(const KeyRow& row, KeysColumn c) {
  return row.null(c) ? 0 : opaque(row.get(c));
}

void read_row(const KeyRow& row, StoredRow* view) {
  *view = StoredRow{};
  if (!parse_state(DatumGetChar(row.get(kState)), &view->state))
    ereport(ERROR, errcode(ERRCODE_DATA_CORRUPTED),
            errmsg("idempotency.keys holds a row with an unknown state \"%c\"",
                   DatumGetChar(row.get(kState))));
  view->attempt = DatumGetInt32(row.get(kAttempt));
  view->first_claimed_at = DatumGetTimestampTz(row.get(kFirstClaimedAt));
  view->expires_at = DatumGetTimestampTz(row.get(kExpiresAt));
  if (!row.null(kLeaseExpiresAt))
    view->lease_expires_at = DatumGetTimestampTz(row.get(kLeaseExpiresAt));
  if (!row.null(kFingerprint)) {
    bytea* fp = DatumGetByteaPP(row.get(kFingerprint));
    view->fingerprint = std::string_view(VARDATA_ANY(fp), VARSIZE_ANY_EXHDR(fp));
    view->fingerprint_value = opaque(row.get(kFingerprint));
  }
  view->lease = opaque_or_null(row, kLease);
  view->checkpoint = opaque_or_null(row, kCheckpoint);
  view->checkpoint_data = opaque_or_null(row, kCheckpointData);
  view->response = opaque_or_null(row, kResponse);
}

static void set_or_clear(KeyRow* row, KeysColumn c, Opaque value) {
  if (value == 0)
    row->clear(c);
  else
    row->set(c, datum(value));
}

void write_row(const StoredRow& next, KeyRow* row) {
  row->set(kState, CharGetDatum(static_cast<char>(next.state)));
  row->set(kAttempt, Int32GetDatum(next.attempt));
  row->set(kFirstClaimedAt, TimestampTzGetDatum(next.first_claimed_at));
  row->set(kExpiresAt, TimestampTzGetDatum(next.expires_at));
  if (next.lease_expires_at)
    row->set(kLeaseExpiresAt, TimestampTzGetDatum(*next.lease_expires_at));
  else
    row->clear(kLeaseExpiresAt);
  set_or_clear(row, kFingerprint, next.fingerprint ? next.fingerprint_value : 0);
  set_or_clear(row, kLease, next.lease);
  set_or_clear(row, kCheckpoint, next.checkpoint);
  set_or_clear(row, kCheckpointData, next.checkpoint_data);
  set_or_clear(row, kResponse, next.response);
}

KeyRow* copy_row_into(const KeyRow& row, MemoryContext context) {
  MemoryContext caller = MemoryContextSwitchTo(context);
  KeyRow* copy = static_cast<KeyRow*>(palloc(sizeof(KeyRow)));
  for (int i = 0; i < kKeysColumns; i++) {
    copy->isnull[i] = row.isnull[i];
    copy->values[i] =
        row.isnull[i] ? 0 : datumCopy(row.values[i], kKeyColumns[i].byval, kKeyColumns[i].length);
  }
  copy->route_type = row.route_type;
  copy->isnull[kRoute - 1] = row.null(kRoute);
  copy->values[kRoute - 1] =
      row.null(kRoute) ? 0
                       : datumCopy(row.get(kRoute), row.route_type.byval, row.route_type.length);
  MemoryContextSwitchTo(caller);
  return copy;
}

}  // namespace idempotency
