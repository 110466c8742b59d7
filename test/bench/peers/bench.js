// The driver of test/bench/peers/run.sh (read its header first). One Node.js process, one
// client stack (the pg driver) for every contender. Environment: PGPORT, PGDATA (for the
// postmaster's pid), PGPORT_SQL and PGDATA_SQL (the SQL-only edition's cluster), CLIENTS, ROUNDS, SECONDS_PER_RUN, RELAY_EVENTS, RELAY_SECONDS, RESULTS,
// SQL_EDITION (the SQL-only edition's version, for the header), SHOW_STATEMENTS (set:
// each run's statements per request from pg_stat_statements, to stderr).
'use strict';
const crypto = require('node:crypto');
const fs = require('node:fs');
const pg = require('pg');

const env = (name, fallback) => process.env[name] ?? fallback;
const PORT = Number(env('PGPORT', 5432));
const PORT_SQL = Number(env('PGPORT_SQL', PORT));
const CLIENTS = Number(env('CLIENTS', 8));
const ROUNDS = Number(env('ROUNDS', 3));
const SECONDS = Number(env('SECONDS_PER_RUN', 10));
const RELAY_EVENTS = Number(env('RELAY_EVENTS', 5000));
const RELAY_SECONDS = Number(env('RELAY_SECONDS', 20));
const DUPLICATES = 4;
const conn = (database) => ({
  host: '127.0.0.1', port: database === 'bench_sql' ? PORT_SQL : PORT, user: 'postgres', database });

// Round trips: every query any pg client of this process sends (ours, DBOS's, knex's,
// the outbox library's) goes through Client.prototype.query. The bench's own
// bookkeeping connection is not counted.
let roundTrips = 0;
const query = pg.Client.prototype.query;
pg.Client.prototype.query = function (...args) {
  if (!this.uncounted) roundTrips++;
  return query.apply(this, args);
};

let admin;  // role "observer", uncounted: settings, WAL positions, checks
let adminSql;  // the same in database bench_sql (the SQL-only edition's, its own cluster)
const adminValue = async (sql, params) => Object.values((await admin.query(sql, params)).rows[0])[0];
async function connect(database = 'bench', user = 'postgres') {
  const client = new pg.Client({ ...conn(database), user });  // bench_sql: on PORT_SQL
  await client.connect();
  return client;
}

// Server CPU: utime + stime of the postmaster and every process of the cluster, alive
// (its children in /proc) or ended (cutime + cstime of the postmaster), in clock ticks;
// of both clusters when the SQL-only edition has its own.
const postmasterOf = (dir) => Number(fs.readFileSync(`${dir}/postmaster.pid`, 'utf8').split('\n')[0]);
const postmasters = [env('PGDATA'), process.env.PGDATA_SQL].filter(Boolean).map(postmasterOf);
const TICK_US = 1e6 / 100;  // getconf CLK_TCK = 100 on Linux
function statFields(pid) {
  const stat = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
  return stat.slice(stat.lastIndexOf(')') + 2).split(' ');  // fields from 3 on
}
function serverTicks() {
  let ticks = 0;
  for (const postmaster of postmasters) {
    const own = statFields(postmaster);  // utime 14, stime 15, cutime 16, cstime 17
    ticks += Number(own[11]) + Number(own[12]) + Number(own[13]) + Number(own[14]);
  }
  for (const pid of fs.readdirSync('/proc').filter((p) => /^\d+$/.test(p))) {
    try {
      const f = statFields(pid);
      if (postmasters.includes(Number(f[1]))) ticks += Number(f[11]) + Number(f[12]);
    } catch { /* ended meanwhile: counted in the postmaster's cutime */ }
  }
  return ticks;
}
// The admin connections of each cluster (the first one's, then the SQL-only edition's
// when it has its own): WAL and pg_stat_statements are per cluster.
const admins = () => (PORT_SQL === PORT ? [admin] : [admin, adminSql]);
const sumOver = async (f) => (await Promise.all(admins().map(f))).reduce((a, b) => a + b, 0);

