// The core's exception: a message and the SQLSTATE that the error boundary
// (src/pg/common/errors.hpp) reports it with, so no core error becomes an internal error.
#pragma once

#include <cstddef>
#include <stdexcept>
#include <string>

namespace idempotency {

// Where an Error was thrown: the boundary reports it there, not at itself.
struct ThrowSite {
  const char* file;
  int line;
  const char* function;
};

class Error : public std::runtime_error {
 public:
  // `sqlstate`: five characters, as PostgreSQL's SQLSTATEs ("22023"). The default
  // arguments are evaluated where the Error is made (C++17 has no source_location).
  Error(const char* sqlstate, const std::string& message, const char* file = __builtin_FILE(),
        int line = __builtin_LINE(), const char* function = __builtin_FUNCTION())
      : std::runtime_error(message), site_{file, line, function} {
    std::size_t n = 0;
    for (; n < 5 && sqlstate[n] != '\0'; n++) sqlstate_[n] = sqlstate[n];
    for (; n < 6; n++) sqlstate_[n] = n < 5 ? '0' : '\0';
  }
  const char* sqlstate() const noexcept { return sqlstate_; }
  const ThrowSite& site() const noexcept { return site_; }

 private:
  char sqlstate_[6];
  ThrowSite site_;
};

}  // namespace idempotency
