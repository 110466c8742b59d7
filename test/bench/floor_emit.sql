\set account random(1, 1000000)
CALL floor_payment_emit(gen_random_uuid()::text, :account, 10);
