// The store's catalog identity: the OIDs of idempotency.keys and its indexes, the
// check that the table has the columns this library expects, and the lock secret.
// Looked up once per backend and forgotten when the relcache says they changed.
#include "pg/keys/store_catalog.hpp"
#include "pg/common/open_relations.hpp"
#include "pg/citus/citus_meta.hpp"

#include "pg/common/table.hpp"

extern "C" {
#include "access/genam.h"
#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/snapmgr.h"
}

namespace idempotency {

static StoreOids cached_oids;

// The identity locks' hash key, read once per backend after the OIDs.
static LockSecret cached_secret;
static bool secret_loaded;

static void forget_oids(Datum, Oid relid) {
  if (relid == InvalidOid || relid == cached_oids.heap || relid == cached_oids.index ||
      relid == cached_oids.expires_index || relid == cached_oids.lease_index ||
      relid == cached_oids.leased_index || relid == cached_oids.secret) {
    cached_oids = StoreOids{};
    secret_loaded = false;
  }
}

static void check_layout(Oid heap) {
  ColumnSpec columns[kKeysColumns];
  for (int i = 0; i < kKeysColumns; i++) columns[i] = {kKeyColumns[i].name, kKeyColumns[i].type};
  check_columns(heap, columns, kKeysColumns);
}

const StoreOids& store_oids() {
  static bool callback_registered = false;
  if (OidIsValid(cached_oids.heap)) return cached_oids;
  if (!callback_registered) {
    CacheRegisterRelcacheCallback(forget_oids, 0);
    callback_registered = true;
  }
  auto relation = extension_relation;
  StoreOids oids{relation("keys"),
                 relation("keys_pkey"),
                 relation("keys_expires_at_idx"),
                 relation("keys_lease_expires_at_idx"),
                 relation("keys_leased_idx"),
                 relation("lock_secret"),
                 InvalidOid};
  if (!OidIsValid(oids.heap) || !OidIsValid(oids.index) || !OidIsValid(oids.expires_index) ||
      !OidIsValid(oids.lease_index))
    ereport(ERROR, errcode(ERRCODE_UNDEFINED_TABLE),
            errmsg("the idempotency key store does not exist in this database"),
            errhint("Run CREATE EXTENSION idempotency."));
  check_layout(oids.heap);
  // Distributed with Citus by hand (create_distributed_table): this table is then a
  // shell on the coordinator, or one node's copy, and a key written here would be where
  // a retry routed by Citus does not look. Refused until the distributed store of
  // docs/design-citus.md exists. Checked again after every relcache invalidation of
  // the table, which Citus sends when it distributes or undistributes it.
  if (citus_table(oids.heap))
    ereport(ERROR, errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
            errmsg("the key store idempotency.keys is distributed with Citus, which this version "
                   "of the extension does not support"),
            errdetail("Keys would be stored in this node's own table, where a retry that Citus "
                      "routes to another node would not find them."),
            errhint("Undistribute it; undistribute_table refuses a table of an extension, so: "
                    "ALTER EXTENSION idempotency DROP TABLE idempotency.keys; "
                    "SELECT undistribute_table('idempotency.keys'); "
                    "ALTER EXTENSION idempotency ADD TABLE idempotency.keys;"));
  // The key column's equality function, as the index's operator family defines it.
  Oid opened;  // the index now of that name (REINDEX CONCURRENTLY)
  Relation index_rel = open_current(oids.index, AccessShareLock, &opened);
  oids.index = opened;
  const int key_column = 2;  // 0-based in the index (role, scope, key)
  Oid opfamily = index_rel->rd_opfamily[key_column];
  Oid keytype = index_rel->rd_opcintype[key_column];
  index_close(index_rel, AccessShareLock);
  Oid eq = get_opfamily_member(opfamily, keytype, keytype, BTEqualStrategyNumber);
  oids.key_eq = get_opcode(eq);
  cached_oids = oids;
  return cached_oids;
}

LockSecret store_lock_secret() {
  const StoreOids oids = store_oids();
  if (secret_loaded) return cached_secret;
  LockSecret secret{};
  if (OidIsValid(oids.secret)) {  // absent before ALTER EXTENSION idempotency UPDATE to 1.1
    Relation rel = table_open(oids.secret, AccessShareLock);
    Snapshot snapshot = RegisterSnapshot(GetLatestSnapshot());
    TableScanDesc scan = table_beginscan(rel, snapshot, 0, nullptr);
    HeapTuple tuple = heap_getnext(scan, ForwardScanDirection);
    if (tuple != nullptr) {
      bool isnull;
      Datum value = heap_getattr(tuple, 1, RelationGetDescr(rel), &isnull);
      bytea* bytes = isnull ? nullptr : DatumGetByteaPP(value);
      if (bytes != nullptr && VARSIZE_ANY_EXHDR(bytes) == sizeof(secret.bytes)) {
        memcpy(secret.bytes, VARDATA_ANY(bytes), sizeof(secret.bytes));
        secret.size = sizeof(secret.bytes);
      }
    }
    table_endscan(scan);
    UnregisterSnapshot(snapshot);
    table_close(rel, AccessShareLock);
    if (secret.size == 0)
      ereport(ERROR, errcode(ERRCODE_DATA_CORRUPTED),
              errmsg("idempotency.lock_secret holds no 32-byte secret"));
  }
  // Loaded after the invalidations that opening the table accepted: only now is the
  // cache known to belong to the store of this call.
  if (OidIsValid(cached_oids.heap)) {
    cached_secret = secret;
    secret_loaded = true;
  }
  return secret;
}

}  // namespace idempotency
