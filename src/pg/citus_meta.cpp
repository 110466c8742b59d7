// Citus's catalog, read like PostgreSQL's: see citus_meta.hpp.
#include "pg/citus_meta.hpp"

extern "C" {
#include "access/genam.h"
#include "access/htup_details.h"
#include "access/skey.h"
#include "access/stratnum.h"
#include "access/table.h"
#include "catalog/pg_namespace.h"
#include "storage/lockdefs.h"
#include "utils/fmgroids.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"
}

namespace idempotency {

namespace {
constexpr AttrNumber kPartitionLogicalRelid = 1;  // pg_dist_partition.logicalrelid (regclass)
}

bool citus_table(Oid relid) {
  Oid catalog = get_relname_relid("pg_dist_partition", PG_CATALOG_NAMESPACE);
  if (!OidIsValid(catalog)) return false;  // Citus is not installed in this database
  Oid index = get_relname_relid("pg_dist_partition_logical_relid_index", PG_CATALOG_NAMESPACE);
  Relation rel = table_open(catalog, AccessShareLock);
  ScanKeyData key;
  ScanKeyInit(&key, kPartitionLogicalRelid, BTEqualStrategyNumber, F_OIDEQ,
              ObjectIdGetDatum(relid));
  SysScanDesc scan = systable_beginscan(rel, index, OidIsValid(index), nullptr, 1, &key);
  bool found = HeapTupleIsValid(systable_getnext(scan));
  systable_endscan(scan);
  table_close(rel, AccessShareLock);
  return found;
}

}  // namespace idempotency
