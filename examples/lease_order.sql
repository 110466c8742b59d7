-- A lease claim around work with an outside side effect (a payment provider),
-- with a checkpoint after each phase so a retry can resume where a crashed holder
-- stopped. Used by the README, scripts/demo.sh and test/t/002_lease_crash.pl.

-- The outside service. It applies a charge once per idempotency key it is given,
-- as a payment provider's API does; here it is a table in the same database.
CREATE TABLE provider_charges (
  charge_key idem_key PRIMARY KEY,
  order_key  text NOT NULL,
  amount     numeric NOT NULL
);
CREATE FUNCTION provider_charge(charge_key idem_key, order_key text, amount numeric)
RETURNS text LANGUAGE sql AS $$
  INSERT INTO provider_charges VALUES (charge_key, order_key, amount)
    ON CONFLICT (charge_key) DO NOTHING;
  SELECT 'ch_' || left(charge_key::text, 12);
$$;

CREATE TABLE shipments (order_key text NOT NULL, charge text NOT NULL);

-- Call it outside a transaction block (it commits between phases).
CREATE PROCEDURE fulfil_order(p_key idem_key, p_amount numeric,
                              p_stall interval DEFAULT '0', INOUT result jsonb DEFAULT NULL)
LANGUAGE plpgsql AS $$
DECLARE
  c idem_claim_result;
  charge text;
BEGIN
  c := idem_claim('orders', p_key, idem_fingerprint(to_jsonb(p_amount)), lease => '2 seconds');
  IF c.outcome = 'replay' THEN result := c.response; RETURN; END IF;
  IF c.outcome <> 'claimed' THEN
    RAISE EXCEPTION 'order % is in progress', p_key
      USING ERRCODE = 'IK005', HINT = format('Retry after %s.', c.retry_after);
  END IF;
  COMMIT;  -- the lease claim is visible now: a retry waits for it or takes it over

  IF c.checkpoint IS NULL THEN
    -- Phase 1: the outside call, with a key derived from ours so that a retry of
    -- this phase is applied once by the provider too.
    charge := provider_charge(idem_derive(p_key, 'charge'), p_key::text, p_amount);
    PERFORM idem_checkpoint('orders', p_key, 'charged', jsonb_build_object('charge', charge),
                            c.attempt);
    COMMIT;
  ELSE
    charge := c.checkpoint_data->>'charge';  -- resumed: the charge was already made
  END IF;

  PERFORM pg_sleep_for(p_stall);  -- a slow holder (or one about to crash)

  -- Phase 2: the local write and the completion commit together.
  INSERT INTO shipments VALUES (p_key::text, charge);
  result := jsonb_build_object('order', p_key, 'charge', charge, 'attempt', c.attempt);
  PERFORM idem_complete('orders', p_key, result, c.attempt);
END $$;
