-- idempotency 1.4 -> 1.5
\echo Use "ALTER EXTENSION idempotency UPDATE TO '1.5'" to load this file. \quit

-- As from 1.4, objects whose signature does not change are kept in place (CREATE OR
-- REPLACE), so that users' views and SQL-standard functions over them survive the update;
-- grants are carried by exact signature.
