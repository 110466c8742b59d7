// The relay's functions: idem_outbox_claim, _ack, _dead, _retry and _dead_letters.
// They read and write idempotency.outbox directly; the rules (which event is ready,
// the per-aggregate gate, which ack counts) are src/core/outbox.hpp's. A claim locks
// rows without queueing: a relay never waits for another relay's batch. Ack, dead and
// retry wait for an event another transaction is writing, in the lock queue (the
// deadlock detector sees them), until idempotency.wait_timeout.
// With a distributed key store a client's call serves every shard of
// idempotency.routed_outbox: it calls the function's twin (<function>_routed, with a
// routing value) once per shard it needs, through Citus, which runs it on the shard's
// node, where it works on that shard as on the node-local outbox. An aggregate's
// events are all in one shard (they share a routing value), so the per-aggregate
// order of each shard's batch is the order of the whole batch.
#include <algorithm>
#include <optional>

#include "core/key.hpp"
#include "core/outbox.hpp"
#include "pg/citus/twin_privilege.hpp"
#include "pg/citus/citus_forward.hpp"
#include "pg/citus/citus_meta.hpp"
#include "pg/keys/key_row.hpp"
#include "pg/keys/arguments.hpp"
#include "pg/common/errors.hpp"
#include "pg/common/function_ref.hpp"
#include "pg/messaging/messaging_catalog.hpp"
#include "pg/messaging/outbox_row.hpp"
#include "pg/common/table.hpp"

extern "C" {
#include "access/htup_details.h"
#include "catalog/pg_type.h"
#include "common/pg_prng.h"
#include "funcapi.h"
#include "executor/tuptable.h"
#include "miscadmin.h"
#include "tcop/utility.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/hsearch.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/tuplestore.h"
}

