#!/usr/bin/python3
"""For test/t/033_relay.pl: `amqpread.py URL bind EXCHANGE QUEUE KEY` declares a durable
queue bound to the (topic) exchange; `amqpread.py URL dump QUEUE` prints each message
in the queue as a JSON line {"id", "aggregate", "seq", "topic"} from its properties,
in queue order, and acknowledges it."""
import json
import sys

import pika

url, action = sys.argv[1], sys.argv[2]
connection = pika.BlockingConnection(pika.URLParameters(url))
channel = connection.channel()
if action == "bind":
    exchange, queue, key = sys.argv[3:6]
    channel.exchange_declare(exchange, exchange_type="topic", durable=True)
    channel.queue_declare(queue, durable=True)
    channel.queue_bind(queue, exchange, key)
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
