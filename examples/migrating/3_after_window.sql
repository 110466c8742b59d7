-- After the window: the extension alone. In one transaction, so that every call runs
-- either the switch-over procedure or this one.
BEGIN;
CREATE OR REPLACE PROCEDURE create_transfer(p_key idem_key, p_account bigint, p_amount numeric,
                                            INOUT result jsonb DEFAULT NULL)
LANGUAGE plpgsql AS $$
DECLARE c idem_claim_result;
BEGIN
  c := idem_claim('transfers', p_key,
                  idem_fingerprint(jsonb_build_object('account', p_account, 'amount', p_amount)));
  IF c.outcome = 'replay' THEN result := c.response; RETURN; END IF;
  IF c.outcome = 'in_progress' THEN
    RAISE EXCEPTION 'transfer % is in progress', p_key
      USING ERRCODE = 'IK005', HINT = format('Retry after %s.', c.retry_after);
  END IF;
  INSERT INTO transfers(account, amount) VALUES (p_account, p_amount)
    RETURNING jsonb_build_object('transfer_id', id, 'amount', amount) INTO result;
  PERFORM idem_complete('transfers', p_key, result);
END $$;
DROP PROCEDURE legacy_create_transfer;
DROP TABLE legacy_idempotency_keys;
COMMIT;
