-- The procedure of the README's Getting started, with its business table: the
-- extension's own example of a payment made once, except that `in_progress` is raised
-- with SQLSTATE IK005 (as idem_once raises it) and the time to wait in the hint, so that
-- a client can answer 409 with Retry-After. Used by scripts/demo.sh, sql/claim.sql and
-- test/t/021_clients.pl.
CREATE TABLE payments (id bigserial PRIMARY KEY, account bigint, amount numeric);

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
  INSERT INTO payments(account, amount) VALUES (p_account, p_amount)
    RETURNING jsonb_build_object('payment_id', id, 'amount', amount) INTO result;
  PERFORM idem_complete('payments', p_key, result);
END $$;