// One measured run: `work(worker, deadline)` per client until the deadline; it returns
// the number of requests it made and pushes their latencies.
async function measure(work, { seconds = SECONDS, workers = CLIENTS } = {}) {
  for (const a of admins()) await a.query('SELECT pg_stat_statements_reset()');
  const wal0 = await Promise.all(admins().map(async (a) =>
    (await a.query('SELECT pg_current_wal_insert_lsn() AS lsn')).rows[0].lsn));
  const ticks0 = serverTicks(), trips0 = roundTrips, client0 = process.cpuUsage();
  const start = performance.now(), deadline = start + seconds * 1000;
  const latencies = [], failures = [];
  const counts = await Promise.all(
    Array.from({ length: workers }, (_, w) => work(w, deadline, latencies, failures)));
  const elapsed = (performance.now() - start) / 1000;
  const cpu = process.cpuUsage(client0);
  const ticks = serverTicks() - ticks0, trips = roundTrips - trips0;
  const wal = await sumOver(async (a, i) => Number((await a.query(
    'SELECT pg_current_wal_insert_lsn() - $1::pg_lsn AS bytes', [wal0[i]])).rows[0].bytes));
  const statements = await sumOver(async (a) => Number((await a.query(
    `SELECT coalesce(sum(calls), 0) AS calls FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
      WHERE d.datname IN ('bench', 'bench_sql', 'dbos_sys') AND s.userid <> 'observer'::regrole`)).rows[0].calls));
  const n = counts.reduce((a, b) => a + b, 0) || 1;
  if (process.env.SHOW_STATEMENTS) {  // what the server ran per request, to stderr
    for (const a of admins()) {
      const top = await a.query(
        `SELECT round(calls::numeric / $1, 2) AS per_request, left(regexp_replace(query, '\\s+', ' ', 'g'), 160) AS query
           FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
          WHERE d.datname IN ('bench', 'bench_sql', 'dbos_sys') AND s.userid <> 'observer'::regrole
          ORDER BY calls DESC LIMIT 25`, [n]);
      for (const r of top.rows) console.error(`  ${r.per_request} × ${r.query}`);
    }
  }
  latencies.sort((a, b) => a - b);
  const pct = (p) => latencies[Math.min(latencies.length - 1, Math.floor(p * latencies.length))] ?? 0;
  return {
    n, rps: n / elapsed, trips: trips / n, statements: statements / n,
    serverUs: (ticks * TICK_US) / n, clientUs: (cpu.user + cpu.system) / n, wal: wal / n,
    p50: pct(0.5), p99: pct(0.99), failed: failures.length, firstFailure: failures[0],
  };
}

// A loop of requests of one client; `request()` returns true when it did one.
async function loop(deadline, latencies, failures, request) {
  let n = 0;
  while (performance.now() < deadline) {
    const t0 = performance.now();
    try {
      await request();
      latencies.push(performance.now() - t0);
    } catch (e) {
      failures.push(e.message);
    }
    n++;
  }
  return n;
}

const amount = 10;
const account = () => 1 + Math.floor(Math.random() * 1_000_000);

