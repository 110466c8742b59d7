#include "pg/keys/error_hints.hpp"

#include "pg/common/key_type.hpp"
#include "pg/keys/xact.hpp"

extern "C" {
#include "utils/builtins.h"
#include "utils/elog.h"
}

namespace idempotency {

static emit_log_hook_type previous_emit_log_hook = nullptr;

// What a "function ... does not exist" error says about a key argument.
enum class KeyMistake { kNone, kTextKey, kTextKeyArray };

// Whether an argument's type, as PostgreSQL's message spells it, is text or varchar
// (or an array of either, with `array`).
static bool is_text_type(const char* type, size_t length, bool array) {
  for (const char* name : {"text", "character varying"}) {
    size_t n = strlen(name);
    if (length == n + (array ? 2 : 0) && strncmp(type, name, n) == 0 &&
        (!array || strncmp(type + n, "[]", 2) == 0))
      return true;
  }
  return false;
}

// "function idem_claim(unknown, text) does not exist", the name qualified or not, the
// arguments positional or named ("key => text"): a function on keys whose key argument
// (or array of event ids) is text or varchar (and not, say, idem_emit given a text
// payload).
static KeyMistake key_mistake(const ErrorData* error) {
  static const struct {
    const char* name;
    int position;
    const char* argument;
    bool array;
  } kKeyFunctions[] = {{"idem_claim", 1, "key", false},
                       {"idem_complete", 1, "key", false},
                       {"idem_fail", 1, "key", false},
                       {"idem_release", 1, "key", false},
                       {"idem_checkpoint", 1, "key", false},
                       {"idem_once", 1, "key", false},
                       {"idem_forget", 1, "key", false},
                       {"idem_lookup", 1, "key", false},
                       {"idem_derive", 0, "root", false},
                       {"idem_outbox_ack", 1, "event_ids", true},
                       {"idem_outbox_dead", 1, "event_ids", true},
                       {"idem_outbox_retry", 0, "event_ids", true}};
  const char* message = error->message;
  if (message == nullptr || strncmp(message, "function ", 9) != 0) return KeyMistake::kNone;
  const char* open = strchr(message, '(');
  const char* close = strrchr(message, ')');
  if (open == nullptr || close == nullptr || close < open) return KeyMistake::kNone;
  const char* name = message + 9;
  for (const char* dot = name; dot < open; dot++)
    if (*dot == '.') name = dot + 1;
  for (const auto& function : kKeyFunctions) {
    if (strlen(function.name) != size_t(open - name) ||
        strncmp(name, function.name, open - name) != 0)
      continue;
    // Each argument is "type" or, in named notation, "name => type".
    int position = 0;
    for (const char* argument = open + 1; argument < close; position++) {
      const char* end = strstr(argument, ", ");
      if (end == nullptr || end > close) end = close;
      const char* arrow = strstr(argument, " => ");
      bool named = arrow != nullptr && arrow < end;
      const char* type = named ? arrow + 4 : argument;
      bool is_key = named ? (size_t(arrow - argument) == strlen(function.argument) &&
                             strncmp(argument, function.argument, arrow - argument) == 0)
                          : position == function.position;
      if (is_key && is_text_type(type, end - type, function.array))
        return function.array ? KeyMistake::kTextKeyArray : KeyMistake::kTextKey;
      argument = end == close ? close : end + 2;
    }
    return KeyMistake::kNone;
  }
  return KeyMistake::kNone;
}

static void add_hints(ErrorData* error) {
  if (error->elevel < ERROR) return;
  if (error->sqlerrcode == ERRCODE_UNDEFINED_FUNCTION) {
    switch (key_mistake(error)) {
      case KeyMistake::kTextKey:
        error->hint = pstrdup(
            "Idempotency keys are of type idem_key: write the key as 'the-key'::idem_key, or "
            "convert a text value with value::idem_key (or idem_key(value)).");
        return;
      case KeyMistake::kTextKeyArray:
        error->hint = pstrdup(
            "Event ids are of type idem_key[]: write the array as ARRAY['id-1', "
            "'id-2']::idem_key[] or '{id-1,id-2}', or convert a text[] value with "
            "value::idem_key[].");
        return;
      case KeyMistake::kNone: break;
    }
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
