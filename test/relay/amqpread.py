#!/usr/bin/python3
"""For test/t/033_relay.pl and test/bench/relay.sh:

`amqpread.py URL bind EXCHANGE QUEUE KEY [MAX_LENGTH]` declares a durable queue bound to
the (topic) exchange; with MAX_LENGTH, a queue that holds that many messages and refuses
more (x-overflow reject-publish: the broker nacks them); QUEUE_VERSION=2 declares it with
x-queue-version 2 (the classic queue storage RabbitMQ 3.10 offers and 4.3 keeps alone);

`amqpread.py URL purge QUEUE` empties the queue (test/bench/relay.sh, between runs);

`amqpread.py URL dump QUEUE` prints each message in the queue as a JSON line {"id",
"aggregate", "seq", "topic"} from its properties, in queue order, and acknowledges it;

`amqpread.py URL consume QUEUE` consumes the queue until killed, applying each message
in the database of DATABASE_URL: in one transaction idem_once(SCOPE, message_id) and,
when true, a row of applied(event_id, topic, aggregate, seq); every message received is
a row of arrivals, so a repeat (idem_once false) is an arrival without its applied row.
Manual acks, each after its transaction commits; messages are handled one after another
in queue order (a prefetch of PREFETCH, default 20: what was received but not acked
goes back to the queue, in its place, when the connection is lost). It rides out a
restart of the broker (reconnecting for ever) and of PostgreSQL (the same message tried
again until its transaction commits)."""
import json
import os
import sys
import time

import pika


def log(*args):
    print(time.strftime("%H:%M:%S"), *args, file=sys.stderr, flush=True)


def consume(url, queue):
    import psycopg

    dsn = os.environ["DATABASE_URL"]
    scope = os.environ.get("SCOPE", "amqp")
    prefetch = int(os.environ.get("PREFETCH", "20"))
    db = None

    def apply(properties, routing_key):
        nonlocal db
        h = properties.headers or {}
        row = (properties.message_id, h.get("topic"), h.get("aggregate"), h.get("seq"))
        said = None
        while True:
            try:
                if db is None or db.closed:
                    db = psycopg.connect(dsn, autocommit=True)
                with db.transaction():
                    if db.execute("SELECT idem_once(%s, %s)", (scope, properties.message_id)).fetchone()[0]:
                        db.execute("INSERT INTO applied(event_id, topic, aggregate, seq) VALUES (%s, %s, %s, %s)", row)
                    db.execute("INSERT INTO arrivals(event_id, topic, aggregate, seq, attempt, status, path) "
                               "VALUES (%s, %s, %s, %s, %s, 200, %s)", row + (h.get("attempt"), routing_key))
                return
            except psycopg.Error as error:
                if str(error) != said:
                    log("database (%s, tried again):" % properties.message_id, error)
                    said = str(error)
                try:
                    db.close()
                except Exception:
                    pass
                db = None
                time.sleep(0.2)

    def on_message(channel, method, properties, body):
        apply(properties, method.routing_key)
        channel.basic_ack(method.delivery_tag)

    last = None
    while True:
        try:
            connection = pika.BlockingConnection(pika.URLParameters(url))
            channel = connection.channel()
            channel.basic_qos(prefetch_count=prefetch)
            channel.basic_consume(queue, on_message)
            log("consuming", queue)
            last = None
            channel.start_consuming()
        except Exception as error:  # the broker gone or not ready: connect again
            if repr(error) != last:
                log("broker:", repr(error))
                last = repr(error)
            time.sleep(0.25)


url, action = sys.argv[1], sys.argv[2]
if action == "consume":
    consume(url, sys.argv[3])
    sys.exit(0)
connection = pika.BlockingConnection(pika.URLParameters(url))
channel = connection.channel()
if action == "bind":
    exchange, queue, key = sys.argv[3:6]
    args = {"x-max-length": int(sys.argv[6]), "x-overflow": "reject-publish"} if len(sys.argv) > 6 else {}
    if os.environ.get("QUEUE_VERSION"):
        args["x-queue-version"] = int(os.environ["QUEUE_VERSION"])
    channel.exchange_declare(exchange, exchange_type="topic", durable=True)
    channel.queue_declare(queue, durable=True, arguments=args or None)
    channel.queue_bind(queue, exchange, key)
elif action == "purge":
    channel.queue_purge(sys.argv[3])
else:
    queue = sys.argv[3]
    while True:
        method, properties, body = channel.basic_get(queue)
        if method is None:
            break
        h = properties.headers or {}
        print(json.dumps({"id": properties.message_id, "topic": h.get("topic"), "aggregate": h.get("aggregate"),
                          "seq": h.get("seq"), "mandatory_ok": True, "payload": json.loads(body)}))
        channel.basic_ack(method.delivery_tag)
connection.close()
