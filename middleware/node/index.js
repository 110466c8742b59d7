// Express middleware: the Idempotency-Key header served by the idempotency extension,
// with node-postgres. docs/middleware.md in the repository has the whole story.
//
//   const { idempotency } = require('idempotency-express');
//   app.post('/payments', idempotency({ pool }), async (req, res) => {
//     await req.idempotency.client.query(...);   // commits with the stored response
//     res.status(201).json(...);
//   });
//
// For each request: parse the key, fingerprint the request, take a client from the pool,
// BEGIN, idem_claim, and run the handler with that client inside the claim's
// transaction; hold its response back, store it with idem_complete (or idem_fail for a
// final error), COMMIT, then send it. A retry gets the stored response with
// Idempotent-Replayed: true.
'use strict';
const { requestFingerprint } = require('./fingerprint');

// The server's idempotency.max_response_size in bytes (the SQL-only edition may leave
// it unset: its default then), read with the claim: no round trip of its own.
const LIMIT = "pg_size_bytes(coalesce(current_setting('idempotency.max_response_size', true), '1MB'))";
const CLAIM = `SELECT outcome, response, attempt, checkpoint, checkpoint_data,
    ceil(extract(epoch FROM retry_after))::int AS retry_after, ${LIMIT} AS max_response_size
  FROM idem_claim($1, $2::idem_key, $3, $4::interval, $5::interval, $6::interval)`;

// Errors that say "come back later": a wait that ran out (IK005), a serialization
// failure or deadlock (40001, 40P01: the transaction rolled back, so the retry claims
// afresh or replays), a lock_timeout (55P03), a lease holder fenced out (IK003). They
// are answered 409 with Retry-After, never retried inside the request: a retry would run
// the handler again.
const BUSY = new Set(['IK003', 'IK005', '40001', '40P01', '55P03']);
const STATUS = { IK001: 422, '22P02': 400, '57014': 503, '25006': 503, IK006: 503 };

// The Idempotency-Key field: the IETF draft's Structured Field String (RFC 8941),
// optionally with parameters, which are checked and ignored, or a bare key as most
// clients send it. The same rules, and the same messages, in every language's
// middleware (docs/middleware.md, "The key").
const CHARS = String.raw`(?:[\x20\x21\x23-\x5b\x5d-\x7e]|\\["\\])*`;
const FIELD = new RegExp(
  String.raw`^"(${CHARS})"(?:;[ ]*[a-z*][a-z0-9_.*-]*(?:=(?:"${CHARS}"|[A-Za-z0-9*:?.+/=!#$%&'^_\x60|~-]+))?)*$`);

class MalformedKey extends Error {}

// The key in the field's values (one string per field line; Node.js gives each byte as
// one character).
function parseIdempotencyKey(values) {
  if (values.length !== 1) throw new MalformedKey('more than one Idempotency-Key field: send one');
  const text = values[0].replace(/^[ \t]+|[ \t]+$/g, '');
  if (text === '') throw new MalformedKey('the Idempotency-Key field is empty');
  let key;
  if (text.startsWith('"')) {
    const match = FIELD.exec(text);
    if (!match) {
      throw new MalformedKey('the key starts with a double quote but is not one Structured Field String: ' +
        'a closing quote, \\" and \\\\ the only escapes, nothing after it but parameters (;name=value)');
    }
    key = match[1].replace(/\\(.)/g, '$1');
  } else {
    key = text;
    if (key.includes('"')) {
      throw new MalformedKey(`a bare key cannot hold a double quote (at position ${key.indexOf('"') + 1}): ` +
        'send it as a Structured Field String, "...", with \\" for the quote');
    }
  }
  // An idem_key: 1 to 255 visible ASCII characters.
  if (key === '') throw new MalformedKey('the key is empty: 1 to 255 visible ASCII characters');
  for (let i = 0; i < key.length; i++) {
    const c = key.charCodeAt(i);
    if (c < 0x21 || c > 0x7e) {
      throw new MalformedKey(`the key has a character that is not visible ASCII (0x21 to 0x7E) at position ${i + 1}`);
    }
  }
  if (key.length > 255) throw new MalformedKey(`the key is ${key.length} characters long: at most 255`);
  return key;
}

// The default for which error responses are final, stored with idem_fail and replayed:
// a 4xx other than those that say "try again" (408, 409, 423, 425, 429).
function finalError(status) {
  return status >= 400 && status < 500 && ![408, 409, 423, 425, 429].includes(status);
}

