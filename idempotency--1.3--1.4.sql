-- idempotency 1.3 -> 1.4
-- All below the \echo line also goes into idempotency--1.2--1.4.sql (the path from 1.2,
-- and so of CREATE EXTENSION): `make` remakes it; commit the two together.
\echo Use "ALTER EXTENSION idempotency UPDATE TO '1.4'" to load this file. \quit

-- From 1.4 on, an update script keeps every object whose signature does not change in
-- place (CREATE OR REPLACE), so that views and SQL-standard functions that users built
-- on the extension's functions survive ALTER EXTENSION ... UPDATE.
