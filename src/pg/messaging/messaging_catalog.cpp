#include "pg/messaging/messaging_catalog.hpp"
#include "pg/citus/citus_forward.hpp"
#include "pg/citus/citus_meta.hpp"
#include "pg/common/errors.hpp"
#include "pg/keys/store_catalog.hpp"

#include "pg/common/open_relations.hpp"
#include "pg/common/table.hpp"

extern "C" {
#include "utils/inval.h"
#include "fmgr.h"
#include "utils/lsyscache.h"
}

namespace idempotency {

static MessagingOids cached;

static void forget(Datum, Oid relid) {
  const Oid all[] = {cached.outbox,          cached.outbox_pkey,      cached.outbox_pending,
                     cached.outbox_dead,     cached.outbox_delivered, cached.aggregates,
                     cached.aggregates_pkey, cached.applied,          cached.applied_pkey,
                     cached.applied_expires, cached.position};
  for (Oid oid : all)
    if (relid == InvalidOid || relid == oid) cached = MessagingOids{};
}

static const ColumnSpec kOutboxColumns[outbox_column::kCount] = {
    {"event_id", InvalidOid},
    {"position", INT8OID},
    {"topic", TEXTOID},
    {"aggregate", TEXTOID},
    {"seq", INT8OID},
    {"payload", JSONBOID},
    {"headers", JSONBOID},
    {"emitted_at", TIMESTAMPTZOID},
    {"state", CHAROID},
    {"attempt", INT4OID},
    {"relay", TEXTOID},
    {"lease_expires_at", TIMESTAMPTZOID},
    {"delivered_at", TIMESTAMPTZOID},
    {"reason", TEXTOID},
};
static const ColumnSpec kAggregateColumns[aggregate_column::kCount] = {
    {"topic", TEXTOID}, {"aggregate", TEXTOID}, {"last_seq", INT8OID}};
static const ColumnSpec kAppliedColumns[applied_column::kCount] = {{"role", REGROLEOID},
                                                                   {"expires_at", TIMESTAMPTZOID},
                                                                   {"version", INT8OID},
                                                                   {"scope", TEXTOID},
                                                                   {"entity", TEXTOID}};

bool messaging_oids(MessagingOids* oids) {
  if (!OidIsValid(cached.outbox)) {
    on_relcache_invalidation(forget);
    auto relation = extension_relation;
    MessagingOids found{relation("outbox"),
                        relation("outbox_pkey"),
                        relation("outbox_pending_idx"),
                        relation("outbox_dead_idx"),
                        relation("outbox_delivered_idx"),
                        relation("outbox_aggregates"),
                        relation("outbox_aggregates_pkey"),
                        relation("applied_versions"),
                        relation("applied_versions_pkey"),
                        relation("applied_versions_expires_at_idx"),
                        relation("outbox_position"),
                        InvalidOid};
    const Oid all[] = {found.outbox_pkey,      found.outbox_pending, found.outbox_dead,
                       found.outbox_delivered, found.aggregates,     found.aggregates_pkey,
                       found.applied,          found.applied_pkey,   found.applied_expires,
                       found.position};
    if (!OidIsValid(found.outbox)) return false;
    for (Oid oid : all)
      if (!OidIsValid(oid))
        ereport(ERROR, errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
                errmsg("the idempotency messaging tables are incomplete"),
                errhint("Reinstall the extension: an index or table of schema idempotency was "
                        "dropped."));
    check_columns(found.outbox, kOutboxColumns, outbox_column::kCount);
    check_columns(found.aggregates, kAggregateColumns, aggregate_column::kCount);
    check_columns(found.applied, kAppliedColumns, applied_column::kCount);
    // Distributed with Citus by hand: refused, as the key store (store_catalog.cpp).
    const Oid tables[] = {found.outbox, found.aggregates, found.applied};
    for (Oid table : tables)
      if (citus_table(table))
        ereport(ERROR, errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
                errmsg("the messaging table idempotency.%s is distributed with Citus, which this "
                       "version of the extension does not support",
                       get_rel_name(table)),
                errdetail("Events and applied versions would be stored in this node's own "
                          "tables, where a relay or a retry on another node would not find "
                          "them."));
    found.key_eq = index_equality(found.outbox_pkey, 0);
    cached = found;
  }
  *oids = cached;
  return true;
}

// The routed messaging tables of a distributed store, which a store distributed with
// 1.3 has only once idempotency.distribute_messaging() made them.
static void routed_tables(Oid* outbox, Oid* aggregates, Oid* applied) {
  *outbox = extension_relation("routed_outbox");
  *aggregates = extension_relation("routed_outbox_aggregates");
  *applied = extension_relation("routed_applied_versions");
  if (!OidIsValid(*outbox) || !OidIsValid(*aggregates) || !OidIsValid(*applied))
    ereport(ERROR, errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
            errmsg("the key store is distributed, but its messaging tables are not"),
            errdetail("A store distributed with version 1.3 has no idempotency.routed_outbox."),
            errhint("Run SELECT idempotency.distribute_messaging(); on the coordinator."));
}

Oid routed_outbox() {
  if (!OidIsValid(extension_relation("routed_keys"))) return InvalidOid;
  Oid outbox, aggregates, applied;
  routed_tables(&outbox, &aggregates, &applied);
  return outbox;
}

// A relation of shard `shardid` of routed table `base`, named as Citus names them
// (relay/relay_event_utility.c AppendShardIdToName: the name, "_", the shard id).
static Oid shard_relation(const char* base, int64 shardid) {
  Oid oid = extension_relation(psprintf("%s_" INT64_FORMAT, base, shardid));
  if (!OidIsValid(oid))
    ereport(ERROR, errcode(ERRCODE_IDEM_NOT_LOCAL),
            errmsg("shard " INT64_FORMAT " of idempotency.%s is placed on this node but %s is "
                   "not here",
                   shardid, base, base),
            errhint("After a shard move, retry; otherwise check the shard's placement with "
                    "citus_shards."));
  return oid;
}

static ColumnSpec* with_route(const ColumnSpec* columns, int count, Oid route_type) {
  auto all = static_cast<ColumnSpec*>(palloc(sizeof(ColumnSpec) * (count + 1)));
  for (int i = 0; i < count; i++) all[i] = columns[i];
  all[count] = {"route", route_type};
  return all;
}

// This node's shards of routed table `base` whose tables are here (a placement whose
// table is not here yet, or any more, has nothing to reap or count); their shard ids,
// with the heap of each, in the current memory context.
static int present_local_shards(const char* base, int64** present, Oid** heaps) {
  *present = nullptr;
  *heaps = nullptr;
  Oid table = extension_relation(base);
  if (!OidIsValid(table)) return 0;
  int64* shardids;
  int count = citus_local_shards(table, &shardids);
  *present = static_cast<int64*>(palloc(sizeof(int64) * Max(count, 1)));
  *heaps = static_cast<Oid*>(palloc(sizeof(Oid) * Max(count, 1)));
  int found = 0;
  for (int i = 0; i < count; i++) {
    Oid heap = extension_relation(psprintf("%s_" INT64_FORMAT, base, shardids[i]));
    if (!OidIsValid(heap)) continue;
    (*present)[found] = shardids[i];
    (*heaps)[found++] = heap;
  }
  return found;
}

int local_applied_shards(AppliedShard** shards) {
  int64* shardids;
  Oid* heaps;
  int count = present_local_shards("routed_applied_versions", &shardids, &heaps);
  *shards = static_cast<AppliedShard*>(palloc(sizeof(AppliedShard) * Max(count, 1)));
  for (int i = 0; i < count; i++)
    (*shards)[i] =
        AppliedShard{heaps[i], shard_relation("routed_applied_versions_pkey", shardids[i]),
                     shard_relation("routed_applied_versions_expires_at_idx", shardids[i])};
  return count;
}

int local_outbox_shards(OutboxShard** shards) {
  int64* shardids;
  Oid* heaps;
  int count = present_local_shards("routed_outbox", &shardids, &heaps);
  *shards = static_cast<OutboxShard*>(palloc(sizeof(OutboxShard) * Max(count, 1)));
  for (int i = 0; i < count; i++)
    (*shards)[i] = OutboxShard{heaps[i], shard_relation("routed_outbox_pending_idx", shardids[i]),
                               shard_relation("routed_outbox_dead_idx", shardids[i]),
                               shard_relation("routed_outbox_delivered_idx", shardids[i])};
  return count;
}

bool messaging_target(FunctionCallInfo fcinfo, int route_arg, const char* function,
                      MessagingTarget* target, Route* route) {
  *route = Route{};
  citus_twin_settings(fcinfo, route_arg);
  if (PG_NARGS() > route_arg && !PG_ARGISNULL(route_arg)) {  // absent before 1.4
    route->type = get_fn_expr_argtype(fcinfo->flinfo, route_arg);
    if (!OidIsValid(route->type))
      ereport(ERROR, errcode(ERRCODE_INVALID_PARAMETER_VALUE),
              errmsg("could not determine the type of the routing value"));
    route->value = PG_GETARG_DATUM(route_arg);
  }
  *target = MessagingTarget{};
  target->oids = required_messaging_oids();
  Oid keys = extension_relation("routed_keys");
  if (!OidIsValid(keys)) {
    if (route->given())
      ereport(ERROR, errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
              errmsg("the key store is not distributed, so %s takes no routing value", function),
              errhint("Distribute it with idem_distribute(business table) on the Citus "
                      "coordinator, or call without route."));
    return true;
  }
  if (!route->given())
    ereport(ERROR, errcode(ERRCODE_INVALID_PARAMETER_VALUE),
            errmsg("the key store is distributed: %s needs the routing value of its business "
                   "rows",
                   function),
            errhint("Pass the business row's distribution value: route => ..."));
  Oid outbox, aggregates, applied;
  routed_tables(&outbox, &aggregates, &applied);
  // The three are co-located: one lock orders the call with moves of them all.
  CitusRoute where = routed_shard(outbox, route);
  if (!where.local) {
    if (citus_may_forward(fcinfo)) return false;
    ereport(ERROR, errcode(ERRCODE_IDEM_NOT_LOCAL),
            errmsg("the routing value's shard " INT64_FORMAT
                   " of idempotency.routed_outbox is on %s, not on this node",
                   where.shardid, citus_shard_node(where.shardid)),
            errhint("After a shard move, retry. Otherwise Citus could not run the call on the "
                    "shard's node: check the shard's placements with citus_shards."));
  }
  int64 aggregates_shard = citus_route(aggregates, route->value, route->type).shardid;
  int64 applied_shard = citus_route(applied, route->value, route->type).shardid;
  int64 s = where.shardid;
  MessagingOids& oids = target->oids;
  oids.outbox = shard_relation("routed_outbox", s);
  oids.outbox_pkey = shard_relation("routed_outbox_pkey", s);
  oids.outbox_pending = shard_relation("routed_outbox_pending_idx", s);
  oids.outbox_dead = shard_relation("routed_outbox_dead_idx", s);
  oids.outbox_delivered = shard_relation("routed_outbox_delivered_idx", s);
  oids.aggregates = shard_relation("routed_outbox_aggregates", aggregates_shard);
  oids.aggregates_pkey = shard_relation("routed_outbox_aggregates_pkey", aggregates_shard);
  oids.applied = shard_relation("routed_applied_versions", applied_shard);
  oids.applied_pkey = shard_relation("routed_applied_versions_pkey", applied_shard);
  oids.applied_expires = shard_relation("routed_applied_versions_expires_at_idx", applied_shard);
  check_columns(oids.outbox, with_route(kOutboxColumns, outbox_column::kCount, route->type),
                outbox_column::kCount + 1);
  ColumnSpec aggregate_columns[aggregate_column::kRoutedCount] = {{"topic", TEXTOID},
                                                                  {"aggregate", TEXTOID},
                                                                  {"last_seq", INT8OID},
                                                                  {"route", route->type},
                                                                  {"last_position", INT8OID}};
  check_columns(oids.aggregates, aggregate_columns, aggregate_column::kRoutedCount);
  ColumnSpec* applied_columns = with_route(kAppliedColumns, applied_column::kCount, route->type);
  applied_columns[applied_column::kRole - 1] = {"role", InvalidOid, "idem_role"};
  check_columns(oids.applied, applied_columns, applied_column::kCount + 1);
  oids.key_eq = index_equality(oids.outbox_pkey, 0);
  target->routed = true;
  target->route = route->value;
  target->outbox_route_eq = index_equality(oids.outbox_pkey, 1);
  target->aggregates_route_eq = index_equality(oids.aggregates_pkey, 2);
  target->applied_route_eq = index_equality(oids.applied_pkey, 3);
  return true;
}

MessagingOids required_messaging_oids() {
  MessagingOids oids;
  if (!messaging_oids(&oids))
    ereport(ERROR, errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
            errmsg("the idempotency extension in this database is older than 1.1"),
            errhint("Run ALTER EXTENSION idempotency UPDATE."));
  return oids;
}

}  // namespace idempotency
