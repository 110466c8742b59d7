"""ASGI middleware (Starlette, FastAPI): the Idempotency-Key header served by idem_claim.

For each request to a configured route: parse the key, fingerprint the request, take a
connection from the psycopg pool, claim the key and run the handler on that connection
inside the claim's transaction; store the response with idem_complete (or idem_fail for
a final error) and commit, so the handler's writes and the stored response commit
together. A retry replays the stored response with Idempotent-Replayed: true.
docs/middleware.md has the whole story.
"""
from __future__ import annotations

import base64
import json
import logging
from dataclasses import dataclass
from datetime import timedelta
from typing import Callable, Iterable, Optional

import psycopg
from psycopg.types.json import Jsonb

from .fingerprint import request_fingerprint
from .header import MalformedKey, parse_idempotency_key

log = logging.getLogger("idempotency_http")

# The server's idempotency.max_response_size in bytes (the SQL-only edition may leave
# it unset: its default then), read with the claim: no round trip of its own.
LIMIT = "pg_size_bytes(coalesce(current_setting('idempotency.max_response_size', true), '1MB'))"
CLAIM = f"""SELECT outcome, response, attempt, checkpoint, checkpoint_data,
                  ceil(extract(epoch FROM retry_after))::int, {LIMIT}
           FROM idem_claim(%s, %s::idem_key, %s, %s::interval, %s::interval, %s::interval)"""

# Errors that say "come back later": a wait that ran out (IK005), a serialization
# failure or deadlock (40001, 40P01: the whole transaction rolled back, so the retry
# claims afresh or replays), a lock_timeout (55P03), a lease holder fenced out (IK003).
# They are answered 409 with Retry-After, never retried inside the request: a retry
# would run the handler again.
BUSY = {"IK003", "IK005", "40001", "40P01", "55P03"}
STATUS = {"IK001": 422, "22P02": 400, "57014": 503, "25006": 503, "IK006": 503}


def final_error(status: int) -> bool:
    """The default for which error responses are final, stored with idem_fail and
    replayed: a 4xx other than those that say "try again" (408, 409, 423, 425, 429)."""
    return 400 <= status < 500 and status not in (408, 409, 423, 425, 429)


@dataclass(frozen=True)
class Route:
    """How one route uses keys. scope None: "METHOD /route/path" (its template)."""
    required: bool = True
    scope: Optional[str] = None
    lease: Optional[timedelta] = None  # lease mode: the claim commits before the handler
    ttl: Optional[timedelta] = None    # None: idempotency.default_ttl
    wait: Optional[timedelta] = None   # None: idempotency.wait_timeout
    # The largest response body held back, in bytes; None: the server's
    # idempotency.max_response_size (and never more than that).
    max_response_size: Optional[int] = None


class Idempotency:
    """request.state.idempotency: what the handler gets. conn is the claim's
    connection; key is None on an optional route called without one."""

    def __init__(self, pool, conn, scope, key, lease, attempt=None, checkpoint=None,
                 checkpoint_data=None):
        self.pool, self.conn, self.scope, self.key, self.lease = pool, conn, scope, key, lease
        self.attempt, self.checkpoint, self.checkpoint_data = attempt, checkpoint, checkpoint_data
        self.checkpointed = False
        self.limit = None  # the largest body kept, in bytes

    async def save_checkpoint(self, point: str, data=None):
        """idem_checkpoint: a recovery point a takeover sees (and, in lease mode, the
        lease renewed). In lease mode it commits at once, on a second connection, since
        the handler's own transaction commits only at the end."""
        sql = "SELECT idem_checkpoint(%s, %s::idem_key, %s, %s, %s)"
        args = (self.scope, self.key, point, Jsonb(data) if data is not None else None,
                self.attempt if self.lease else None)
        if self.lease is None:
            await self.conn.execute(sql, args)
            return
        async with self.pool.connection() as other:
            async with other.transaction():
                await other.execute(sql, args)
        self.checkpointed = True


class _Captured:
    """A response the handler sent, held back until the transaction commits. A body
    over the limit, or one sent in several messages (streamed), is not kept: its bytes
    are dropped as they come, and not_stored says why."""

    def __init__(self, limit):
        self.status, self.headers, self.body = 500, [], bytearray()
        self.limit, self.not_stored = limit, None

    async def send(self, message):
        if message["type"] == "http.response.start":
            self.status, self.headers = message["status"], list(message.get("headers", []))
        elif message["type"] == "http.response.body" and self.not_stored is None:
            chunk = message.get("body", b"")
            if message.get("more_body"):
                self.not_stored, self.body = "streamed", bytearray()
            elif len(self.body) + len(chunk) > self.limit:
                self.not_stored, self.body = "too-large", bytearray()
            else:
                self.body += chunk


