-- One relay round: lease a batch, then (the broker's publish left out) acknowledge it,
-- each in its own transaction as a relay does.
SELECT quote_literal(coalesce(array_agg(event_id)::text, '{}')) AS ids FROM idem_outbox_claim('relay-' || :client_id, 500) \gset
SELECT idem_outbox_ack('relay-' || :client_id, :ids::idem_key[]);
