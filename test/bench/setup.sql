-- Benchmark schema: the business table, a bare procedure, a hand-written PL/pgSQL
-- idempotency layer (what teams write instead), and the extension's procedure.
CREATE EXTENSION IF NOT EXISTS idempotency;

CREATE TABLE payments (id bigserial PRIMARY KEY, account bigint, amount numeric);

-- 1. bare: the business write and its response only.
CREATE PROCEDURE bare_payment(p_account bigint, p_amount numeric, INOUT result jsonb DEFAULT NULL)
LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO payments(account, amount) VALUES (p_account, p_amount)
    RETURNING jsonb_build_object('payment_id', id, 'amount', amount) INTO result;
END $$;

-- 2. plpgsql: a straightforward hand-written claim/complete.
CREATE TABLE plpgsql_keys (
  scope text NOT NULL, key text NOT NULL, fingerprint bytea, state text NOT NULL,
  response jsonb, created_at timestamptz NOT NULL DEFAULT now(),
  expires_at timestamptz NOT NULL, PRIMARY KEY (scope, key));
CREATE FUNCTION plpgsql_claim(p_scope text, p_key text, p_fingerprint bytea,
                              OUT outcome text, OUT response jsonb)
LANGUAGE plpgsql AS $$
DECLARE r plpgsql_keys;
BEGIN
  INSERT INTO plpgsql_keys(scope, key, fingerprint, state, expires_at)
    VALUES (p_scope, p_key, p_fingerprint, 'pending', now() + interval '24 hours')
    ON CONFLICT DO NOTHING;
  IF FOUND THEN outcome := 'claimed'; RETURN; END IF;
  SELECT * INTO r FROM plpgsql_keys WHERE scope = p_scope AND key = p_key;
  IF r.fingerprint IS DISTINCT FROM p_fingerprint THEN
    RAISE EXCEPTION 'fingerprint mismatch' USING ERRCODE = 'IK001';
  END IF;
  IF r.state = 'completed' THEN outcome := 'replay'; response := r.response;
  ELSE outcome := 'in_progress'; END IF;
END $$;
CREATE FUNCTION plpgsql_complete(p_scope text, p_key text, p_response jsonb) RETURNS void
LANGUAGE sql AS $$
  UPDATE plpgsql_keys SET state = 'completed', response = p_response
  WHERE scope = p_scope AND key = p_key AND state = 'pending';
$$;
CREATE PROCEDURE plpgsql_payment(p_key text, p_account bigint, p_amount numeric,
                                 INOUT result jsonb DEFAULT NULL)
LANGUAGE plpgsql AS $$
DECLARE c record;
BEGIN
  c := plpgsql_claim('payments', p_key,
         sha256(convert_to(jsonb_build_object('account', p_account, 'amount', p_amount)::text, 'UTF8')));
  IF c.outcome = 'replay' THEN result := c.response; RETURN; END IF;
  IF c.outcome = 'in_progress' THEN RETURN; END IF;
  INSERT INTO payments(account, amount) VALUES (p_account, p_amount)
    RETURNING jsonb_build_object('payment_id', id, 'amount', amount) INTO result;
  PERFORM plpgsql_complete('payments', p_key, result);
END $$;

-- floor: the business insert plus ONE plain INSERT of the key's finished row into a
-- table whose only index is the primary key (scope, key): no conflict handling, no
-- look-up, no state. Any table-backed key store pays at least this through SQL.
CREATE TABLE floor_keys (
  scope text NOT NULL, key text NOT NULL, fingerprint bytea NOT NULL, response jsonb,
  expires_at timestamptz NOT NULL, PRIMARY KEY (scope, key));
CREATE PROCEDURE floor_payment(p_key text, p_account bigint, p_amount numeric,
                               INOUT result jsonb DEFAULT NULL)
LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO payments(account, amount) VALUES (p_account, p_amount)
    RETURNING jsonb_build_object('payment_id', id, 'amount', amount) INTO result;
  INSERT INTO floor_keys(scope, key, fingerprint, response, expires_at)
    VALUES ('payments', p_key,
            sha256(convert_to(jsonb_build_object('account', p_account, 'amount', p_amount)::text, 'UTF8')),
            result, now() + interval '24 hours');
END $$;

