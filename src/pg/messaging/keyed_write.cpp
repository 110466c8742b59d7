#include "pg/messaging/keyed_write.hpp"

#include "pg/keys/identity_lock.hpp"
#include "pg/common/waits.hpp"

extern "C" {
#include "miscadmin.h"
}

namespace idempotency {

bool write_keyed(Table* table, Oid index, ScanKey keys, int nkeys, const LOCKTAG& lock,
                 TimestampTz deadline, DecideWrite decide) {
  long sleep_us = 50;
  for (;;) {
    CHECK_FOR_INTERRUPTS();
    if (!lock_briefly(lock, deadline)) return false;
    Look look = table_look(table, index, keys, nkeys);
    if (look.found && TransactionIdIsValid(look.writer)) {
      unlock_briefly(lock);
      if (!wait_for_writer(look.writer, deadline)) return false;
      continue;
    }
    KeyedWrite write = decide(look.found);
    // Others update the row only under this lock, but the reaper deletes expired
    // applied versions without it: it may hold or have deleted the row.
    Write written = Write::kDone;
    if (write.kind == KeyedWrite::kInsert) table_insert(table, write.values, write.nulls);
    if (write.kind == KeyedWrite::kUpdate)
      written = table_try_update(table, &look.tid, write.values, write.nulls);
    unlock_briefly(lock);
    if (written == Write::kDone) return true;
    if (written == Write::kBusy && !sleep_before_retry(&sleep_us, deadline)) return false;
  }
}

}  // namespace idempotency
