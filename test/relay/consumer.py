#!/usr/bin/python3
"""The receiving service of test/t/033_relay.pl: an HTTP endpoint that idem-relay's http
sink posts events to. It applies each event once, with idem_once(scope, event id) and
its write in one transaction, and records every request it gets.

Tables (in DATABASE_URL's database): arrivals (every request, its answer and when),
applied (one row per event applied, in the order applied).

What it answers depends on the event's topic:
  poison: 422 (refused for good: the relay makes it a dead letter);
  flaky:  500, always (the relay retries, then max_attempts makes it dead);
  busy:   429 with Retry-After: 2 the first time an event comes, then applies it;
  other:  applies it (200). With SECRET set, a request whose Idem-Signature is not
          sha256=HMAC-SHA256(SECRET, body) gets 401.
DELAY_MS: each request pauses between 0 and twice that long (random), to keep a run going
long enough to kill a relay in it, and so that requests sent at once finish in any order.
"""
import hashlib
import hmac
import json
import os
import queue
import random
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import psycopg

DATABASE_URL = os.environ["DATABASE_URL"]
PORT = int(os.environ["PORT"])
SECRET = os.environ.get("SECRET", "")
DELAY = float(os.environ.get("DELAY_MS", "0")) / 1000
seen_busy = set()
lock = threading.Lock()
# Connections kept between requests (each request has a thread of its own): a new one
# per request would make PostgreSQL's connection start the bottleneck.
pool = queue.LifoQueue()


def take():
    try:
        return pool.get_nowait()
    except queue.Empty:
        return psycopg.connect(DATABASE_URL, autocommit=True)


def drain():
    """After a database error: the other idle connections are likely broken too (a
    restarted server), so none is used again."""
    while True:
        try:
            pool.get_nowait().close()
        except queue.Empty:
            return


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def answer(self, status, body=b"", headers=None):
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        self.answer(200, b"up")

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        if DELAY:
            time.sleep(random.uniform(0, 2 * DELAY))
        conn = None
        try:
            event = json.loads(body)
            key = self.headers.get("Idempotency-Key", "")
            status, extra = self.decide(event, body, key)
            conn = take()
            if status == 200:
                with conn.transaction():
                    if conn.execute("SELECT idem_once('relay-test', %s)", (event["id"],)).fetchone()[0]:
                        conn.execute("INSERT INTO applied(event_id, topic, aggregate, seq) VALUES (%s, %s, %s, %s)",
                                     (event["id"], event["topic"], event["aggregate"], event["seq"]))
            conn.execute("INSERT INTO arrivals(event_id, topic, aggregate, seq, attempt, status, idem_key, path) "
                         "VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
                         (event["id"], event["topic"], event["aggregate"], event["seq"], int(self.headers.get("Idem-Attempt", "0")), status,
                          key, self.path))
        except psycopg.Error as error:
            print("database:", error, file=sys.stderr, flush=True)
            if conn is not None:
                conn.close()
            drain()
            self.answer(503, b"database unavailable")
            return
        pool.put(conn)
        self.answer(status, b"" if status == 200 else b"refused", extra)

    def decide(self, event, body, key):
        if key != '"%s"' % event["id"]:
            return 400, {}
        if SECRET:
            want = "sha256=" + hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
            if not hmac.compare_digest(want, self.headers.get("Idem-Signature", "")):
                return 401, {}
        topic = event["topic"]
        if topic == "poison":
            return 422, {}
        if topic == "flaky":
            return 500, {}
        if topic == "busy":
            with lock:
                if event["id"] not in seen_busy:
                    seen_busy.add(event["id"])
                    return 429, {"Retry-After": "2"}
        return 200, {}


ThreadingHTTPServer.daemon_threads = True
ThreadingHTTPServer.request_queue_size = 128
print("listening on", PORT, flush=True)
ThreadingHTTPServer(("127.0.0.1", PORT), Handler).serve_forever()
