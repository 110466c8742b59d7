CALL bare_payment(42, 10);
