#include "core/key.hpp"

#include <cstdio>

namespace idempotency {

KeyProblem check_key(std::string_view key) noexcept {
  KeyProblem problem;
  problem.length = key.size();
  if (key.empty()) {
    problem.kind = KeyProblem::Kind::kEmpty;
  } else if (key.size() > kMaxKeyBytes) {
    problem.kind = KeyProblem::Kind::kTooLong;
  } else {
    for (std::size_t i = 0; i < key.size(); i++) {
      auto byte = static_cast<unsigned char>(key[i]);
      if (byte < 0x21 || byte > 0x7E) {
        problem.kind = KeyProblem::Kind::kBadByte;
        problem.position = i + 1;
        problem.byte = byte;
        break;
      }
    }
  }
  return problem;
}

std::string describe(const KeyProblem& problem) {
  char text[160];
  switch (problem.kind) {
    case KeyProblem::Kind::kNone: return "idem_key is valid";
    case KeyProblem::Kind::kEmpty: return "idem_key must not be empty";
    case KeyProblem::Kind::kTooLong:
      std::snprintf(text, sizeof(text), "idem_key is %zu bytes long, at most %zu are allowed",
                    problem.length, kMaxKeyBytes);
      return text;
    case KeyProblem::Kind::kBadByte:
      std::snprintf(text, sizeof(text),
                    "idem_key has byte 0x%02X at position %zu, only visible ASCII characters "
                    "(0x21 to 0x7E) are allowed",
                    problem.byte, problem.position);
      return text;
  }
  return "idem_key is invalid";
}

}  // namespace idempotency
