// An outbox event's row and the core's OutboxEvent, both ways, and an applied
// version's row as the core's AppliedRecord: the one place where the glue turns
// messaging's stored values into what src/core/outbox.hpp decides on.
#pragma once

#include "core/outbox.hpp"
#include "pg/messaging/messaging_catalog.hpp"
#include "pg/common/table.hpp"

namespace idempotency {

// Whether a text datum holds the same bytes as `b`.
bool same_text(Datum a, const text* b);

// The row in the table's slot as the core sees it; `relay` (may be null) is the
// caller's name, to tell whether the event was last leased to it.
OutboxEvent read_event(Table* outbox, const text* relay);

// The row of idempotency.applied_versions in the table's slot as the core sees it,
// with whether this transaction wrote that version.
AppliedRecord read_applied(Table* applied);

// Writes `next` over the row version in the table's slot; the relay column becomes
// `relay` when given, and NULL when the event is requeued; the reason column `reason`
// when set_reason. `locked`: the version is the newest and this transaction locked
// it (always kDone); else it is written only if it still is the newest and no one
// else holds it (table_try_update).
Write write_event(Table* outbox, const OutboxEvent& next, const text* relay, const text* reason,
                  bool set_reason, bool locked);

}  // namespace idempotency
