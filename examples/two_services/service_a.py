#!/usr/bin/python3
"""Service A of examples/two_services: takes orders behind an Idempotency-Key header.

    POST /orders  {"customer": 7, "amount": 10}   Idempotency-Key: "<key>"  -> 201

The repository's middleware (middleware/python, idempotency_http) claims the key; the
handler runs inside the claim's transaction on the claim's connection: it writes the
order and records the event `order.placed` with idem_emit (aggregate: the customer), so
the key's stored answer, the order and its event commit together or not at all. A retry
with the same key replays the answer and writes and emits nothing. idem-relay then posts
the event to service B.

    DATABASE_URL='dbname=service_a' PORT=8001 PYTHONPATH=middleware/python \\
      /usr/bin/python3 examples/two_services/service_a.py
"""
import os

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from idempotency_http import IdempotencyMiddleware, Route

pool = AsyncConnectionPool(os.environ.get("DATABASE_URL", ""), open=False, min_size=1, max_size=8)
app = FastAPI()
app.add_middleware(IdempotencyMiddleware, pool=pool, routes={"POST /orders": Route()})


@app.on_event("startup")
async def open_pool():
    await pool.open(wait=True)


@app.on_event("shutdown")
async def close_pool():
    await pool.close()


@app.post("/orders")
async def place_order(request: Request):
    conn = request.state.idempotency.conn  # the claim's transaction
    body = await request.json()
    customer, amount = int(body["customer"]), body["amount"]
    order_id, = await (await conn.execute(
        "INSERT INTO orders(customer, amount) VALUES (%s, %s) RETURNING id", (customer, amount))).fetchone()
    await conn.execute("SELECT idem_emit('order.placed', %s, aggregate => %s)",
                       (Jsonb({"order_id": order_id, "customer": customer, "amount": amount}),
                        f"customer-{customer}"))
    return JSONResponse({"order_id": order_id}, status_code=201, headers={"Location": f"/orders/{order_id}"})


@app.get("/healthz")
async def healthz():
    return {"ok": True}


if __name__ == "__main__":
    uvicorn.run(app, host=os.environ.get("HOST", "127.0.0.1"), port=int(os.environ.get("PORT", "8001")),
                log_level="warning")