// ---- the payment contenders: each has request(client, key, account) ----
const contenders = {
  // 1. The extension: one CALL.
  extension: {
    request: (c, key, acct) =>
      c.query('CALL create_payment($1::idem_key, $2, $3)', [key, acct, amount]).then((r) => r.rows[0].result),
  },
  // 1b. The SQL-only edition: the same CALL, in database bench_sql as role bench_app.
  sqlOnly: {
    request: (c, key, acct) =>
      c.query('CALL create_payment($1::idem_key, $2, $3)', [key, acct, amount]).then((r) => r.rows[0].result),
  },
  // 2. The hand-written application-side table: each statement from the client, one
  // transaction. A retry finds the key: its row locked until the first attempt ends,
  // then 'completed' with the stored response.
  appTable: {
    async request(c, key, acct) {
      const fingerprint = crypto.createHash('sha256').update(JSON.stringify({ account: acct, amount })).digest('hex');
      await c.query('BEGIN');
      try {
        await c.query(
          `INSERT INTO app_idempotency_keys (key, fingerprint, state, expires_at)
           VALUES ($1, $2, 'pending', now() + interval '24 hours') ON CONFLICT DO NOTHING`, [key, fingerprint]);
        const stored = (await c.query(
          'SELECT fingerprint, state, response FROM app_idempotency_keys WHERE key = $1 FOR UPDATE', [key])).rows[0];
        if (stored.fingerprint !== fingerprint) throw new Error('another request under this key');
        if (stored.state === 'completed') {
          await c.query('COMMIT');
          return stored.response;
        }
        const payment = (await c.query(
          'INSERT INTO payments (key, account, amount) VALUES ($1, $2, $3) RETURNING id, amount',
          [key, acct, amount])).rows[0];
        const response = { payment_id: Number(payment.id), amount: Number(payment.amount) };
        await c.query(
          `UPDATE app_idempotency_keys SET state = 'completed', response = $2 WHERE key = $1`, [key, response]);
        await c.query('COMMIT');
        return response;
      } catch (e) {
        await c.query('ROLLBACK');
        throw e;
      }
    },
  },
  // 3. DBOS Transact: a workflow whose id is the idempotency key, with one transaction
  // step (KnexDataSource, which records the step's output in the same transaction).
  dbos: { request: null /* set by startDbos */ },
};

async function startDbos() {
  const { DBOS } = require('@dbos-inc/dbos-sdk');
  const { KnexDataSource } = require('@dbos-inc/knex-datasource');
  const knexConfig = { client: 'pg', connection: conn('bench'), pool: { min: 0, max: CLIENTS * 2 } };
  await KnexDataSource.initializeDBOSSchema(knexConfig);
  const dataSource = new KnexDataSource('bench', knexConfig);
  const insertPayment = dataSource.registerTransaction(async (key, acct) => {
    const row = (await dataSource.client.raw(
      'INSERT INTO payments (key, account, amount) VALUES (?, ?, ?) RETURNING id, amount', [key, acct, amount])).rows[0];
    return { payment_id: Number(row.id), amount: Number(row.amount) };
  }, { name: 'insertPayment' });
  const payment = DBOS.registerWorkflow(async (key, acct) => insertPayment(key, acct), { name: 'payment' });
  DBOS.setConfig({
    name: 'bench', systemDatabaseUrl: `postgresql://postgres@127.0.0.1:${PORT}/dbos_sys`,
    systemDatabasePoolSize: CLIENTS * 2, logLevel: 'error',
  });
  await DBOS.launch();
  contenders.dbos.request = (_c, key, acct) => DBOS.withNextWorkflowID(key, () => payment(key, acct));
  return DBOS;
}

// Runs of the payment request: fresh keys, replays of stored keys, and 4-way concurrent
// duplicates of every key.
const storedKeys = {};  // contender -> keys of earlier new-key runs
async function paymentRun(name, mode, sessions, tag) {
  const { request } = contenders[name];
  const keys = (storedKeys[name] ??= []);
  if (mode === 'new' || mode === 'replay') {
    return measure((w, deadline, latencies, failures) => loop(deadline, latencies, failures, async () => {
      if (mode === 'new') {
        const key = `${tag}-${crypto.randomUUID()}`, acct = account();
        await request(sessions[w], key, acct);
        if (keys.length < 200_000) keys.push([key, acct]);
      } else {  // the same request again: same key, same account
        const [key, acct] = keys[Math.floor(Math.random() * keys.length)];
        await request(sessions[w], key, acct);
      }
    }));
  }
  // dup: CLIENTS / 4 groups; each sends the same new key 4 times at once.
  const spreads = [];
  const result = await measure(async (g, deadline, latencies, failures) => {
    let n = 0;
    while (performance.now() < deadline) {
      const key = `dup-${tag}-${crypto.randomUUID()}`, acct = account();
      const done = await Promise.all(Array.from({ length: DUPLICATES }, async (_, i) => {
        const t0 = performance.now();
        try {
          await request(sessions[g * DUPLICATES + i], key, acct);
          latencies.push(performance.now() - t0);
        } catch (e) {
          failures.push(e.message);
        }
        return performance.now() - t0;
      }));
      spreads.push(Math.max(...done) - Math.min(...done));
      n += DUPLICATES;
    }
    return n;
  }, { workers: Math.max(1, Math.floor(CLIENTS / DUPLICATES)) });
  const rows = (await (name === 'sqlOnly' ? adminSql : admin).query(
    `SELECT count(*) AS keys, min(n) AS min, max(n) AS max FROM (
       SELECT count(*) AS n FROM payments WHERE key LIKE $1 GROUP BY key) k`, [`dup-${tag}-%`])).rows[0];
  spreads.sort((a, b) => a - b);
  result.keysSent = result.n / DUPLICATES;
  result.rowsPerKey = { keys: Number(rows.keys), min: Number(rows.min), max: Number(rows.max) };
  result.waitP50 = spreads[Math.floor(spreads.length / 2)] ?? 0;
  result.waitP99 = spreads[Math.min(spreads.length - 1, Math.floor(spreads.length * 0.99))] ?? 0;
  return result;
}

