// The core's exception: a message and the SQLSTATE that the error boundary
// (src/pg/errors.hpp) reports it with, so no core error becomes an internal error.
#pragma once

#include <cstddef>
#include <stdexcept>
#include <string>

namespace idempotency {

class Error : public std::runtime_error {
 public:
  // `sqlstate`: five characters, as PostgreSQL's SQLSTATEs ("22023").
  Error(const char* sqlstate, const std::string& message) : std::runtime_error(message) {
    std::size_t n = 0;
    for (; n < 5 && sqlstate[n] != '\0'; n++) sqlstate_[n] = sqlstate[n];
    for (; n < 6; n++) sqlstate_[n] = n < 5 ? '0' : '\0';
  }
  const char* sqlstate() const noexcept { return sqlstate_; }

 private:
  char sqlstate_[6];
};

}  // namespace idempotency