class IdempotencyMiddleware:
    """app.add_middleware(IdempotencyMiddleware, pool=..., routes={"POST /payments": Route()}).

    pool: a psycopg_pool.AsyncConnectionPool (keys belong to its role). routes: "METHOD
    /path" (the route's path template) to Route; other requests pass untouched.
    stored_headers: the response headers stored and replayed. is_final(status): which
    error responses are stored (idem_fail) rather than rolled back.
    """

    def __init__(self, app, pool, routes: dict, *,
                 stored_headers: Iterable[str] = ("content-type", "location"),
                 is_final: Callable[[int], bool] = final_error):
        self.app, self.pool, self.routes = app, pool, routes
        self.stored_headers = {name.lower().encode("latin-1") for name in stored_headers}
        self.is_final = is_final

    async def __call__(self, scope, receive, send):
        found = self._route(scope) if scope["type"] == "http" else None
        if found is None:
            return await self.app(scope, receive, send)
        name, route = found
        key_scope = route.scope or name
        values = [v.decode("latin-1") for k, v in scope["headers"] if k == b"idempotency-key"]
        key = None
        try:
            if values:
                key = parse_idempotency_key(values)
            elif route.required:
                return await _reply(send, *_problem(400, "missing-key", "Idempotency-Key is missing",
                                                    f"{name} requires an Idempotency-Key header"))
        except MalformedKey as error:
            return await _reply(send, *_problem(400, "malformed-key", "Idempotency-Key is malformed", str(error)))

        body = await _read_body(receive)
        # The path as sent (raw_path keeps its %-escapes), with the query string.
        path = (scope.get("raw_path") or scope["path"].encode()).decode("latin-1") + \
            ("?" + scope["query_string"].decode("latin-1") if scope.get("query_string") else "")
        fingerprint = request_fingerprint(scope["method"], path, bytes(body))
        replay_receive = _replaying(body, receive)
        async with self.pool.connection() as conn:
            try:
                if route.lease is None or key is None:
                    answer = await self._in_transaction(conn, scope, replay_receive, key_scope, key, fingerprint, route)
                else:
                    answer = await self._with_lease(conn, scope, replay_receive, key_scope, key, fingerprint, route)
            except psycopg.Error as error:
                answer = _database_error(error)
        await _reply(send, *answer)

    def _route(self, scope):
        """("METHOD /template", Route) of a configured route that matches, else None."""
        router = getattr(scope.get("app"), "router", None)
        for candidate in getattr(router, "routes", ()):
            match, _ = candidate.matches(scope)
            if match.name == "FULL" and hasattr(candidate, "path"):
                name = f"{scope['method']} {candidate.path}"
                return (name, self.routes[name]) if name in self.routes else None
        return None

    async def _claim(self, conn, key_scope, key, fingerprint, route):
        row = await (await conn.execute(CLAIM, (key_scope, key, fingerprint, route.ttl, route.lease,
                                                route.wait))).fetchone()
        outcome, response, attempt, checkpoint, data, retry_after, limit = row
        if outcome == "replay":
            return None, _stored(response)
        if outcome == "in_progress":
            return None, _busy(retry_after)
        if outcome != "claimed":  # duplicate: not in a fresh transaction
            raise RuntimeError(f"idem_claim answered {outcome} to a fresh transaction")
        return (attempt, checkpoint, data, limit), None

    async def _in_transaction(self, conn, scope, receive, key_scope, key, fingerprint, route):
        """Claim, handler and completion in one transaction."""
        async with conn.transaction():
            state = Idempotency(self.pool, conn, key_scope, key, None)
            if key is not None:
                claimed, answer = await self._claim(conn, key_scope, key, fingerprint, route)
                if answer:
                    return answer
                state.attempt, state.checkpoint, state.checkpoint_data, state.limit = claimed
            else:
                state.limit = (await (await conn.execute(f"SELECT {LIMIT}")).fetchone())[0]
            captured = await self._run(scope, receive, state, route)
            if not await self._finish(conn, state, captured):
                raise psycopg.Rollback()  # the claim and the handler's writes are gone
        # Stored, or rolled back (Rollback lands here): the handler's response goes out.
        return _answer(captured)

    async def _with_lease(self, conn, scope, receive, key_scope, key, fingerprint, route):
        """The claim commits first (a lease); the handler then runs in its own
        transaction, which completes the key with the attempt."""
        async with conn.transaction():
            claimed, answer = await self._claim(conn, key_scope, key, fingerprint, route)
        if answer:
            return answer
        state = Idempotency(self.pool, conn, key_scope, key, route.lease, *claimed[:3])
        state.limit = claimed[3]
        finished = False
        try:
            async with conn.transaction():
                captured = await self._run(scope, receive, state, route)
                finished = await self._finish(conn, state, captured)
                if not finished:
                    raise psycopg.Rollback()
        finally:
            # Not finished (an error, or a response that is not kept): give the key up so
            # a retry runs afresh, unless the handler recorded a checkpoint: then the
            # claim stays until its lease runs out, and a retry takes it over from there.
            if not finished and not state.checkpointed:
                try:
                    async with conn.transaction():
                        await conn.execute("SELECT idem_release(%s, %s::idem_key, %s)",
                                           (key_scope, key, state.attempt))
                except psycopg.Error as error:  # the lease runs out instead
                    log.warning("idem_release failed: %s", error)
        return _answer(captured)

    async def _run(self, scope, receive, state, route):
        limit = state.limit if route.max_response_size is None else min(state.limit, route.max_response_size)
        captured = _Captured(limit)
        scope.setdefault("state", {})["idempotency"] = state
        await self.app(scope, receive, captured.send)
        return captured

    async def _finish(self, conn, state, captured):
        """Stores the response; False if it is not to be kept (roll back)."""
        if captured.not_stored:
            return False
        if state.key is None:
            return captured.status < 500
        if captured.status < 400:
            function = "idem_complete"
        elif self.is_final(captured.status):
            function = "idem_fail"
        else:
            return False
        response = {"status": captured.status,
                    "headers": {k.decode("latin-1"): v.decode("latin-1")
                                for k, v in captured.headers if k in self.stored_headers}}
        try:
            response["body"] = captured.body.decode("utf-8")
            if "\x00" in response["body"]:
                raise UnicodeDecodeError("utf-8", b"", 0, 1, "jsonb holds no U+0000")
        except UnicodeDecodeError:
            response.pop("body", None)
            response["body_base64"] = base64.b64encode(captured.body).decode("ascii")
        try:
            await conn.execute(f"SELECT {function}(%s, %s::idem_key, %s, %s)",
                               (state.scope, state.key, Jsonb(response), state.attempt if state.lease else None))
        except psycopg.Error as error:
            # The stored document (the body escaped or in base64, the headers) over the
            # server's limit: the same rule as a body over it. The caller rolls back.
            if error.sqlstate != "54000":
                raise
            captured.not_stored = "stored-too-large"
            return False
        return True


