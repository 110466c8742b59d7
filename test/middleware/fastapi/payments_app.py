#!/usr/bin/python3
"""The payments app of test/t/029_middleware.pl: FastAPI with idempotency_http.

    POST /payments  {"account": 1, "amount": 10}  key required: 201, or 402 (declined,
                    amount over 1000: final, stored with idem_fail)
    POST /tips      the same, key optional, responses held back up to 32768 bytes
    POST /orders    lease mode: a checkpoint, then the payment

Test hooks: every handler first takes advisory lock 43 shared, so the test can hold a
handler inside its transaction by holding that lock; X-Test-Fail: 1 makes a handler
raise after its insert; X-Test-Size: N pads the payment's answer to N bytes, and
X-Test-Stream: 1 streams it (the response-size rule). POST /manual: the same payment
with idem_claim and idem_complete by hand, without the middleware (the benchmark of
test/bench/middleware). DATABASE_URL and PORT come from the environment.
"""
import json
import os
from datetime import timedelta

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from idempotency_http import IdempotencyMiddleware, Route, request_fingerprint

pool = AsyncConnectionPool(os.environ.get("DATABASE_URL", ""), open=False, min_size=1, max_size=8)
app = FastAPI()
app.add_middleware(IdempotencyMiddleware, pool=pool, routes={
    "POST /payments": Route(),
    "POST /tips": Route(required=False, max_response_size=32768),
    "POST /orders": Route(lease=timedelta(seconds=60)),
})


@app.on_event("startup")
async def open_pool():
    await pool.open(wait=True)


@app.on_event("shutdown")
async def close_pool():
    await pool.close()


async def pay(request: Request):
    idem = request.state.idempotency
    body = await request.json()
    await idem.conn.execute("SELECT pg_advisory_xact_lock_shared(43)")
    if body["amount"] > 1000:
        await idem.conn.execute("INSERT INTO declines(account) VALUES (%s)", (body["account"],))
        return JSONResponse({"error": "declined"}, status_code=402)
    row = await (await idem.conn.execute(
        "INSERT INTO payments(account, amount) VALUES (%s, %s) RETURNING id",
        (body["account"], body["amount"]))).fetchone()
    if request.headers.get("x-test-fail"):
        raise RuntimeError("the handler failed after its insert")
    if request.headers.get("x-test-stream"):
        async def chunks():
            yield b'{"payment_id": %d, ' % row[0]
            yield b'"streamed": true}'
        return StreamingResponse(chunks(), status_code=201, media_type="application/json")
    if request.headers.get("x-test-size"):
        head = b'{"payment_id": %d, "pad": "' % row[0]
        body = head + b"x" * (int(request.headers["x-test-size"]) - len(head) - 2) + b'"}'
        return Response(body, status_code=201, media_type="application/json")
    return JSONResponse({"payment_id": row[0], "amount": body["amount"]}, status_code=201,
                        headers={"Location": f"/payments/{row[0]}"})


app.post("/payments")(pay)
app.post("/tips")(pay)


@app.post("/orders")
async def order(request: Request):
    idem = request.state.idempotency
    body = await request.json()
    await idem.conn.execute("SELECT pg_advisory_xact_lock_shared(43)")
    # Here a payment provider would be called with a key derived from ours.
    await idem.save_checkpoint("charged", {"attempt": idem.attempt})
    row = await (await idem.conn.execute(
        "INSERT INTO payments(account, amount) VALUES (%s, %s) RETURNING id",
        (body["account"], body["amount"]))).fetchone()
    return JSONResponse({"payment_id": row[0], "amount": body["amount"]}, status_code=201)


@app.post("/manual")
async def manual(request: Request):
    key = request.headers["idempotency-key"]
    raw = await request.body()
    body = json.loads(raw)
    async with pool.connection() as conn, conn.transaction():
        outcome, stored = await (await conn.execute(
            "SELECT outcome, response FROM idem_claim('POST /manual', %s::idem_key, %s)",
            (key, request_fingerprint("POST", "/manual", raw)))).fetchone()
        if outcome == "replay":
            return Response(stored["body"], status_code=stored["status"],
                            headers={**stored["headers"], "idempotent-replayed": "true"})
        if outcome != "claimed":
            return JSONResponse({"status": 409}, status_code=409, headers={"retry-after": "1"})
        await conn.execute("SELECT pg_advisory_xact_lock_shared(43)")
        row = await (await conn.execute(
            "INSERT INTO payments(account, amount) VALUES (%s, %s) RETURNING id",
            (body["account"], body["amount"]))).fetchone()
        text = json.dumps({"payment_id": row[0], "amount": body["amount"]})
        headers = {"content-type": "application/json", "location": f"/payments/{row[0]}"}
        await conn.execute("SELECT idem_complete('POST /manual', %s::idem_key, %s)",
                           (key, Jsonb({"status": 201, "headers": headers, "body": text})))
    return Response(text, status_code=201, headers=headers)


if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(os.environ.get("PORT", "8080")), log_level="warning")
