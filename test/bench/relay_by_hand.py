#!/usr/bin/python3
"""A relay written by hand: the benchmark's baseline (test/bench/relay.sh, sink relay.py).

This is the relay teams write themselves when they adopt an outbox, in its usual
shape: one process, one event at a time, a publisher confirm awaited for each. The
benchmark runs it side by side with idem-relay (relay/README.md), the relay this
project ships, to the same RabbitMQ in the same run (docs/performance.md, "The relay").
It is not an example to copy: use idem-relay. (It was examples/messaging/relay.py;
that file is now a few lines showing the SQL calls.)

It loops:

  1. idem_outbox_claim(RELAY_NAME, BATCH_SIZE, LEASE): one short transaction that leases
     up to BATCH_SIZE committed, undelivered events to this relay, oldest first, and
     per aggregate in `seq` order;
  2. publishes them, in the order given, to the topic exchange EXCHANGE with the
     event's topic as routing key, persistent, `mandatory`, with publisher confirms:
     each basic_publish returns once the broker has taken the message. The message
     carries message_id = event_id and the headers topic, aggregate, seq, attempt
     and emitted_at (plus the event's own headers);
  3. idem_outbox_ack(RELAY_NAME, ids) for the confirmed events.

Dead letters: an event the broker refuses goes to idem_outbox_dead(RELAY_NAME, ids,
reason) instead, so it stops holding back its aggregate's later events. The broker
refuses an event when no queue is bound for its topic (the message comes back as
unroutable, because it is published `mandatory`) or when it nacks it.

Failures: events published but not acked (the relay died, or lost PostgreSQL before
the ack) are handed out again when their lease runs out (attempt + 1) and published
again. It reconnects to both PostgreSQL and the broker on failure, with a growing pause
(up to 5 s); events confirmed before the broker connection broke are still acked.

Run it (Debian 12: apt-get install python3-psycopg python3-pika) as a role that may
call idem_outbox_claim, idem_outbox_ack and idem_outbox_dead:

    DATABASE_URL='host=127.0.0.1 dbname=shop user=relay' \\
    AMQP_URL='amqp://guest:guest@127.0.0.1:5672/%2F' RELAY_NAME=relay-1 \\
      /usr/bin/python3 test/bench/relay_by_hand.py

Settings (environment): DATABASE_URL, AMQP_URL, RELAY_NAME (default relay-<pid>),
EXCHANGE (idem.events), BATCH_SIZE (100), LEASE (30s: longer than publishing a batch
takes), IDLE_SECONDS (0.5: the pause when there is nothing to relay), PUBLISH_DELAY
(0: seconds to pause after each message). It stops at the end of its current batch on
SIGTERM or SIGINT.
"""
import json
import logging
import os
import signal
import time
from decimal import Decimal

import pika
import psycopg

DATABASE_URL = os.environ.get("DATABASE_URL", "")
AMQP_URL = os.environ.get("AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2F")
RELAY_NAME = os.environ.get("RELAY_NAME") or f"relay-{os.getpid()}"
EXCHANGE = os.environ.get("EXCHANGE", "idem.events")
BATCH_SIZE = int(os.environ.get("BATCH_SIZE", "100"))
LEASE = os.environ.get("LEASE", "30s")
IDLE_SECONDS = float(os.environ.get("IDLE_SECONDS", "0.5"))
PUBLISH_DELAY = float(os.environ.get("PUBLISH_DELAY", "0"))

log = logging.getLogger("relay")
stopping = False


def stop(signum, frame):
    global stopping
    stopping = True


def pause(seconds):
    """Sleeps, but returns early when asked to stop."""
    deadline = time.monotonic() + seconds
    while not stopping and time.monotonic() < deadline:
        time.sleep(min(0.1, deadline - time.monotonic()))


def connect_db():
    # Autocommit: each statement below is its own short transaction, so a lease is
    # committed (and visible to the other relays) as soon as it is taken.
    db = psycopg.connect(DATABASE_URL, autocommit=True)
    log.info("connected to PostgreSQL")
    return db


def connect_broker():
    connection = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
    channel = connection.channel()
    channel.exchange_declare(EXCHANGE, exchange_type="topic", durable=True)
    channel.confirm_delivery()  # basic_publish now waits for the broker's ack
    log.info("connected to the broker")
    return connection, channel


def claim(db):
    return db.execute(
        """SELECT event_id::text, topic, aggregate, seq, payload::text, headers::text,
                  emitted_at, attempt
           FROM idem_outbox_claim(%s, %s, %s::interval)""",
        (RELAY_NAME, BATCH_SIZE, LEASE)).fetchall()


