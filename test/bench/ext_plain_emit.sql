\set account random(1, 1000000)
CALL create_payment_plain_emit(gen_random_uuid()::idem_key, :account, 10);
