#!/usr/bin/env bash
# The relay's throughput (docs/performance.md, "The relay"): events per second through
# idem-relay per sink, beside the SQL relay calls alone (claim + ack, no publish) and
# a relay written by hand (test/bench/relay_by_hand.py, Python and pika, what teams
# write themselves), at batch sizes 1, 100 and 1000, and the
# relay's own CPU time per event beside the database's. Everything on this machine:
# PostgreSQL (a cluster of its own), nats-server with JetStream, and the relay.
#
#   test/bench/relay.sh            (as root: the cluster runs as postgres)
#   EVENTS=20000 BATCHES="100 1000" SINKS="stdout nats" CONCURRENCY=200 test/bench/relay.sh
#
# SINKS: sql (the SQL calls alone), stdout, nats, amqp (idem-relay to RabbitMQ, started
# here when an amqp sink or by-hand is asked for), amqp-pipeline (the same with
# --amqp-pipeline=$AMQP_PIPELINE, default 16), by-hand (relay_by_hand.py, to RabbitMQ).
# RabbitMQ's queues: durable classic queues of version QUEUE_VERSION (default 2, the
# storage RabbitMQ 4.3 keeps alone; 1 is 3.10's default), QUEUES of them (default 1),
# the events going round robin over topics bench.t0 ... each bound to its own queue.
#
# Each run emits EVENTS events over 200 aggregates (on an empty queue: nothing consumes
# it), then starts the relay and times it from start to an empty outbox. CPU: the relay's (user + system, from /proc) and the
# PostgreSQL server's (this cluster's processes) over the run, in microseconds per event.
set -euo pipefail
cd "$(dirname "$0")/../.."
EVENTS=${EVENTS:-20000}
BATCHES=${BATCHES:-"1 100 1000"}
SINKS=${SINKS:-"sql stdout nats amqp amqp-pipeline by-hand"}
QUEUES=${QUEUES:-1}   # topics bench.t0 ... (round robin), each to its own RabbitMQ queue
PGBIN=${PGBIN:-/usr/lib/postgresql/15/bin}
work=$(mktemp -d /tmp/idem-relay-bench.XXXXXX)
chown postgres: "$work"
port=$((20000 + RANDOM % 20000)); nats_port=$((port + 1)); amqp_port=$((port + 2))
epmd_port=$((port + 3)); dist_port=$((port + 4))
cleanup() {
  [ -n "${nats_pid:-}" ] && kill "$nats_pid" 2>/dev/null || true
  [ -n "${rabbit_pid:-}" ] && kill "$rabbit_pid" 2>/dev/null && wait "$rabbit_pid" 2>/dev/null || true
  [ -n "${epmd_pid:-}" ] && kill "$epmd_pid" 2>/dev/null || true
  su postgres -c "$PGBIN/pg_ctl -D $work/data -m immediate stop" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

make -s -C relay OUT="$work/idem-relay" GOCACHE="$work/gocache" >/dev/null
relay_bin=${RELAY_BIN:-$work/idem-relay}   # RELAY_BIN: another build, e.g. with symbols for perf
su postgres -c "$PGBIN/initdb -D $work/data -A trust" >/dev/null
cat >>"$work/data/postgresql.conf" <<CONF
shared_preload_libraries = 'idempotency'
port = $port
unix_socket_directories = '$work'
listen_addresses = '127.0.0.1'
fsync = on
synchronous_commit = on
CONF
su postgres -c "$PGBIN/pg_ctl -D $work/data -l $work/pg.log -w start" >/dev/null
psql() { command "$PGBIN/psql" -h 127.0.0.1 -p "$port" -U postgres -d postgres -qAtX "$@"; }
psql -c 'CREATE EXTENSION idempotency'
/usr/sbin/nats-server -js -a 127.0.0.1 -p "$nats_port" -sd "$work/nats" >"$work/nats.log" 2>&1 &
nats_pid=$!
sleep 1
make -s -C relay natsread NATSREAD_OUT="$work/natsread" GOCACHE="$work/gocache" >/dev/null
"$work/natsread" "nats://127.0.0.1:$nats_port" create BENCH 'bench.>'

if [[ " $SINKS " == *" amqp"* || " $SINKS " == *" by-hand "* ]]; then
  r=$work/rabbit; mkdir -p "$r/home" "$r/mnesia"
  head -c 15 /dev/urandom | base64 | tr -dc A-Z >"$r/home/.erlang.cookie"; chmod 400 "$r/home/.erlang.cookie"
  printf 'disk_free_limit.absolute = 1MB\nvm_memory_high_watermark.relative = 0.9\n' >"$r/rabbitmq.conf"
  export HOME=$r/home ERL_EPMD_PORT=$epmd_port ERL_EPMD_ADDRESS=127.0.0.1 RABBITMQ_NODENAME=bench@localhost \
    RABBITMQ_NODE_IP_ADDRESS=127.0.0.1 RABBITMQ_NODE_PORT=$amqp_port RABBITMQ_DIST_PORT=$dist_port \
    RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS='-kernel inet_dist_use_interface {127,0,0,1}' \
    RABBITMQ_MNESIA_BASE=$r/mnesia RABBITMQ_LOG_BASE=$r/log RABBITMQ_CONFIG_FILE=$r/rabbitmq.conf \
    RABBITMQ_ADVANCED_CONFIG_FILE=$r/advanced.config RABBITMQ_CONF_ENV_FILE=$r/rabbitmq-env.conf \
    RABBITMQ_ENABLED_PLUGINS_FILE=$r/enabled_plugins RABBITMQ_PLUGINS_EXPAND_DIR=$r/plugins \
    RABBITMQ_PID_FILE=$r/rabbitmq.pid
  /usr/bin/epmd -port "$epmd_port" >/dev/null 2>&1 & epmd_pid=$!
  /usr/lib/rabbitmq/bin/rabbitmq-server >"$r/out.log" 2>&1 & rabbit_pid=$!
  amqp_url=amqp://guest:guest@127.0.0.1:$amqp_port/
  for _ in $(seq 120); do
    QUEUE_VERSION=${QUEUE_VERSION:-2} /usr/bin/python3 test/relay/amqpread.py "$amqp_url" bind idem.events bench-q0 bench.t0 2>/dev/null && break
    sleep 1
  done
  for ((q = 1; q < QUEUES; q++)); do
    QUEUE_VERSION=${QUEUE_VERSION:-2} /usr/bin/python3 test/relay/amqpread.py "$amqp_url" bind idem.events "bench-q$q" "bench.t$q"
  done
fi

psql -c 'CREATE TABLE bench_last (event_id idem_key)'
# Emits the events, EVENTS over 200 aggregates, and keeps each aggregate's last one in
# bench_last: an aggregate's events are delivered in seq order, so the outbox is empty
# when those 200 are delivered. That is what wait_delivered polls (200 key lookups,
# in one session): a scan of the pending events costs the database more as the
# delivered ones pile up, and a new connection per poll costs a process start.
emit() {
  psql -c "TRUNCATE bench_last;
           WITH e AS (SELECT g, idem_emit('bench.t' || (g % $QUEUES), jsonb_build_object('n', g, 'pad', repeat('x', 100)), 'a' || (g % 200)) AS id
                      FROM generate_series(1, $EVENTS) g)
           INSERT INTO bench_last SELECT id FROM e WHERE g > $EVENTS - 200" >/dev/null
}
wait_delivered() {
  psql -c "DO \$\$ BEGIN
             WHILE EXISTS (SELECT FROM bench_last b
                          WHERE (SELECT state FROM idempotency.outbox o WHERE o.event_id = b.event_id) = 'p') LOOP
               COMMIT;  -- holds no snapshot between polls: vacuum and pruning go on
               PERFORM pg_sleep(0.05);
             END LOOP; END \$\$"
}
# Jiffies (user + system) of a process, or of all PostgreSQL server processes.
jiffies() { awk '{print $14 + $15}' "/proc/$1/stat"; }
pg_jiffies() {
  # This cluster's postmaster (its reaped children in cutime/cstime) and its children.
  # A backend that ends while they are read (the relay's, as it stops) moves its time
  # from its own line to the postmaster's: read again until the postmaster's count of
  # reaped children held still, or that time counts twice or not at all.
  local pm total pid j before after
  pm=$(head -1 "$work/data/postmaster.pid")
  reaped() { awk '{print $16 + $17}' "/proc/$pm/stat"; }
  while :; do
    before=$(reaped) total=0
    for pid in "$pm" $(pgrep -P "$pm"); do
      j=$(awk '{print $14 + $15 + $16 + $17}' "/proc/$pid/stat" 2>/dev/null) || j=0
      total=$((total + ${j:-0}))
    done
    after=$(reaped)
    [ "$before" = "$after" ] && break
  done
  echo "$total"
}
hz=$(getconf CLK_TCK)

# The broker's own process: RabbitMQ's Erlang VM, or nats-server.
broker_pid() {
  case $1 in
    amqp*|by-hand) pgrep -f "beam.smp.*$work" | head -1 || true ;;
    nats) echo "$nats_pid" ;;
  esac
}

