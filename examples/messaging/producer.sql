-- The producer of examples/messaging: a payment and the event announcing it, committed
-- together (the transactional outbox), in the producer's database.
--
-- create_payment claims the request's key as examples/create_payment.sql does, inserts
-- the payment, records the event `payment.created` with idem_emit and completes the key,
-- all in the caller's transaction. If it commits, the payment, its event and the key's
-- stored response are there together; if it rolls back, none of them is: no event ever
-- announces a payment that does not exist, and no payment goes unannounced.
--   - aggregate => the account: the events of one account get seq 1, 2, 3, ... in
--     commit order, and idem-relay hands them to the broker in that order.
--   - event_id => idem_derive(key, 'payment.created'): the event's id follows from the
--     request's key, so however often this step runs for one key it emits one event,
--     and a consumer can tell which request an event came from.
-- A retry of a finished key replays the stored response and emits nothing.
--
-- Call it in a transaction block (or from a procedure or function that runs in one):
--
--   BEGIN;
--   CALL create_payment('order-1001', 42, 19.99);
--     -- claimed | {"amount": 19.99, "account": 42, "payment_id": 1}
--   COMMIT;
--   BEGIN; CALL create_payment('order-1001', 42, 19.99); COMMIT;   -- replay, the same
--
-- The relay (idem-relay, relay/) reads the outbox with functions that are not granted to PUBLIC:
--
--   CREATE ROLE relay LOGIN;
--   GRANT EXECUTE ON FUNCTION idem_outbox_claim(text, integer, interval, text[]),
--       idem_outbox_ack(text, idem_key[]), idem_outbox_dead(text, idem_key[], text),
--       idem_outbox_retry(idem_key[]), idem_outbox_dead_letters(text, integer) TO relay;
CREATE TABLE payments (id bigserial PRIMARY KEY, key text NOT NULL, account bigint NOT NULL,
                       amount numeric NOT NULL, created_at timestamptz NOT NULL DEFAULT now());

-- outcome: claimed (a new payment), replay (result is the stored response), or
-- in_progress (another attempt with this key holds it for longer than
-- idempotency.wait_timeout: retry later; result is NULL).
CREATE PROCEDURE create_payment(p_key idem_key, p_account bigint, p_amount numeric,
                                INOUT outcome text DEFAULT NULL, INOUT result jsonb DEFAULT NULL)
LANGUAGE plpgsql AS $$
DECLARE c idem_claim_result; payment_id bigint;
BEGIN
  c := idem_claim('payments', p_key,
                  idem_fingerprint(jsonb_build_object('account', p_account, 'amount', p_amount)));
  outcome := c.outcome;
  IF c.outcome = 'replay' THEN result := c.response; RETURN; END IF;
  IF c.outcome <> 'claimed' THEN RETURN; END IF;
  INSERT INTO payments(key, account, amount) VALUES (p_key::text, p_account, p_amount)
    RETURNING id INTO payment_id;
  result := jsonb_build_object('payment_id', payment_id, 'account', p_account, 'amount', p_amount);
  PERFORM idem_emit('payment.created', result, aggregate => p_account::text,
                    event_id => idem_derive(p_key, 'payment.created'));
  PERFORM idem_complete('payments', p_key, result);
END $$;
