// What the key functions answered, counted per database since server start in shared
// memory (when preloaded), for idem_stats: no write to any table, one atomic add per
// answer. Counted where the answer is final (api_claim.cpp), on the node that decides
// it (a call forwarded through Citus is counted on its shard's node, not twice).
#pragma once

#include "pg/common/postgres.hpp"

namespace idempotency {

enum class Answer {
  kClaimed,     // idem_claim `claimed` (new or taken over), idem_once(_many) true
  kReplay,      // idem_claim `replay`, idem_once(_many) false (a finished key)
  kMismatch,    // IK001 raised
  kInProgress,  // idem_claim `in_progress`, IK005 from idem_once(_many)
};
constexpr int kAnswerKinds = 4;

void count_answer(Answer answer);

// This database's totals by Answer; false without the preloaded library, or when the
// table of databases is full (256 databases counted and all still exist).
bool answer_totals(int64 totals[kAnswerKinds]);

// For shmem.cpp.
Size answer_counters_size();
void attach_answer_counters(void* memory, bool initialize);

}  // namespace idempotency
