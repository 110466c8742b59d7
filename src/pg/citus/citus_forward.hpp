// A key function called where its shard is not (a transaction block on the coordinator,
// say) runs on the node of its shard, inside the caller's transaction, through Citus's
// own delegation of a distributed function call. References are to Citus 14.0.1.
//
// idem_distribute makes a twin of each key function, named <function>_routed, whose
// routing argument has the distribution column's type (Citus refuses a distribution
// argument of type "any": commands/function.c), distributed with
// create_distributed_function(..., colocate_with => the key store, force_delegation =>
// true). Citus then delegates `SELECT ... FROM twin(<constants>)` to the shard's node
// even inside a transaction block (planner/function_call_delegation.c,
// TryToDelegateFunctionCall: force_delegation, a Const distribution argument, the call
// in FROM), as a modifying task over the connection of that shard's placements, which
// later statements on the same shard group reuse (connection/placement_connection.c):
// the key, the business rows and the finish commit together, in one or two phases.
#pragma once

#include "pg/common/postgres.hpp"

extern "C" {
#include "utils/tuplestore.h"
}

namespace idempotency {

// Whether the call `fcinfo` may be forwarded through Citus from this backend: not a
// twin (a twin running here means Citus did not delegate it: a replicated shard, or a
// node without metadata), and not a backend Citus opened to run a delegated call or a
// shard's query (application_name "citus_internal ...": transaction/backend_data.c
// IsCitusInternalBackend), where a nested distributed execution is refused.
bool citus_may_forward(FunctionCallInfo fcinfo);

// In a twin's call (argument `route_arg` is its route): the caller's
// idempotency.wait_timeout, which citus_forward passes after the route, set here for
// the rest of this node's transaction (SET LOCAL), so that a wait on this node is
// bounded as the caller's would be.
void citus_twin_settings(FunctionCallInfo fcinfo, int route_arg);

// Runs the twin of the called function with the call's arguments (or `args`, one per
// argument of the called function), argument `route_arg` replaced by `route` (of type
// `route_type`, the distribution column's; `route_arg` one past the called function's
// last argument: the twin has one more), and after it the session's
// idempotency.wait_timeout, through SPI, as parameters of a one-shot plan (which the
// planner makes constants of, as Citus needs them); returns its
// single result, copied into the caller's memory context (*isnull for NULL and void).
Datum citus_forward(FunctionCallInfo fcinfo, int route_arg, Datum route, Oid route_type,
                    bool* isnull, const NullableDatum* args = nullptr);

// The same for a set-returning function: the twin's rows go into `rows` (of `desc`).
void citus_forward_rows(FunctionCallInfo fcinfo, int route_arg, Datum route, Oid route_type,
                        Tuplestorestate* rows, TupleDesc desc, const NullableDatum* args = nullptr);

// The state ("pending", "completed", ...) of key `key` of scope `scope` and routing
// value `route` on the node of its shard, as this transaction sees it there (through
// the twin of idem_lookup in schema `schema`), or nullptr where it has none. For
// COMMIT, to learn whether a claim forwarded from here was finished there by other
// means (a function Citus delegated in the same transaction).
const char* citus_forwarded_state(Oid schema, const char* scope, const char* key, Datum route,
                                  Oid route_type);

}  // namespace idempotency
