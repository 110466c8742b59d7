// The payments app of test/t/029_middleware.pl: Express 5 with idempotency-express.
//
//   POST /payments  {"account": 1, "amount": 10}  key required: 201, or 402 (declined,
//                   amount over 1000: final, stored with idem_fail)
//   POST /tips      the same, key optional
//   POST /orders    lease mode: a checkpoint, then the payment
//
// Test hooks: every handler first takes advisory lock 43 shared, so the test can hold a
// handler inside its transaction by holding that lock; X-Test-Fail: 1 makes a handler
// throw after its insert. The PG* variables and PORT come from the environment.
'use strict';
const express = require('express');
const { Pool } = require('pg');
const { idempotency } = require('idempotency-express');

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
  res.status(201).location(`/payments/${row.id}`).json({ payment_id: Number(row.id), amount });
}

app.post('/payments', idempotency({ pool }), pay);
app.post('/tips', idempotency({ pool, required: false }), pay);
app.post('/orders', idempotency({ pool, lease: '60 seconds' }), async (req, res) => {
  const idem = req.idempotency;
  await idem.client.query('SELECT pg_advisory_xact_lock_shared(43)');
  // Here a payment provider would be called with a key derived from ours.
  await idem.saveCheckpoint('charged', { attempt: idem.attempt });
  const { rows: [row] } = await idem.client.query(
    'INSERT INTO payments(account, amount) VALUES ($1, $2) RETURNING id', [req.body.account, req.body.amount]);
  res.status(201).json({ payment_id: Number(row.id), amount: req.body.amount });
});

app.listen(Number(process.env.PORT ?? 8080), '127.0.0.1');
