\set k random(1, 4)
CALL plpgsql_payment('hot-' || (extract(epoch FROM clock_timestamp()) * 20)::bigint || '-' || :k, 42, 10);
