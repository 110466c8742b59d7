\set k random(1, 100000)
CALL create_payment(('replay-' || :k)::idem_key, 42, 10);
