#include "pg/module/shmem.hpp"

#include "pg/common/errors.hpp"
#include "pg/keys/identity_lock.hpp"
#include "pg/keys/outcome_counters.hpp"
#include "pg/worker/worker.hpp"

extern "C" {
#include "miscadmin.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
}

namespace idempotency {

// Each part of the library's shared memory: its size, and how a process attaches to
// it (initializing it when it is new).
struct Segment {
  const char* name;
  Size (*size)();
  void (*attach)(void* memory, bool initialize);
};
static const Segment kSegments[] = {
    {"idempotency identity locks", insert_counts_size, attach_insert_counts},
    {"idempotency", worker_state_size, attach_worker_state},
    {"idempotency answer counters", answer_counters_size, attach_answer_counters},
};

static shmem_request_hook_type previous_request;
static shmem_startup_hook_type previous_startup;

static void request_memory() {
  if (previous_request) previous_request();
  for (const Segment& segment : kSegments) RequestAddinShmemSpace(segment.size());
}

static void attach_memory() {
  if (previous_startup) previous_startup();
  LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
  for (const Segment& segment : kSegments) {
    bool found;
    void* memory = ShmemInitStruct(segment.name, segment.size(), &found);
    segment.attach(memory, !found);
  }
  LWLockRelease(AddinShmemInitLock);
}

void install_shared_memory_hooks() {
  previous_request = shmem_request_hook;
  shmem_request_hook = [] { guarded(request_memory); };
  previous_startup = shmem_startup_hook;
  shmem_startup_hook = [] { guarded(attach_memory); };
}

}  // namespace idempotency