// ---- messaging: a payment and its event in one transaction, then a relay ----
const outbox = require('pg-transactional-outbox');
const quiet = outbox.getDisabledLogger();
const libSettings = {
  dbSchema: 'public', dbTable: 'outbox', enableMaxAttemptsProtection: false,
  enablePoisonousMessageProtection: false,
};
const libSetup = {
  outboxOrInbox: 'outbox', database: 'bench', schema: 'public', table: 'outbox',
  listenerRole: 'postgres', handlerRole: 'postgres', publication: 'outbox_pub',
  replicationSlot: 'outbox_slot', nextMessagesName: 'next_outbox_messages',
};
const storeOutboxMessage = outbox.initializeMessageStorage(
  { outboxOrInbox: 'outbox', dbListenerConfig: conn('bench'), settings: libSettings }, quiet);

// The producers: BEGIN; the payment; the event; COMMIT, each a statement from the client.
async function produce(c, emit) {
  const acct = account();
  await c.query('BEGIN');
  const row = (await c.query(
    'INSERT INTO payments (key, account, amount) VALUES ($1, $2, $3) RETURNING id, amount',
    [null, acct, amount])).rows[0];
  await emit(c, { payment_id: Number(row.id), amount: Number(row.amount) }, String(acct));
  await c.query('COMMIT');
}
const producers = {
  // The event ordered per account (aggregate); idem_emit numbers it.
  extension: (c, payload, acct) =>
    c.query(`SELECT idem_emit('payment.created', $1::jsonb, $2)`, [payload, acct]),
  // The library's storage; segment = the account, so that its relay keeps an
  // account's events in order, as the extension's does.
  library: (c, payload, acct) => storeOutboxMessage({
    id: crypto.randomUUID(), aggregateType: 'account', aggregateId: acct, segment: acct,
    messageType: 'payment.created', payload,
  }, c),
};
// The extension's producer as one CALL: the same payment and idem_emit in a procedure
// (emit_payment in setup.sql), which the library's client-side storage cannot be.
const emitByCall = (c) => c.query('CALL emit_payment($1, $2)', [account(), amount]);
const producerRun = (name, sessions, seconds = SECONDS) => measure((w, deadline, latencies, failures) =>
  loop(deadline, latencies, failures, () =>
    name === 'extension (one CALL)' ? emitByCall(sessions[w]) : produce(sessions[w], producers[name])), { seconds });
async function produceCount(name, sessions, total) {  // exactly `total` events, unmeasured
  let left = total;
  await Promise.all(sessions.map(async (c) => {
    while (left-- > 0) await produce(c, producers[name]);
  }));
}

