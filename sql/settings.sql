-- The idempotency.* settings.
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idempotency;
RESET client_min_messages;
-- Settings are defined when the library loads: at server start when it is preloaded,
-- else at the first call of one of its functions, or by LOAD.
LOAD 'idempotency';

SHOW idempotency.default_ttl;
SHOW idempotency.wait_timeout;
SHOW idempotency.max_response_size;

-- default_ttl sets the window of keys claimed without a ttl.
SET idempotency.default_ttl = '90min';
SHOW idempotency.default_ttl;
BEGIN;
SELECT expires_at - first_claimed_at AS window FROM idem_claim('settings', 'ttl');
SELECT idem_release('settings', 'ttl');
COMMIT;
RESET idempotency.default_ttl;
BEGIN;
SELECT expires_at - first_claimed_at AS window FROM idem_claim('settings', 'ttl');
SELECT expires_at - first_claimed_at AS window FROM idem_claim('settings', 'ttl2', ttl => '10 days');
SELECT idem_release('settings', 'ttl'), idem_release('settings', 'ttl2');
COMMIT;

-- Units and bounds are checked like any setting's.
SET idempotency.wait_timeout = '250ms';
SHOW idempotency.wait_timeout;
SET idempotency.wait_timeout = 0;
SHOW idempotency.wait_timeout;
SET idempotency.wait_timeout = '-1s';
\echo :LAST_ERROR_SQLSTATE
SET idempotency.default_ttl = 'forever';
\echo :LAST_ERROR_SQLSTATE
SET idempotency.max_response_size = '64kB';
SHOW idempotency.max_response_size;
RESET ALL;
-- The prefix is reserved.
SET idempotency.no_such_setting = 1;
\echo :LAST_ERROR_SQLSTATE
-- Each with its default (the server's own configuration may set the sighup ones).
SELECT name, boot_val AS default, unit, context FROM pg_settings WHERE name LIKE 'idempotency.%' ORDER BY name;
