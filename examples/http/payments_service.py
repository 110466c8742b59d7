#!/usr/bin/python3
"""An HTTP service that takes payments exactly once, behind an Idempotency-Key header.

POST /payments with a JSON body {"account": 42, "amount": 10} and a header
`Idempotency-Key: "<key>"` (draft-ietf-httpapi-idempotency-key-header: a Structured
Field String, RFC 8941) calls the procedure http_create_payment
(examples/http/payments.sql) in one transaction, and answers:

    201  the payment, the first time             Location: /payments/<id>
    201  the same status, Location and body      Idempotent-Replayed: true
    409  another attempt is still in flight      Retry-After: <seconds left>
    422  the key was used for a different body   (IK001)
    400  no key, a malformed or invalid key, or a body that is not a payment

Every answer about a stored key carries `Idempotency-Key-Expires: <HTTP-date>`, when the
key is forgotten. Every error is an RFC 9457 problem (application/problem+json).

Run it (Debian 12: apt-get install python3-psycopg python3-psycopg-pool) against a
database with the extension where examples/http/payments.sql has been run:

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
from datetime import timezone
from decimal import Decimal
from email.utils import format_datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import psycopg
from psycopg_pool import ConnectionPool

# Each request is one CALL, cut off after this many seconds (statement_timeout): an
# attempt in flight is over at most this long after it began, which bounds how long
# its duplicates must wait.
REQUEST_TIMEOUT = float(os.environ.get("REQUEST_TIMEOUT", "5"))
pool = ConnectionPool(os.environ.get("DATABASE_URL", ""), min_size=1,
                      max_size=int(os.environ.get("POOL_SIZE", "8")), open=False,
                      kwargs={"options": f"-c statement_timeout={round(REQUEST_TIMEOUT * 1000)}"})

SCOPE = "payments-service POST /payments"  # as in payments.sql
# Problem types are sections of the API's documentation; this is the draft's example
# address, for a deployment to replace with its own.
DOCS = "https://developer.example.com/idempotency"


class MalformedKey(ValueError):
    """An Idempotency-Key field that is not one usable key; the message says why."""


# RFC 8941 4.2.3.3: a parameter's key.
PARAMETER_KEY = re.compile(r"[a-z*][a-z0-9_.*-]*")
# RFC 8941 4.2.3.1: a bare item other than a String (parsed on its own): an Integer
# (at most 15 digits) or a Decimal (at most 12 digits, a dot, 1 to 3 digits), a Token,
# a Byte Sequence, a Boolean. Only recognised, never decoded: parameters are ignored.
BARE_ITEM = re.compile(r"-?(?:[0-9]{1,12}\.[0-9]{1,3}|[0-9]{1,15})(?![0-9.])"
                       r"|[A-Za-z*][!#$%&'*+.^_`|~0-9A-Za-z:/-]*"
                       r"|:[A-Za-z0-9+/=]*:"
                       r"|\?[01]")


def parse_idempotency_key(lines):
    """The key in the Idempotency-Key field lines: an sf-string, with any parameters."""
    if len(lines) > 1:  # the draft: a client MUST NOT send more than one
        raise MalformedKey("more than one Idempotency-Key field")
    # HTTP drops whitespace around a field value (RFC 9110 5.5); RFC 8941 4.2 drops SP.
    text = lines[0].strip(" \t")
    if not text.isascii():  # RFC 8941 4.2; http.server decodes bytes as Latin-1
        position = next(i for i, char in enumerate(text) if not char.isascii())
        raise MalformedKey(f"byte 0x{ord(text[position]):02X} at character {position + 1} is not ASCII")
    if not text:
        raise MalformedKey("the field is empty")
    if not text.startswith('"'):
        raise MalformedKey('the key must be a Structured Field String, in double quotes: '
                           'Idempotency-Key: "8e03978e-40d5-43e8-bc93-6894a57f9324"')
    key, position = parse_string(text, 0)
    position = skip_parameters(text, position)
    if position < len(text):
        raise MalformedKey(f"unexpected {describe(text[position])} at character {position + 1}, "
                           "after the String and its parameters")
    # A valid String may still not be a valid idem_key (1 to 255 of 0x21-0x7E).
    if not key:
        raise MalformedKey("the key is empty")
    if " " in key:
        raise MalformedKey("the key contains a space; a key is 1 to 255 visible ASCII characters")
    if len(key) > 255:
        raise MalformedKey("the key is longer than 255 characters")
    return key


def parse_string(text, position):
    """RFC 8941 4.2.5: the String starting at text[position] (a DQUOTE), and where it ends."""
    chars = []
    position += 1
    while position < len(text):
        char = text[position]
        position += 1
        if char == "\\":
            if position == len(text) or text[position] not in '"\\':
                raise MalformedKey(f"a backslash at character {position} escapes neither \" nor \\")
            chars.append(text[position])
            position += 1
        elif char == '"':
            return "".join(chars), position
        elif not " " <= char <= "~":
            raise MalformedKey(f"{describe(char)} at character {position} is not allowed in a String")
        else:
            chars.append(char)
    raise MalformedKey("the String has no closing double quote")


def skip_parameters(text, position):
    """RFC 8941 4.2.3.2: past the parameters at text[position], if any. The draft defines
    none, so they are checked and ignored, as unknown parameters are."""
    while position < len(text) and text[position] == ";":
        position += 1
        while position < len(text) and text[position] == " ":
            position += 1
        match = PARAMETER_KEY.match(text, position)
        if not match:
            raise MalformedKey(f"no parameter name at character {position + 1}")
        position = match.end()
        if position < len(text) and text[position] == "=":
            position += 1
            if position < len(text) and text[position] == '"':
                _, position = parse_string(text, position)
            else:
                match = BARE_ITEM.match(text, position)
                if not match:
                    raise MalformedKey(f"no parameter value at character {position + 1}")
                position = match.end()
    return position


def describe(char):
    return f'"{char}"' if " " <= char <= "~" else f"byte 0x{ord(char):02X}"


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


def problem(status, kind, title, detail, headers=None):
    """(status, headers, body) of an RFC 9457 problem; kind None is about:blank."""
    body = {"type": f"{DOCS}#{kind}" if kind else "about:blank", "title": title,
            "status": status, "detail": detail}
    return status, {"Content-Type": "application/problem+json", **(headers or {})}, body


def expiry(expires_at):
    """The header that publishes when the key is forgotten and a retry is no longer
    recognised. HTTP-dates have whole seconds: rounded down, so that a retry before the
    date is surely recognised."""
    if expires_at is None:
        return {}
    utc = expires_at.astimezone(timezone.utc).replace(microsecond=0)
    return {"Idempotency-Key-Expires": format_datetime(utc, usegmt=True)}


def in_progress(seconds, headers=None):
    return problem(409, "in-progress", "A request is outstanding for this Idempotency-Key",
                   "A request with the same Idempotency-Key is being processed; "
                   "retry after Retry-After seconds.",
                   {"Retry-After": str(max(1, math.ceil(seconds))), **(headers or {})})


def create_payment(key, account, amount):
    """(status, headers, body) of one attempt."""
    with pool.connection() as conn:
        try:
            with conn.transaction():
                outcome, response, expires_at, retry_after = conn.execute(
                    "CALL http_create_payment(%s::idem_key, %s::bigint, %s::numeric)",
                    (key, account, amount)).fetchone()
        except psycopg.Error as error:
            return error_response(conn, key, error)
    if outcome in ("claimed", "replay"):
        # A replay repeats the stored status and headers, and says it is one.
        replayed = {"Idempotent-Replayed": "true"} if outcome == "replay" else {}
        return response["status"], {**response["headers"], **replayed, **expiry(expires_at)}, \
            response["body"]
    if outcome == "in_progress":
        # retry_after is how long this call waited for the attempt in flight, which held
        # the key all that time: it began at least that long ago, so it is over within
        # the rest of its REQUEST_TIMEOUT. That rest is the time left to wait.
        return in_progress(REQUEST_TIMEOUT - retry_after.total_seconds(), expiry(expires_at))
    print(f"payments_service: unexpected outcome {outcome}", file=sys.stderr)
    return problem(500, None, "Internal Server Error", "unexpected claim outcome")


def error_response(conn, key, error):
    state = error.sqlstate
    message = error.diag.message_primary or ""
    if state == "IK001":
        with conn.transaction():  # the failed one rolled back; the key's window is stored
            row = conn.execute("SELECT expires_at FROM idem_lookup(%s, %s::idem_key)",
                               (SCOPE, key)).fetchone()
        return problem(422, "key-reused", "Idempotency-Key is already used",
                       "This Idempotency-Key was used for a request with a different body; "
                       "use a new key for a new request.", expiry(row and row[0]))
    if state == "22P02":  # the service checks keys first; kept in case the rule differs
        return problem(400, "malformed-key", "Idempotency-Key is malformed", message)
    if state == "IK005":  # an attempt in flight: over within REQUEST_TIMEOUT
        return in_progress(REQUEST_TIMEOUT)
    print(f"payments_service: {state}: {message}", file=sys.stderr)
    return problem(500, None, "Internal Server Error", "the payment could not be made")


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        length = self.headers.get("Content-Length") or "0"
        if not length.isdigit() or "Transfer-Encoding" in self.headers:
            self.close_connection = True  # cannot tell where the body ends
            return self.reply(*problem(400, None, "Bad Request", "a body with a Content-Length is required"))
        raw = self.rfile.read(int(length))
        lines = self.headers.get_all("Idempotency-Key")
        if self.path != "/payments":
            return self.reply(*problem(404, None, "Not Found", f"no resource {self.path}"))
        if lines is None:
            return self.reply(*problem(400, "missing-key", "Idempotency-Key is missing",
                                       "POST /payments requires an Idempotency-Key header."))
        try:
            key = parse_idempotency_key(lines)
        except MalformedKey as error:
            return self.reply(*problem(400, "malformed-key", "Idempotency-Key is malformed", str(error)))
        payment = parse_payment(raw)
        if payment is None:
            return self.reply(*problem(400, "invalid-payment", "The body is not a payment",
                                       'The body must be {"account": <integer>, "amount": <positive number>}.'))
        self.reply(*create_payment(key, *payment))

    def send_error(self, code, message=None, explain=None):
        # http.server's own refusals (an unsupported method, a malformed request) are
        # problems too; a HEAD response has no body to hold one.
        if self.command == "HEAD":
            return super().send_error(code, message, explain)
        self.close_connection = True
        title = self.responses.get(code, ("Error",))[0]
        self.reply(*problem(code, None, title, message or title, {"Connection": "close"}))

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