// options: pool (a pg Pool; keys belong to its role), required (default true), scope
// (default "METHOD /route/path"), lease (an interval, e.g. '60 seconds': lease mode),
// ttl and wait (intervals; default the server's settings), storedHeaders (the response
// headers stored and replayed), isFinal(status) (which error responses are stored rather
// than rolled back), maxResponseSize (the largest response body held back, in bytes;
// default, and never more than, the server's idempotency.max_response_size).
function idempotency(options) {
  const { pool, required = true, lease = null, ttl = null, wait = null, isFinal = finalError } = options;
  const maxResponseSize = options.maxResponseSize ?? Infinity;
  const storedHeaders = (options.storedHeaders ?? ['content-type', 'location']).map((h) => h.toLowerCase());
  if (!pool) throw new TypeError('idempotency: a pg Pool is required');

  return async function idempotencyMiddleware(req, res, next) {
    const scope = options.scope ?? `${req.method} ${req.route ? req.baseUrl + req.route.path : req.path}`;
    let key = null;
    const values = req.headersDistinct['idempotency-key'];
    try {
      if (values) key = parseIdempotencyKey(values);
      else if (required) {
        return reply(res, problem(400, 'missing-key', 'Idempotency-Key is missing',
          `${scope} requires an Idempotency-Key header`));
      }
    } catch (e) {
      if (!(e instanceof MalformedKey)) throw e;
      return reply(res, problem(400, 'malformed-key', 'Idempotency-Key is malformed', e.message));
    }

    let raw;
    try {
      raw = await readBody(req);
    } catch (e) {
      return next(e);
    }
    const fingerprint = requestFingerprint(req.method, req.originalUrl, raw);
    const client = await pool.connect();
    const state = { client, scope, key, attempt: null, checkpoint: null, checkpointData: null, checkpointed: false };
    state.saveCheckpoint = (point, data = null) => saveCheckpoint(pool, state, lease, point, data);
    req.idempotency = state;
    let broken = false;
    let answer;
    try {
      answer = lease && key !== null
        ? await withLease(client, state, { ttl, lease, wait }, fingerprint, req, res, next)
        : await inTransaction(client, state, { ttl, wait }, fingerprint, req, res, next);
    } catch (e) {
      if (!e.code) broken = e; // not from the server: the connection may be unusable
      await client.query('ROLLBACK').catch(() => {});
      answer = databaseError(e);
    } finally {
      client.release(broken || undefined);
    }
    reply(res, answer);
  };

  async function claim(client, state, settings, fingerprint) {
    const { rows: [row] } = await client.query(CLAIM,
      [state.scope, state.key, fingerprint, settings.ttl, settings.lease ?? null, settings.wait]);
    if (row.outcome === 'replay') return stored(row.response);
    if (row.outcome === 'in_progress') return busy(row.retry_after);
    if (row.outcome !== 'claimed') throw new Error(`idem_claim answered ${row.outcome} to a fresh transaction`);
    Object.assign(state, { attempt: row.attempt, checkpoint: row.checkpoint, checkpointData: row.checkpoint_data });
    state.limit = Math.min(Number(row.max_response_size), maxResponseSize);
    return null;
  }

  // Claim, handler and completion in one transaction.
  async function inTransaction(client, state, settings, fingerprint, req, res, next) {
    await client.query('BEGIN');
    if (state.key !== null) {
      const answer = await claim(client, state, settings, fingerprint);
      if (answer) {
        await client.query('COMMIT');
        return answer;
      }
    } else {
      const { rows: [row] } = await client.query(`SELECT ${LIMIT} AS max_response_size`);
      state.limit = Math.min(Number(row.max_response_size), maxResponseSize);
    }
    const captured = await run(req, res, next, state.limit);
    // Not kept: ROLLBACK takes the claim and the handler's writes away.
    await client.query((await finish(client, state, captured, null)) ? 'COMMIT' : 'ROLLBACK');
    return captured;
  }

  // The claim commits first (a lease); the handler then runs in its own transaction,
  // which completes the key with the attempt.
  async function withLease(client, state, settings, fingerprint, req, res, next) {
    await client.query('BEGIN');
    const answer = await claim(client, state, settings, fingerprint);
    await client.query('COMMIT');
    if (answer) return answer;
    let finished = false;
    try {
      await client.query('BEGIN');
      const captured = await run(req, res, next, state.limit);
      finished = await finish(client, state, captured, state.attempt);
      await client.query(finished ? 'COMMIT' : 'ROLLBACK');
      return captured;
    } finally {
      // Not finished (an error, or a response that is not kept): give the key up so a
      // retry runs afresh, unless the handler recorded a checkpoint: then the claim stays
      // until its lease runs out, and a retry takes it over from there.
      if (!finished && !state.checkpointed) {
        await client.query('ROLLBACK').catch(() => {});
        await client.query('SELECT idem_release($1, $2::idem_key, $3)', [state.scope, state.key, state.attempt])
          .catch((e) => console.error(`idempotency: idem_release failed: ${e.message}`));
      }
    }
  }

  // Stores the response; false if it is not to be kept (roll back).
  async function finish(client, state, captured, attempt) {
    if (captured.notStored) return false;
    if (state.key === null) return captured.status < 500;
    let fn;
    if (captured.status < 400) fn = 'idem_complete';
    else if (isFinal(captured.status)) fn = 'idem_fail';
    else return false;
    const headers = {};
    for (const name of storedHeaders) {
      if (captured.headers[name] !== undefined) headers[name] = String(captured.headers[name]);
    }
    const response = { status: captured.status, headers };
    const text = captured.body.toString('utf8');
    // jsonb holds valid UTF-8 without U+0000; anything else is stored as base64.
    if (Buffer.from(text, 'utf8').equals(captured.body) && !text.includes('\0')) response.body = text;
    else response.body_base64 = captured.body.toString('base64');
    try {
      await client.query(`SELECT ${fn}($1, $2::idem_key, $3::jsonb, $4)`,
        [state.scope, state.key, JSON.stringify(response), attempt]);
    } catch (e) {
      // The stored document (the body escaped or in base64, the headers) over the
      // server's limit: the same rule as a body over it. The caller rolls back.
      if (e.code !== '54000') throw e;
      captured.notStored = 'stored-too-large';
      return false;
    }
    return true;
  }
}

