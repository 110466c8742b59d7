-- The procedure behind examples/http/payments_service.py: the README's create_payment
-- (Getting started; examples/create_payment.sql), except that it stores the whole HTTP
-- response (status, Location, body), so that a retry gets the same status and headers,
-- and that it returns the claim's outcome, the key's expiry and the time to wait, so
-- that the service needs no second query and no error message to parse.
CREATE TABLE IF NOT EXISTS payments (id bigserial PRIMARY KEY, account bigint, amount numeric);

CREATE PROCEDURE http_create_payment(p_key idem_key, p_account bigint, p_amount numeric,
                                     INOUT outcome text DEFAULT NULL,
                                     INOUT response jsonb DEFAULT NULL,
                                     INOUT expires_at timestamptz DEFAULT NULL,
                                     INOUT retry_after interval DEFAULT NULL)
LANGUAGE plpgsql AS $$
DECLARE c idem_claim_result; payment_id bigint; payment jsonb;
BEGIN
  -- Its own scope: its stored responses have another shape than create_payment's, and
  -- than the middleware's, whose default scope for this route is 'POST /payments'.
  c := idem_claim('payments-service POST /payments', p_key,
                  idem_fingerprint(jsonb_build_object('account', p_account, 'amount', p_amount)));
  outcome := c.outcome;
  expires_at := c.expires_at;   -- NULL while another attempt's claim is not written yet
  retry_after := c.retry_after;
  IF c.outcome = 'replay' THEN response := c.response; END IF;
  IF c.outcome <> 'claimed' THEN RETURN; END IF;
  INSERT INTO payments(account, amount) VALUES (p_account, p_amount)
    RETURNING id, jsonb_build_object('payment_id', id, 'amount', amount) INTO payment_id, payment;
  response := jsonb_build_object('status', 201,
                                 'headers', jsonb_build_object('Location', '/payments/' || payment_id),
                                 'body', payment);
  PERFORM idem_complete('payments-service POST /payments', p_key, response);
END $$;
