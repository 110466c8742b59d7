-- idempotency 1.3 -> 1.4
\echo Use "ALTER EXTENSION idempotency UPDATE TO '1.4'" to load this file. \quit

-- From 1.4 on, an update script keeps every object whose signature does not change in
-- place (CREATE OR REPLACE), so that views and SQL-standard functions that users built
-- on the extension's functions survive ALTER EXTENSION ... UPDATE.

-- idem_once_many (issue 37): the batch inbox, idem_once for an array of message keys
-- in one call. Granted to PUBLIC like idem_once (keys are per role).
CREATE FUNCTION idem_once_many(scope text, keys idem_key[],
    ttl interval DEFAULT NULL, wait interval DEFAULT NULL, route "any" DEFAULT NULL)
  RETURNS boolean[] AS 'MODULE_PATHNAME' LANGUAGE C VOLATILE;
