// Citus's catalog, read like PostgreSQL's: see citus_meta.hpp. Column numbers are
// those of Citus 14.0.1's include/distributed/pg_dist_{partition,shard,placement,
// local_group}.h.
#include "pg/citus/citus_meta.hpp"
#include "pg/common/compat.hpp"
#include "pg/common/errors.hpp"
#include "pg/common/open_relations.hpp"

#include <algorithm>

extern "C" {
#include "access/genam.h"
#include "access/htup_details.h"
#include "access/skey.h"
#include "access/stratnum.h"
#include "access/table.h"
#include "catalog/namespace.h"
#include "catalog/pg_namespace.h"
#include "catalog/pg_proc.h"
#include "catalog/pg_type.h"
#include "miscadmin.h"
#include "nodes/primnodes.h"
#include "storage/lmgr.h"
#include "storage/lock.h"
#include "storage/lockdefs.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/datum.h"
#include "utils/fmgroids.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/syscache.h"
#include "utils/typcache.h"
#include "utils/varlena.h"
}

namespace idempotency {

namespace {

constexpr AttrNumber kPartitionLogicalRelid = 1;  // pg_dist_partition
constexpr AttrNumber kPartitionMethod = 2;
constexpr AttrNumber kPartitionKey = 3;
constexpr AttrNumber kPartitionColocation = 4;
constexpr AttrNumber kShardLogicalRelid = 1;  // pg_dist_shard
constexpr AttrNumber kShardId = 2;
constexpr AttrNumber kShardMin = 5;
constexpr AttrNumber kShardMax = 6;
constexpr AttrNumber kPlacementShardId = 2;  // pg_dist_placement
constexpr AttrNumber kPlacementGroup = 5;
constexpr AttrNumber kLocalGroupId = 1;  // pg_dist_local_group
constexpr AttrNumber kNodeGroup = 2;     // pg_dist_node
constexpr AttrNumber kNodeName = 3;
constexpr AttrNumber kNodePort = 4;
// The advisory lock class of a co-location group's shard metadata
// (include/distributed/resource_lock.h:44).
constexpr uint16 kColocatedShardsMetadataLockClass = 8;

struct Shard {
  int32 min;
  int32 max;
  int64 shardid;
  int32 group;
  bool local;
};

// One distributed table's routing, in its own memory context.
struct Entry {
  Oid relid;  // InvalidOid: unused
  bool valid;
  bool distributed;  // hash-distributed; false: nothing else is filled in
  MemoryContext context;
  uint32 colocation;
  Oid column_type;
  Oid column_collation;
  int16 column_length;
  bool column_byval;
  FmgrInfo hash;
  int nshards;
  Shard* shards;  // sorted by min
  // The relay's routing values, one per shard (citus_shard_values), found once.
  bool routes_searched;
  Datum* routes;  // by shard; with has_route
  bool* has_route;
  void* domain_check;  // domain_accepts's cache of the column's domain constraints
};

constexpr int kEntries = 8;
Entry entries[kEntries];
// Counts invalidations, so that a cache built while one arrived is built again.
uint64 invalidations;
Oid local_group_relid;
Oid node_relid;

Oid catalog_relid(const char* name) { return get_relname_relid(name, PG_CATALOG_NAMESPACE); }

void forget(Datum, Oid relid) {
  bool all = relid == InvalidOid || relid == local_group_relid || relid == node_relid;
  for (Entry& entry : entries)
    if (entry.valid && (all || entry.relid == relid)) entry.valid = false;
  invalidations++;
}

void register_callback() { on_relcache_invalidation(forget); }

// Scans `catalog` through `index` for rows whose `attno` equals `value` (an int8 when
// `int8`, else an OID), calling `row` for each.
template <typename Row>
void scan(Oid catalog, const char* index_name, AttrNumber attno, Datum value, bool int8, Row row) {
  Relation rel = table_open(catalog, AccessShareLock);
  Oid index = catalog_relid(index_name);
  ScanKeyData key;
  ScanKeyInit(&key, attno, BTEqualStrategyNumber, int8 ? F_INT8EQ : F_OIDEQ, value);
  SysScanDesc sscan = systable_beginscan(rel, index, OidIsValid(index), nullptr, 1, &key);
  HeapTuple tuple;
  while (HeapTupleIsValid(tuple = systable_getnext(sscan))) row(tuple, RelationGetDescr(rel));
  systable_endscan(sscan);
  table_close(rel, AccessShareLock);
}

int32 local_group() {
  Oid catalog = catalog_relid("pg_dist_local_group");
  if (!OidIsValid(catalog)) return -1;
  Relation rel = table_open(catalog, AccessShareLock);
  SysScanDesc sscan = systable_beginscan(rel, InvalidOid, false, nullptr, 0, nullptr);
  HeapTuple tuple = systable_getnext(sscan);
  int32 group = -1;
  bool isnull = true;
  if (HeapTupleIsValid(tuple)) {
    Datum value = heap_getattr(tuple, kLocalGroupId, RelationGetDescr(rel), &isnull);
    if (!isnull) group = DatumGetInt32(value);
  }
  systable_endscan(sscan);
  table_close(rel, AccessShareLock);
  return group;
}

[[noreturn]] void not_hash_distributed(Oid relid) {
  ereport(ERROR, errcode(ERRCODE_INVALID_PARAMETER_VALUE),
          errmsg("\"%s\" is not a hash-distributed Citus table", get_rel_name(relid)));
}

// Fills `entry` for `relid` from the catalogs, in a fresh context; a table that is not
// hash-distributed (or no Citus) is remembered as such.
void build(Entry* entry, Oid relid) {
  if (entry->context != nullptr) MemoryContextDelete(entry->context);
  *entry = Entry{};
  entry->relid = relid;
  Oid partition = catalog_relid("pg_dist_partition");
  if (!OidIsValid(partition)) {
    entry->valid = true;
    return;
  }
  local_group_relid = catalog_relid("pg_dist_local_group");
  node_relid = catalog_relid("pg_dist_node");
  bool found = false;
  char method = 0;
  uint32 colocation = 0;
  Var* column = nullptr;
  scan(partition, "pg_dist_partition_logical_relid_index", kPartitionLogicalRelid,
       ObjectIdGetDatum(relid), false, [&](HeapTuple tuple, TupleDesc desc) {
         bool isnull;
         found = true;
         method = DatumGetChar(heap_getattr(tuple, kPartitionMethod, desc, &isnull));
         Datum key = heap_getattr(tuple, kPartitionKey, desc, &isnull);
         if (!isnull) {
           Node* node = static_cast<Node*>(stringToNode(TextDatumGetCString(key)));
           if (node != nullptr && IsA(node, Var)) column = reinterpret_cast<Var*>(node);
         }
         Datum value = heap_getattr(tuple, kPartitionColocation, desc, &isnull);
         colocation = isnull ? 0 : DatumGetUInt32(value);
       });
  if (!found || method != 'h' || column == nullptr) {
    entry->valid = true;
    return;
  }
  TypeCacheEntry* type = lookup_type_cache(column->vartype, TYPECACHE_HASH_PROC_FINFO);
  if (!OidIsValid(type->hash_proc_finfo.fn_oid))
    ereport(ERROR, errcode(ERRCODE_UNDEFINED_FUNCTION),
            errmsg("type %s has no hash function", format_type_be(column->vartype)));

  // Under the caller's context until complete, so that an error frees it.
  MemoryContext context = AllocSetContextCreate(CurrentMemoryContext, "idempotency citus routing",
                                                ALLOCSET_SMALL_SIZES);
  MemoryContext old = MemoryContextSwitchTo(context);
  Entry fresh{};
  fresh.relid = relid;
  fresh.context = context;
  fresh.colocation = colocation;
  fresh.column_type = column->vartype;
  fresh.column_collation = column->varcollid;
  get_typlenbyval(column->vartype, &fresh.column_length, &fresh.column_byval);
  fmgr_info_copy(&fresh.hash, &type->hash_proc_finfo, context);
  int capacity = 16;
  fresh.shards = static_cast<Shard*>(palloc(sizeof(Shard) * capacity));
  scan(catalog_relid("pg_dist_shard"), "pg_dist_shard_logical_relid_index", kShardLogicalRelid,
       ObjectIdGetDatum(relid), false, [&](HeapTuple tuple, TupleDesc desc) {
         bool min_null, max_null, isnull;
         Datum min = heap_getattr(tuple, kShardMin, desc, &min_null);
         Datum max = heap_getattr(tuple, kShardMax, desc, &max_null);
         if (min_null || max_null) return;
         if (fresh.nshards == capacity) {
           capacity *= 2;
           fresh.shards = static_cast<Shard*>(repalloc(fresh.shards, sizeof(Shard) * capacity));
         }
         Shard& shard = fresh.shards[fresh.nshards++];
         shard.shardid = DatumGetInt64(heap_getattr(tuple, kShardId, desc, &isnull));
         shard.min = pg_strtoint32(TextDatumGetCString(min));
         shard.max = pg_strtoint32(TextDatumGetCString(max));
         shard.group = -1;
         shard.local = false;
       });
  std::sort(fresh.shards, fresh.shards + fresh.nshards,
            [](const Shard& a, const Shard& b) { return a.min < b.min; });
  int32 here = local_group();
  Oid placement = catalog_relid("pg_dist_placement");
  for (int i = 0; i < fresh.nshards; i++) {
    Shard& shard = fresh.shards[i];
    scan(placement, "pg_dist_placement_shardid_index", kPlacementShardId,
         Int64GetDatum(shard.shardid), true, [&](HeapTuple tuple, TupleDesc desc) {
           bool isnull;
           int32 group = DatumGetInt32(heap_getattr(tuple, kPlacementGroup, desc, &isnull));
           if (shard.group < 0 || group == here) shard.group = group;
           if (group == here) shard.local = true;
         });
  }
  MemoryContextSwitchTo(old);
  MemoryContextSetParent(context, CacheMemoryContext);
  fresh.valid = fresh.distributed = true;
  *entry = fresh;
}

Entry* lookup(Oid relid) {
  register_callback();
  Entry* slot = nullptr;
  for (Entry& entry : entries) {
    if (entry.relid == relid) {
      slot = &entry;
      break;
    }
    if (slot == nullptr && (entry.relid == InvalidOid || !entry.valid)) slot = &entry;
  }
  if (slot == nullptr) slot = &entries[relid % kEntries];  // full: evict one
  // Built again when an invalidation arrived while building (opening a catalog
  // accepts invalidation messages).
  for (int attempt = 0; !(slot->relid == relid && slot->valid); attempt++) {
    uint64 before = invalidations;
    build(slot, relid);
    if (invalidations != before && attempt < 10) slot->valid = false;
  }
  return slot;
}

CitusRoute route_in(const Entry* entry, Datum value) {
  int32 hash = DatumGetInt32(
      FunctionCall1Coll(const_cast<FmgrInfo*>(&entry->hash), entry->column_collation, value));
  int low = 0, high = entry->nshards - 1;
  while (low <= high) {
    int middle = low + (high - low) / 2;
    const Shard& shard = entry->shards[middle];
    if (hash < shard.min) {
      high = middle - 1;
    } else if (hash > shard.max) {
      low = middle + 1;
    } else {
      return CitusRoute{shard.shardid, middle, entry->colocation, shard.group, shard.local};
    }
  }
  ereport(ERROR, errcode(ERRCODE_DATA_EXCEPTION),
          errmsg("no shard of \"%s\" holds hash value %d", get_rel_name(entry->relid), hash));
}

}  // namespace

bool citus_table(Oid relid) {
  Oid catalog = catalog_relid("pg_dist_partition");
  if (!OidIsValid(catalog)) return false;  // Citus is not installed in this database
  bool found = false;
  scan(catalog, "pg_dist_partition_logical_relid_index", kPartitionLogicalRelid,
       ObjectIdGetDatum(relid), false, [&found](HeapTuple, TupleDesc) { found = true; });
  return found;
}

CitusRoute citus_route(Oid relid, Datum value, Oid value_type) {
  const Entry* entry = lookup(relid);
  if (!entry->distributed) not_hash_distributed(relid);
  if (value_type != entry->column_type)
    ereport(ERROR, errcode(ERRCODE_DATATYPE_MISMATCH),
            errmsg("the routing value is of type %s, the distribution column of \"%s\" of type %s",
                   format_type_be(value_type), get_rel_name(relid),
                   format_type_be(entry->column_type)));
  return route_in(entry, value);
}

CitusRoute citus_lock_route(Oid relid, Datum value, Oid value_type) {
  CitusRoute route = citus_route(relid, value, value_type);
  for (int attempt = 0;; attempt++) {
    LOCKTAG tag;
    SET_LOCKTAG_ADVISORY(tag, MyDatabaseId, static_cast<uint32>(route.shard_index),
                         route.colocation, kColocatedShardsMetadataLockClass);
    (void)LockAcquire(&tag, ShareLock, false, false);
    // An advisory lock accepts no invalidations by itself (LockRelationOid does).
    AcceptInvalidationMessages();
    CitusRoute now = citus_route(relid, value, value_type);
    // The same lock still covers it (a split renumbers the shards), or it is held
    // already: then the metadata cannot change under us any more.
    if ((now.shard_index == route.shard_index && now.colocation == route.colocation) ||
        attempt >= 10)
      return now;
    route = now;
  }
}

bool citus_is_coordinator() { return local_group() == 0; }

bool citus_preloaded() {
  static int preloaded = -1;  // shared_preload_libraries is fixed for the server's life
  if (preloaded >= 0) return preloaded;
  char* names = pstrdup(shared_preload_libraries_string);
  List* libraries;
  preloaded = 0;
  if (SplitDirectoriesString(names, ',', &libraries)) {
    ListCell* cell;
    foreach (cell, libraries) {
      const char* library = static_cast<const char*>(lfirst(cell));
      const char* separator = last_dir_separator(library);
      const char* base = separator == nullptr ? library : separator + 1;
      if (strcmp(base, "citus") == 0 || strcmp(base, "citus" DLSUFFIX) == 0) preloaded = 1;
    }
  }
  list_free_deep(libraries);
  pfree(names);
  return preloaded;
}

bool citus_column(Oid relid, CitusColumn* column) {
  const Entry* entry = lookup(relid);
  *column = CitusColumn{entry->column_type, entry->column_length, entry->column_byval};
  return entry->distributed;
}

namespace {

// Where the relay's routing values come from: values of the column's base type, through
// its input function, that pass a domain's constraints.
struct RouteCandidates {
  Oid base;  // the column's type, or a domain's base type
  bool domain;
  bool signed_number;  // tried with both signs: a domain may accept negative values only
  Oid input;
  Oid ioparam;
};

RouteCandidates route_candidates(const Entry* entry) {
  RouteCandidates candidates{};
  candidates.base = getBaseType(entry->column_type);
  candidates.domain = candidates.base != entry->column_type;
  char category;
  bool preferred;
  get_type_category_preferred(candidates.base, &category, &preferred);
  if (candidates.base != UUIDOID && category != TYPCATEGORY_NUMERIC &&
      category != TYPCATEGORY_STRING)
    ereport(ERROR, errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
            errmsg("the relay serves a distributed key store routed by a number, a string or "
                   "a uuid, not by %s",
                   format_type_be(entry->column_type)));
  switch (candidates.base) {
    case INT2OID:
    case INT4OID:
    case INT8OID:
    case NUMERICOID:
    case FLOAT4OID:
    case FLOAT8OID: candidates.signed_number = true; break;
    default: break;
  }
  getTypeInputInfo(candidates.base, &candidates.input, &candidates.ioparam);
  return candidates;
}

// Whether `value` may be passed as a routing value: a domain's constraints (which Citus
// checks on both ends of a delegated call) accept it.
bool routable(Entry* entry, const RouteCandidates& candidates, Datum value) {
  return !candidates.domain ||
         compat::domain_accepts(value, entry->column_type, &entry->domain_check, entry->context);
}

// Fills entry->routes with the first candidate found in each shard: "0", "1", "2", ...
// ("0", "-1", "1", "-2", ... for a signed number; a uuid: ...-000000000000, ...-000000000001).
// Hash values spread evenly: a shard of 1/n of the range is met within a few times n
// tries; the bound is for ranges made tiny by splits, and a domain's check that refuses
// every candidate for long gives up early (citus_shard_values then asks the shards).
void search_routes(Entry* entry) {
  constexpr int64 kTries = 1000000;
  constexpr int64 kRefusedInARow = 10000;
  RouteCandidates candidates = route_candidates(entry);
  int n = entry->nshards;
  MemoryContext old = MemoryContextSwitchTo(entry->context);
  if (entry->routes == nullptr) {
    entry->routes = static_cast<Datum*>(palloc0(sizeof(Datum) * Max(n, 1)));
    entry->has_route = static_cast<bool*>(palloc0(sizeof(bool) * Max(n, 1)));
  }
  MemoryContext trials =
      AllocSetContextCreate(entry->context, "idempotency routing values", ALLOCSET_SMALL_SIZES);
  MemoryContextSwitchTo(trials);
  int missing = 0;
  for (int i = 0; i < n; i++) missing += entry->has_route[i] ? 0 : 1;
  int64 limit = candidates.base == INT2OID ? 2 * static_cast<int64>(PG_INT16_MAX) : kTries;
  int64 refused = 0;
  for (int64 i = 0; missing > 0 && i <= limit && refused < kRefusedInARow; i++) {
    char text[48];
    int64 number = candidates.signed_number ? (i % 2 == 0 ? i / 2 : -(i + 1) / 2) : i;
    if (candidates.base == UUIDOID)
      snprintf(text, sizeof(text), "00000000-0000-4000-8000-%012llx",
               static_cast<long long>(number));
    else
      snprintf(text, sizeof(text), INT64_FORMAT, number);
    Datum value = OidInputFunctionCall(candidates.input, text, candidates.ioparam, -1);
    int index = route_in(entry, value).shard_index;
    if (!entry->has_route[index]) {
      if (routable(entry, candidates, value)) {
        entry->routes[index] = datumCopy(value, entry->column_byval, entry->column_length);
        entry->has_route[index] = true;
        missing--;
        refused = 0;
      } else {
        refused++;
      }
    }
    if (i % 1024 == 0) MemoryContextReset(trials);
  }
  MemoryContextSwitchTo(old);
  MemoryContextDelete(trials);
  entry->routes_searched = true;
}

// idempotency.shard_routes(regclass, bigint[]) (1.5), or InvalidOid before the update.
// From the catalog, not by name lookup: the caller has no USAGE on schema idempotency.
Oid shard_routes_function() {
  Oid schema = get_namespace_oid("idempotency", true);
  if (!OidIsValid(schema)) return InvalidOid;
  Oid types[] = {REGCLASSOID, INT8ARRAYOID};
  return GetSysCacheOid3(PROCNAMEARGSNSP, Anum_pg_proc_oid, CStringGetDatum("shard_routes"),
                         PointerGetDatum(buildoidvector(types, 2)), ObjectIdGetDatum(schema));
}

// For the shards of `relid` without a routing value: the route of one of the events
// waiting in each (pending or dead), read on the shard's node by
// idempotency.shard_routes; a shard with none has nothing for the relay and stays
// without. Returns the entry, which reading may have built again.
Entry* routes_from_shards(Oid relid, Entry* entry) {
  Oid function = shard_routes_function();
  if (!OidIsValid(function)) {
    int missing = 0;
    for (int i = 0; i < entry->nshards; i++) missing += entry->has_route[i] ? 0 : 1;
    ereport(ERROR, errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
            errmsg("no routing value for %d of the %d shards of \"%s\" was found", missing,
                   entry->nshards, get_rel_name(relid)),
            errhint("Run ALTER EXTENSION idempotency UPDATE on the coordinator: from 1.5 on, "
                    "the relay finds them in the shards."));
  }
  ArrayBuildState* wanted = initArrayResult(INT8OID, CurrentMemoryContext, false);
  for (int i = 0; i < entry->nshards; i++)
    if (!entry->has_route[i])
      accumArrayResult(wanted, Int64GetDatum(entry->shards[i].shardid), false, INT8OID,
                       CurrentMemoryContext);
  // As the function's owner (SECURITY DEFINER), who may read the shards; no EXECUTE
  // check here: the relay function calling it is the caller's grant.
  ArrayType* found = DatumGetArrayTypeP(OidFunctionCall2(
      function, ObjectIdGetDatum(relid), makeArrayResult(wanted, CurrentMemoryContext)));
  // Opening catalogs and running SQL accept invalidations: look again.
  entry = lookup(relid);
  if (!entry->distributed) not_hash_distributed(relid);
  if (!entry->routes_searched) search_routes(entry);
  RouteCandidates candidates = route_candidates(entry);
  Datum* texts;
  bool* nulls;
  int count;
  deconstruct_array(found, TEXTOID, -1, false, TYPALIGN_INT, &texts, &nulls, &count);
  for (int i = 0; i < count; i++) {
    if (nulls[i]) continue;
    Datum value = OidInputFunctionCall(candidates.input, TextDatumGetCString(texts[i]),
                                       candidates.ioparam, -1);
    int index = route_in(entry, value).shard_index;
    if (entry->has_route[index] || !routable(entry, candidates, value)) continue;
    MemoryContext old = MemoryContextSwitchTo(entry->context);
    entry->routes[index] = datumCopy(value, entry->column_byval, entry->column_length);
    entry->has_route[index] = true;
    MemoryContextSwitchTo(old);
  }
  return entry;
}

}  // namespace

int citus_shard_values(Oid relid, Datum** values, int64** shardids) {
  Entry* entry = lookup(relid);
  if (!entry->distributed) not_hash_distributed(relid);
  if (entry->routes_searched && entry->domain_check != nullptr) {
    // A domain's constraints may have changed since (ALTER DOMAIN): keep what passes.
    RouteCandidates candidates = route_candidates(entry);
    for (int i = 0; i < entry->nshards; i++)
      if (entry->has_route[i] && !routable(entry, candidates, entry->routes[i])) {
        entry->has_route[i] = false;
        entry->routes_searched = false;
      }
  }
  if (!entry->routes_searched) search_routes(entry);
  bool complete = true;
  for (int i = 0; i < entry->nshards; i++) complete = complete && entry->has_route[i];
  if (!complete) entry = routes_from_shards(relid, entry);
  int n = entry->nshards;
  *values = static_cast<Datum*>(palloc(sizeof(Datum) * Max(n, 1)));
  *shardids = static_cast<int64*>(palloc(sizeof(int64) * Max(n, 1)));
  int count = 0;
  for (int i = 0; i < n; i++) {
    if (!entry->has_route[i]) continue;
    (*values)[count] = datumCopy(entry->routes[i], entry->column_byval, entry->column_length);
    (*shardids)[count] = entry->shards[i].shardid;
    count++;
  }
  return count;
}

int citus_local_shards(Oid relid, int64** shardids) {
  *shardids = nullptr;
  const Entry* entry = lookup(relid);
  if (!entry->distributed) return 0;
  int64* local = static_cast<int64*>(palloc(sizeof(int64) * Max(entry->nshards, 1)));
  int count = 0;
  for (int i = 0; i < entry->nshards; i++)
    if (entry->shards[i].local) local[count++] = entry->shards[i].shardid;
  *shardids = local;
  return count;
}

const char* citus_shard_node(int64 shardid) {
  Oid placement = catalog_relid("pg_dist_placement");
  Oid node = catalog_relid("pg_dist_node");
  if (!OidIsValid(placement) || !OidIsValid(node)) return "another node";
  int32 group = -1;
  scan(placement, "pg_dist_placement_shardid_index", kPlacementShardId, Int64GetDatum(shardid),
       true, [&](HeapTuple tuple, TupleDesc desc) {
         bool isnull;
         group = DatumGetInt32(heap_getattr(tuple, kPlacementGroup, desc, &isnull));
       });
  const char* where = "another node";
  Relation rel = table_open(node, AccessShareLock);
  SysScanDesc sscan = systable_beginscan(rel, InvalidOid, false, nullptr, 0, nullptr);
  HeapTuple tuple;
  while (HeapTupleIsValid(tuple = systable_getnext(sscan))) {
    bool isnull;
    TupleDesc desc = RelationGetDescr(rel);
    if (DatumGetInt32(heap_getattr(tuple, kNodeGroup, desc, &isnull)) != group) continue;
    where = psprintf("%s:%d", TextDatumGetCString(heap_getattr(tuple, kNodeName, desc, &isnull)),
                     DatumGetInt32(heap_getattr(tuple, kNodePort, desc, &isnull)));
    break;
  }
  systable_endscan(sscan);
  table_close(rel, AccessShareLock);
  return where;
}

}  // namespace idempotency

// A test hook, not part of the extension's SQL: 017_citus.pl creates it with
//   CREATE FUNCTION idem_test_citus_route(regclass, anyelement, boolean) RETURNS text
//     AS 'idempotency', 'idem_test_citus_route' LANGUAGE C STRICT;
// and compares its answer ("shardid shard_index local") with Citus's own.
static Datum test_citus_route(FunctionCallInfo fcinfo) {
  Oid relid = PG_GETARG_OID(0);
  Oid type = get_fn_expr_argtype(fcinfo->flinfo, 1);
  idempotency::CitusRoute route =
      PG_GETARG_BOOL(2) ? idempotency::citus_lock_route(relid, PG_GETARG_DATUM(1), type)
                        : idempotency::citus_route(relid, PG_GETARG_DATUM(1), type);
  PG_RETURN_TEXT_P(cstring_to_text(
      psprintf(INT64_FORMAT " %d %s", route.shardid, route.shard_index, route.local ? "t" : "f")));
}

IDEM_SQL_FUNCTION(idem_test_citus_route, test_citus_route)
