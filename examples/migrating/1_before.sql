-- What runs today: a hand-written key table and the procedure that uses it.
CREATE TABLE transfers (id bigserial PRIMARY KEY, account bigint NOT NULL, amount numeric NOT NULL);

CREATE TABLE legacy_idempotency_keys (
  key text PRIMARY KEY,
  request_hash bytea NOT NULL,
  status text NOT NULL,                 -- 'started' or 'done'
  response jsonb,
  created_at timestamptz NOT NULL DEFAULT now());

CREATE PROCEDURE legacy_create_transfer(p_key text, p_account bigint, p_amount numeric,
                                        INOUT result jsonb DEFAULT NULL)
LANGUAGE plpgsql AS $$
DECLARE
  v_hash bytea := sha256(convert_to(
    jsonb_build_object('account', p_account, 'amount', p_amount)::text, 'UTF8'));
  v_row legacy_idempotency_keys;
BEGIN
  INSERT INTO legacy_idempotency_keys(key, request_hash, status)
    VALUES (p_key, v_hash, 'started') ON CONFLICT (key) DO NOTHING;
  IF NOT FOUND THEN
    SELECT * INTO v_row FROM legacy_idempotency_keys WHERE key = p_key;
    IF v_row.request_hash <> v_hash THEN
      RAISE EXCEPTION 'key % was used for another request', p_key USING ERRCODE = '22023';
    END IF;
    IF v_row.status = 'done' THEN result := v_row.response; RETURN; END IF;
    RAISE EXCEPTION 'transfer % is in progress', p_key USING ERRCODE = '55006';
  END IF;
  INSERT INTO transfers(account, amount) VALUES (p_account, p_amount)
    RETURNING jsonb_build_object('transfer_id', id, 'amount', amount) INTO result;
  UPDATE legacy_idempotency_keys SET status = 'done', response = result WHERE key = p_key;
END $$;
