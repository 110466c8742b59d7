-- The contract's example procedure, exactly as written there, with its business table.
-- Used by scripts/demo.sh and sql/claim.sql, and shown in the README.
CREATE TABLE payments (id bigserial PRIMARY KEY, account bigint, amount numeric);

CREATE PROCEDURE create_payment(p_key idem_key, p_account bigint, p_amount numeric,
                                INOUT result jsonb DEFAULT NULL)
LANGUAGE plpgsql AS $$
DECLARE c idem_claim_result;
BEGIN
  c := idem_claim('payments', p_key,
                  idem_fingerprint(jsonb_build_object('account', p_account, 'amount', p_amount)));
  IF c.outcome = 'replay' THEN result := c.response; RETURN; END IF;
  IF c.outcome = 'in_progress' THEN RAISE EXCEPTION 'retry after %', c.retry_after; END IF;
  INSERT INTO payments(account, amount) VALUES (p_account, p_amount)
    RETURNING jsonb_build_object('payment_id', id, 'amount', amount) INTO result;
  PERFORM idem_complete('payments', p_key, result);
END $$;
