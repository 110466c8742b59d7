// SQLSTATEs of the extension, and the one boundary between C++ and PostgreSQL errors.
//
// Glue code reports with ereport() directly and holds only plain data on its stack, so
// a longjmp never skips a destructor. C++ code (src/core) reports with exceptions;
// guarded() catches them, leaves the catch block, and only then calls ereport, so no
// exception is ever live while PostgreSQL unwinds. Every entry point PostgreSQL calls
// (SQL functions, worker mains, hooks, callbacks) runs inside guarded().
#pragma once

#include <exception>
#include <new>
#include <stdexcept>

#include "core/error.hpp"
#include "pg/common/postgres.hpp"

extern "C" {
#include "utils/elog.h"
}

#define ERRCODE_IDEM_FINGERPRINT_MISMATCH MAKE_SQLSTATE('I', 'K', '0', '0', '1')
#define ERRCODE_IDEM_CLAIM_NOT_FINISHED MAKE_SQLSTATE('I', 'K', '0', '0', '2')
#define ERRCODE_IDEM_CLAIM_LOST MAKE_SQLSTATE('I', 'K', '0', '0', '3')
#define ERRCODE_IDEM_NOT_CLAIMED MAKE_SQLSTATE('I', 'K', '0', '0', '4')
#define ERRCODE_IDEM_IN_PROGRESS MAKE_SQLSTATE('I', 'K', '0', '0', '5')
#define ERRCODE_IDEM_NOT_LOCAL MAKE_SQLSTATE('I', 'K', '0', '0', '6')

namespace idempotency {

// What a caught exception becomes; plain data only, so it survives leaving the catch.
struct PendingError {
  int sqlstate = 0;
  char message[256] = {};
  ThrowSite site{nullptr, 0, nullptr};  // no file: reported at the boundary
};

[[noreturn]] void raise_pending(const PendingError& error);

// Runs fn(); turns a C++ exception escaping it into an ERROR with a SQLSTATE: an
// Error carries its own, std::invalid_argument is bad input (22023), std::bad_alloc
// is out of memory (53200), anything else an internal error (XX000).
template <typename Fn>
auto guarded(Fn fn) -> decltype(fn()) {
  PendingError error;
  try {
    return fn();
  } catch (const Error& e) {
    const char* s = e.sqlstate();
    error.sqlstate = MAKE_SQLSTATE(s[0], s[1], s[2], s[3], s[4]);
    strlcpy(error.message, e.what(), sizeof(error.message));
    error.site = e.site();
  } catch (const std::invalid_argument& e) {
    error.sqlstate = ERRCODE_INVALID_PARAMETER_VALUE;
    strlcpy(error.message, e.what(), sizeof(error.message));
  } catch (const std::bad_alloc&) {
    error.sqlstate = ERRCODE_OUT_OF_MEMORY;
    strlcpy(error.message, "out of memory", sizeof(error.message));
  } catch (const std::exception& e) {
    error.sqlstate = ERRCODE_INTERNAL_ERROR;
    strlcpy(error.message, e.what(), sizeof(error.message));
  } catch (...) {
    error.sqlstate = ERRCODE_INTERNAL_ERROR;
    strlcpy(error.message, "unknown C++ exception", sizeof(error.message));
  }
  raise_pending(error);
}

}  // namespace idempotency

// Declares the C entry point `name` for SQL and runs `impl` inside the boundary.
#define IDEM_SQL_FUNCTION(name, impl)                               \
  extern "C" {                                                      \
  PG_FUNCTION_INFO_V1(name);                                        \
  Datum name(PG_FUNCTION_ARGS) {                                    \
    return idempotency::guarded([fcinfo] { return impl(fcinfo); }); \
  }                                                                 \
  }
