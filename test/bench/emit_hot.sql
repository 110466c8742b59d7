CALL create_payment_emit(gen_random_uuid()::idem_key, 42, 10);
