#!/usr/bin/python3
"""The consumer: applies the events that idem-relay (relay/) published to a second database, the
ledger, exactly once and in each account's order.

It declares a durable queue QUEUE (with x-single-active-consumer, so that a second copy
of this process waits as a standby instead of breaking the order), binds it to the
topic exchange EXCHANGE for each topic in TOPICS, and reads it with manual acks. Each
message is one transaction in the ledger database:

    CALL apply_event(message_id, topic, aggregate, seq, body)     -- consumer.sql

which applies the event unless idem_once says this event id was applied before (a
message the relay published twice, or that the broker redelivered) or
idem_apply_version says its seq is not past the last one applied for its account.
The broker message is acked only after that transaction commits: if the consumer, the
broker connection or the database fails in between, the broker delivers it again and
the second copy is skipped. On such a failure it drops both connections (the broker
requeues what it had handed out, in order) and reconnects, with a growing pause (up to
5 s). A message that can never be applied (no message_id, aggregate or seq, or a body
that is not JSON) is rejected without requeue, so the broker drops it (or moves it to
the queue's dead-letter exchange, if one is configured).

Run it (Debian 12: apt-get install python3-psycopg python3-pika) against a database
with the extension where examples/messaging/consumer.sql has been run:

    DATABASE_URL='host=127.0.0.1 dbname=ledger' \\
    AMQP_URL='amqp://guest:guest@127.0.0.1:5672/%2F' \\
      /usr/bin/python3 examples/messaging/consumer.py

Settings (environment): DATABASE_URL, AMQP_URL, EXCHANGE (idem.events), QUEUE
(ledger), TOPICS (payment.created: a comma-separated list of routing keys to bind;
restarting with another topic added binds it too), PREFETCH (50). It stops after the
message in hand on SIGTERM or SIGINT.
"""
import logging
import os
import signal
import time

import pika
import psycopg

DATABASE_URL = os.environ.get("DATABASE_URL", "")
AMQP_URL = os.environ.get("AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2F")
EXCHANGE = os.environ.get("EXCHANGE", "idem.events")
QUEUE = os.environ.get("QUEUE", "ledger")
TOPICS = [topic.strip() for topic in os.environ.get("TOPICS", "payment.created").split(",")]
PREFETCH = int(os.environ.get("PREFETCH", "50"))

log = logging.getLogger("consumer")
stopping = False


def stop(signum, frame):
    global stopping
    stopping = True


def pause(seconds):
    """Sleeps, but returns early when asked to stop."""
    deadline = time.monotonic() + seconds
    while not stopping and time.monotonic() < deadline:
        time.sleep(min(0.1, deadline - time.monotonic()))


class Unusable(ValueError):
    """A message that no retry can apply."""


def connect_db():
    db = psycopg.connect(DATABASE_URL, autocommit=True)
    log.info("connected to PostgreSQL")
    return db


def connect_broker():
    connection = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
    channel = connection.channel()
    channel.exchange_declare(EXCHANGE, exchange_type="topic", durable=True)
    channel.queue_declare(QUEUE, durable=True, arguments={"x-single-active-consumer": True})
    for topic in TOPICS:
        channel.queue_bind(QUEUE, EXCHANGE, routing_key=topic)
        log.info("bound %s to %s for %s", QUEUE, EXCHANGE, topic)
    channel.basic_qos(prefetch_count=PREFETCH)
    log.info("connected to the broker")
    return connection, channel


def apply(db, properties, body):
    """Applies one message in one transaction; returns the outcome of apply_event."""
    headers = properties.headers or {}
    event_id, aggregate, seq = properties.message_id, headers.get("aggregate"), headers.get("seq")
    topic = headers.get("topic") or properties.type
    if not event_id or not topic or aggregate is None or not isinstance(seq, int):
        raise Unusable("no message_id, topic, aggregate or seq")
    try:
        with db.transaction():
            return db.execute("CALL apply_event(%s, %s, %s, %s, %s::jsonb)",
                              (event_id, topic, aggregate, seq, body.decode())).fetchone()[0]
    except (psycopg.errors.DataException, UnicodeDecodeError) as error:
        raise Unusable(str(error).strip()) from error


def consume(db, channel):
    for method, properties, body in channel.consume(QUEUE, inactivity_timeout=0.5):
        if stopping:
            break
        if method is None:  # nothing arrived for a while
            continue
        try:
            outcome = apply(db, properties, body)
        except Unusable as error:
            log.error("rejected message %s: %s", properties.message_id, error)
            channel.basic_reject(method.delivery_tag, requeue=False)
            continue
        headers = properties.headers or {}
        line = (f"{outcome} {properties.message_id} ({headers.get('topic')}/"
                f"{headers.get('aggregate')}#{headers.get('seq')}, attempt {headers.get('attempt')})")
        if outcome == "stale":
            log.warning("%s: its account already has a later seq applied; not applied", line)
        else:
            log.info("%s", line)
        # Only now, after the commit: a crash before this line means a redelivery,
        # which apply_event skips.
        channel.basic_ack(method.delivery_tag)
    channel.cancel()  # hands the prefetched, unacked messages back


def main():
    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s consumer %(levelname)s %(message)s")
    logging.getLogger("pika").setLevel(logging.CRITICAL)  # its errors are logged below, once
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    db = broker = None
    backoff = 0.2
    while not stopping:
        try:
            if db is None or db.closed:
                db = connect_db()
            broker, channel = connect_broker()
            backoff = 0.2
            consume(db, channel)
        except psycopg.Error as error:
            log.error("PostgreSQL: %s; reconnecting in %.1fs", str(error).strip(), backoff)
            if db is not None:
                db.close()
            db = None
        except (pika.exceptions.AMQPError, OSError) as error:
            log.error("broker: %r; reconnecting in %.1fs", error, backoff)
        # Whatever failed, drop the broker connection: the broker requeues the
        # unacked messages in their order, and delivers them again.
        if broker is not None and broker.is_open:
            try:
                broker.close()
            except (pika.exceptions.AMQPError, OSError):
                pass
        broker = None
        if not stopping:
            pause(backoff)
            backoff = min(backoff * 2, 5.0)
    log.info("stopped")
    if db is not None:
        db.close()


if __name__ == "__main__":
    main()
