// The payments app of test/t/029_middleware.pl: Express 5 with idempotency-express.
//
//   POST /payments  {"account": 1, "amount": 10}  key required: 201, or 402 (declined,
//                   amount over 1000: final, stored with idem_fail)
//   POST /tips      the same, key optional, responses held back up to 32768 bytes
//   POST /orders    lease mode: a checkpoint, then the payment
//
// Test hooks: every handler first takes advisory lock 43 shared, so the test can hold a
// handler inside its transaction by holding that lock; X-Test-Fail: 1 makes a handler
// throw after its insert; X-Test-Size: N pads the payment's answer to N bytes, and
// X-Test-Stream: 1 streams it (the response-size rule). The PG* variables and PORT come
// from the environment. The same app runs on Express 4 (test/middleware/express4).
// POST /manual: the same payment with idem_claim and idem_complete by hand, without the
// middleware (the benchmark of test/bench/middleware).
'use strict';
const express = require('express');
const { Pool } = require('pg');
const { idempotency, requestFingerprint } = require('idempotency-express');

const pool = new Pool({ max: 8 });
const app = express();

async function pay(req, res) {
  const db = req.idempotency.client;
  await db.query('SELECT pg_advisory_xact_lock_shared(43)');
  const { account, amount } = req.body;
  if (amount > 1000) {
    await db.query('INSERT INTO declines(account) VALUES ($1)', [account]);
    return res.status(402).json({ error: 'declined' });
  }
  const { rows: [row] } = await db.query(
    'INSERT INTO payments(account, amount) VALUES ($1, $2) RETURNING id', [account, amount]);
  if (req.get('X-Test-Fail')) throw new Error('the handler failed after its insert');
  if (req.get('X-Test-Stream')) {
    res.status(201).type('application/json');
    res.write(`{"payment_id": ${row.id}, `);
    return res.end('"streamed": true}');
  }
  if (req.get('X-Test-Size')) {
    const head = `{"payment_id": ${row.id}, "pad": "`;
    const pad = 'x'.repeat(Number(req.get('X-Test-Size')) - head.length - 2);
    return res.status(201).type('application/json').send(Buffer.from(`${head}${pad}"}`));
  }
  res.status(201).location(`/payments/${row.id}`).json({ payment_id: Number(row.id), amount });
}

app.post('/payments', idempotency({ pool }), pay);
app.post('/tips', idempotency({ pool, required: false, maxResponseSize: 32768 }), pay);
app.post('/orders', idempotency({ pool, lease: '60 seconds' }), async (req, res) => {
  const idem = req.idempotency;
  await idem.client.query('SELECT pg_advisory_xact_lock_shared(43)');
  // Here a payment provider would be called with a key derived from ours.
  await idem.saveCheckpoint('charged', { attempt: idem.attempt });
  const { rows: [row] } = await idem.client.query(
    'INSERT INTO payments(account, amount) VALUES ($1, $2) RETURNING id', [req.body.account, req.body.amount]);
  res.status(201).json({ payment_id: Number(row.id), amount: req.body.amount });
});

app.post('/manual', express.raw({ type: '*/*' }), async (req, res) => {
  const key = req.get('Idempotency-Key');
  const body = JSON.parse(req.body.toString('utf8'));
  const client = await pool.connect();
  try {
    await client.query('BEGIN');
    const { rows: [claim] } = await client.query(
      "SELECT outcome, response FROM idem_claim('POST /manual', $1::idem_key, $2)",
      [key, requestFingerprint('POST', '/manual', req.body)]);
    if (claim.outcome === 'replay') {
      await client.query('COMMIT');
      const stored = claim.response;
      return res.status(stored.status).set({ ...stored.headers, 'idempotent-replayed': 'true' }).send(stored.body);
    }
    if (claim.outcome !== 'claimed') {
      await client.query('ROLLBACK');
      return res.status(409).set('retry-after', '1').json({ status: 409 });
    }
    await client.query('SELECT pg_advisory_xact_lock_shared(43)');
    const { rows: [row] } = await client.query(
      'INSERT INTO payments(account, amount) VALUES ($1, $2) RETURNING id', [body.account, body.amount]);
    const text = JSON.stringify({ payment_id: Number(row.id), amount: body.amount });
    const headers = { 'content-type': 'application/json', location: `/payments/${row.id}` };
    await client.query("SELECT idem_complete('POST /manual', $1::idem_key, $2::jsonb)",
      [key, JSON.stringify({ status: 201, headers, body: text })]);
    await client.query('COMMIT');
    res.status(201).set(headers).send(text);
  } catch (e) {
    await client.query('ROLLBACK').catch(() => {});
    res.status(500).json({ error: e.message });
  } finally {
    client.release();
  }
});

app.listen(Number(process.env.PORT ?? 8080), '127.0.0.1');
