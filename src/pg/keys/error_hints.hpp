// Hints added to two of PostgreSQL's own errors that users of the extension meet
// and that PostgreSQL cannot explain in the extension's terms.
#pragma once

namespace idempotency {

// Chains emit_log_hook, which sees each error before it is reported to the client:
//   - 42883 for an idem_ function called with a text value where an idem_key is
//     expected gets a hint that names ::idem_key, and with a text[] where an
//     idem_key[] is expected (the relay's event ids) one that names ::idem_key[];
//   - 2D000 (a COMMIT in a procedure CALLed inside a transaction block) in a
//     transaction that made a lease claim gets a detail and hint saying why and what
//     to do.
// The hook runs only for errors that reach the log (log_min_messages at ERROR or
// lower, as by default). Once per backend.
void install_error_hints();

}  // namespace idempotency
