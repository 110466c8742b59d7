-- The schema of test/bench/peers' second database, "bench_sql": the SQL-only edition
-- (dist/idempotency-sql--1.5.sql, run before this file by the database owner
-- bench_owner, as a user would), its payments table and the same create_payment
-- procedure as setup.sql's. It runs in a database of its own because the two editions
-- define the same names. Run by bench_owner; the requests come from role bench_app, a
-- plain role (neither the store's owner nor a superuser), so that row-level security
-- applies as it does for an application.
CREATE TABLE payments (id bigserial PRIMARY KEY, key text, account bigint, amount numeric);
GRANT SELECT, INSERT ON payments TO bench_app;
GRANT USAGE ON SEQUENCE payments_id_seq TO bench_app;

-- The procedure of examples/create_payment.sql (as setup.sql's), one CALL per request.
CREATE PROCEDURE create_payment(p_key idem_key, p_account bigint, p_amount numeric,
                                INOUT result jsonb DEFAULT NULL)
LANGUAGE plpgsql AS $$
DECLARE c idem_claim_result;
BEGIN
  c := idem_claim('payments', p_key,
                  idem_fingerprint(jsonb_build_object('account', p_account, 'amount', p_amount)));
  IF c.outcome = 'replay' THEN result := c.response; RETURN; END IF;
  IF c.outcome = 'in_progress' THEN   -- IK005, so that a client can answer 409 with Retry-After
    RAISE EXCEPTION 'payment % is in progress', p_key
      USING ERRCODE = 'IK005', HINT = format('Retry after %s.', c.retry_after);
  END IF;
  INSERT INTO payments(key, account, amount) VALUES (p_key::text, p_account, p_amount)
    RETURNING jsonb_build_object('payment_id', id, 'amount', amount) INTO result;
  PERFORM idem_complete('payments', p_key, result);
END $$;