-- floor_ttl: the floor plus the expiry index that any key store which reaps expired
-- keys needs (the extension's keys have one too): the business insert and ONE plain
-- INSERT of the key's finished row into a table with its primary key (scope, key) and
-- an index on expires_at. Against it, a new key's claim pays the look before the
-- insert and the identity lock, not the index the reaper needs.
CREATE TABLE floor_ttl_keys (
  scope text NOT NULL, key text NOT NULL, fingerprint bytea NOT NULL, response jsonb,
  expires_at timestamptz NOT NULL, PRIMARY KEY (scope, key));
CREATE INDEX floor_ttl_keys_expires_at_idx ON floor_ttl_keys (expires_at);
CREATE PROCEDURE floor_ttl_payment(p_key text, p_account bigint, p_amount numeric,
                                   INOUT result jsonb DEFAULT NULL)
LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO payments(account, amount) VALUES (p_account, p_amount)
    RETURNING jsonb_build_object('payment_id', id, 'amount', amount) INTO result;
  INSERT INTO floor_ttl_keys(scope, key, fingerprint, response, expires_at)
    VALUES ('payments', p_key,
            sha256(convert_to(jsonb_build_object('account', p_account, 'amount', p_amount)::text, 'UTF8')),
            result, now() + interval '24 hours');
END $$;

-- 3-5. the extension: the README's procedure; in_progress returns instead of raising,
-- so pgbench (which stops a client on an error) can run the hot-key case.
CREATE PROCEDURE create_payment(p_key idem_key, p_account bigint, p_amount numeric,
                                INOUT result jsonb DEFAULT NULL)
LANGUAGE plpgsql AS $$
DECLARE c idem_claim_result;
BEGIN
  c := idem_claim('payments', p_key,
                  idem_fingerprint(jsonb_build_object('account', p_account, 'amount', p_amount)));
  IF c.outcome = 'replay' THEN result := c.response; RETURN; END IF;
  IF c.outcome = 'in_progress' THEN RETURN; END IF;
  INSERT INTO payments(account, amount) VALUES (p_account, p_amount)
    RETURNING jsonb_build_object('payment_id', id, 'amount', amount) INTO result;
  PERFORM idem_complete('payments', p_key, result);
END $$;

-- 6. ext_emit: the same, announcing the payment through the outbox in the same
-- transaction (aggregate = the account, the event id derived from the key).
CREATE PROCEDURE create_payment_emit(p_key idem_key, p_account bigint, p_amount numeric,
                                     INOUT result jsonb DEFAULT NULL)
LANGUAGE plpgsql AS $$
DECLARE c idem_claim_result;
BEGIN
  c := idem_claim('payments', p_key,
                  idem_fingerprint(jsonb_build_object('account', p_account, 'amount', p_amount)));
  IF c.outcome = 'replay' THEN result := c.response; RETURN; END IF;
  IF c.outcome = 'in_progress' THEN RETURN; END IF;
  INSERT INTO payments(account, amount) VALUES (p_account, p_amount)
    RETURNING jsonb_build_object('payment_id', id, 'amount', amount) INTO result;
  PERFORM idem_emit('payment.created', result, p_account::text, NULL,
                    idem_derive(p_key, 'payment.created'));
  PERFORM idem_complete('payments', p_key, result);
END $$;

-- 7. floor_emit: the floor plus ONE plain INSERT of the event's row into an outbox
-- table with a primary key on a random event id and an index on its position (the
-- relay's queue): what any table-backed outbox pays at least through SQL, without
-- per-aggregate order or an id emitted at most once. Against the floor, the least an
-- event can add to a new key.
CREATE TABLE floor_outbox (
  event_id uuid PRIMARY KEY, position bigserial NOT NULL, topic text NOT NULL,
  aggregate text, payload jsonb NOT NULL, emitted_at timestamptz NOT NULL DEFAULT now());
CREATE INDEX floor_outbox_position_idx ON floor_outbox (position);
CREATE PROCEDURE floor_payment_emit(p_key text, p_account bigint, p_amount numeric,
                                    INOUT result jsonb DEFAULT NULL)
LANGUAGE plpgsql AS $$
BEGIN
  CALL floor_payment(p_key, p_account, p_amount, result);
  INSERT INTO floor_outbox(event_id, topic, aggregate, payload)
    VALUES (gen_random_uuid(), 'payment.created', p_account::text, result);
END $$;

-- 8. ext_plain_emit: ext_new plus the same ONE plain INSERT of an event row into
-- floor_outbox, where ext_emit calls idem_emit. What any table-backed outbox adds to
-- the claim + insert + complete transaction at least, before order and event ids.
CREATE PROCEDURE create_payment_plain_emit(p_key idem_key, p_account bigint, p_amount numeric,
                                           INOUT result jsonb DEFAULT NULL)
LANGUAGE plpgsql AS $$
DECLARE c idem_claim_result;
BEGIN
  c := idem_claim('payments', p_key,
                  idem_fingerprint(jsonb_build_object('account', p_account, 'amount', p_amount)));
  IF c.outcome = 'replay' THEN result := c.response; RETURN; END IF;
  IF c.outcome = 'in_progress' THEN RETURN; END IF;
  INSERT INTO payments(account, amount) VALUES (p_account, p_amount)
    RETURNING jsonb_build_object('payment_id', id, 'amount', amount) INTO result;
  INSERT INTO floor_outbox(event_id, topic, aggregate, payload)
    VALUES (gen_random_uuid(), 'payment.created', p_account::text, result);
  PERFORM idem_complete('payments', p_key, result);
END $$;

-- 100,000 completed keys to replay.
DO $$
BEGIN
  PERFORM idem_claim('payments', ('replay-' || g)::idem_key,
                     idem_fingerprint(jsonb_build_object('account', 42, 'amount', 10))),
          idem_complete('payments', ('replay-' || g)::idem_key, jsonb_build_object('payment_id', g, 'amount', 10))
  FROM generate_series(1, 100000) g;
END $$;

-- The batch inbox's floor (idem_once_many; test/bench/batch.sh, profile.sh): a plain
-- table with idempotency.keys' columns and indexes (the expiry index and the partial
-- lease indexes included), holding the same rows, into which one
-- INSERT ... SELECT unnest(keys) ... ON CONFLICT DO NOTHING RETURNING takes a batch.
CREATE TABLE floor_many (LIKE idempotency.keys INCLUDING ALL) WITH (fillfactor = 90);
INSERT INTO floor_many SELECT * FROM idempotency.keys;