// A relay run: until `done()` or RELAY_SECONDS; the publish is a no-op (no broker).
async function relayRun(start, done) {  // done(final): finished? / how many relayed
  let relayed = 0, stop;
  const result = await measure(async (_w, deadline) => {
    stop = await start();
    while (performance.now() < deadline && !(relayed = await done())) {
      await new Promise((r) => setTimeout(r, 10));
    }
    await stop();
    relayed = await done(true);
    return relayed;
  }, { seconds: RELAY_SECONDS, workers: 1 });
  return result;
}
const relays = {
  // One relay of the extension: claim 100 events, publish, acknowledge them; it stops
  // when a claim finds nothing.
  extension: () => {
    let drained = false;
    return relayRun(async () => {
      const c = await connect();
      const worker = (async () => {
        for (;;) {
          const ids = (await c.query('SELECT event_id FROM idem_outbox_claim($1, 100)', ['relay-1'])).rows
            .map((r) => r.event_id);
          if (ids.length === 0) break;
          await c.query('SELECT idem_outbox_ack($1, $2::idem_key[])', ['relay-1', ids]);
        }
        drained = true;
      })();
      return async () => { await worker; await c.end(); };
    }, async (final) => {
      if (!final) return drained;
      return RELAY_EVENTS - Number(await adminValue(`SELECT count(*) FROM idempotency.outbox WHERE state = 'p'`));
    });
  },
  // The library's polling listener: batches of 100, polling every 10 ms.
  libraryPolling: () => relayRun(async () => {
    const [shutdown] = outbox.initializePollingMessageListener({
      outboxOrInbox: 'outbox', dbListenerConfig: conn('bench'),
      settings: { ...libSettings, nextMessagesFunctionName: 'next_outbox_messages',
        nextMessagesBatchSize: 100, nextMessagesPollingIntervalInMs: 10 },
    }, { handle: async () => {} }, quiet);
    return shutdown;
  }, libraryDone),
  // The library's logical-replication listener (slot made before the events were).
  libraryReplication: () => relayRun(async () => {
    const [shutdown] = outbox.initializeReplicationMessageListener({
      outboxOrInbox: 'outbox', dbListenerConfig: conn('bench'),
      settings: { ...libSettings, dbPublication: 'outbox_pub', dbReplicationSlot: 'outbox_slot' },
    }, { handle: async () => {} }, quiet);
    return shutdown;
  }, libraryDone),
};
async function libraryDone(final) {
  const relayed = Number(await adminValue('SELECT count(*) FROM outbox WHERE processed_at IS NOT NULL'));
  return final ? relayed : relayed >= RELAY_EVENTS && relayed;
}

// ---- the runs, the tables ----
const median = (xs) => {
  const s = [...xs].sort((a, b) => a - b), m = Math.floor(s.length / 2);
  return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2;
};
const fmt = (x, digits = 0) => x.toLocaleString('en-US', { minimumFractionDigits: digits, maximumFractionDigits: digits });
const results = [];  // { table, name, workload, sync, ...measure }
function record(table, name, workload, sync, r) {
  results.push({ table, name, workload, sync, ...r });
  console.error(`${table} ${name} ${workload} synchronous_commit=${sync}: ${fmt(r.rps)}/s, ${r.trips.toFixed(1)} round trips, ` +
    `${fmt(r.serverUs)} µs server CPU, ${fmt(r.wal)} B WAL, p50 ${r.p50.toFixed(2)} ms, p99 ${r.p99.toFixed(2)} ms, ` +
    `${r.failed} failed${r.firstFailure ? ` (${r.firstFailure})` : ''}${r.rowsPerKey ? `, rows per key ${r.rowsPerKey.min}-${r.rowsPerKey.max} over ${r.rowsPerKey.keys} keys` : ''}`);
}