def _answer(captured):
    """What the client gets for the handler's response: that response, or, when it
    could not be held back and stored, the problem that says so (the request's work
    rolled back, the key free again)."""
    if captured.not_stored:
        return _not_stored(captured.not_stored, captured.limit)
    return captured.status, captured.headers, bytes(captured.body)


def _not_stored(reason, limit):
    """The rule for a response too large to store, or streamed: not stored, its work
    rolled back, 500 with Idempotent-Not-Stored saying why."""
    detail = {
        "too-large": f"the response is larger than idempotency.max_response_size ({limit} bytes)",
        "stored-too-large": "the response as stored (its body escaped or in base64, and its headers) "
                            "is larger than idempotency.max_response_size",
        "streamed": "the response was streamed, and a response is held back until its transaction commits",
    }[reason]
    return _problem(500, "response-not-stored", "The response could not be stored",
                    detail + ": it was not stored, and the request's work was rolled back",
                    [(b"idempotent-not-stored", reason.removeprefix("stored-").encode())])


def _stored(response):
    """The answer that replays a stored response."""
    body = response["body"].encode("utf-8") if "body" in response else \
        base64.b64decode(response.get("body_base64", ""))
    headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in response.get("headers", {}).items()]
    return response["status"], headers + [(b"idempotent-replayed", b"true")], body


def _busy(seconds):
    return _problem(409, "in-progress", "A request is outstanding for this Idempotency-Key",
                    "a request with this key is being processed; retry after Retry-After seconds",
                    [(b"retry-after", str(max(1, seconds or 1)).encode())])


def _database_error(error):
    state = error.sqlstate
    if state in BUSY:
        return _busy(1)
    if state == "IK001":
        return _problem(422, "key-reused", "Idempotency-Key is already used",
                        "this key was used for another request; use a new key for a new request")
    status = STATUS.get(state, 500)
    if status == 500:
        log.error("idempotency middleware: %s: %s", state, error)
    detail = (error.diag.message_primary or "database error") if status != 500 else "internal error"
    return _problem(status, "database", "The request could not be served", detail)


def _problem(status, kind, title, detail, headers=()):
    """(status, headers, body) of a JSON error (RFC 9457 shape)."""
    body = json.dumps({"type": f"about:blank#{kind}", "title": title, "status": status, "detail": detail})
    return status, [(b"content-type", b"application/problem+json"), *headers], body.encode()


async def _reply(send, status, headers, body):
    await send({"type": "http.response.start", "status": status,
                "headers": [h for h in headers if h[0] != b"content-length"]
                + [(b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


async def _read_body(receive):
    body = bytearray()
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    return body


def _replaying(body, receive):
    """A receive that hands the handler the body already read, then the real one."""
    sent = False

    async def replay():
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": bytes(body), "more_body": False}
    return replay
