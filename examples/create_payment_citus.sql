-- examples/create_payment.sql on a Citus cluster (README, "Scaling out with Citus"):
-- the business table distributed by account, the key store distributed with it, and
-- the procedure distributed by its account argument, so that Citus runs each call on
-- the node that holds the account's payments and keys. Run on the coordinator.
CREATE TABLE payments (id bigserial, account bigint NOT NULL, amount numeric,
                       PRIMARY KEY (account, id));  -- Citus: the key holds the account
SELECT create_distributed_table('payments', 'account');
SELECT idem_distribute('payments');

-- Two changes from the single-node procedure: each key function gets the account as
-- route => p_account, and the response is built after the INSERT (Citus refuses
-- jsonb_build_object, a STABLE function, in RETURNING on a distributed table).
CREATE PROCEDURE create_payment(p_key idem_key, p_account bigint, p_amount numeric,
                                INOUT result jsonb DEFAULT NULL)
LANGUAGE plpgsql AS $$
DECLARE c idem_claim_result; v_id bigint;
BEGIN
  c := idem_claim('payments', p_key,
                  idem_fingerprint(jsonb_build_object('account', p_account, 'amount', p_amount)),
                  route => p_account);
  IF c.outcome = 'replay' THEN result := c.response; RETURN; END IF;
  IF c.outcome = 'in_progress' THEN   -- IK005, so that a client can answer 409 with Retry-After
    RAISE EXCEPTION 'payment % is in progress', p_key
      USING ERRCODE = 'IK005', HINT = format('Retry after %s.', c.retry_after);
  END IF;
  INSERT INTO payments(account, amount) VALUES (p_account, p_amount) RETURNING id INTO v_id;
  result := jsonb_build_object('payment_id', v_id, 'amount', p_amount);
  PERFORM idem_complete('payments', p_key, result, route => p_account);
END $$;
SELECT create_distributed_function('create_payment(idem_key, bigint, numeric, jsonb)',
                                   distribution_arg_name => 'p_account',
                                   colocate_with => 'payments');