function tables() {
  const groups = new Map();
  for (const r of results) {
    const id = `${r.table}|${r.name}|${r.workload}|${r.sync}`;
    if (!groups.has(id)) groups.set(id, []);
    groups.get(id).push(r);
  }
  const rows = (table) => [...groups.values()].filter((g) => g[0].table === table).map((g) => {
    const m = (f) => median(g.map(f));
    const rps = g.map((r) => r.rps);
    return {
      ...g[0], runs: g.length, rps: m((r) => r.rps), min: Math.min(...rps), max: Math.max(...rps),
      trips: m((r) => r.trips), statements: m((r) => r.statements), serverUs: m((r) => r.serverUs),
      clientUs: m((r) => r.clientUs), wal: m((r) => r.wal), p50: m((r) => r.p50), p99: m((r) => r.p99),
      failed: g.reduce((a, r) => a + r.failed, 0), waitP50: m((r) => r.waitP50 ?? 0), waitP99: m((r) => r.waitP99 ?? 0),
      keys: g.reduce((a, r) => a + (r.rowsPerKey?.keys ?? 0), 0), keysSent: g.reduce((a, r) => a + (r.keysSent ?? 0), 0),
      rowsMin: Math.min(...g.map((r) => r.rowsPerKey?.min ?? Infinity)), rowsMax: Math.max(...g.map((r) => r.rowsPerKey?.max ?? 0)),
    };
  });
  const range = (r) => `${fmt(r.rps)} (${fmt(r.min)}–${fmt(r.max)})`;
  const per = (r) => `${r.trips.toFixed(r.trips < 1 ? 2 : 1)} | ${r.statements.toFixed(r.statements < 1 ? 2 : 1)} | ${fmt(r.serverUs)} | ${fmt(r.clientUs)} | ${fmt(r.wal)}`;
  const out = [];
  out.push('Payment request (claim, insert the payment, store the response): fresh keys and replays.', '',
    '| contender | keys | synchronous_commit | requests/s median (min–max) | round trips / request | statements / request | server CPU µs / request | client CPU µs / request | WAL bytes / request | p50 ms | p99 ms | failed |',
    '| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |');
  for (const r of rows('payment').filter((r) => r.workload !== 'dup')) {
    out.push(`| ${r.name} | ${r.workload} | ${r.sync} | ${range(r)} | ${per(r)} | ${r.p50.toFixed(2)} | ${r.p99.toFixed(2)} | ${r.failed} |`);
  }
  out.push('', `Concurrent duplicates: every key sent ${DUPLICATES} times at once (${Math.max(1, Math.floor(CLIENTS / DUPLICATES))} keys in flight, ${CLIENTS} connections).`, '',
    '| contender | synchronous_commit | keys sent | keys with a payment | payments per key (min–max) | requests/s median | p50 ms | p99 ms | a duplicate waits, p50 / p99 ms | failed |',
    '| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |');
  for (const r of rows('payment').filter((r) => r.workload === 'dup')) {
    out.push(`| ${r.name} | ${r.sync} | ${fmt(r.keysSent)} | ${fmt(r.keys)} | ${r.rowsMin}–${r.rowsMax} | ${fmt(r.rps)} | ${r.p50.toFixed(2)} | ${r.p99.toFixed(2)} | ${r.waitP50.toFixed(2)} / ${r.waitP99.toFixed(2)} | ${r.failed} |`);
  }
  out.push('', 'Messaging: the producer (BEGIN; the payment; its event; COMMIT) and one relay draining ' +
    `${fmt(RELAY_EVENTS)} events (publish a no-op; at most ${RELAY_SECONDS} s).`, '',
    '| contender | part | synchronous_commit | messages/s median (min–max) | round trips / message | statements / message | server CPU µs / message | client CPU µs / message | WAL bytes / message | p50 ms | p99 ms | failed |',
    '| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |');
  for (const r of rows('messaging')) {
    const lat = r.p50 ? `${r.p50.toFixed(2)} | ${r.p99.toFixed(2)}` : '– | –';
    out.push(`| ${r.name} | ${r.workload} | ${r.sync} | ${range(r)} | ${per(r)} | ${lat} | ${r.failed} |`);
  }
  return out.join('\n');
}

