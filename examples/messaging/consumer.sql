-- The consumer of examples/messaging (consumer.py), in a second database, the ledger:
-- each account's balance and number of payments, from the events `payment.created`
-- of producer.sql, and a log of the events applied.
--
-- consumer.py calls apply_event once per broker message, in one transaction, and acks
-- the message after the commit. apply_event applies the event only if
--   - idem_once('ledger', event id) is true: the first time this event id is seen.
--     Its record commits with the event's effect (a rollback takes both), so a second
--     copy (the relay published it twice, the broker redelivered it) returns
--     'duplicate' and changes nothing: exactly once.
--   - idem_apply_version('ledger:' || topic, account, seq) is true: seq is past the
--     last seq applied for this account and topic, which it then records. The relay
--     and the queue deliver an account's events in seq order, so this holds for
--     every new event; the one exception is a dead letter put back with
--     idem_outbox_retry after later events of its account went through. Such an event
--     returns 'stale' and is not applied (consumer.py logs it for an operator)
--     rather than applied out of order.
-- A `payment.disputed` event counts a dispute on the account; an event of another
-- topic is only logged.
--
-- applied_events.event_id has no UNIQUE constraint on purpose: idem_once is what keeps
-- every event applied once, and the example's test (test/t/015_messaging_e2e.pl)
-- counts that it did.
CREATE TABLE accounts (account text PRIMARY KEY, balance numeric NOT NULL DEFAULT 0,
                       payments integer NOT NULL DEFAULT 0, disputes integer NOT NULL DEFAULT 0);
CREATE TABLE applied_events (id bigserial PRIMARY KEY, event_id text NOT NULL,
                             topic text NOT NULL, account text NOT NULL, seq bigint NOT NULL,
                             payload jsonb NOT NULL,
                             applied_at timestamptz NOT NULL DEFAULT clock_timestamp());

-- outcome: applied, duplicate or stale.
CREATE PROCEDURE apply_event(p_event_id idem_key, p_topic text, p_account text, p_seq bigint,
                             p_payload jsonb, INOUT outcome text DEFAULT NULL)
LANGUAGE plpgsql AS $$
BEGIN
  IF NOT idem_once('ledger', p_event_id) THEN outcome := 'duplicate'; RETURN; END IF;
  IF NOT idem_apply_version('ledger:' || p_topic, p_account, p_seq) THEN
    outcome := 'stale';
    RETURN;
  END IF;
  CASE p_topic
    WHEN 'payment.created' THEN
      INSERT INTO accounts AS a (account, balance, payments)
        VALUES (p_account, (p_payload->>'amount')::numeric, 1)
        ON CONFLICT (account) DO UPDATE SET balance = a.balance + excluded.balance,
                                            payments = a.payments + 1;
    WHEN 'payment.disputed' THEN
      INSERT INTO accounts AS a (account, disputes) VALUES (p_account, 1)
        ON CONFLICT (account) DO UPDATE SET disputes = a.disputes + 1;
    ELSE
      NULL;
  END CASE;
  INSERT INTO applied_events(event_id, topic, account, seq, payload)
    VALUES (p_event_id::text, p_topic, p_account, p_seq, p_payload);
  outcome := 'applied';
END $$;
