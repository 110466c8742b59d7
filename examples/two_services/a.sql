-- Service A's database: orders, each announced by an event in the same transaction.
CREATE EXTENSION IF NOT EXISTS idempotency;
CREATE TABLE orders(id bigserial PRIMARY KEY, customer int NOT NULL, amount numeric NOT NULL,
                    created_at timestamptz NOT NULL DEFAULT now());
