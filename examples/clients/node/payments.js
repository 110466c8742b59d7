// A payment made once, from Node.js with node-postgres (`npm ci` installs the pinned `pg`).
//
// pay(pool, key, account, amount) claims the key, inserts the payment and completes the
// key in one transaction, and answers as an HTTP service would (docs/clients.md): 201
// (a retry gets the same body with Idempotent-Replayed: true), 409 with Retry-After
// (in_progress), 422 (IK001), 400 (22P02), 503 (40001/40P01 still there after the
// retries, other transient errors), the rest as docs/reference.md's error table says,
// 500 for anything else (IK002 included).
//
// It needs the table and scope of examples/create_payment.sql. Connection settings come
// from the PG* environment variables (PGHOST, PGPORT, PGDATABASE, PGUSER).
//   node payments.js pay KEY ACCOUNT AMOUNT
//   node payments.js race PREFIX WORKERS KEYS ACCOUNT_BASE   (WORKERS pay the same KEYS)
'use strict';
const { Pool } = require('pg');

// The key is bound as text and cast to idem_key; the fingerprint covers the request.
const CLAIM = `SELECT outcome, response, ceil(extract(epoch FROM retry_after))::int AS retry_after
  FROM idem_claim('payments', $1::idem_key,
                  idem_fingerprint(jsonb_build_object('account', $2::bigint, 'amount', $3::numeric)))`;
const INSERT = `INSERT INTO payments(account, amount) VALUES ($1, $2)
  RETURNING jsonb_build_object('payment_id', id, 'amount', amount) AS payment`;
const COMPLETE = `SELECT idem_complete('payments', $1::idem_key, $2::jsonb)`;

const RETRIED = new Set(['IK005', '40001', '40P01']); // the whole transaction again, after a backoff
const ATTEMPTS = 5;
// The HTTP column of docs/reference.md's error table; anything else is 500.
const STATUS = { 'IK001': 422, 'IK003': 409, 'IK005': 409, '22P02': 400, '22004': 400, '22023': 400,
                 '54000': 413, '40001': 503, '40P01': 503, '55P03': 503, '57014': 503, 'IK006': 503,
                 '25006': 503 };

async function payOnce(pool, key, account, amount) {
  const client = await pool.connect();
  try {
    await client.query('BEGIN');
    const { rows: [claim] } = await client.query(CLAIM, [key, account, amount]);
    if (claim.outcome === 'replay') {
      await client.query('COMMIT');
      return { status: 201, headers: { 'Idempotent-Replayed': 'true' }, body: claim.response };
    }
    if (claim.outcome === 'in_progress') {
      await client.query('ROLLBACK');
      return { status: 409, headers: { 'Retry-After': String(Math.max(1, claim.retry_after)) },
               body: { title: 'in progress' } };
    }
    // claimed ("duplicate" only comes to a transaction that claimed the key already)
    const { rows: [{ payment }] } = await client.query(INSERT, [account, amount]);
    await client.query(COMPLETE, [key, payment]);
    await client.query('COMMIT'); // IK002 would come from here
    return { status: 201, headers: {}, body: payment };
  } catch (error) {
    await client.query('ROLLBACK').catch(() => {});
    throw error;
  } finally {
    client.release();
  }
}

async function pay(pool, key, account, amount) {
  for (let attempt = 1; ; attempt++) {
    try {
      return await payOnce(pool, key, account, amount);
    } catch (error) { // error.code is the SQLSTATE
      if (RETRIED.has(error.code) && attempt < ATTEMPTS) {
        console.error(`${key}: retrying after ${error.code} (attempt ${attempt})`);
        await sleep(50 * 2 ** attempt * (0.5 + Math.random()));
        continue;
      }
      const status = STATUS[error.code] || 500;
      return { status, headers: status === 409 || status === 503 ? { 'Retry-After': '1' } : {},
               body: { sqlstate: error.code, title: error.message } };
    }
  }
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

function report(key, { status, headers, body }) {
  const replayed = headers['Idempotent-Replayed'] ? 'replayed' : 'new';
  console.log(key, status, replayed, headers['Retry-After'] || '-', JSON.stringify(body));
}

async function worker(pool, prefix, keys, accountBase) {
  for (let i = 1; i <= keys; i++) {
    const key = `${prefix}-${i}`;
    let response;
    for (;;) {
      response = await pay(pool, key, accountBase + i, `${i}.5`);
      if (response.status !== 409) break;
      await sleep(1000 * Number(response.headers['Retry-After'])); // as an HTTP client would
    }
    report(key, response);
  }
}

async function main([command, ...args]) {
  if (command === 'pay') {
    const pool = new Pool({ max: 1 });
    report(args[0], await pay(pool, args[0], Number(args[1]), args[2]));
    await pool.end();
  } else if (command === 'race') {
    const [prefix, workers, keys, accountBase] = [args[0], ...args.slice(1).map(Number)];
    const pool = new Pool({ max: workers });
    await Promise.all(Array.from({ length: workers }, () => worker(pool, prefix, keys, accountBase)));
    await pool.end();
  }
}

main(process.argv.slice(2)).catch((error) => { console.error(error); process.exit(1); });
