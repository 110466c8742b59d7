// The store's catalog identity: the OIDs of idempotency.keys and its indexes, the
// check that the table has the columns this library expects, and the lock secret.
// Looked up once per backend and forgotten when the relcache says they changed.
#include "pg/keys/store_catalog.hpp"
#include "pg/common/open_relations.hpp"
#include "pg/citus/citus_forward.hpp"
#include "pg/citus/citus_meta.hpp"
#include "pg/common/errors.hpp"

#include "pg/common/table.hpp"

extern "C" {
#include "access/genam.h"
#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "catalog/pg_type.h"
#include "parser/parse_coerce.h"
#include "utils/builtins.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
}

namespace idempotency {

static StoreOids cached_oids;
static Oid cached_distributed;  // idempotency.routed_keys, looked up with cached_oids

// The local shards of routed_keys met so far, by shard id.
constexpr int kShardsCached = 64;
static StoreOids cached_shards[kShardsCached];
static int shards_cached;

static bool is_store_relation(const StoreOids& oids, Oid relid) {
  return relid == oids.heap || relid == oids.index || relid == oids.expires_index ||
         relid == oids.lease_index || relid == oids.leased_index || relid == oids.secret;
}

// The identity locks' hash key, read once per backend after the OIDs.
static LockSecret cached_secret;
static bool secret_loaded;

// Any invalidation while the store is not distributed in a server running Citus,
// since the creation of routed_keys (on a worker, by Citus) invalidates only
// routed_keys itself, whose OID is not known yet.
static void forget_oids(Datum, Oid relid) {
  bool all = relid == InvalidOid || relid == cached_distributed ||
             (!OidIsValid(cached_distributed) && citus_preloaded());
  if (all || is_store_relation(cached_oids, relid)) {
    cached_oids = StoreOids{};
    cached_distributed = InvalidOid;
    secret_loaded = false;
  }
  for (int i = shards_cached - 1; i >= 0; i--)
    if (all || is_store_relation(cached_shards[i], relid))
      cached_shards[i] = cached_shards[--shards_cached];
}

// idempotency.keys' columns, and for routed_keys the route after them.
static void check_layout(Oid heap, Oid route_type) {
  ColumnSpec columns[kRowColumns];
  for (int i = 0; i < kKeysColumns; i++) columns[i] = {kKeyColumns[i].name, kKeyColumns[i].type};
  columns[kRoute - 1] = {"route", route_type};
  if (OidIsValid(route_type)) columns[kRole - 1] = {"role", InvalidOid, "idem_role"};
  check_columns(heap, columns, OidIsValid(route_type) ? kRowColumns : kKeysColumns);
}

// The key column's equality function, as the primary key's operator family defines
// it; *index becomes the index now of that name (REINDEX CONCURRENTLY).
static RegProcedure key_equality(Oid* index) {
  Oid opened;
  Relation index_rel = open_current(*index, AccessShareLock, &opened);
  *index = opened;
  const int key_column = 2;  // 0-based in the index (role, scope, key[, route])
  Oid opfamily = index_rel->rd_opfamily[key_column];
  Oid keytype = index_rel->rd_opcintype[key_column];
  index_close(index_rel, AccessShareLock);
  Oid eq = get_opfamily_member(opfamily, keytype, keytype, BTEqualStrategyNumber);
  return get_opcode(eq);
}

const StoreOids& store_oids() {
  static bool callback_registered = false;
  if (OidIsValid(cached_oids.heap)) return cached_oids;
  if (!callback_registered) {
    (void)citus_preloaded();  // worked out here, not inside the callback
    on_relcache_invalidation(forget_oids);
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
  check_layout(oids.heap, InvalidOid);
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
  oids.key_eq = key_equality(&oids.index);
  Oid distributed = relation("routed_keys");
  cached_oids = oids;
  cached_distributed = distributed;
  return cached_oids;
}

Oid distributed_store() {
  (void)store_oids();
  return cached_distributed;
}

// The relations of routed_keys' shard `shardid`, named as Citus names them
// (relay/relay_event_utility.c AppendShardIdToName: the name, "_", the shard id).
static StoreOids shard_oids(int64 shardid, Oid route_type) {
  for (int i = 0; i < shards_cached; i++)
    if (cached_shards[i].shardid == shardid) return cached_shards[i];
  auto name = [shardid](const char* base) {
    return static_cast<const char*>(psprintf("%s_" INT64_FORMAT, base, shardid));
  };
  StoreOids oids{extension_relation(name("routed_keys")),
                 extension_relation(name("routed_keys_pkey")),
                 extension_relation(name("routed_keys_expires_at_idx")),
                 extension_relation(name("routed_keys_lease_expires_at_idx")),
                 extension_relation(name("routed_keys_leased_idx")),
                 store_oids().secret,
                 InvalidOid,
                 shardid};
  if (!OidIsValid(oids.heap) || !OidIsValid(oids.index) || !OidIsValid(oids.expires_index) ||
      !OidIsValid(oids.lease_index) || !OidIsValid(oids.leased_index))
    ereport(ERROR, errcode(ERRCODE_IDEM_NOT_LOCAL),
            errmsg("shard " INT64_FORMAT " of the key store is placed on this node but its "
                   "table is not here",
                   shardid),
            errhint("Check the shard's placement with citus_shards."));
  check_layout(oids.heap, route_type);
  oids.key_eq = key_equality(&oids.index);
  if (shards_cached == kShardsCached) shards_cached--;  // full: replace the last
  cached_shards[shards_cached++] = oids;
  return oids;
}

// The route as a value of the distribution column's type, as an implicit cast (or a
// literal's input function) would make it: a domain's constraints checked too (23514),
// so that no route the business table could not hold is stored (a shard's next move,
// whose copy checks them, would fail on it).
static void coerce_route(Route* route, const CitusColumn& column) {
  static void* domain_state;  // domain_check's, for the column's domain
  Oid want = column.type;
  if (route->type != want) {
    bool literal = route->type == UNKNOWNOID;  // a domain's input function checks it
    Oid function;
    CoercionPathType path =
        route->type == UNKNOWNOID
            ? COERCION_PATH_COERCEVIAIO
            : find_coercion_pathway(want, route->type, COERCION_IMPLICIT, &function);
    switch (path) {
      case COERCION_PATH_RELABELTYPE: break;
      case COERCION_PATH_FUNC: route->value = OidFunctionCall1(function, route->value); break;
      case COERCION_PATH_COERCEVIAIO:
        if (route->type == UNKNOWNOID) {
          Oid input, param;
          getTypeInputInfo(want, &input, &param);
          route->value = OidInputFunctionCall(input, DatumGetCString(route->value), param, -1);
          break;
        }
        [[fallthrough]];
      default:
        ereport(ERROR, errcode(ERRCODE_DATATYPE_MISMATCH),
                errmsg("the routing value is of type %s, the key store's route of type %s",
                       format_type_be(route->type), format_type_be(want)),
                errhint("Pass the business table's distribution value, or cast it: route => "
                        "value::%s.",
                        format_type_be(want)));
    }
    if (!literal && get_typtype(want) == TYPTYPE_DOMAIN)
      domain_check(route->value, false, want, &domain_state, CacheMemoryContext);
  }
  *route = Route{route->value, want, column.length, column.byval};
}

StoreOids store_for_key(Identity* id) {
  const StoreOids local = store_oids();
  Oid distributed = cached_distributed;
  if (!OidIsValid(distributed)) {
    if (id->route.given())
      ereport(ERROR, errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
              errmsg("the key store is not distributed, so a key takes no routing value"),
              errhint("Distribute it with idem_distribute(business table) on the Citus "
                      "coordinator, or call without route."));
    return local;
  }
  if (!id->route.given())
    ereport(ERROR, errcode(ERRCODE_INVALID_PARAMETER_VALUE),
            errmsg("the key store is distributed: a key needs its routing value"),
            errhint("Pass the business row's distribution value: route => ..."));
  CitusColumn column;
  if (!citus_column(distributed, &column))
    ereport(ERROR, errcode(ERRCODE_IDEM_NOT_LOCAL),
            errmsg("this node has no Citus metadata for the distributed key store"),
            errhint("Call on the coordinator or on a worker with Citus metadata "
                    "(citus_add_node syncs it)."));
  coerce_route(&id->route, column);
  CitusRoute route = citus_lock_route(distributed, id->route.value, column.type);
  if (!route.local)
    ereport(ERROR, errcode(ERRCODE_IDEM_NOT_LOCAL),
            errmsg("the key's shard " INT64_FORMAT " of the key store is on %s, not on this node",
                   route.shardid, citus_shard_node(route.shardid)),
            errdetail("A key is stored in the shard of its routing value, beside the business "
                      "rows of that value, and only where that shard is."),
            errhint("After a shard move, retry. Otherwise Citus could not run the call on the "
                    "shard's node (a shard with replicas, or a node without Citus metadata): "
                    "check the shard's placements with citus_shards."));
  return shard_oids(route.shardid, column.type);
}

CitusRoute routed_shard(Oid table, Route* route) {
  CitusColumn column;
  if (!citus_column(table, &column))
    ereport(ERROR, errcode(ERRCODE_IDEM_NOT_LOCAL),
            errmsg("this node has no Citus metadata for %s", get_rel_name(table)),
            errhint("Call on the coordinator or on a worker with Citus metadata "
                    "(citus_add_node syncs it)."));
  coerce_route(route, column);
  return citus_lock_route(table, route->value, column.type);
}

bool key_elsewhere(Identity* id, FunctionCallInfo fcinfo) {
  (void)store_oids();
  Oid distributed = cached_distributed;
  CitusColumn column;
  if (!OidIsValid(distributed) || !id->route.given() || !citus_column(distributed, &column))
    return false;  // store_for_key says what is wrong
  coerce_route(&id->route, column);
  CitusRoute route = citus_lock_route(distributed, id->route.value, column.type);
  return !route.local && citus_may_forward(fcinfo);
}

int local_stores(StoreOids** stores) {
  const StoreOids local = store_oids();
  Oid distributed = cached_distributed;
  int64* shardids = nullptr;
  int nshards = OidIsValid(distributed) ? citus_local_shards(distributed, &shardids) : 0;
  *stores = static_cast<StoreOids*>(palloc(sizeof(StoreOids) * (nshards + 1)));
  (*stores)[0] = local;
  CitusColumn column;
  (void)citus_column(distributed, &column);
  for (int i = 0; i < nshards; i++) (*stores)[i + 1] = shard_oids(shardids[i], column.type);
  return nshards + 1;
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
