#!/usr/bin/python3
"""An HTTP service that takes payments exactly once, behind an Idempotency-Key header.

POST /payments with a JSON body {"account": 42, "amount": 10} and a header
`Idempotency-Key: <key>` calls the SPEC's stored procedure create_payment
(examples/create_payment.sql) in one transaction, and answers:

    201  the payment, the first time             Location: /payments/<id>
    201  the same body on a retry                Idempotent-Replayed: true
    409  another attempt is still in flight      Retry-After: <seconds>
    422  the key was used for a different body   (IK001)
    400  no key, an invalid key (22P02), or a body that is not a payment

Run it (Debian 12: apt-get install python3-psycopg python3-psycopg-pool):

    DATABASE_URL='host=127.0.0.1 port=5432 dbname=postgres user=postgres' PORT=8080 \\
      /usr/bin/python3 examples/http/payments_service.py

Nothing here depends on session state: each request is one transaction on whichever
pooled connection is free, so a connection pooler in transaction mode works too.
"""
import json
import math
import os
import re
import sys
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import psycopg
from psycopg_pool import ConnectionPool

pool = ConnectionPool(os.environ.get("DATABASE_URL", ""), min_size=1,
                      max_size=int(os.environ.get("POOL_SIZE", "8")), open=False)


def parse_payment(raw):
    """The payment in a request body, or None if it is not one."""
    try:  # decimals stay exact; NaN and Infinity are not JSON numbers
        body = json.loads(raw, parse_float=Decimal, parse_constant=reject)
    except ValueError:  # UnicodeDecodeError included
        return None
    if not isinstance(body, dict) or set(body) != {"account", "amount"}:
        return None
    account, amount = body["account"], body["amount"]
    if type(account) is not int or not -2**63 <= account < 2**63:
        return None  # a bigint
    if type(amount) not in (int, Decimal) or amount <= 0:
        return None
    return account, amount


def reject(constant):
    raise ValueError(constant)


def retry_after_seconds(message):
    """Whole seconds from the procedure's 'retry after HH:MM:SS.ffffff', at least 1."""
    match = re.search(r"(\d+):(\d+):(\d+(?:\.\d+)?)", message or "")
    if not match:
        return 1
    hours, minutes, seconds = match.groups()
    return max(1, math.ceil(int(hours) * 3600 + int(minutes) * 60 + float(seconds)))


def create_payment(key, account, amount):
    """(status, headers, body) of one attempt."""
    with pool.connection() as conn:
        try:
            with conn.transaction():
                result = conn.execute("CALL create_payment(%s::idem_key, %s::bigint, %s::numeric, NULL)",
                                      (key, account, amount)).fetchone()[0]
                # A replay writes nothing, so it leaves the transaction without an id.
                replayed = conn.execute(
                    "SELECT pg_current_xact_id_if_assigned() IS NULL").fetchone()[0]
        except psycopg.Error as error:
            return error_response(error)
    headers = {"Location": f"/payments/{result['payment_id']}"}
    if replayed:
        headers["Idempotent-Replayed"] = "true"
    return 201, headers, result


def error_response(error):
    state = error.sqlstate
    message = error.diag.message_primary or ""
    if state == "IK001":
        return 422, {}, {"error": "this Idempotency-Key was used for a different request"}
    if state == "22P02":
        return 400, {}, {"error": f"invalid Idempotency-Key: {message}"}
    if state == "IK005" or (state == "P0001" and message.startswith("retry after")):
        return 409, {"Retry-After": str(retry_after_seconds(message))}, \
            {"error": "another request with this Idempotency-Key is in progress"}
    print(f"payments_service: {state}: {message}", file=sys.stderr)
    return 500, {}, {"error": "internal error"}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        length = self.headers.get("Content-Length") or "0"
        if not length.isdigit() or "Transfer-Encoding" in self.headers:
            self.close_connection = True  # cannot tell where the body ends
            return self.reply(400, {}, {"error": "a body with a Content-Length is required"})
        raw = self.rfile.read(int(length))
        key = self.headers.get("Idempotency-Key")
        payment = parse_payment(raw)
        if self.path != "/payments":
            self.reply(404, {}, {"error": "not found"})
        elif not key:
            self.reply(400, {}, {"error": "the Idempotency-Key header is required"})
        elif payment is None:
            self.reply(400, {}, {"error": 'the body must be {"account": <integer>, "amount": <positive number>}'})
        else:
            self.reply(*create_payment(key, *payment))

    def reply(self, status, headers, body):
        data = json.dumps(body).encode()
        try:
            self.send_response(status)
            for name, value in {"Content-Type": "application/json", **headers}.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except OSError:  # the client left; its retry gets the stored response
            self.close_connection = True

    def log_message(self, format, *args):
        print(f"payments_service: {self.address_string()} {format % args}", file=sys.stderr)


def main():
    pool.open(wait=True)
    server = ThreadingHTTPServer(("127.0.0.1", int(os.environ.get("PORT", "8080"))), Handler)
    server.daemon_threads = True
    print(f"payments_service: listening on 127.0.0.1:{server.server_port}", file=sys.stderr)
    try:
        server.serve_forever()
    finally:
        pool.close()


if __name__ == "__main__":
    main()
