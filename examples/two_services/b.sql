-- Service B's database (its own): one shipment per order event it applies. No unique
-- constraint on event_id on purpose: applying an event once is the middleware's job here.
CREATE EXTENSION IF NOT EXISTS idempotency;
CREATE TABLE shipments(n bigserial PRIMARY KEY, event_id text NOT NULL, order_id bigint NOT NULL,
                       customer int NOT NULL, amount numeric NOT NULL,
                       applied_at timestamptz NOT NULL DEFAULT clock_timestamp());
