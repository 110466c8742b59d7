#include "pg/messaging/messaging_catalog.hpp"
#include "pg/citus/citus_meta.hpp"

#include "pg/common/open_relations.hpp"
#include "pg/common/table.hpp"

extern "C" {
#include "utils/inval.h"
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
  static bool callback_registered = false;
  if (!OidIsValid(cached.outbox)) {
    if (!callback_registered) {
      CacheRegisterRelcacheCallback(forget, 0);
      callback_registered = true;
    }
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

void refuse_with_distributed_store(const char* function) {
  if (OidIsValid(extension_relation("routed_keys")))
    ereport(ERROR, errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
            errmsg("%s is not supported with a distributed key store yet", function),
            errdetail("The outbox and the applied versions are tables of each node, not "
                      "distributed with the business rows."),
            errhint("Keep messaging on a database whose key store is not distributed."));
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
