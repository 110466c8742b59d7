-- idempotency 1.3 -> 1.4
-- All below the \echo line also goes into idempotency--1.2--1.4.sql (the path from 1.2,
-- and so of CREATE EXTENSION): `make` remakes it; commit the two together.
\echo Use "ALTER EXTENSION idempotency UPDATE TO '1.4'" to load this file. \quit

-- From 1.4 on, an update script keeps every object whose signature does not change in
-- place (CREATE OR REPLACE), so that views and SQL-standard functions that users built
-- on the extension's functions survive ALTER EXTENSION ... UPDATE.

------------------------------------------------------------------------------
-- Install notice (issue 36): on a server that did not preload the library, CREATE
-- EXTENSION (which runs 1.0 -> ... -> 1.4) and ALTER EXTENSION ... UPDATE say so.
-- The function is dropped again, so the catalog is as before; a later update
-- script that should say it too repeats these three lines.
------------------------------------------------------------------------------
CREATE FUNCTION idem_install_notice() RETURNS void
  AS 'MODULE_PATHNAME' LANGUAGE C VOLATILE;
SELECT idem_install_notice();
DROP FUNCTION idem_install_notice();