printf '%-9s %6s %10s %12s %12s %12s\n' sink batch events/s relay_us/ev db_us/ev broker_us/ev
for sink in $SINKS; do
  for batch in $BATCHES; do
    # batch 1 is slow: a tenth of the events.
    n=$EVENTS; [ "$batch" = 1 ] && n=$((EVENTS / 10))
    EVENTS=$n emit
    # The emitting session's backend has exited and been reaped before the CPU is read
    # (its time then moves to the postmaster's count of reaped children).
    sleep 0.5
    # Each run starts with an empty queue (nothing consumes it here).
    case $sink in
      amqp*|by-hand) for ((q = 0; q < QUEUES; q++)); do /usr/bin/python3 test/relay/amqpread.py "$amqp_url" purge "bench-q$q"; done ;;
    esac
    bp=$(broker_pid "$sink"); b0=0; [ -n "$bp" ] && b0=$(jiffies "$bp")
    db0=$(pg_jiffies); t0=$(date +%s.%N)
    case $sink in
      sql)
        # The SQL calls alone: claim and ack in one session, nothing published.
        psql -c "DO \$\$ DECLARE ids idem_key[]; BEGIN LOOP
                   SELECT array_agg(event_id) INTO ids FROM idem_outbox_claim('bench', $batch, '30s');
                   EXIT WHEN ids IS NULL; PERFORM idem_outbox_ack('bench', ids); COMMIT; END LOOP; END \$\$"
        relay_j=0 ;;
      by-hand)
        DATABASE_URL="host=127.0.0.1 port=$port user=postgres dbname=postgres" AMQP_URL=$amqp_url \
          BATCH_SIZE=$batch IDLE_SECONDS=0.01 RELAY_NAME=bench-py /usr/bin/python3 test/bench/relay_by_hand.py \
          >/dev/null 2>"$work/relay.log" &
        pid=$!
        wait_delivered
        relay_j=$(jiffies "$pid")
        kill -TERM "$pid"; wait "$pid" ;;
      *)
        args=(--sink="${sink%-pipeline}" --batch-size="$batch" --listen= --idle=10ms --concurrency="${CONCURRENCY:-32}")
        [ "$sink" = nats ] && args+=(--nats-url="nats://127.0.0.1:$nats_port" --nats-subject-prefix=bench.)
        [ "$sink" = amqp ] && args+=(--amqp-url="$amqp_url")
        [ "$sink" = amqp-pipeline ] && args+=(--amqp-url="$amqp_url" --amqp-pipeline="${AMQP_PIPELINE:-16}")
        PGHOST=127.0.0.1 PGPORT=$port PGUSER=postgres PGDATABASE=postgres PGSSLMODE=disable \
          "$relay_bin" "${args[@]}" >/dev/null 2>"$work/relay.log" &
        pid=$!
        wait_delivered
        relay_j=$(jiffies "$pid")
        kill -TERM "$pid"; wait "$pid" ;;
    esac
    t1=$(date +%s.%N); db1=$(pg_jiffies); b1=0; [ -n "$bp" ] && b1=$(jiffies "$bp")
    awk -v n="$n" -v t="$(echo "$t1 - $t0" | bc)" -v rj="$relay_j" -v dj="$((db1 - db0))" -v hz="$hz" \
        -v s="$sink" -v b="$batch" -v bj="$((b1 - b0))" -v bp="$bp" \
      'BEGIN { printf "%-9s %6d %10.0f %12.1f %12.1f %12s\n", s, b, n / t, rj / hz / n * 1e6, dj / hz / n * 1e6,
               bp == "" ? "-" : sprintf("%.1f", bj / hz / n * 1e6) }'
  done
done
