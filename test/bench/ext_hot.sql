\set k random(1, 4)
CALL create_payment(('hot-' || (extract(epoch FROM clock_timestamp()) * 20)::bigint || '-' || :k)::idem_key, 42, 10);