// idem_checkpoint: a recovery point a takeover sees (and, in lease mode, the lease
// renewed). In lease mode it commits at once, through the pool (the handler's own
// transaction commits only at the end).
async function saveCheckpoint(pool, state, lease, point, data) {
  const sql = 'SELECT idem_checkpoint($1, $2::idem_key, $3, $4::jsonb, $5)';
  const json = data === null ? null : JSON.stringify(data);
  if (!lease) {
    await state.client.query(sql, [state.scope, state.key, point, json, null]);
    return;
  }
  await pool.query(sql, [state.scope, state.key, point, json, state.attempt]);
  state.checkpointed = true;
}

// Runs the rest of the route with the response held back: resolves with what the
// handler sent once it ends the response. An error the handler throws reaches Express's
// error handling, whose 500 is captured the same way (on Express 4 too: see
// catchRejections). A body over LIMIT bytes, or one written before the end (res.write,
// res.flushHeaders: streamed), is not kept: its bytes are dropped as they come, and
// notStored says why.
function run(req, res, next, limit) {
  const chunks = [];
  let size = 0;
  let notStored = null;
  const saved = { writeHead: res.writeHead, write: res.write, end: res.end, flushHeaders: res.flushHeaders };
  return new Promise((resolve) => {
    const add = (chunk, encoding) => {
      if (!chunk || typeof chunk === 'function' || notStored) return;
      const buffer = Buffer.from(chunk, typeof encoding === 'string' ? encoding : 'utf8');
      size += buffer.length;
      if (size > limit) {
        notStored = 'too-large';
        chunks.length = 0;
      } else {
        chunks.push(buffer);
      }
    };
    const streamed = () => {
      if (!notStored) notStored = 'streamed';
      chunks.length = 0;
    };
    res.writeHead = (status, reason, headers) => {
      res.statusCode = status;
      for (const [name, value] of Object.entries((typeof reason === 'string' ? headers : reason) ?? {})) {
        res.setHeader(name, value);
      }
      return res;
    };
    res.flushHeaders = streamed;
    res.write = (chunk, encoding, callback) => {
      streamed();
      for (const f of [encoding, callback]) if (typeof f === 'function') process.nextTick(f);
      return true;
    };
    res.end = (chunk, encoding) => {
      add(chunk, encoding);
      Object.assign(res, saved); // the real ones again, to send
      resolve({ status: res.statusCode, headers: res.getHeaders(), body: Buffer.concat(chunks), captured: true, notStored, limit });
      return res;
    };
    catchRejections(req);
    next();
  });
}

