"""Idempotency-Key middleware for Starlette and FastAPI on the idempotency extension.

    from idempotency_http import IdempotencyMiddleware, Route
    app.add_middleware(IdempotencyMiddleware, pool=pool, routes={"POST /payments": Route(required=True)})
    # in the handler: conn = request.state.idempotency.conn  (its work commits with the key)

docs/middleware.md in the repository describes it.
"""
from .asgi import Idempotency, IdempotencyMiddleware, Route
from .fingerprint import canonical_json, request_fingerprint
from .header import MalformedKey, parse_idempotency_key

__all__ = ["Idempotency", "IdempotencyMiddleware", "Route", "MalformedKey", "canonical_json",
           "parse_idempotency_key", "request_fingerprint"]
