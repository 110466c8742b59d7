// The arguments every key function shares, checked as docs/reference.md says (22004 for a
// NULL, 22023 for a bad value, 54000 for an oversized one), and the errors about a key
// (IK001, IK003, IK004, IK005) with their messages.
#pragma once

#include <optional>
#include <string_view>

#include "pg/keys/driver.hpp"
#include "pg/keys/key_row.hpp"

extern "C" {
#include "datatype/timestamp.h"
#include "utils/timestamp.h"
}

namespace idempotency {

void require_argument(FunctionCallInfo fcinfo, int n, const char* name);
// Arguments 0 and 1 of every key function: (scope text, key idem_key), for the
// calling role, and from 1.3 argument `route_arg` (the last), the routing value, of
// any type (checked against the store by store_for_key); NULL or absent: none.
Identity identity_arguments(FunctionCallInfo fcinfo, int route_arg);
// The same without a key (idem_once_many, whose argument 1 is an array of them).
Identity scope_arguments(FunctionCallInfo fcinfo, int route_arg);
// A name of 1 to 255 bytes (a topic, aggregate, relay or entity); NULL is 22004.
text* name_argument(FunctionCallInfo fcinfo, int n, const char* name);
// A listing's max_rows: not NULL, not negative.
int32 max_rows_argument(FunctionCallInfo fcinfo, int n);
std::optional<int32_t> attempt_argument(FunctionCallInfo fcinfo, int n);
// The dedup window of a key created now (NULL: idempotency.default_ttl), positive.
Interval* ttl_argument(FunctionCallInfo fcinfo, int n, TimestampTz now);
// A lease (NULL: none), positive and no longer than ttl.
Interval* lease_argument(FunctionCallInfo fcinfo, int n, TimestampTz now, Interval* ttl);
// When a wait for another writer gives up (NULL: idempotency.wait_timeout).
TimestampTz wait_deadline(FunctionCallInfo fcinfo, int n, TimestampTz now);
TimestampTz default_wait_deadline(TimestampTz now);
// A fingerprint of at most 64 bytes, or none.
std::optional<Fingerprint> fingerprint_argument(FunctionCallInfo fcinfo, int n);
// 54000 when a response, error or checkpoint is over idempotency.max_response_size.
void check_stored_size(Datum value, const char* what);
// The same for two values stored together (an event's payload and headers; 0: none).
void check_combined_size(Datum first, Datum second, const char* what);

TimestampTz plus(TimestampTz t, Interval* span);
Interval* micros_interval(int64 micros);

[[noreturn]] void raise_in_progress(const Identity& id);
[[noreturn]] void raise_claim_lost(const Identity& id, const Probe& probe,
                                   std::optional<int32_t> attempt);
[[noreturn]] void raise_not_claimed(const Identity& id);
[[noreturn]] void raise_mismatch(const Identity& id);

}  // namespace idempotency
