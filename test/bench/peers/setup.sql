-- The schema of test/bench/peers (database "bench"). The payment rows record their key
-- (no index, no constraint) so that the rows per key can be counted afterwards.
CREATE EXTENSION idempotency;
CREATE TABLE payments (id bigserial PRIMARY KEY, key text, account bigint, amount numeric);

-- 1. The extension: the procedure of examples/create_payment.sql, one CALL per request.
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
  INSERT INTO payments(key, account, amount) VALUES (p_key::text, p_account, p_amount)
    RETURNING jsonb_build_object('payment_id', id, 'amount', amount) INTO result;
  PERFORM idem_complete('payments', p_key, result);
END $$;

-- The extension's producer as one CALL: the payment and its event (aggregate = the
-- account) in the caller's transaction.
CREATE PROCEDURE emit_payment(p_account bigint, p_amount numeric)
LANGUAGE plpgsql AS $$
DECLARE result jsonb;
BEGIN
  INSERT INTO payments(account, amount) VALUES (p_account, p_amount)
    RETURNING jsonb_build_object('payment_id', id, 'amount', amount) INTO result;
  PERFORM idem_emit('payment.created', result, p_account::text);
END $$;

-- 2. The hand-written application-side table; the statements are sent by the client
-- (bench.js, appTable).
CREATE TABLE app_idempotency_keys (
  key text PRIMARY KEY, fingerprint text NOT NULL, state text NOT NULL, response jsonb,
  created_at timestamptz NOT NULL DEFAULT now(), expires_at timestamptz NOT NULL);
CREATE INDEX ON app_idempotency_keys (expires_at);  -- for the job that deletes old keys

-- 3. DBOS Transact keeps its own tables: its system database "dbos_sys" (made by
-- DBOS.launch) and dbos.transaction_completion here (made by KnexDataSource).
-- 4. pg-transactional-outbox's table, function and publication: made by bench.js
-- through the library's DatabaseSetup.
