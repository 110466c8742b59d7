CALL create_payment(gen_random_uuid()::idem_key, 42, 10);
