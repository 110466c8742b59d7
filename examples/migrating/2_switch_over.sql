-- During one dedup window: the extension decides every key, and the old table is
-- consulted for keys it may know. New keys go to the extension.
CREATE PROCEDURE create_transfer(p_key idem_key, p_account bigint, p_amount numeric,
                                 INOUT result jsonb DEFAULT NULL)
LANGUAGE plpgsql AS $$
DECLARE
  v_request jsonb := jsonb_build_object('account', p_account, 'amount', p_amount);
  v_legacy_hash bytea := sha256(convert_to(v_request::text, 'UTF8'));  -- the old code's hash
  c idem_claim_result;
  v_old legacy_idempotency_keys;
BEGIN
  -- 1. The extension first: a retry of a request made since the switch replays here,
  --    and concurrent duplicates wait here for the first one.
  c := idem_claim('transfers', p_key, idem_fingerprint(v_request));
  IF c.outcome = 'replay' THEN result := c.response; RETURN; END IF;
  IF c.outcome = 'in_progress' THEN
    RAISE EXCEPTION 'transfer % is in progress', p_key
      USING ERRCODE = 'IK005', HINT = format('Retry after %s.', c.retry_after);
  END IF;
  -- 2. Claimed here: does the old table know the key? Inserting a marker row, rather
  --    than reading, waits for an old-code transaction still writing that key (a plain
  --    SELECT would not see it), and makes old code still running answer "in
  --    progress" for this key instead of applying it.
  INSERT INTO legacy_idempotency_keys(key, request_hash, status)
    VALUES (p_key::text, v_legacy_hash, 'moved') ON CONFLICT (key) DO NOTHING;
  IF NOT FOUND THEN
    SELECT * INTO v_old FROM legacy_idempotency_keys WHERE key = p_key::text;
    IF v_old.status <> 'moved' AND v_old.request_hash <> v_legacy_hash THEN
      RAISE EXCEPTION 'idempotency key "%" in scope "transfers" was used for a different request', p_key
        USING ERRCODE = 'IK001';
    END IF;
    IF v_old.status = 'done' THEN
      -- Applied by the old code: answer its response, and store it with the extension,
      -- whose later retries then replay without looking here.
      PERFORM idem_complete('transfers', p_key, v_old.response);
      result := v_old.response;
      RETURN;
    END IF;
    IF v_old.status = 'started' THEN
      RAISE EXCEPTION 'transfer % is in progress', p_key USING ERRCODE = 'IK005';
    END IF;
    -- 'moved': a marker of an earlier claim here whose key the extension has since
    -- let go (expired or forgotten): a new request.
  END IF;
  INSERT INTO transfers(account, amount) VALUES (p_account, p_amount)
    RETURNING jsonb_build_object('transfer_id', id, 'amount', amount) INTO result;
  PERFORM idem_complete('transfers', p_key, result);
END $$;
