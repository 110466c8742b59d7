#include "pg/keys/error_hints.hpp"

#include "pg/common/key_type.hpp"
#include "pg/keys/xact.hpp"

extern "C" {
#include "utils/builtins.h"
#include "utils/elog.h"
}

namespace idempotency {

static emit_log_hook_type previous_emit_log_hook = nullptr;

// Whether the argument list at `argument` starts with a text or varchar argument.
static bool is_text_type(const char* argument) {
  for (const char* type : {"text", "character varying"}) {
    size_t n = strlen(type);
    if (strncmp(argument, type, n) == 0 && (argument[n] == ',' || argument[n] == ')')) return true;
  }
  return false;
}

// "function idem_claim(unknown, text) does not exist", the name qualified or not: a
// function on one key whose key argument is text or varchar (and not, say, idem_emit
// given a text payload).
static bool is_key_passed_as_text(const ErrorData* error) {
  static const struct {
    const char* name;
    int key_argument;
  } kKeyFunctions[] = {{"idem_claim(", 1},   {"idem_complete(", 1},   {"idem_fail(", 1},
                       {"idem_release(", 1}, {"idem_checkpoint(", 1}, {"idem_once(", 1},
                       {"idem_forget(", 1},  {"idem_lookup(", 1},     {"idem_derive(", 0}};
  const char* message = error->message;
  if (message == nullptr || strncmp(message, "function ", 9) != 0) return false;
  for (const auto& function : kKeyFunctions) {
    const char* name = strstr(message, function.name);
    if (name == nullptr || strchr(message, '(') != name + strlen(function.name) - 1) continue;
    const char* argument = name + strlen(function.name);
    for (int i = 0; i < function.key_argument && argument != nullptr; i++) {
      argument = strstr(argument, ", ");
      if (argument != nullptr) argument += 2;
    }
    return argument != nullptr && is_text_type(argument);
  }
  return false;
}

static void add_hints(ErrorData* error) {
  if (error->elevel < ERROR) return;
  if (error->sqlerrcode == ERRCODE_UNDEFINED_FUNCTION && is_key_passed_as_text(error)) {
    error->hint = pstrdup(
        "Idempotency keys are of type idem_key: write the key as 'the-key'::idem_key, or "
        "convert a text value with value::idem_key (or idem_key(value)).");
    return;
  }
  if (error->sqlerrcode != ERRCODE_INVALID_TRANSACTION_TERMINATION) return;
  const Identity* lease = last_lease_claim();
  if (lease == nullptr) return;
  error->detail = psprintf(
      "This transaction made a lease claim on idempotency key \"%s\" in scope \"%s\"; "
      "the procedure's COMMIT, which publishes the lease before the outside call, cannot "
      "run inside a transaction block (CALL then runs atomically).",
      key_cstring(lease->key), text_to_cstring(lease->scope));
  error->hint = pstrdup(
      "CALL the procedure outside BEGIN ... COMMIT, with autocommit on (psql and most "
      "drivers' default), so that each of its COMMITs takes effect.");
}

// Runs in the error's memory context (ErrorContext, which keeps memory in reserve for
// reporting), so the few small allocations above cannot fail in a way that matters.
static void emit_log_with_hints(ErrorData* error) {
  add_hints(error);
  if (previous_emit_log_hook != nullptr) previous_emit_log_hook(error);
}

void install_error_hints() {
  previous_emit_log_hook = emit_log_hook;
  emit_log_hook = emit_log_with_hints;
}

}  // namespace idempotency