async function main() {
  admin = await connect('bench', 'observer');
  admin.uncounted = true;
  adminSql = await connect('bench_sql', 'observer');
  adminSql.uncounted = true;
  const setup = outbox.DatabaseSetup;
  await admin.query(setup.dropAndCreateTable(libSetup) + setup.createPollingFunction(libSetup) +
    setup.setupPollingIndexes(libSetup) + setup.setupReplicationCore(libSetup));
  const DBOS = await startDbos();
  const sessions = await Promise.all(Array.from({ length: CLIENTS }, () => connect()));
  const sqlSessions = await Promise.all(Array.from({ length: CLIENTS }, () => connect('bench_sql', 'bench_app')));
  const order = ['extension', 'sqlOnly', 'appTable', 'dbos'];
  for (const sync of ['off', 'on']) {
    await admin.query(`ALTER SYSTEM SET synchronous_commit = ${sync}`);
    await admin.query('SELECT pg_reload_conf()');
    await new Promise((r) => setTimeout(r, 500));
    for (let round = 1; round <= ROUNDS; round++) {
      const turn = order.map((_, i) => order[(i + round - 1) % order.length]);  // who goes first rotates
      for (const workload of ['new', 'replay', 'dup']) {
        for (const name of turn) {
          record('payment', name, workload, sync,
            await paymentRun(name, workload, name === 'sqlOnly' ? sqlSessions : sessions, `${name}-${sync}-${round}`));
        }
      }
      const names = ['extension', 'library', 'extension (one CALL)'];
      for (const name of names.map((_, i) => names[(i + round - 1) % names.length])) {
        record('messaging', name, 'producer', sync, await producerRun(name, sessions));
      }
      // The relays, each on a backlog of exactly RELAY_EVENTS events of its own producer.
      await admin.query('DELETE FROM idempotency.outbox');
      await admin.query('TRUNCATE outbox');
      await produceCount('extension', sessions, RELAY_EVENTS);
      record('messaging', 'extension', 'relay (idem_outbox_claim 100 + idem_outbox_ack)', sync, await relays.extension());
      await produceCount('library', sessions, RELAY_EVENTS);
      record('messaging', 'library', 'relay: polling listener (batches of 100)', sync, await relays.libraryPolling());
      await admin.query('TRUNCATE outbox');
      await admin.query(`SELECT pg_create_logical_replication_slot('outbox_slot', 'pgoutput')`);
      await produceCount('library', sessions, RELAY_EVENTS);
      record('messaging', 'library', 'relay: logical replication listener', sync, await relays.libraryReplication());
      for (let i = 0; i < 50; i++) {  // the listener's walsender may take a moment to end
        try {
          await admin.query(`SELECT pg_drop_replication_slot('outbox_slot')`);
          break;
        } catch {
          await new Promise((r) => setTimeout(r, 200));
        }
      }
    }
  }
  await admin.query('ALTER SYSTEM RESET synchronous_commit');
  await admin.query('SELECT pg_reload_conf()');
  const versions = (await admin.query(`SELECT current_setting('server_version') AS pg,
    (SELECT extversion FROM pg_extension WHERE extname = 'idempotency') AS ext`)).rows[0];
  const sqlEdition = env('SQL_EDITION', '?');  // run.sh: the version and the commit it was built from

  const pkg = (name) => JSON.parse(fs.readFileSync(`${__dirname}/node_modules/${name}/package.json`, 'utf8')).version;
  const markdown = `Measured ${new Date().toISOString().slice(0, 16).replace('T', ' ')} UTC on ` +
    `${require('node:os').cpus().length} cores, PostgreSQL ${versions.pg}, idempotency ${versions.ext} ` +
    `(sqlOnly: the SQL-only edition ${sqlEdition}), ` +
    `Node.js ${process.versions.node}, pg ${pkg('pg')}, @dbos-inc/dbos-sdk ${pkg('@dbos-inc/dbos-sdk')}, ` +
    `@dbos-inc/knex-datasource ${pkg('@dbos-inc/knex-datasource')}, pg-transactional-outbox ` +
    `${pkg('pg-transactional-outbox')}; CLIENTS=${CLIENTS} ROUNDS=${ROUNDS} SECONDS_PER_RUN=${SECONDS} ` +
    `RELAY_EVENTS=${RELAY_EVENTS} RELAY_SECONDS=${RELAY_SECONDS}.\n\n` + tables();
  console.log(markdown);
  if (process.env.RESULTS) fs.writeFileSync(process.env.RESULTS, markdown + '\n');
  await Promise.all([...sessions, ...sqlSessions].map((c) => c.end()));
  await DBOS.shutdown();
  await admin.end();
}

main().then(() => process.exit(0), (e) => { console.error(e); process.exit(1); });
