-- Yardsticks beside the SQL-only edition in database bench_sql (test/bench/profile_editions.sh),
-- run by bench_owner after test/bench/peers/setup-sql.sql and once the store holds
-- bench_app's 100,000 keys. They tell the edition's cost apart from what any PL/pgSQL
-- layer over the same store pays.
--
-- floor_payment: the payment's insert alone, what both editions' requests also do.
CREATE PROCEDURE floor_payment(p_key idem_key, p_account bigint, p_amount numeric,
                               INOUT result jsonb DEFAULT NULL)
LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO payments(key, account, amount) VALUES (p_key::text, p_account, p_amount)
    RETURNING jsonb_build_object('payment_id', id, 'amount', amount) INTO result;
END $$;

-- statements_payment: the edition's three statements of a new key and nothing else, in
-- PL/pgSQL, on a copy of its store (the same columns and indexes, the same 100,000
-- rows): the look, the insert of the pending row, its update to completed. No
-- row-level security, no canonical fingerprint (a constant), no IK002 trigger, no
-- bounded wait or subtransaction, no checks of arguments or settings.
CREATE TABLE statements_keys (LIKE idempotency.keys INCLUDING ALL);
INSERT INTO statements_keys SELECT * FROM idempotency.keys;
CREATE FUNCTION statements_claim(scope text, key text, fingerprint bytea) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
  r statements_keys;
BEGIN
  SELECT * INTO r FROM statements_keys k
    WHERE k.role = 'bench_app'::regrole AND k.scope = statements_claim.scope
      AND k.key = statements_claim.key;
  IF r.key IS NULL THEN
    INSERT INTO statements_keys (role, attempt, first_claimed_at, expires_at, xact, scope, key,
                                 fingerprint, state)
      VALUES ('bench_app'::regrole, 1, now(), now() + interval '24 hours', pg_current_xact_id(),
              scope, key, fingerprint, 'p');
    RETURN 'claimed';
  END IF;
  RETURN 'replay';
END $$;
CREATE FUNCTION statements_complete(scope text, key text, response jsonb) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
  UPDATE statements_keys k SET state = 'c', response = statements_complete.response
    WHERE k.role = 'bench_app'::regrole AND k.scope = statements_complete.scope
      AND k.key = statements_complete.key AND k.state = 'p';
END $$;
CREATE PROCEDURE statements_payment(p_key idem_key, p_account bigint, p_amount numeric,
                                    INOUT result jsonb DEFAULT NULL)
LANGUAGE plpgsql AS $$
BEGIN
  IF statements_claim('payments', p_key, '\x01'::bytea) = 'replay' THEN
    RETURN;
  END IF;
  INSERT INTO payments(key, account, amount) VALUES (p_key::text, p_account, p_amount)
    RETURNING jsonb_build_object('payment_id', id, 'amount', amount) INTO result;
  PERFORM statements_complete('payments', p_key, result);
END $$;
GRANT SELECT, INSERT, UPDATE ON statements_keys TO bench_app;
ANALYZE statements_keys;