// Express 5 passes a rejected async handler's error to next(); Express 4 does not, and
// the request would hang with its transaction open. So the route's handlers after this
// middleware get that from a wrapper (once; its result is not returned, so Express 5
// does not pass the error twice).
const WRAPPED = Symbol('idempotency: rejections caught');
function catchRejections(req) {
  const stack = req.route?.stack ?? [];
  for (const layer of stack) {
    const handle = layer.handle;
    if (typeof handle !== 'function' || handle.length > 3 || handle[WRAPPED]) continue;
    const wrapped = function (req, res, next) {
      const result = handle.call(this, req, res, next);
      if (result && typeof result.then === 'function') result.then(undefined, next);
    };
    wrapped[WRAPPED] = true;
    layer.handle = wrapped;
  }
}

function readBody(req) {
  if (Buffer.isBuffer(req.rawBody)) return Promise.resolve(req.rawBody);
  if (req._body || req.readableEnded) {
    return Promise.reject(new Error('idempotency: the body was read before the middleware: put it before ' +
      'express.json(), or keep the raw body: express.json({ verify: (req, res, buf) => { req.rawBody = buf; } })'));
  }
  return new Promise((resolve, reject) => {
    const chunks = [];
    req.on('data', (c) => chunks.push(c));
    req.on('error', reject);
    req.on('end', () => {
      req.rawBody = Buffer.concat(chunks);
      req._body = true; // body-parser (express.json()) leaves a read body alone
      // The handler gets the parsed body, as express.json() would give it.
      if (/\bjson\b/i.test(req.headers['content-type'] ?? '') && req.rawBody.length) {
        try {
          req.body = JSON.parse(req.rawBody.toString('utf8'));
        } catch {
          req.body = undefined;
        }
      }
      resolve(req.rawBody);
    });
  });
}

function stored(response) {
  const body = response.body !== undefined ? Buffer.from(response.body, 'utf8') : Buffer.from(response.body_base64 ?? '', 'base64');
  return { status: response.status, headers: { ...response.headers, 'idempotent-replayed': 'true' }, body };
}

function busy(seconds) {
  return problem(409, 'in-progress', 'A request is outstanding for this Idempotency-Key',
    'a request with this key is being processed; retry after Retry-After seconds',
    { 'retry-after': String(Math.max(1, seconds || 1)) });
}

function databaseError(e) {
  if (BUSY.has(e.code)) return busy(1);
  if (e.code === 'IK001') {
    return problem(422, 'key-reused', 'Idempotency-Key is already used',
      'this key was used for another request; use a new key for a new request');
  }
  const status = STATUS[e.code] ?? 500;
  if (status === 500) console.error(`idempotency middleware: ${e.code ?? ''} ${e.stack ?? e}`);
  return problem(status, 'database', 'The request could not be served', status === 500 ? 'internal error' : e.message);
}

// The rule for a response too large to store, or streamed: not stored, its work rolled
// back, 500 with Idempotent-Not-Stored saying why.
function notStoredAnswer(reason, limit) {
  const detail = {
    'too-large': `the response is larger than idempotency.max_response_size (${limit} bytes)`,
    'stored-too-large': 'the response as stored (its body escaped or in base64, and its headers) ' +
      'is larger than idempotency.max_response_size',
    streamed: 'the response was streamed, and a response is held back until its transaction commits',
  }[reason];
  return problem(500, 'response-not-stored', 'The response could not be stored',
    `${detail}: it was not stored, and the request's work was rolled back`,
    { 'idempotent-not-stored': reason.replace(/^stored-/, '') });
}

// A JSON error (RFC 9457 shape).
function problem(status, kind, title, detail, headers = {}) {
  const body = Buffer.from(JSON.stringify({ type: `about:blank#${kind}`, title, status, detail }));
  return { status, headers: { 'content-type': 'application/problem+json', ...headers }, body };
}

// Sends an answer. A captured response still has the handler's headers on res; any
// other answer replaces them.
function reply(res, answer) {
  if (answer.notStored) answer = notStoredAnswer(answer.notStored, answer.limit);
  if (!answer.captured) {
    for (const name of res.getHeaderNames()) res.removeHeader(name);
    res.setHeader('content-type', 'application/json');
    for (const [name, value] of Object.entries(answer.headers)) res.setHeader(name, value);
  }
  res.statusCode = answer.status;
  res.setHeader('content-length', answer.body.length);
  res.end(answer.body);
}

module.exports = { idempotency, finalError, parseIdempotencyKey, MalformedKey, requestFingerprint };
