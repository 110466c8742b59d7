#!/usr/bin/python3
"""Service B of examples/two_services: applies service A's events, each once.

    POST /events/order.placed   the relay's event (relay/README.md, "What the sinks
                                send"), with Idempotency-Key: "<event id>"   -> 200

idem-relay --sink=http --http-url='http://127.0.0.1:8002/events/{topic}' posts each event
at least once; the repository's middleware (middleware/python) claims the event id as
the request's key in B's own database, and the handler writes the shipment inside that
transaction. A repeat (the relay retrying after a lost answer, a relay restarted after it
posted) replays the stored answer and writes nothing: each event is applied once.

    DATABASE_URL='dbname=service_b' PORT=8002 PYTHONPATH=middleware/python \\
      /usr/bin/python3 examples/two_services/service_b.py

Fault injection, to see it work (and fail without the middleware):
    LOSE_ANSWER_EVERY=N  every Nth POST runs and commits, but its answer is lost: the
                         client (the relay) gets a 502 instead and posts it again;
    NO_MIDDLEWARE=1      runs the same handler without the middleware (what not to do:
                         every repeat is applied again).
"""
import itertools
import os

import uvicorn
from fastapi import FastAPI, Request
from psycopg_pool import AsyncConnectionPool

from idempotency_http import IdempotencyMiddleware, Route

pool = AsyncConnectionPool(os.environ.get("DATABASE_URL", ""), open=False, min_size=1, max_size=8)
app = FastAPI()
WITH_MIDDLEWARE = os.environ.get("NO_MIDDLEWARE", "") != "1"
if WITH_MIDDLEWARE:
    app.add_middleware(IdempotencyMiddleware, pool=pool, routes={"POST /events/order.placed": Route()})


@app.on_event("startup")
async def open_pool():
    await pool.open(wait=True)


@app.on_event("shutdown")
async def close_pool():
    await pool.close()


async def apply(conn, event):
    payload = event["payload"]
    await conn.execute("INSERT INTO shipments(event_id, order_id, customer, amount) VALUES (%s, %s, %s, %s)",
                       (event["id"], payload["order_id"], payload["customer"], payload["amount"]))


@app.post("/events/order.placed")
async def order_placed(request: Request):
    event = await request.json()
    if WITH_MIDDLEWARE:
        await apply(request.state.idempotency.conn, event)  # the claim's transaction
    else:
        async with pool.connection() as conn:
            await apply(conn, event)
    return {"applied": event["id"]}


@app.get("/healthz")
async def healthz():
    return {"ok": True}


LOSE_EVERY = int(os.environ.get("LOSE_ANSWER_EVERY", "0"))
posts = itertools.count(1)


async def service(scope, receive, send):
    """The app, except that with LOSE_ANSWER_EVERY every Nth POST's answer is lost after
    the handler committed (as when a proxy or the network drops it)."""
    if not (LOSE_EVERY and scope["type"] == "http" and scope["method"] == "POST" and next(posts) % LOSE_EVERY == 0):
        return await app(scope, receive, send)

    async def swallow(message):
        pass
    await app(scope, receive, swallow)
    await send({"type": "http.response.start", "status": 502, "headers": [(b"content-length", b"0")]})
    await send({"type": "http.response.body", "body": b""})


if __name__ == "__main__":
    uvicorn.run(service, host=os.environ.get("HOST", "127.0.0.1"), port=int(os.environ.get("PORT", "8002")),
                log_level="warning", lifespan="on")
