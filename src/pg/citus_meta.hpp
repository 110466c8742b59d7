// What the extension reads of Citus's metadata (docs/design-citus.md): Citus's catalog
// tables, read with PostgreSQL's own catalog access. No Citus header, library or SQL
// function is used, and where Citus is not installed in the database nothing is read.
#pragma once

#include "pg/postgres.hpp"

namespace idempotency {

// Whether `relid` is a Citus table on this node: a row of pg_catalog.pg_dist_partition
// (Citus 14.0.1: include/distributed/pg_dist_partition.h:22-45, logicalrelid first),
// found through its index on logicalrelid. False where that catalog does not exist.
bool citus_table(Oid relid);

}  // namespace idempotency