def message_properties(event_id, topic, aggregate, seq, headers, emitted_at, attempt):
    # The event's own headers (idem_emit's `headers`), then ours; JSON numbers with a
    # fraction as Decimal, since AMQP tables have no float.
    table = json.loads(headers, parse_float=Decimal) if headers else {}
    table.update(topic=topic, aggregate=aggregate, seq=seq, attempt=attempt,
                 emitted_at=emitted_at.isoformat())
    return pika.BasicProperties(message_id=event_id, type=topic, headers=table,
                                content_type="application/json",
                                delivery_mode=2,  # persistent
                                timestamp=int(emitted_at.timestamp()), app_id="idempotency-relay")


def publish(channel, events):
    """Publishes the batch in order. Returns (delivered ids, {dead id: reason}, error):
    error is the broker failure that ended the batch early, else None."""
    delivered, dead = [], {}
    for event_id, topic, aggregate, seq, payload, headers, emitted_at, attempt in events:
        try:
            channel.basic_publish(EXCHANGE, topic, payload.encode(),
                                  message_properties(event_id, topic, aggregate, seq, headers,
                                                     emitted_at, attempt),
                                  mandatory=True)
        except pika.exceptions.UnroutableError:
            dead[event_id] = (f"unroutable: no queue is bound to exchange {EXCHANGE} "
                              f"for routing key {topic}")
            log.warning("dead letter %s (%s/%s#%s): %s", event_id, topic, aggregate, seq,
                        dead[event_id])
            continue
        except pika.exceptions.NackError:
            dead[event_id] = "rejected by the broker (basic.nack)"
            log.warning("dead letter %s (%s/%s#%s): %s", event_id, topic, aggregate, seq,
                        dead[event_id])
            continue
        except (pika.exceptions.AMQPError, OSError) as error:
            # The connection or channel broke: this event and the rest of the batch stay
            # leased to us and are handed out again when the lease runs out.
            return delivered, dead, error
        delivered.append(event_id)
        log.info("published %s (%s/%s#%s, attempt %s)", event_id, topic, aggregate, seq,
                 attempt)
        if PUBLISH_DELAY:
            pause(PUBLISH_DELAY)
    return delivered, dead, None


def finish(db, delivered, dead):
    """Acks the delivered events and moves the dead ones, in one transaction."""
    with db.transaction():
        acked = 0
        if delivered:
            acked = db.execute("SELECT idem_outbox_ack(%s, %s::idem_key[])",
                               (RELAY_NAME, delivered)).fetchone()[0]
        for event_id, reason in dead.items():
            db.execute("SELECT idem_outbox_dead(%s, ARRAY[%s::idem_key], %s)",
                       (RELAY_NAME, event_id, reason))
    log.info("acked %d of %d published events, %d dead", acked, len(delivered), len(dead))
    if acked < len(delivered):
        # Our lease ran out before the ack: another relay has them (or will) and
        # publishes them again. Consumers skip the second copy.
        log.warning("%d published events were no longer leased to %s",
                    len(delivered) - acked, RELAY_NAME)


def main():
    logging.basicConfig(level=logging.INFO,
                        format=f"%(asctime)s {RELAY_NAME} %(levelname)s %(message)s")
    logging.getLogger("pika").setLevel(logging.CRITICAL)  # its errors are logged below, once
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    db = broker = channel = None
    backoff = 0.2
    while not stopping:
        try:
            if db is None or db.closed:
                db = connect_db()
            if broker is None or broker.is_closed:
                broker, channel = connect_broker()
            events = claim(db)
            if not events:
                backoff = 0.2
                # Serves the connection meanwhile (heartbeats; a closed connection is
                # noticed here rather than at the next publish).
                broker.sleep(IDLE_SECONDS)
                continue
            log.info("claimed %d events", len(events))
            delivered, dead, broker_error = publish(channel, events)
            # Ack what the broker confirmed even if it failed later in the batch.
            if delivered or dead:
                finish(db, delivered, dead)
            if broker_error is not None:
                raise broker_error
            backoff = 0.2
        except psycopg.Error as error:
            log.error("PostgreSQL: %s; reconnecting in %.1fs", str(error).strip(), backoff)
            if db is not None:
                db.close()
            db = None
        except (pika.exceptions.AMQPError, OSError) as error:
            log.error("broker: %r; reconnecting in %.1fs", error, backoff)
            if broker is not None and broker.is_open:
                try:
                    broker.close()
                except (pika.exceptions.AMQPError, OSError):
                    pass
            broker = None
        else:
            continue
        pause(backoff)
        backoff = min(backoff * 2, 5.0)
    log.info("stopped")
    if broker is not None and broker.is_open:
        broker.close()
    if db is not None:
        db.close()


if __name__ == "__main__":
    main()
