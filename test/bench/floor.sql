CALL floor_payment(gen_random_uuid()::text, 42, 10);