namespace idempotency {

namespace col = outbox_column;

// The elements of an array of event ids; returns how many.
static int elements_of(ArrayType* ids, Datum** elements, bool** nulls) {
  int count;
  int16 length;
  bool byval;
  char align;
  get_typlenbyvalalign(ARR_ELEMTYPE(ids), &length, &byval, &align);
  deconstruct_array(ids, ARR_ELEMTYPE(ids), length, byval, align, elements, nulls, &count);
  return count;
}

// ---------------------------------------------------------------------------
// Where a relay function runs
// ---------------------------------------------------------------------------

// With a distributed key store, a client's call (not the twin's, which has argument
// `route_arg`) runs on every shard: returns idempotency.routed_outbox, else InvalidOid.
static Oid on_every_shard(FunctionCallInfo fcinfo, int route_arg, const char* function) {
  if (PG_NARGS() > route_arg) return InvalidOid;
  Oid outbox = routed_outbox();
  if (OidIsValid(outbox) && !citus_may_forward(fcinfo))
    ereport(ERROR, errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
            errmsg("%s cannot serve a distributed key store from inside a call Citus delegated",
                   function),
            errdetail("It calls every shard's node through Citus, which a delegated call cannot."),
            errhint("Call it in the relay's own session, on the coordinator."));
  return outbox;
}

// The outbox the call works on: the node-local one, or for the twin the shard of its
// routing value (argument `route_arg`), on this node.
static MessagingOids relay_oids(FunctionCallInfo fcinfo, int route_arg, const char* function) {
  if (PG_NARGS() <= route_arg) return required_messaging_oids();
  MessagingTarget target;
  Route route;
  if (!messaging_target(fcinfo, route_arg, function, &target, &route))
    elog(ERROR, "%s was to be forwarded from its own twin", function);  // twins never are
  return target.oids;
}

// One routing value per shard of the routed outbox, for the twins' calls.
struct Shards {
  Datum* routes;
  int64* shardids;
  int count;
  Oid type;
};

static Shards shards_of(Oid outbox) {
  Shards shards{};
  shards.count = citus_shard_values(outbox, &shards.routes, &shards.shardids);
  CitusColumn column;
  citus_column(outbox, &column);
  shards.type = column.type;
  return shards;
}

// An ack names events by id, and an id does not say its shard: the session that was
// handed them out (a relay's loop) remembers the shards of the ids idem_emit made
// (random UUIDs: no other event has one), so that its ack or dead letter goes to those
// shards only. Every other id goes to every shard, so that the ack settles each event
// of that id leased to the relay, as from any session: one it does not know (claimed
// by another session, or forgotten: at most kRemembered are kept, and a split makes
// new shards), and an application's own id, which it may have given again with
// another routing value (the outbox's key is the id and the route), perhaps to an
// event another session of the relay was handed from another shard.
constexpr long kRemembered = 16384;
struct EventKey {
  uint32 length;
  char bytes[kMaxKeyBytes];
};
struct EventShard {
  EventKey key;
  int64 shardid;  // kEveryShard: handed out from more than one
};
constexpr int64 kEveryShard = -1;
static HTAB* event_shards;

static EventKey event_key(Datum id) {
  EventKey key;
  memset(&key, 0, sizeof(key));
  const struct varlena* v = PG_DETOAST_DATUM_PACKED(id);
  key.length = Min(VARSIZE_ANY_EXHDR(v), kMaxKeyBytes);
  memcpy(key.bytes, VARDATA_ANY(v), key.length);
  return key;
}

static void remember_shard(Datum id, int64 shardid) {
  EventKey key = event_key(id);
  if (!is_stored_random_uuid(std::string_view(key.bytes, key.length))) return;
  if (event_shards != nullptr && hash_get_num_entries(event_shards) >= kRemembered) {
    hash_destroy(event_shards);
    event_shards = nullptr;
  }
  if (event_shards == nullptr) {
    HASHCTL control{};
    control.keysize = sizeof(EventKey);
    control.entrysize = sizeof(EventShard);
    control.hcxt = TopMemoryContext;
    event_shards = hash_create("idempotency relay's event shards", 1024, &control,
                               HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
  }
  bool known;
  auto entry = static_cast<EventShard*>(hash_search(event_shards, &key, HASH_ENTER, &known));
  entry->shardid = known && entry->shardid != shardid ? kEveryShard : shardid;
}

// The shard remembered for `id` (and forgotten now), or kEveryShard.
static int64 recall_shard(Datum id) {
  EventShard found;
  EventKey key = event_key(id);
  if (event_shards == nullptr) return kEveryShard;
  auto entry = static_cast<EventShard*>(hash_search(event_shards, &key, HASH_FIND, nullptr));
  if (entry == nullptr) return kEveryShard;
  found = *entry;
  hash_search(event_shards, &key, HASH_REMOVE, nullptr);
  return found.shardid;
}

// The sum of the twin's counts (ack, dead, retry) over the shards: the listed ids
// (argument `ids_arg`) each to its remembered shard, or to every shard; all dead
// letters (no list) on every shard. A shard ignores the ids it does not hold.
static int64 count_on_shards(FunctionCallInfo fcinfo, Oid outbox, int ids_arg, int route_arg) {
  Shards shards = shards_of(outbox);
  NullableDatum args[FUNC_MAX_ARGS];
  memcpy(args, fcinfo->args, sizeof(NullableDatum) * PG_NARGS());
  // The shards to call, and each one's ids.
  auto send = static_cast<bool*>(palloc0(sizeof(bool) * shards.count));
  auto lists = static_cast<ArrayBuildState**>(palloc0(sizeof(ArrayBuildState*) * shards.count));
  if (args[ids_arg].isnull) {
    for (int i = 0; i < shards.count; i++) send[i] = true;
  } else {
    ArrayType* ids = PG_GETARG_ARRAYTYPE_P(ids_arg);
    Oid type = ARR_ELEMTYPE(ids);
    Datum* elements;
    bool* nulls;
    int count = elements_of(ids, &elements, &nulls);
    for (int n = 0; n < count; n++) {
      if (nulls[n]) continue;  // ignored, as by the shards
      int64 shardid = recall_shard(elements[n]);
      int only = -1;  // its shard's place, if remembered and still there (not split)
      for (int i = 0; i < shards.count; i++)
        if (shards.shardids[i] == shardid) only = i;
      for (int i = 0; i < shards.count; i++) {
        if (only != -1 && i != only) continue;
        if (lists[i] == nullptr) lists[i] = initArrayResult(type, CurrentMemoryContext, false);
        accumArrayResult(lists[i], elements[n], false, type, CurrentMemoryContext);
        send[i] = true;
      }
    }
  }
  int64 total = 0;
  for (int i = 0; i < shards.count; i++) {
    if (!send[i]) continue;
    CHECK_FOR_INTERRUPTS();
    if (lists[i] != nullptr) args[ids_arg].value = makeArrayResult(lists[i], CurrentMemoryContext);
    bool isnull;
    Datum changed = citus_forward(fcinfo, route_arg, shards.routes[i], shards.type, &isnull, args);
    if (!isnull) total += DatumGetInt64(changed);
  }
  return total;
}

// The event's columns as idem_outbox_claim and idem_outbox_dead_letters return them
// (the claim's result has no reason: the tuplestore takes the columns of its type).
static void put_event(ReturnSetInfo* rsinfo, Table* outbox, int32 attempt) {
  slot_getallattrs(outbox->slot);
  const Datum* v = outbox->slot->tts_values;
  const bool* n = outbox->slot->tts_isnull;
  Datum values[9] = {v[col::kEventId - 1],   v[col::kTopic - 1],     v[col::kAggregate - 1],
                     v[col::kSeq - 1],       v[col::kPayload - 1],   v[col::kHeaders - 1],
                     v[col::kEmittedAt - 1], Int32GetDatum(attempt), v[col::kReason - 1]};
  bool nulls[9] = {
      false, false, n[col::kAggregate - 1], n[col::kSeq - 1], false, n[col::kHeaders - 1],
      false, false, n[col::kReason - 1]};
  tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
}

// ---------------------------------------------------------------------------
// idem_outbox_claim
// ---------------------------------------------------------------------------

// A claim examines at most this many pending events per event asked for (and at
// least kMinWindow), in emission order: behind a backlog held by other relays'
// leases, a claim returns fewer events (or none) instead of reading the whole queue.
constexpr int64 kWindowFactor = 10;
constexpr int64 kMinWindow = 10000;

// An aggregate's entry in a batch's gate: (topic, aggregate) as one fixed-size key.
struct GateKey {
  char bytes[2 * sizeof(uint32) + 2 * 255];
};
struct GateEntry {
  GateKey key;
  AggregateSeen seen;
};

static GateKey gate_key(Datum topic, Datum aggregate) {
  GateKey key;
  memset(&key, 0, sizeof(key));
  char* out = key.bytes;
  for (Datum part : {topic, aggregate}) {
    const text* t = DatumGetTextPP(part);
    uint32 length = Min(VARSIZE_ANY_EXHDR(t), 255);
    memcpy(out, &length, sizeof(length));
    memcpy(out + sizeof(length), VARDATA_ANY(t), length);
    out += sizeof(length) + length;
  }
  return key;
}

// The relay's topics (NULL: all).
struct Topics {
  bool all;
  Datum* elements;
  bool* nulls;
  int count;
};

static Topics topics_argument(FunctionCallInfo fcinfo, int n) {
  Topics topics{PG_ARGISNULL(n), nullptr, nullptr, 0};
  if (!topics.all)
    deconstruct_array(PG_GETARG_ARRAYTYPE_P(n), TEXTOID, -1, false, TYPALIGN_INT, &topics.elements,
                      &topics.nulls, &topics.count);
  return topics;
}

static bool topic_wanted(Datum topic, const Topics& topics) {
  for (int i = 0; i < topics.count; i++)
    if (!topics.nulls[i] && same_text(topic, DatumGetTextPP(topics.elements[i]))) return true;
  return topics.all;
}

// The batch from every shard: each asked for what the batch still lacks, from a
// random first shard on (relays calling at once start at different shards, and no
// shard's backlog starves the others'). Each event's shard is remembered for its ack.
static void claim_on_every_shard(FunctionCallInfo fcinfo, ReturnSetInfo* rsinfo, Oid outbox,
                                 int32 max_events) {
  Shards shards = shards_of(outbox);
  NullableDatum args[4];
  memcpy(args, fcinfo->args, sizeof(args));
  int first = static_cast<int>(pg_prng_uint64_range(&pg_global_prng_state, 0, shards.count - 1));
  Tuplestorestate* batch = tuplestore_begin_heap(false, false, work_mem);
  TupleTableSlot* slot = MakeSingleTupleTableSlot(rsinfo->setDesc, &TTSOpsMinimalTuple);
  int32 handed_out = 0;
  for (int i = 0; i < shards.count && handed_out < max_events; i++) {
    CHECK_FOR_INTERRUPTS();
    int shard = (first + i) % shards.count;
    args[1].value = Int32GetDatum(max_events - handed_out);
    citus_forward_rows(fcinfo, 4, shards.routes[shard], shards.type, batch, rsinfo->setDesc, args);
    while (tuplestore_gettupleslot(batch, true, false, slot)) {
      bool isnull;
      remember_shard(slot_getattr(slot, 1, &isnull), shards.shardids[shard]);  // event_id
      tuplestore_puttupleslot(rsinfo->setResult, slot);
      handed_out++;
    }
    tuplestore_clear(batch);
  }
  ExecDropSingleTupleTableSlot(slot);
  tuplestore_end(batch);
}

static Datum outbox_claim(FunctionCallInfo fcinfo) {
  text* relay = name_argument(fcinfo, 0, "relay");
  require_argument(fcinfo, 1, "max_events");
  require_argument(fcinfo, 2, "lease");
  int32 max_events = PG_GETARG_INT32(1);
  if (max_events <= 0)
    ereport(ERROR, errcode(ERRCODE_INVALID_PARAMETER_VALUE), errmsg("max_events must be positive"));
  TimestampTz now = GetCurrentTimestamp();
  TimestampTz lease_end = plus(now, PG_GETARG_INTERVAL_P(2));
  if (lease_end <= now)
    ereport(ERROR, errcode(ERRCODE_INVALID_PARAMETER_VALUE), errmsg("lease must be positive"));
  Topics topics = topics_argument(fcinfo, 3);
  PreventCommandIfReadOnly("idem_outbox_claim()");
  Oid routed = on_every_shard(fcinfo, 4, "idem_outbox_claim");
  InitMaterializedSRF(fcinfo, 0);
  auto rsinfo = reinterpret_cast<ReturnSetInfo*>(fcinfo->resultinfo);
  if (OidIsValid(routed)) {
    claim_on_every_shard(fcinfo, rsinfo, routed, max_events);
    return (Datum)0;
  }

  MessagingOids oids = relay_oids(fcinfo, 4, "idem_outbox_claim");
  HASHCTL gate_control{};
  gate_control.keysize = sizeof(GateKey);
  gate_control.entrysize = sizeof(GateEntry);
  gate_control.hcxt = CurrentMemoryContext;
  HTAB* gate = hash_create("idempotency relay gate", 64, &gate_control,
                           HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
  MemoryContext row_context =
      AllocSetContextCreate(CurrentMemoryContext, "idempotency relay row", ALLOCSET_SMALL_SIZES);

  Table outbox;
  open_table(&outbox, oids.outbox, true);
  Snapshot snapshot = RegisterSnapshot(GetLatestSnapshot());
  IndexCursor pending;
  cursor_open(&outbox, &pending, oids.outbox_pending, snapshot, nullptr, 0);
  int32 handed_out = 0;
  int64 examined = 0;
  int64 window = Max(static_cast<int64>(max_events) * kWindowFactor, kMinWindow);
  while (handed_out < max_events && examined++ < window && cursor_next(&outbox, &pending)) {
    CHECK_FOR_INTERRUPTS();
    MemoryContext caller = MemoryContextSwitchTo(row_context);
    bool isnull;
    Datum topic = column(&outbox, col::kTopic, &isnull);
    if (topic_wanted(topic, topics)) {
      Datum aggregate = column(&outbox, col::kAggregate, &isnull);
      GateEntry* entry = nullptr;
      if (!isnull) {
        GateKey key = gate_key(topic, aggregate);
        bool known;
        entry = static_cast<GateEntry*>(hash_search(gate, &key, HASH_ENTER, &known));
        if (!known) entry->seen = AggregateSeen::kNotYet;
      }
      AggregateSeen seen = entry != nullptr ? entry->seen : AggregateSeen::kNotYet;
      OutboxEvent event = read_event(&outbox, relay);
      // First as scanned: leased in one write if that version is still the newest and
      // no other relay holds it.
      bool free = worth_locking(event, seen, now);
      Admission admission = admit(event, seen, free, now);
      Write written = Write::kChanged;
      if (admission == Admission::kHandOut) {
        written = write_event(&outbox, lease(event, lease_end), relay, nullptr, false, false);
        if (written == Write::kBusy) admission = admit(event, seen, false, now);
      }
      if (free && written == Write::kChanged) {
        // Changed since the scan's snapshot: decide on its newest version, locked.
        ItemPointerData tid = outbox.slot->tts_tid;
        Lock lock = table_lock(&outbox, &tid);
        if (lock == Lock::kGone) {  // removed: delivered and reaped
          MemoryContextSwitchTo(caller);
          MemoryContextReset(row_context);
          continue;
        }
        if (lock == Lock::kLocked) event = read_event(&outbox, relay);
        admission = admit(event, seen, lock == Lock::kLocked, now);
        if (admission == Admission::kHandOut)
          write_event(&outbox, lease(event, lease_end), relay, nullptr, false, true);
      }
      if (entry != nullptr) entry->seen = after(admission, seen);
      if (admission == Admission::kHandOut) {
        put_event(rsinfo, &outbox, lease(event, lease_end).attempt);
        handed_out++;
      }
    }
    MemoryContextSwitchTo(caller);
    MemoryContextReset(row_context);
  }
  cursor_close(&pending);
  UnregisterSnapshot(snapshot);
  close_table(&outbox);
  return (Datum)0;
}

// ---------------------------------------------------------------------------
// Acknowledging, dead letters, retry
// ---------------------------------------------------------------------------

// What an ack, dead or retry makes of an event, if anything.
using NextEvent = FunctionRef<std::optional<OutboxEvent>(const OutboxEvent& event)>;

// What the call writes besides the event's state.
struct Settlement {
  const text* relay;   // the calling relay (null: retry)
  const text* reason;  // idem_outbox_dead's
  bool set_reason;
  TimestampTz deadline;  // for an event another transaction is writing
};

// Settles the event version in the table's slot: written as read if it still is the
// newest and no one else holds it, else decided again on its newest version, locked
// (waiting in the queue for its holder until the deadline; an event that stays busy
// is left alone, and a relay will have it again). True if it was changed.
static bool settle(Table* outbox, const Settlement& how, NextEvent next) {
  std::optional<OutboxEvent> event = next(read_event(outbox, how.relay));
  if (!event) return false;
  Write written = write_event(outbox, *event, how.relay, how.reason, how.set_reason, false);
  if (written == Write::kDone) return true;
  ItemPointerData tid = outbox->slot->tts_tid;
  if (table_lock_waiting(outbox, &tid, how.deadline) != Lock::kLocked) return false;
  event = next(read_event(outbox, how.relay));
  if (!event) return false;
  write_event(outbox, *event, how.relay, how.reason, how.set_reason, true);
  return true;
}

// Settles each listed event (unknown ids and NULLs are ignored); counts those changed.
static int64 settle_listed(Table* outbox, const MessagingOids& oids, ArrayType* ids,
                           const Settlement& how, NextEvent next) {
  Datum* elements;
  bool* nulls;
  int count = elements_of(ids, &elements, &nulls);
  Snapshot snapshot = RegisterSnapshot(GetLatestSnapshot());
  int64 changed = 0;
  for (int i = 0; i < count; i++) {
    CHECK_FOR_INTERRUPTS();
    if (nulls[i]) continue;
    ScanKeyData key;
    ScanKeyInit(&key, 1, BTEqualStrategyNumber, oids.key_eq, elements[i]);
    if (table_find(outbox, oids.outbox_pkey, snapshot, &key, 1) && settle(outbox, how, next))
      changed++;
  }
  UnregisterSnapshot(snapshot);
  return changed;
}

static ArrayType* ids_argument(FunctionCallInfo fcinfo, int n) {
  require_argument(fcinfo, n, "event_ids");
  return PG_GETARG_ARRAYTYPE_P(n);
}

static Datum outbox_ack(FunctionCallInfo fcinfo) {
  text* relay = name_argument(fcinfo, 0, "relay");
  ArrayType* ids = ids_argument(fcinfo, 1);
  PreventCommandIfReadOnly("idem_outbox_ack()");
  Oid routed = on_every_shard(fcinfo, 2, "idem_outbox_ack");
  if (OidIsValid(routed)) PG_RETURN_INT64(count_on_shards(fcinfo, routed, 1, 2));
  MessagingOids oids = relay_oids(fcinfo, 2, "idem_outbox_ack");
  Table outbox;
  open_table(&outbox, oids.outbox, true);
  TimestampTz now = GetCurrentTimestamp();
  // A late ack (another relay has the event, or it is done) changes nothing.
  auto next = [now](const OutboxEvent& event) {
    return may_settle(event) ? std::optional(deliver(event, now)) : std::nullopt;
  };
  int64 acked = settle_listed(&outbox, oids, ids,
                              Settlement{relay, nullptr, false, default_wait_deadline(now)}, next);
  close_table(&outbox);
  PG_RETURN_INT64(acked);
}

static Datum outbox_dead(FunctionCallInfo fcinfo) {
  text* relay = name_argument(fcinfo, 0, "relay");
  ArrayType* ids = ids_argument(fcinfo, 1);
  text* reason = PG_ARGISNULL(2) ? nullptr : PG_GETARG_TEXT_PP(2);
  if (reason != nullptr) check_stored_size(PointerGetDatum(reason), "reason");
  PreventCommandIfReadOnly("idem_outbox_dead()");
  Oid routed = on_every_shard(fcinfo, 3, "idem_outbox_dead");
  if (OidIsValid(routed)) PG_RETURN_INT64(count_on_shards(fcinfo, routed, 1, 3));
  MessagingOids oids = relay_oids(fcinfo, 3, "idem_outbox_dead");
  Table outbox;
  open_table(&outbox, oids.outbox, true);
  auto next = [](const OutboxEvent& event) {
    return may_settle(event) ? std::optional(bury(event)) : std::nullopt;
  };
  Settlement how{relay, reason, true, default_wait_deadline(GetCurrentTimestamp())};
  int64 buried = settle_listed(&outbox, oids, ids, how, next);
  close_table(&outbox);
  PG_RETURN_INT64(buried);
}

static Datum outbox_retry(FunctionCallInfo fcinfo) {
  PreventCommandIfReadOnly("idem_outbox_retry()");
  Oid routed = on_every_shard(fcinfo, 1, "idem_outbox_retry");
  if (OidIsValid(routed)) PG_RETURN_INT64(count_on_shards(fcinfo, routed, 0, 1));
  MessagingOids oids = relay_oids(fcinfo, 1, "idem_outbox_retry");
  Table outbox;
  open_table(&outbox, oids.outbox, true);
  auto next = [](const OutboxEvent& event) {
    return may_requeue(event) ? std::optional(requeue(event)) : std::nullopt;
  };
  Settlement how{nullptr, nullptr, false, default_wait_deadline(GetCurrentTimestamp())};
  int64 requeued = 0;
  if (!PG_ARGISNULL(0)) {
    requeued = settle_listed(&outbox, oids, PG_GETARG_ARRAYTYPE_P(0), how, next);
  } else {
    // Every dead letter, through the dead index.
    Snapshot snapshot = RegisterSnapshot(GetLatestSnapshot());
    IndexCursor dead;
    cursor_open(&outbox, &dead, oids.outbox_dead, snapshot, nullptr, 0);
    while (cursor_next(&outbox, &dead)) {
      CHECK_FOR_INTERRUPTS();
      if (settle(&outbox, how, next)) requeued++;
    }
    cursor_close(&dead);
    UnregisterSnapshot(snapshot);
  }
  close_table(&outbox);
  PG_RETURN_INT64(requeued);
}

// Every shard's oldest `max_rows` dead letters, then the oldest of them all (by
// emitted_at: positions are each node's own), in the shards' order where equal.
static void dead_letters_on_every_shard(FunctionCallInfo fcinfo, ReturnSetInfo* rsinfo, Oid outbox,
                                        int32 max_rows) {
  constexpr int kEmittedAt = 7;  // the result's column
  Shards shards = shards_of(outbox);
  Tuplestorestate* all = tuplestore_begin_heap(false, false, work_mem);
  for (int i = 0; i < shards.count; i++) {
    CHECK_FOR_INTERRUPTS();
    citus_forward_rows(fcinfo, 2, shards.routes[i], shards.type, all, rsinfo->setDesc);
  }
  int64 count = tuplestore_tuple_count(all);
  auto rows = static_cast<HeapTuple*>(palloc(sizeof(HeapTuple) * Max(count, 1)));
  TupleTableSlot* slot = MakeSingleTupleTableSlot(rsinfo->setDesc, &TTSOpsMinimalTuple);
  for (int64 i = 0; i < count && tuplestore_gettupleslot(all, true, false, slot); i++)
    rows[i] = ExecCopySlotHeapTuple(slot);
  auto emitted_at = [desc = rsinfo->setDesc](HeapTuple row) {
    bool isnull;
    return DatumGetTimestampTz(heap_getattr(row, kEmittedAt, desc, &isnull));
  };
  std::stable_sort(rows, rows + count,
                   [&](HeapTuple a, HeapTuple b) { return emitted_at(a) < emitted_at(b); });
  for (int64 i = 0; i < count && i < max_rows; i++) tuplestore_puttuple(rsinfo->setResult, rows[i]);
  ExecDropSingleTupleTableSlot(slot);
  tuplestore_end(all);
}

static Datum outbox_dead_letters(FunctionCallInfo fcinfo) {
  text* topic = PG_ARGISNULL(0) ? nullptr : PG_GETARG_TEXT_PP(0);
  int32 max_rows = max_rows_argument(fcinfo, 1);
  InitMaterializedSRF(fcinfo, 0);
  auto rsinfo = reinterpret_cast<ReturnSetInfo*>(fcinfo->resultinfo);
  Oid routed = on_every_shard(fcinfo, 2, "idem_outbox_dead_letters");
  if (OidIsValid(routed)) {
    dead_letters_on_every_shard(fcinfo, rsinfo, routed, max_rows);
    return (Datum)0;
  }
  MessagingOids oids = relay_oids(fcinfo, 2, "idem_outbox_dead_letters");
  Table outbox;
  open_table(&outbox, oids.outbox, false);
  IndexCursor dead;
  cursor_open(&outbox, &dead, oids.outbox_dead, GetActiveSnapshot(), nullptr, 0);
  int32 listed = 0;
  while (listed < max_rows && cursor_next(&outbox, &dead)) {
    CHECK_FOR_INTERRUPTS();
    bool isnull;
    if (topic != nullptr && !same_text(column(&outbox, col::kTopic, &isnull), topic)) continue;
    put_event(rsinfo, &outbox, DatumGetInt32(column(&outbox, col::kAttempt, &isnull)));
    listed++;
  }
  cursor_close(&dead);
  close_table(&outbox);
  return (Datum)0;
}

}  // namespace idempotency

using namespace idempotency;

IDEM_TWINNED_SQL_FUNCTION(idem_outbox_claim, outbox_claim)
IDEM_TWINNED_SQL_FUNCTION(idem_outbox_ack, outbox_ack)
IDEM_TWINNED_SQL_FUNCTION(idem_outbox_dead, outbox_dead)
IDEM_TWINNED_SQL_FUNCTION(idem_outbox_retry, outbox_retry)
IDEM_TWINNED_SQL_FUNCTION(idem_outbox_dead_letters, outbox_dead_letters)
