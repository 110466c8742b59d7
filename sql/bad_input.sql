-- Every bad input gets its SQLSTATE; nothing is stored by a failed call.
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idempotency;
RESET client_min_messages;

-- NULL where a value is required: 22004 (functions are not STRICT).
SELECT idem_claim(NULL, 'k');
\echo :LAST_ERROR_SQLSTATE
SELECT idem_claim('s', NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT idem_complete(NULL, 'k');
\echo :LAST_ERROR_SQLSTATE
SELECT idem_fail('s', NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT idem_release(NULL, NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT idem_checkpoint('s', 'k', NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT idem_once(NULL, 'k');
\echo :LAST_ERROR_SQLSTATE
SELECT idem_forget('s', NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idem_lookup(NULL, 'k');
\echo :LAST_ERROR_SQLSTATE

-- Bad scope, ttl, lease, wait and fingerprint: 22023.
SELECT idem_claim('', 'k');
\echo :LAST_ERROR_SQLSTATE
SELECT idem_claim(repeat('s', 256), 'k');
\echo :LAST_ERROR_SQLSTATE
SELECT idem_claim('s', 'k', ttl => '0');
\echo :LAST_ERROR_SQLSTATE
SELECT idem_claim('s', 'k', ttl => '-1 hour');
\echo :LAST_ERROR_SQLSTATE
SELECT idem_claim('s', 'k', lease => '0');
\echo :LAST_ERROR_SQLSTATE
SELECT idem_claim('s', 'k', lease => '-5 minutes');
\echo :LAST_ERROR_SQLSTATE
SELECT idem_claim('s', 'k', ttl => '1 minute', lease => '2 minutes');
\echo :LAST_ERROR_SQLSTATE
SELECT idem_claim('s', 'k', wait => '-1 second');
\echo :LAST_ERROR_SQLSTATE
SELECT idem_once('s', 'k', wait => '-1 second');
\echo :LAST_ERROR_SQLSTATE
SELECT idem_claim('s', 'k', decode(repeat('ab', 65), 'hex'));
\echo :LAST_ERROR_SQLSTATE
-- A 64-byte fingerprint is fine (in a transaction, released).
BEGIN;
SELECT outcome FROM idem_claim('s', 'k64', decode(repeat('ab', 64), 'hex'));
SELECT idem_release('s', 'k64');
COMMIT;
-- Keys are validated before anything else.
SELECT idem_claim('s', 'bad key');
\echo :LAST_ERROR_SQLSTATE

-- Over idempotency.max_response_size: 54000, and the claim stays as it was.
SET idempotency.max_response_size = '1kB';
BEGIN;
SELECT outcome FROM idem_claim('s', 'big');
SELECT idem_complete('s', 'big', jsonb_build_object('blob', repeat('x', 2000)));
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
BEGIN;
SELECT outcome FROM idem_claim('s', 'big');
SAVEPOINT before_big;
SELECT idem_fail('s', 'big', jsonb_build_object('blob', repeat('x', 2000)));
\echo :LAST_ERROR_SQLSTATE
ROLLBACK TO before_big;
SELECT idem_checkpoint('s', 'big', 'step', jsonb_build_object('blob', repeat('x', 2000)));
\echo :LAST_ERROR_SQLSTATE
ROLLBACK TO before_big;
SELECT idem_checkpoint('s', 'big', repeat('p', 2000));
\echo :LAST_ERROR_SQLSTATE
ROLLBACK TO before_big;
SELECT state, checkpoint FROM idem_lookup('s', 'big');
SELECT idem_complete('s', 'big', jsonb_build_object('blob', repeat('x', 100)));
COMMIT;
SELECT state, length(response->>'blob') AS blob FROM idem_lookup('s', 'big');
RESET idempotency.max_response_size;

-- Writing functions in a read-only transaction: 25006, even for a replay.
BEGIN READ ONLY;
SELECT idem_claim('s', 'big');
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
BEGIN READ ONLY;
SELECT idem_once('s', 'ro');
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
BEGIN READ ONLY;
SELECT idem_forget('s', 'big');
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
BEGIN READ ONLY;
SELECT idem_complete('s', 'big');
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
-- Reading works there.
BEGIN READ ONLY;
SELECT state FROM idem_lookup('s', 'big');
COMMIT;

-- Quotes, backslashes and long values are data, never SQL.
BEGIN;
SELECT outcome FROM idem_claim($$it's "quoted" \ ; DROP TABLE x; --$$, 'k''";\');
SELECT idem_complete($$it's "quoted" \ ; DROP TABLE x; --$$, 'k''";\', '"safe"');
COMMIT;
SELECT state, response FROM idem_lookup($$it's "quoted" \ ; DROP TABLE x; --$$, 'k''";\');
SELECT idem_forget($$it's "quoted" \ ; DROP TABLE x; --$$, 'k''";\');
