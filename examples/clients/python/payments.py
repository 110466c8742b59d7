#!/usr/bin/python3
"""A payment made once, from Python with psycopg 3 (Debian: apt-get install python3-psycopg).

pay(conn, key, account, amount) claims the key, inserts the payment and completes the key
in one transaction, and answers as an HTTP service would (docs/clients.md):

    201  the payment; a retry gets the same body with Idempotent-Replayed: true
    409  another attempt holds the key (in_progress): Retry-After, in seconds
    422  IK001, the key was used for another request; 400 an invalid key (22P02)
    503  a conflict still there after the retries (40001, 40P01), and other
         transient errors; the rest as docs/reference.md's error table says, and
         500 for anything else (IK002: a code path left the claim open)

It needs the table and scope of examples/create_payment.sql. Connection settings come
from the PG* environment variables (PGHOST, PGPORT, PGDATABASE, PGUSER). Two commands:

    payments.py pay KEY ACCOUNT AMOUNT
    payments.py race PREFIX WORKERS KEYS ACCOUNT_BASE   # WORKERS threads pay the same KEYS
"""
import json
import random
import sys
import threading
import time
from decimal import Decimal

import psycopg
from psycopg.types.json import Jsonb

# The key is bound as text and cast to idem_key; the fingerprint covers the request.
CLAIM = """SELECT outcome, response, ceil(extract(epoch FROM retry_after))::int
           FROM idem_claim('payments', %s::idem_key,
                           idem_fingerprint(jsonb_build_object('account', %s::bigint,
                                                               'amount', %s::numeric)))"""
INSERT = """INSERT INTO payments(account, amount) VALUES (%s, %s)
            RETURNING jsonb_build_object('payment_id', id, 'amount', amount)"""
COMPLETE = "SELECT idem_complete('payments', %s::idem_key, %s)"

RETRIED = {"IK005", "40001", "40P01"}  # the whole transaction again, after a backoff
ATTEMPTS = 5
# The HTTP column of docs/reference.md's error table; anything else is 500.
STATUS = {"IK001": 422, "IK003": 409, "IK005": 409, "22P02": 400, "22004": 400, "22023": 400,
          "54000": 413, "40001": 503, "40P01": 503, "55P03": 503, "57014": 503, "IK006": 503,
          "25006": 503}


def pay_once(conn, key, account, amount):
    with conn.transaction():  # COMMIT at the end of the block; IK002 would come from it
        outcome, response, retry_after = conn.execute(CLAIM, (key, account, amount)).fetchone()
        if outcome == "replay":
            return 201, {"Idempotent-Replayed": "true"}, response
        if outcome == "in_progress":
            return 409, {"Retry-After": str(max(1, retry_after))}, {"title": "in progress"}
        # claimed ("duplicate" only comes to a transaction that claimed the key already)
        payment = conn.execute(INSERT, (account, amount)).fetchone()[0]
        conn.execute(COMPLETE, (key, Jsonb(payment)))
    return 201, {}, payment


def pay(conn, key, account, amount):
    for attempt in range(1, ATTEMPTS + 1):
        try:
            return pay_once(conn, key, account, amount)
        except psycopg.Error as error:  # the transaction is rolled back
            if error.sqlstate in RETRIED and attempt < ATTEMPTS:
                print(f"{key}: retrying after {error.sqlstate} (attempt {attempt})", file=sys.stderr)
                time.sleep(0.05 * 2 ** attempt * random.uniform(0.5, 1.5))
                continue
            status = STATUS.get(error.sqlstate, 500)
            headers = {"Retry-After": "1"} if status in (409, 503) else {}
            return status, headers, {"sqlstate": error.sqlstate, "title": str(error).splitlines()[0]}


output = threading.Lock()


def report(key, status, headers, body):
    replayed = "replayed" if headers.get("Idempotent-Replayed") else "new"
    with output:
        print(key, status, replayed, headers.get("Retry-After", "-"), json.dumps(body), flush=True)


def worker(prefix, keys, account_base):
    with psycopg.connect(autocommit=True) as conn:
        for i in range(1, keys + 1):
            key = f"{prefix}-{i}"
            while True:
                status, headers, body = pay(conn, key, account_base + i, Decimal(i) + Decimal("0.5"))
                if status != 409:
                    break
                time.sleep(int(headers["Retry-After"]))  # as an HTTP client would
            report(key, status, headers, body)


def main(argv):
    if argv[0] == "pay":
        with psycopg.connect(autocommit=True) as conn:
            report(argv[1], *pay(conn, argv[1], int(argv[2]), Decimal(argv[3])))
    elif argv[0] == "race":
        prefix, workers, keys, account_base = argv[1], int(argv[2]), int(argv[3]), int(argv[4])
        threads = [threading.Thread(target=worker, args=(prefix, keys, account_base))
                   for _ in range(workers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()


if __name__ == "__main__":
    main(sys.argv[1:])
