-- floor_ttl: the floor plus an expiry index (setup.sql, floor_ttl_payment).
CALL floor_ttl_payment(gen_random_uuid()::text, 42, 10);
