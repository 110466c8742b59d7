#!/usr/bin/python3
"""The calls every outbox relay makes, in a few lines: an illustration, not a relay.

To move producer.sql's events to RabbitMQ (or NATS JetStream, HTTP, stdout), run
idem-relay, the relay program (relay/README.md), as the relays' role:

    PGHOST=127.0.0.1 PGDATABASE=shop PGUSER=relay PGSSLMODE=disable \\
      idem-relay --sink=amqp --amqp-url=amqp://guest:guest@127.0.0.1:5672/ --name=relay-1

It publishes each aggregate's events in seq order with publisher confirms, acks what
the broker took, moves what it refuses to the dead letters with the reason, reconnects,
runs in several copies, drains on SIGTERM and serves /metrics and /healthz.

Below, once over the outbox: idem_outbox_claim leases a batch (each aggregate's events
in seq order); each event of a topic in TOPICS is "published", here printed; any other
is refused, as a broker with no queue bound for its topic would refuse it; then
idem_outbox_ack marks the printed ones delivered and idem_outbox_dead moves the refused
ones to the dead letters, in one transaction. A relay that dies before its ack loses
nothing: the lease runs out and the batch is handed out again. As the relays' role
(producer.sql's header), with Debian's python3-psycopg:

    DATABASE_URL='host=127.0.0.1 dbname=shop user=relay' TOPICS=payment.created \\
      /usr/bin/python3 examples/messaging/relay.py
"""
import os

import psycopg

NAME, TOPICS = "relay.py", os.environ.get("TOPICS", "payment.created").split(",")
with psycopg.connect(os.environ.get("DATABASE_URL", ""), autocommit=True) as db:
    while batch := db.execute("SELECT event_id::text, topic, aggregate, seq, payload::text"
                              " FROM idem_outbox_claim(%s, 100, '30s')", (NAME,)).fetchall():
        published = [e for e in batch if e[1] in TOPICS]
        for event_id, topic, aggregate, seq, payload in published:
            print(event_id, topic, aggregate, seq, payload)  # a relay publishes here
        with db.transaction():
            db.execute("SELECT idem_outbox_ack(%s, %s::idem_key[])",
                       (NAME, [e[0] for e in published]))
            db.execute("SELECT idem_outbox_dead(%s, %s::idem_key[], %s)",
                       (NAME, [e[0] for e in batch if e not in published],
                        "unroutable: no route for its topic"))
