# Upgrades from 1.0, 1.1, 1.2, 1.3 and 1.4 to 1.5: keys stored under 1.0, keys and
# undelivered events stored under 1.1, and keys and privileges under 1.2, survive ALTER
# EXTENSION idempotency UPDATE; each upgraded database has exactly the objects of a
# fresh install of the new version; the stored keys replay, fence and take over as
# before, the events are relayed in order, emitting has become a privilege (1.2 revokes
# PUBLIC's grant), and the key functions 1.3 makes again with a route argument keep
# exactly their grants, by signature: from 1.2 the update takes the direct path
# idempotency--1.2--1.4.sql, whose carry-over neither gives to nor takes from an
# application's function of the same name (issue 35; 1.2--1.3 looked them up by name).
# A view or a BEGIN ATOMIC function over the extension's functions blocks the update
# from 1.2 (the docs' query finds it first), and no longer the update from 1.3.
# Updates from 1.3 and 1.4 where idem_claim and idem_once were restricted leave every
# function that adds keys (idem_once_many too) refused to the roles refused before, in
# the database and in a dump of it restored, and leave alone an idem_once_many granted
# otherwise on purpose (issue 41). The grants the released updates carried over (1.2's
# to the key functions, 1.3's to idem_emit and idem_apply_version) survive a dump
# restored into a fresh install too. idem_stats and idem_node_stats, which 1.4 -> 1.5
# makes again, keep exactly their ACL (revoked from pg_monitor too, issue 50), in the
# database and in a dump restored. Every released step taken one by one, 1.0 to 1.5,
# leaves exactly the grants made along the way and a fresh install's objects.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('upgrade');
$node->init;
$node->append_conf('postgresql.conf', qq{
shared_preload_libraries = 'idempotency'
idempotency.reaper_enabled = off
});
$node->start;
$node->safe_psql('postgres', 'CREATE DATABASE upgraded');
$node->safe_psql('postgres', 'CREATE DATABASE fresh');
$node->safe_psql('postgres', 'CREATE DATABASE from11');
$node->safe_psql('postgres', 'CREATE DATABASE from12');
$node->safe_psql('postgres', 'CREATE DATABASE from13');
$node->safe_psql('postgres', 'CREATE DATABASE via13');

# 1.0, and keys of every kind stored through its functions.
$node->safe_psql('upgraded', q{CREATE EXTENSION idempotency VERSION '1.0'});
is($node->safe_psql('upgraded', q{SELECT extversion FROM pg_extension WHERE extname = 'idempotency'}),
	'1.0', 'installed at 1.0');
$node->safe_psql('upgraded', q{
  BEGIN;
  SELECT idem_claim('pay', 'done', idem_fingerprint('{"amount": 10}'::jsonb));
  SELECT idem_complete('pay', 'done', '{"payment_id": 1}');
  SELECT idem_claim('pay', 'declined');
  SELECT idem_fail('pay', 'declined', '{"error": "card declined"}');
  COMMIT;
  SELECT idem_claim('pay', 'leased-done', lease => '1 hour');
  SELECT idem_complete('pay', 'leased-done', '"shipped"', attempt => 1);
  SELECT idem_claim('pay', 'in-flight', lease => '1 hour');
  SELECT idem_claim('pay', 'crashed', lease => '1 hour');
  SELECT idem_checkpoint('pay', 'crashed', 'charged', '{"charge": "ch_1"}', attempt => 1);
  SELECT idem_once('inbox', 'message-1');
});
# The holder of 'crashed' is gone; its lease ran out and the reaper marked it. A
# finished lease claim kept its lease under the 1.0 library.
$node->safe_psql('upgraded', q{
  UPDATE idempotency.keys SET lease = '1 hour' WHERE key = 'leased-done';
  UPDATE idempotency.keys SET lease_expires_at = now() - interval '1 second'
  WHERE key = 'crashed';
  SELECT idem_reap();
});
is($node->safe_psql('upgraded', q{SELECT key || ':' || attempt || ':' || checkpoint FROM idem_abandoned()}),
	'crashed:1:charged', 'idem_abandoned works on 1.0');
my $keys_before = $node->safe_psql('upgraded', q{
  SELECT string_agg(concat_ws(' ', role::text, scope, key, state, attempt, fingerprint,
                              checkpoint, checkpoint_data, response, first_claimed_at, expires_at),
                    E'\n' ORDER BY scope, key)
  FROM idempotency.keys});

$node->safe_psql('upgraded', 'ALTER EXTENSION idempotency UPDATE');
$node->safe_psql('fresh', 'CREATE EXTENSION idempotency');
is($node->safe_psql('upgraded', q{SELECT extversion FROM pg_extension WHERE extname = 'idempotency'}),
	'1.5', 'ALTER EXTENSION UPDATE reaches 1.5');
# PostgreSQL takes the shortest path: from 1.2 (and so CREATE EXTENSION, from 1.0) the
# direct script to 1.4, from 1.3 its own; then 1.4 -> 1.5.
is($node->safe_psql('fresh', q{
  SELECT string_agg(source || ': ' || path, ', ' ORDER BY source)
  FROM pg_extension_update_paths('idempotency') WHERE target = '1.5'}),
	'1.0: 1.0--1.1--1.2--1.4--1.5, 1.1: 1.1--1.2--1.4--1.5, 1.2: 1.2--1.4--1.5, '
	  . '1.3: 1.3--1.4--1.5, 1.4: 1.4--1.5',
	'every version reaches 1.5, from 1.2 by the direct path to 1.4');

# Every object of the extension, described without OIDs: members, columns, indexes,
# constraints, privileges (the extension's initial ones too: pg_dump writes what differs
# from those) and function definitions.
my $catalog = q{
  SELECT string_agg(line, E'\n' ORDER BY line) FROM (
    SELECT 'member ' || pg_describe_object(classid, objid, objsubid) AS line
    FROM pg_depend WHERE refclassid = 'pg_extension'::regclass AND deptype = 'e'
      AND refobjid = (SELECT oid FROM pg_extension WHERE extname = 'idempotency')
    UNION ALL
    SELECT format('column %s.%s %s %s %s %s', c.relname, a.attname, a.attnum,
                  format_type(a.atttypid, a.atttypmod), a.attnotnull, a.attcollation::regcollation)
    FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
    WHERE c.relnamespace = 'idempotency'::regnamespace AND a.attnum > 0 AND NOT a.attisdropped
    UNION ALL
    SELECT format('relation %s %s %s %s', c.relname, c.relkind, c.reloptions, c.relacl)
    FROM pg_class c WHERE c.relnamespace = 'idempotency'::regnamespace
    UNION ALL
    SELECT 'index ' || pg_get_indexdef(i.indexrelid)
    FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid
    WHERE c.relnamespace = 'idempotency'::regnamespace
    UNION ALL
    SELECT format('constraint %s %s', conname, pg_get_constraintdef(oid))
    FROM pg_constraint WHERE connamespace = 'idempotency'::regnamespace
    UNION ALL
    SELECT format('function %s %s %s', p.oid::regprocedure,
                  (SELECT array_agg(a::text ORDER BY a::text)  -- the same grants, in any order
                   FROM unnest(coalesce(p.proacl, acldefault('f', p.proowner))) a),
                  md5(pg_get_functiondef(p.oid)))
    FROM pg_proc p JOIN pg_depend d ON d.objid = p.oid AND d.classid = 'pg_proc'::regclass
    WHERE d.deptype = 'e' AND d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'idempotency')
    UNION ALL
    SELECT format('initial privileges %s %s', i.objoid::regprocedure,
                  (SELECT array_agg(a::text ORDER BY a::text) FROM unnest(i.initprivs) a))
    FROM pg_init_privs i JOIN pg_depend d ON d.objid = i.objoid AND d.classid = 'pg_proc'::regclass
    WHERE i.classoid = 'pg_proc'::regclass AND d.deptype = 'e'
      AND d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'idempotency')
    UNION ALL
    SELECT format('config %s %s', c.relname, e.extcondition)
    FROM pg_extension e, unnest(e.extconfig) AS cfg(oid) JOIN pg_class c ON c.oid = cfg.oid
    WHERE e.extname = 'idempotency'
  ) objects};
my $upgraded = $node->safe_psql('upgraded', $catalog);
my $fresh = $node->safe_psql('fresh', $catalog);
like($fresh, qr/keys_leased_idx/, 'the catalog description covers the new index');
like($fresh, qr/relation lock_secret/, 'and the lock secret');
like($fresh, qr/idem_claim\(text,idem_key,bytea,interval,interval,interval,"any"\)/,
	'and the key functions with their route');
is($upgraded, $fresh, 'the upgraded database has exactly the objects of a fresh 1.5 install');
is($node->safe_psql('upgraded', q{SELECT count(*) FROM idempotency.lock_secret}), '1',
	'the upgrade generated a lock secret');
isnt($node->safe_psql('upgraded', q{SELECT secret FROM idempotency.lock_secret}),
	$node->safe_psql('fresh', q{SELECT secret FROM idempotency.lock_secret}),
	'each database has a secret of its own');

# The stored keys: the same rows (a finished lease claim no longer keeps its lease),
# and they behave as before.
is($node->safe_psql('upgraded', q{
  SELECT string_agg(concat_ws(' ', role::text, scope, key, state, attempt, fingerprint,
                              checkpoint, checkpoint_data, response, first_claimed_at, expires_at),
                    E'\n' ORDER BY scope, key)
  FROM idempotency.keys}), $keys_before, 'the stored keys are kept');
is($node->safe_psql('upgraded', q{SELECT count(*) FROM idempotency.keys WHERE lease IS NOT NULL}),
	'2', 'only the pending and abandoned lease claims keep their lease');
is($node->safe_psql('upgraded', q{
  SELECT outcome || ' ' || response FROM idem_claim('pay', 'done', idem_fingerprint('{"amount": 10}'::jsonb))}),
	'replay {"payment_id": 1}', 'a completed key replays');
is($node->safe_psql('upgraded', q{SELECT outcome || ' ' || response FROM idem_claim('pay', 'declined')}),
	'replay {"error": "card declined"}', 'a failed key replays its error');
my ($status, $out, $err) = $node->psql('upgraded',
	q{SELECT idem_claim('pay', 'done', idem_fingerprint('{"amount": 11}'::jsonb))});
like($err, qr/was used for a different request/, 'a different request is refused (IK001)');
is($node->safe_psql('upgraded', q{SELECT outcome FROM idem_claim('pay', 'in-flight', wait => '0')}),
	'in_progress', 'a live lease claim is in progress');
is($node->safe_psql('upgraded', q{SELECT key || ':' || attempt || ':' || checkpoint FROM idem_abandoned()}),
	'crashed:1:charged', 'idem_abandoned lists the abandoned claim through the new index');
like($node->safe_psql('upgraded', q{
  BEGIN;
  SELECT outcome || ' ' || attempt || ' ' || checkpoint FROM idem_claim('pay', 'crashed');
  SELECT idem_complete('pay', 'crashed', '"resumed"');
  COMMIT;}), qr/^claimed 2 charged$/m, 'an abandoned claim is taken over with its checkpoint');
like($node->safe_psql('upgraded', q{SELECT idem_complete('pay', 'in-flight', '"ok"', attempt => 1);
  SELECT state FROM idem_lookup('pay', 'in-flight')}), qr/^completed$/m, 'the lease holder finishes');
is($node->safe_psql('upgraded', q{SELECT idem_once('inbox', 'message-1')}), 'f',
	'a message applied under 1.0 is skipped');
is($node->safe_psql('upgraded', q{SELECT idem_once('inbox', 'message-2')}), 't',
	'and a new one applied');

like($node->safe_psql('upgraded', q{SELECT idem_emit('order.paid', '{"n": 1}', 'order-1');
  SELECT aggregate || ' ' || seq || ' ' || attempt
  FROM idem_outbox_claim('relay', 10)}), qr/^order-1 1 1$/m,
	'the messaging functions of 1.1 work in the updated database');

$node->safe_psql('upgraded', 'CREATE EXTENSION amcheck');
is($node->safe_psql('upgraded', q{
  SELECT count(*) FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid,
         LATERAL bt_index_parent_check(i.indexrelid, heapallindexed => true)
  WHERE c.relnamespace = 'idempotency'::regnamespace}), '12',
	'amcheck finds every index of the extension consistent (keys 4, lock_secret 1, '
	  . 'outbox 4, outbox_aggregates 1, applied_versions 2)');

# From 1.1: keys, and events emitted but not yet delivered (one claimed by a relay
# whose lease is still running), kept through the update.
$node->safe_psql('from11', q{CREATE EXTENSION idempotency VERSION '1.1'});
$node->safe_psql('from11', q{
  CREATE ROLE upgrade_producer LOGIN;
  BEGIN;
  SELECT idem_claim('pay', 'done-11', idem_fingerprint('{"amount": 7}'::jsonb));
  SELECT idem_complete('pay', 'done-11', '{"payment_id": 11}');
  SELECT idem_emit('order.paid', '{"n": 1}', 'order-11', event_id => 'ev-1');
  SELECT idem_emit('order.paid', '{"n": 2}', 'order-11', event_id => 'ev-2');
  SELECT idem_apply_version('entities', 'acct-11', 3);
  COMMIT;
  SELECT count(*) FROM idem_outbox_claim('relay-old', 1, lease => '1 hour');
});
is($node->safe_psql('from11', q{SELECT has_function_privilege('upgrade_producer',
  'idem_emit(text,jsonb,text,jsonb,idem_key)', 'EXECUTE')}), 't', '1.1 grants idem_emit to PUBLIC');
my $outbox_before = $node->safe_psql('from11', q{
  SELECT string_agg(concat_ws(' ', event_id, topic, aggregate, seq, payload, delivered_at IS NULL),
                    E'\n' ORDER BY seq) FROM idempotency.outbox});
$node->safe_psql('from11', 'ALTER EXTENSION idempotency UPDATE');
is($node->safe_psql('from11', q{SELECT extversion FROM pg_extension WHERE extname = 'idempotency'}),
	'1.5', 'from 1.1, ALTER EXTENSION UPDATE reaches 1.5');
is($node->safe_psql('from11', $catalog), $fresh,
	'the database updated from 1.1 has exactly the objects of a fresh 1.5 install');
is($node->safe_psql('from11', q{
  SELECT string_agg(concat_ws(' ', event_id, topic, aggregate, seq, payload, delivered_at IS NULL),
                    E'\n' ORDER BY seq) FROM idempotency.outbox}), $outbox_before,
	'the undelivered events are kept');
is($node->safe_psql('from11', q{
  SELECT outcome || ' ' || response FROM idem_claim('pay', 'done-11', idem_fingerprint('{"amount": 7}'::jsonb))}),
	'replay {"payment_id": 11}', 'a key stored under 1.1 replays');
is($node->safe_psql('from11', q{SELECT idem_apply_version('entities', 'acct-11', 3)}), 'f',
	'a version applied under 1.1 is a duplicate');
is($node->safe_psql('from11', q{
  SELECT string_agg(event_id || ':' || seq, ' ' ORDER BY seq) FROM idem_outbox_claim('relay-new', 10)}),
	'', 'the event a relay claimed under 1.1 keeps its lease, and holds its aggregate back');
$node->safe_psql('from11', q{SELECT idem_outbox_ack('relay-old', '{ev-1}')});
is($node->safe_psql('from11', q{
  SELECT string_agg(event_id || ':' || seq, ' ' ORDER BY seq) FROM idem_outbox_claim('relay-new', 10)}),
	'ev-2:2', 'once it is acknowledged, the next event of the aggregate is relayed');

# Emitting is a privilege now: PUBLIC's grant is gone, and a grant gives it back.
is($node->safe_psql('from11', q{SELECT has_function_privilege('upgrade_producer',
  'idem_emit(text,jsonb,text,jsonb,idem_key,"any")', 'EXECUTE')}), 'f', '1.2 revokes PUBLIC\'s grant of idem_emit');
($status, $out, $err) = $node->psql('from11', q{SELECT idem_emit('order.paid', '{"n": 3}', 'order-11')},
	extra_params => [ '-U', 'upgrade_producer', '-v', 'VERBOSITY=verbose' ]);
like($err, qr/42501.*permission denied for function idem_emit/s, 'a role without the grant gets 42501');
$node->safe_psql('from11', q{GRANT EXECUTE ON FUNCTION idem_emit TO upgrade_producer});
is($node->safe_psql('from11', q{SELECT idem_emit('order.paid', '{"n": 3}', 'order-11', event_id => 'ev-3')},
	extra_params => [ '-U', 'upgrade_producer' ]), 'ev-3', 'and with the grant it emits');

$node->safe_psql('from11', 'CREATE EXTENSION amcheck');
is($node->safe_psql('from11', q{
  SELECT count(*) FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid,
         LATERAL bt_index_parent_check(i.indexrelid, heapallindexed => true)
  WHERE c.relnamespace = 'idempotency'::regnamespace}), '12',
	'amcheck finds every index consistent after the update from 1.1');

# From 1.2: keys, and privileges on the functions 1.3 drops and makes again (their
# parameters change): who may claim, who may read idem_stats. Beside them, in the
# extension's schema, an application's functions of the same names (a wrapper
# idem_claim(integer) with grants of its own, an idem_stats(text) with the default
# ones): the update must neither give them the extension's grants nor take theirs.
$node->safe_psql('from12', q{CREATE EXTENSION idempotency VERSION '1.2'});
$node->safe_psql('from12', q{
  CREATE ROLE upgrade_claimer LOGIN;
  CREATE ROLE upgrade_outsider LOGIN;
  CREATE ROLE upgrade_monitor LOGIN;
  CREATE ROLE "Upgrade Auditor";
  REVOKE EXECUTE ON FUNCTION idem_claim(text, idem_key, bytea, interval, interval, interval) FROM PUBLIC;
  GRANT EXECUTE ON FUNCTION idem_claim(text, idem_key, bytea, interval, interval, interval)
    TO upgrade_claimer WITH GRANT OPTION;
  GRANT EXECUTE ON FUNCTION idem_claim(text, idem_key, bytea, interval, interval, interval)
    TO "Upgrade Auditor";
  GRANT EXECUTE ON FUNCTION idem_stats() TO upgrade_monitor;
  CREATE FUNCTION public.idem_claim(order_id integer) RETURNS idem_claim_result
    LANGUAGE sql AS $$ SELECT idem_claim('orders', order_id::text::idem_key) $$;
  REVOKE ALL ON FUNCTION public.idem_claim(integer) FROM PUBLIC;
  GRANT EXECUTE ON FUNCTION public.idem_claim(integer) TO upgrade_outsider;
  CREATE FUNCTION public.idem_stats(label text) RETURNS text
    LANGUAGE sql AS $$ SELECT label || ': ' || keys_total FROM idem_stats() $$;
  BEGIN;
  SELECT idem_claim('pay', 'done-12', idem_fingerprint('{"amount": 12}'::jsonb));
  SELECT idem_complete('pay', 'done-12', '{"payment_id": 12}');
  COMMIT;
});
# Every function of these names in the schema with its grants (sorted): the extension's
# by name (their signatures change), the others by signature.
my $grants = q{
  SELECT string_agg(line, E'\n' ORDER BY line) FROM (
    SELECT format('%s %s %s',
                  CASE WHEN EXISTS (SELECT FROM pg_depend d WHERE d.classid = 'pg_proc'::regclass
                                      AND d.objid = p.oid AND d.deptype = 'e')
                       THEN 'extension ' || p.proname ELSE 'other ' || p.oid::regprocedure END,
                  (SELECT array_agg(a::text ORDER BY a::text) FROM unnest(p.proacl) a),
                  p.proacl IS NULL) AS line
    FROM pg_proc p
    WHERE p.pronamespace = 'public'::regnamespace
      AND p.proname IN ('idem_claim', 'idem_complete', 'idem_fail', 'idem_release', 'idem_checkpoint',
                        'idem_once', 'idem_forget', 'idem_lookup', 'idem_abandoned', 'idem_stats')
  ) functions};
my $grants_before = $node->safe_psql('from12', $grants);
like($grants_before, qr/^extension idem_claim \{.*Upgrade Auditor.*=X\/.*upgrade_claimer=X\*\/.*\} f$/m,
	'1.2: idem_claim is granted to two roles, not to PUBLIC');
like($grants_before, qr/^other idem_claim\(integer\) \{.*upgrade_outsider=X\/.*\} f$/m,
	'1.2: the wrapper idem_claim(integer) has grants of its own');

# A view and a BEGIN ATOMIC function over functions that 1.2 -> 1.4 drops block the
# update; the query of docs/operations.md (Upgrades) lists them beforehand.
$node->safe_psql('from12', q{
  CREATE VIEW key_monitor AS SELECT keys_total, pending FROM idem_stats();
  CREATE FUNCTION order_state(k text) RETURNS text LANGUAGE sql
  BEGIN ATOMIC
    SELECT (idem_claim('orders', k::idem_key)).outcome;
    SELECT idem_complete('orders', k::idem_key, '"shipped"');
    SELECT state FROM idem_lookup('orders', k::idem_key);
  END;});
# The query of docs/operations.md (Upgrades), as written there.
my $dependents = q{
SELECT DISTINCT
       CASE WHEN d.classid = 'pg_rewrite'::regclass
            THEN (SELECT pg_describe_object('pg_class'::regclass, r.ev_class, 0)
                  FROM pg_rewrite r WHERE r.oid = d.objid)
            ELSE pg_describe_object(d.classid, d.objid, d.objsubid) END AS dependent,
       p.oid::regprocedure AS uses
FROM pg_extension x
JOIN pg_depend m ON m.refclassid = 'pg_extension'::regclass AND m.refobjid = x.oid
                AND m.classid = 'pg_proc'::regclass AND m.deptype = 'e'
JOIN pg_proc p ON p.oid = m.objid
JOIN pg_depend d ON d.refclassid = 'pg_proc'::regclass AND d.refobjid = p.oid AND d.deptype = 'n'
WHERE x.extname = 'idempotency'
  AND p.proname IN ('idem_claim', 'idem_complete', 'idem_fail', 'idem_release', 'idem_checkpoint',
                    'idem_once', 'idem_forget', 'idem_lookup', 'idem_abandoned', 'idem_stats',
                    'idem_emit', 'idem_apply_version')
ORDER BY 1, 2};
is($node->safe_psql('from12', qq{SELECT string_agg(dependent || ' uses ' || uses, E'\\n' ORDER BY dependent, uses::text)
  FROM ($dependents) found}),
	"function order_state(text) uses idem_claim(text,idem_key,bytea,interval,interval,interval)\n"
	  . "function order_state(text) uses idem_complete(text,idem_key,jsonb,integer)\n"
	  . "function order_state(text) uses idem_lookup(text,idem_key)\n"
	  . "view key_monitor uses idem_stats()",
	'the documented query lists what the update from 1.2 will drop');
($status, $out, $err) = $node->psql('from12', 'ALTER EXTENSION idempotency UPDATE',
	extra_params => [ '-v', 'VERBOSITY=verbose' ]);
like($err, qr/2BP01: cannot drop function idem_claim\(.*because other objects depend on it/,
	'from 1.2, a BEGIN ATOMIC function over idem_claim blocks the update (2BP01), as documented');
is($node->safe_psql('from12', q{SELECT extversion FROM pg_extension WHERE extname = 'idempotency'}),
	'1.2', 'and the database stays at 1.2');
# The documented way: drop them, update and create them again, in one transaction.
$node->safe_psql('from12', q{
  BEGIN;
  DROP VIEW key_monitor;
  DROP FUNCTION order_state(text);
  ALTER EXTENSION idempotency UPDATE;
  CREATE VIEW key_monitor AS SELECT keys_total, pending FROM idem_stats();
  CREATE FUNCTION order_state(k text) RETURNS text LANGUAGE sql
  BEGIN ATOMIC
    SELECT (idem_claim('orders', k::idem_key)).outcome;
    SELECT idem_complete('orders', k::idem_key, '"shipped"');
    SELECT state FROM idem_lookup('orders', k::idem_key);
  END;
  COMMIT;});
is($node->safe_psql('from12', q{SELECT extversion FROM pg_extension WHERE extname = 'idempotency'}),
	'1.5', 'from 1.2, ALTER EXTENSION UPDATE reaches 1.5');
is($node->safe_psql('from12', q{SELECT order_state('o-12') || ' ' || pending FROM key_monitor}),
	'completed 0', 'the view and the function made again over the new signatures work');
is($node->safe_psql('from12', $grants), $grants_before,
	'the extension\'s functions made again keep exactly their grants, and the other '
	  . 'functions of those names keep exactly theirs');
my $claim = 'idem_claim(text,idem_key,bytea,interval,interval,interval,"any")';
my $privileges_12 = qq{
  SELECT string_agg(r || ':' || has_function_privilege(r, '$claim', 'EXECUTE')
                    || ':' || has_function_privilege(r, '$claim', 'EXECUTE WITH GRANT OPTION')
                    || ':' || has_function_privilege(r, 'idem_stats(boolean)', 'EXECUTE')
                    || ':' || has_function_privilege(r, 'public.idem_claim(integer)', 'EXECUTE'),
                    ' ' ORDER BY r)
  FROM unnest(ARRAY['upgrade_claimer', 'upgrade_monitor', 'upgrade_outsider', 'Upgrade Auditor']) r};
my $privileges_12_expected = 'Upgrade Auditor:true:false:false:false upgrade_claimer:true:true:false:false '
	  . 'upgrade_monitor:false:false:true:false upgrade_outsider:false:false:false:true';
is($node->safe_psql('from12', $privileges_12), $privileges_12_expected,
	'the grants and revokes of 1.2 hold for the functions 1.3 made again, and for the wrapper');
($status, $out, $err) = $node->psql('from12', q{SELECT idem_claim('pay', 'outsider')},
	extra_params => [ '-U', 'upgrade_outsider', '-v', 'VERBOSITY=verbose' ]);
like($err, qr/42501.*permission denied for function idem_claim/s,
	'a role granted only the wrapper still may not add keys');
is($node->safe_psql('from12', q{
  SELECT outcome || ' ' || response FROM idem_claim('pay', 'done-12', idem_fingerprint('{"amount": 12}'::jsonb))}),
	'replay {"payment_id": 12}', 'a key stored under 1.2 replays');
# They are the database's grants: a dump restored into a fresh install keeps them
# (1.2 -> 1.4 granted them in its script, which recorded them as the extension's own,
# so pg_dump wrote none of them and the restore gave idem_claim back to PUBLIC).
dump_and_restore('from12', 'restored12');
is($node->safe_psql('restored12', $privileges_12), $privileges_12_expected,
	'restored into a fresh install, the grants and revokes of 1.2 hold as in the updated database');
$node->safe_psql('from12', qq{
  GRANT EXECUTE ON FUNCTION $claim TO PUBLIC;
  REVOKE ALL ON FUNCTION $claim FROM upgrade_claimer CASCADE;
  REVOKE ALL ON FUNCTION $claim FROM "Upgrade Auditor";
  REVOKE ALL ON FUNCTION idem_stats(boolean) FROM upgrade_monitor;});
is($node->safe_psql('from12', $catalog), $fresh,
	'with those grants undone, it has exactly the objects of a fresh 1.5 install');

# The same 1.2 database updated by the released scripts, 1.2 -> 1.3 then 1.3 -> 1.4:
# 1.3 gave the wrapper idem_claim's grants and left the extension's own to PUBLIC, and
# 1.4 cannot know what they were. The query of docs/operations.md shows it.
$node->safe_psql('via13', q{CREATE EXTENSION idempotency VERSION '1.2'});
$node->safe_psql('via13', q{
  REVOKE EXECUTE ON FUNCTION idem_claim(text, idem_key, bytea, interval, interval, interval) FROM PUBLIC;
  GRANT EXECUTE ON FUNCTION idem_claim(text, idem_key, bytea, interval, interval, interval)
    TO upgrade_claimer;
  CREATE FUNCTION public.idem_claim(order_id integer) RETURNS idem_claim_result
    LANGUAGE sql AS $$ SELECT idem_claim('orders', order_id::text::idem_key) $$;
  ALTER EXTENSION idempotency UPDATE TO '1.3';
  ALTER EXTENSION idempotency UPDATE;});
my $check_grants = q{
SELECT p.oid::regprocedure AS function,
       EXISTS (SELECT FROM pg_depend d
               WHERE d.classid = 'pg_proc'::regclass AND d.objid = p.oid AND d.deptype = 'e'
                 AND d.refclassid = 'pg_extension'::regclass AND d.refobjid = x.oid) AS of_the_extension,
       coalesce(p.proacl::text, 'default: PUBLIC may execute') AS grants
FROM pg_extension x
JOIN pg_proc p ON p.pronamespace = x.extnamespace
WHERE x.extname = 'idempotency'
  AND p.proname IN ('idem_claim', 'idem_complete', 'idem_fail', 'idem_release', 'idem_checkpoint',
                    'idem_once', 'idem_forget', 'idem_lookup', 'idem_abandoned', 'idem_stats')
ORDER BY p.proname, of_the_extension DESC, 1};
like($node->safe_psql('via13', qq{SELECT string_agg(concat_ws(' ', function, of_the_extension, grants), E'\\n'
                                              ORDER BY of_the_extension DESC)
  FROM ($check_grants) found WHERE function::text LIKE 'idem_claim%'}),
	qr/^idem_claim\(text,idem_key,bytea,interval,interval,interval,"any"\) \ t\ default:\ PUBLIC\ may\ execute\n
	   idem_claim\(integer\) \ f \ \{\w+=X\/\w+,upgrade_claimer=X\/\w+\}$/x,
	'through the released 1.3, the wrapper got idem_claim\'s grants: the documented query shows it');

# From 1.3: a monitoring view over idem_stats() and a BEGIN ATOMIC function calling
# idem_claim and idem_lookup. 1.3 -> 1.4 keeps them in place, so the update succeeds
# and both still work.
$node->safe_psql('from13', q{CREATE EXTENSION idempotency VERSION '1.3'});
$node->safe_psql('from13', q{
  CREATE VIEW key_monitor AS SELECT keys_total, pending, completed FROM idem_stats();
  CREATE FUNCTION order_state(k text) RETURNS text LANGUAGE sql
  BEGIN ATOMIC
    SELECT (idem_claim('orders', k::idem_key)).outcome;
    SELECT idem_complete('orders', k::idem_key, '"shipped"');
    SELECT state FROM idem_lookup('orders', k::idem_key);
  END;
  BEGIN;
  SELECT idem_claim('pay', 'done-13');
  SELECT idem_complete('pay', 'done-13', '{"payment_id": 13}');
  COMMIT;});
is($node->safe_psql('from13', q{SELECT order_state('o-1')}), 'completed',
	'1.3: the BEGIN ATOMIC function claims and looks up');
$node->safe_psql('from13', q{ALTER EXTENSION idempotency UPDATE TO '1.4'});
is($node->safe_psql('from13', q{SELECT keys_total || ' ' || pending || ' ' || completed FROM key_monitor}),
	'2 0 2', 'from 1.3 to 1.4, the view over idem_stats() still works');
# 1.4 -> 1.5 makes idem_stats() again (new columns): the view stops the update with
# 2BP01, naming it, before anything changes; docs/operations.md's "Updating to 1.5"
# drops it, updates and makes it again in one transaction.
($status, $out, $err) = $node->psql('from13', 'ALTER EXTENSION idempotency UPDATE',
	extra_params => [ '-v', 'VERBOSITY=verbose' ]);
like($err, qr/2BP01.*key_monitor/s, '1.4 -> 1.5 with a view over idem_stats(): 2BP01 naming the view');
is($node->safe_psql('from13', q{SELECT extversion FROM pg_extension WHERE extname = 'idempotency'}),
	'1.4', 'and nothing changed');
$node->safe_psql('from13', q{
  BEGIN;
  DROP VIEW key_monitor;
  ALTER EXTENSION idempotency UPDATE;
  CREATE VIEW key_monitor AS SELECT keys_total, pending, completed FROM idem_stats();
  COMMIT;});
is($node->safe_psql('from13', q{SELECT extversion FROM pg_extension WHERE extname = 'idempotency'}),
	'1.5', 'from 1.3, with a view and a BEGIN ATOMIC function over its functions, UPDATE reaches 1.5');
is($node->safe_psql('from13', q{SELECT keys_total || ' ' || pending || ' ' || completed FROM key_monitor}),
	'2 0 2', 'the view over idem_stats() made again works');
is($node->safe_psql('from13', q{SELECT order_state('o-2')}), 'completed',
	'and the BEGIN ATOMIC function over idem_claim and idem_lookup');
is($node->safe_psql('from13', $catalog), $fresh,
	'the database updated from 1.3 has exactly the objects of a fresh 1.5 install');

# From 1.3, idem_emit and idem_apply_version are made again with a route (messaging on
# a Citus cluster): their grants follow them.
$node->safe_psql('postgres', 'CREATE DATABASE from13_grants');
$node->safe_psql('from13_grants', q{
  CREATE EXTENSION idempotency VERSION '1.3';
  CREATE ROLE producer13;
  GRANT EXECUTE ON FUNCTION idem_emit(text, jsonb, text, jsonb, idem_key) TO producer13 WITH GRANT OPTION;
  REVOKE EXECUTE ON FUNCTION idem_apply_version(text, text, bigint, interval) FROM PUBLIC;
  GRANT EXECUTE ON FUNCTION idem_node_stats() TO producer13;});
$node->safe_psql('from13_grants', 'ALTER EXTENSION idempotency UPDATE');
is($node->safe_psql('from13_grants', q{
  SELECT string_agg(p.oid::regprocedure || ' ' || CASE WHEN p.proacl IS NULL THEN 'PUBLIC' ELSE
                      coalesce((SELECT string_agg(a.grantee::regrole || ':' || a.is_grantable, ',' ORDER BY a.grantee::regrole::text)
                                FROM aclexplode(p.proacl) a WHERE a.grantee <> p.proowner), 'owner') END, ' ' ORDER BY p.proname)
  FROM pg_proc p WHERE p.proname IN ('idem_emit', 'idem_apply_version')}),
	'idem_apply_version(text,text,bigint,interval,"any") owner idem_emit(text,jsonb,text,jsonb,idem_key,"any") producer13:true',
	'1.3 -> 1.4: the grants of idem_emit and idem_apply_version are carried to their new signatures');
dump_and_restore('from13_grants', 'restored13');
is($node->safe_psql('restored13', q{
  SELECT has_function_privilege('producer13', 'idem_emit(text,jsonb,text,jsonb,idem_key,"any")', 'EXECUTE WITH GRANT OPTION')
         || ' ' || has_function_privilege('public', 'idem_apply_version(text,text,bigint,interval,"any")', 'EXECUTE')
         || ' ' || has_function_privilege('producer13', 'idem_node_stats()', 'EXECUTE')}),
	'true false true', 'restored into a fresh install, idem_emit and idem_node_stats are still granted and '
	  . 'idem_apply_version still revoked');


# Who may add keys (issue 41): 1.3 -> 1.4 made idem_once_many with PUBLIC's grant even
# where idem_claim and idem_once had been revoked from PUBLIC. From 1.3 (through 1.4)
# and from a database already at 1.4, the update to 1.5 gives idem_once_many exactly
# idem_once's grants: a role refused before is refused by every function that adds
# keys, the application's role keeps them all. An idem_once_many granted otherwise on
# purpose is left as it is.
$node->safe_psql('postgres', q{
  CREATE ROLE upgrade_app LOGIN;
  CREATE ROLE upgrade_stranger LOGIN;
  CREATE ROLE upgrade_batch LOGIN;});
my $once = 'idem_once(text,idem_key,interval,interval,"any")';
my $once_many = 'idem_once_many(text,idem_key[],interval,interval,"any")';
my $restrict = qq{
  REVOKE EXECUTE ON FUNCTION $claim FROM PUBLIC;
  GRANT EXECUTE ON FUNCTION $claim TO upgrade_app;
  REVOKE EXECUTE ON FUNCTION $once FROM PUBLIC;
  GRANT EXECUTE ON FUNCTION $once TO upgrade_app;};
# Each function that adds keys called as `role`: "ok", or the SQLSTATE and function of
# the error.
sub add_keys_as {
	my ($db, $role, @functions) = @_;
	my %calls = (
		idem_claim => q{BEGIN; SELECT idem_claim('grants', 'claimed');
                        SELECT idem_complete('grants', 'claimed'); COMMIT;},
		idem_once => q{SELECT idem_once('grants', 'once')},
		idem_once_many => q{SELECT idem_once_many('grants', '{many-1,many-2}')});
	return join ' ', map {
		my ($status, $out, $err) = $node->psql($db, $calls{$_},
			extra_params => [ '-U', $role, '-v', 'VERBOSITY=verbose', '-v', 'ON_ERROR_STOP=1' ]);
		"$_:" . ($status == 0 ? 'ok'
			: $err =~ /(42501): permission denied for function (\w+)/ ? "$1 $2" : "error $err");
	} @functions;
}
my @key_functions = qw(idem_claim idem_once idem_once_many);
my $refused = 'idem_claim:42501 idem_claim idem_once:42501 idem_once idem_once_many:42501 idem_once_many';
my $allowed = 'idem_claim:ok idem_once:ok idem_once_many:ok';
my $keys_by_role = q{SELECT coalesce(string_agg(role::text || ' ' || key, ', ' ORDER BY role::text, key), 'none')
                     FROM idempotency.keys WHERE scope = 'grants'};

# From 1.3: the update runs 1.3 -> 1.4 -> 1.5.
$node->safe_psql('postgres', 'CREATE DATABASE from13_restricted');
$node->safe_psql('from13_restricted', qq{CREATE EXTENSION idempotency VERSION '1.3'; $restrict});
is(add_keys_as('from13_restricted', 'upgrade_stranger', qw(idem_claim idem_once)),
	'idem_claim:42501 idem_claim idem_once:42501 idem_once',
	'1.3 with idem_claim and idem_once revoked from PUBLIC: a role without a grant may add no key');
$node->safe_psql('from13_restricted', 'ALTER EXTENSION idempotency UPDATE');
is($node->safe_psql('from13_restricted', q{SELECT extversion FROM pg_extension WHERE extname = 'idempotency'}),
	'1.5', 'from 1.3 with restricted grants, UPDATE reaches 1.5');
is(add_keys_as('from13_restricted', 'upgrade_stranger', @key_functions), $refused,
	'from 1.3: the role refused before is refused by every function that adds keys (42501)');
is(add_keys_as('from13_restricted', 'upgrade_app', @key_functions), $allowed,
	'from 1.3: the application\'s role calls them all');
is($node->safe_psql('from13_restricted', $keys_by_role),
	'upgrade_app claimed, upgrade_app many-1, upgrade_app many-2, upgrade_app once',
	'from 1.3: only the application\'s role stored keys');

# From 1.2, by the direct path idempotency--1.2--1.4.sql (which makes idem_once_many as
# 1.3 -> 1.4 does), then 1.4 -> 1.5.
$node->safe_psql('postgres', 'CREATE DATABASE from12_restricted');
$node->safe_psql('from12_restricted', q{
  CREATE EXTENSION idempotency VERSION '1.2';
  REVOKE EXECUTE ON FUNCTION idem_claim(text, idem_key, bytea, interval, interval, interval) FROM PUBLIC;
  GRANT EXECUTE ON FUNCTION idem_claim(text, idem_key, bytea, interval, interval, interval) TO upgrade_app;
  REVOKE EXECUTE ON FUNCTION idem_once(text, idem_key, interval, interval) FROM PUBLIC;
  GRANT EXECUTE ON FUNCTION idem_once(text, idem_key, interval, interval) TO upgrade_app;
  ALTER EXTENSION idempotency UPDATE;});
is(add_keys_as('from12_restricted', 'upgrade_stranger', @key_functions), $refused,
	'from 1.2 with restricted grants: refused by every function that adds keys after the update');
is(add_keys_as('from12_restricted', 'upgrade_app', @key_functions), $allowed,
	'from 1.2: the application\'s role calls them all');

# From 1.4, where idem_once_many was PUBLIC's: the hole, then the update closes it.
$node->safe_psql('postgres', 'CREATE DATABASE from14_restricted');
$node->safe_psql('from14_restricted', qq{CREATE EXTENSION idempotency VERSION '1.4'; $restrict});
is(add_keys_as('from14_restricted', 'upgrade_stranger', @key_functions),
	'idem_claim:42501 idem_claim idem_once:42501 idem_once idem_once_many:ok',
	'1.4 with idem_claim and idem_once restricted: idem_once_many still adds keys for anyone');
$node->safe_psql('from14_restricted', q{DELETE FROM idempotency.keys WHERE scope = 'grants'});
$node->safe_psql('from14_restricted', 'ALTER EXTENSION idempotency UPDATE');
is($node->safe_psql('from14_restricted', q{SELECT extversion FROM pg_extension WHERE extname = 'idempotency'}),
	'1.5', 'from 1.4 with restricted grants, UPDATE reaches 1.5');
is(add_keys_as('from14_restricted', 'upgrade_stranger', @key_functions), $refused,
	'from 1.4: the update refuses that role idem_once_many too (42501)');
is(add_keys_as('from14_restricted', 'upgrade_app', @key_functions), $allowed,
	'from 1.4: the application\'s role calls them all');
is($node->safe_psql('from14_restricted', $keys_by_role),
	'upgrade_app claimed, upgrade_app many-1, upgrade_app many-2, upgrade_app once',
	'from 1.4: only the application\'s role stored keys');
is($node->safe_psql('from14_restricted', qq{
  SELECT count(DISTINCT (SELECT array_agg(a::text ORDER BY a::text)
                         FROM unnest(coalesce(proacl, acldefault('f', proowner))) a))
  FROM pg_proc WHERE oid IN ('$once'::regprocedure, '$once_many'::regprocedure)}),
	'1', 'idem_once_many has exactly idem_once\'s grants');

# They are the database's grants, not the extension's initial ones: a dump restored
# into a fresh install (where idem_once_many is PUBLIC's) keeps them.
is($node->safe_psql('from14_restricted', q{
  SELECT count(*) FROM pg_init_privs WHERE classoid = 'pg_proc'::regclass
    AND objoid = 'idem_once_many(text,idem_key[],interval,interval,"any")'::regprocedure}),
	'0', 'the update records no initial privileges for idem_once_many, as a fresh install');
dump_and_restore('from14_restricted', 'restored14');
is(add_keys_as('restored14', 'upgrade_stranger', @key_functions), $refused,
	'after the restore, the role is still refused by every function that adds keys');

# Undone, the grants leave exactly the objects of a fresh install.
$node->safe_psql('from14_restricted', qq{
  GRANT EXECUTE ON FUNCTION $claim, $once, $once_many TO PUBLIC;
  REVOKE ALL ON FUNCTION $claim, $once, $once_many FROM upgrade_app;});
is($node->safe_psql('from14_restricted', $catalog), $fresh,
	'with those grants undone, the database updated from 1.4 has exactly the objects of a fresh 1.5 install');
$node->safe_psql('from13_restricted', qq{
  GRANT EXECUTE ON FUNCTION $claim, $once, $once_many TO PUBLIC;
  REVOKE ALL ON FUNCTION $claim, $once, $once_many FROM upgrade_app;});
is($node->safe_psql('from13_restricted', $catalog), $fresh,
	'and so has the database updated from 1.3');

# idem_once_many granted on purpose otherwise than idem_once: left as it is.
$node->safe_psql('postgres', 'CREATE DATABASE from14_deliberate');
$node->safe_psql('from14_deliberate', qq{CREATE EXTENSION idempotency VERSION '1.4'; $restrict
  REVOKE EXECUTE ON FUNCTION $once_many FROM PUBLIC;
  GRANT EXECUTE ON FUNCTION $once_many TO upgrade_batch WITH GRANT OPTION;});
my $deliberate = qq{SELECT proacl FROM pg_proc WHERE oid = '$once_many'::regprocedure};
my $deliberate_before = $node->safe_psql('from14_deliberate', $deliberate);
like($deliberate_before, qr/upgrade_batch=X\*\//, '1.4: idem_once_many granted to a batch role on purpose');
$node->safe_psql('from14_deliberate', 'ALTER EXTENSION idempotency UPDATE');
is($node->safe_psql('from14_deliberate', $deliberate), $deliberate_before,
	'the update leaves a deliberately granted idem_once_many exactly as it was');
is(add_keys_as('from14_deliberate', 'upgrade_batch', 'idem_once_many'), 'idem_once_many:ok',
	'and the batch role still calls it');

# idem_stats and idem_node_stats, which 1.4 -> 1.5 makes again, end with exactly the
# ACL they had (issue 50): an administrator's revoke from pg_monitor, grant to another
# role, and the owner's revoke of its own grant hold. Their initial privileges are a
# fresh install's (the owner's and pg_monitor's grants), so pg_dump writes the
# administrator's changes and a restore into a fresh install gets exactly that ACL.
# Left alone, they stay pg_monitor's.
$node->safe_psql('postgres', 'CREATE ROLE monitor_app LOGIN');
my $stats_functions = q{'idem_stats(boolean)'::regprocedure, 'idem_node_stats()'::regprocedure};
# Every entry (grantee, grant option, grantor), sorted; 'default' for a NULL ACL.
my $sorted_acl = q{coalesce((SELECT array_agg(a::text ORDER BY a::text) FROM unnest(%s) a)::text,
                            %s::text, 'default')};
my $stats_acl = sprintf(q{
  SELECT string_agg(p.oid::regprocedure || ' ' || %s, E'\n' ORDER BY p.proname)
  FROM pg_proc p WHERE p.oid IN (%s)}, sprintf($sorted_acl, 'p.proacl', 'p.proacl'), $stats_functions);
my $stats_initial = sprintf(q{
  SELECT string_agg(i.objoid::regprocedure || ' ' || %s, E'\n' ORDER BY i.objoid::regprocedure::text)
  FROM pg_init_privs i WHERE i.classoid = 'pg_proc'::regclass AND i.objoid IN (%s)},
	sprintf($sorted_acl, 'i.initprivs', 'i.initprivs'), $stats_functions);
my $fresh_stats_initial = $node->safe_psql('fresh', $stats_initial);
like($fresh_stats_initial,
	qr/^idem_node_stats\(\) \{pg_monitor=X\/(\w+),\1=X\/\1\}\nidem_stats\(boolean\) \{pg_monitor=X\/\1,\1=X\/\1\}$/,
	'a fresh 1.5 install records the owner\'s and pg_monitor\'s grants of idem_stats and idem_node_stats as initial');

$node->safe_psql('postgres', 'CREATE DATABASE from14_monitor');
$node->safe_psql('from14_monitor', q{
  CREATE EXTENSION idempotency VERSION '1.4';
  REVOKE EXECUTE ON FUNCTION idem_stats(boolean) FROM pg_monitor;
  GRANT EXECUTE ON FUNCTION idem_stats(boolean) TO monitor_app;
  REVOKE EXECUTE ON FUNCTION idem_node_stats() FROM pg_monitor;
  GRANT EXECUTE ON FUNCTION idem_node_stats() TO monitor_app WITH GRANT OPTION;
  REVOKE EXECUTE ON FUNCTION idem_node_stats() FROM CURRENT_USER;});
my $monitor_acl = $node->safe_psql('from14_monitor', $stats_acl);
like($monitor_acl, qr/^idem_node_stats\(\) \{monitor_app=X\*\/(\w+)\}\nidem_stats\(boolean\) \{monitor_app=X\/\1,\1=X\/\1\}$/,
	'1.4: idem_stats and idem_node_stats revoked from pg_monitor, granted to monitor_app, '
	  . 'idem_node_stats revoked from its owner');
$node->safe_psql('from14_monitor', 'ALTER EXTENSION idempotency UPDATE');
is($node->safe_psql('from14_monitor', $stats_acl), $monitor_acl,
	'from 1.4, idem_stats and idem_node_stats made again keep exactly the administrator\'s ACL');
is($node->safe_psql('from14_monitor', qq{
  SELECT string_agg(has_function_privilege('pg_monitor', f, 'EXECUTE')::text, ' ')
  FROM unnest(ARRAY[$stats_functions]) f}), 'false false', 'pg_monitor is not given them back');
is($node->safe_psql('from14_monitor', $stats_initial), $fresh_stats_initial,
	'their initial privileges are a fresh 1.5 install\'s');
dump_and_restore('from14_monitor', 'restored14_monitor');
is($node->safe_psql('restored14_monitor', $stats_acl), $monitor_acl,
	'restored into a fresh install, they have exactly the administrator\'s ACL');

# Left alone: pg_monitor's, as in a fresh install, and exactly a fresh install's objects.
my $fresh_stats_acl = $node->safe_psql('fresh', $stats_acl);
$node->safe_psql('postgres', 'CREATE DATABASE from14_plain');
$node->safe_psql('from14_plain', q{CREATE EXTENSION idempotency VERSION '1.4'});
$node->safe_psql('from14_plain', 'ALTER EXTENSION idempotency UPDATE');
is($node->safe_psql('from14_plain', $stats_acl), $fresh_stats_acl,
	'from 1.4 with grants untouched, idem_stats and idem_node_stats have a fresh install\'s ACL');
like($fresh_stats_acl, qr/^idem_node_stats\(\) \{pg_monitor=X\/(\w+),\1=X\/\1\}\nidem_stats\(boolean\) \{pg_monitor=X\/\1,\1=X\/\1\}$/,
	'the owner\'s and pg_monitor\'s');
is($node->safe_psql('from14_plain', $catalog), $fresh,
	'the database updated from 1.4 has exactly the objects of a fresh 1.5 install');
dump_and_restore('from14_plain', 'restored14_plain');
is($node->safe_psql('restored14_plain', $stats_acl), $fresh_stats_acl,
	'and a dump of it restored into a fresh install the same ACL');

# Every released step, one ALTER EXTENSION UPDATE each (1.0 -> 1.1 -> 1.2 -> 1.3 -> 1.4
# -> 1.5), with grants made along the way: 1.4 -> 1.5 leaves every function's ACL as
# it was, a dump restored into a fresh install has the same ACLs, and with the grants
# undone the database has exactly the objects of a fresh 1.5 install.
$node->safe_psql('postgres', q{CREATE ROLE step_app; CREATE DATABASE stepwise});
$node->safe_psql('stepwise', q{
  CREATE EXTENSION idempotency VERSION '1.0';
  ALTER EXTENSION idempotency UPDATE TO '1.1';
  ALTER EXTENSION idempotency UPDATE TO '1.2';
  REVOKE EXECUTE ON FUNCTION idem_claim(text, idem_key, bytea, interval, interval, interval) FROM PUBLIC;
  GRANT EXECUTE ON FUNCTION idem_claim(text, idem_key, bytea, interval, interval, interval) TO step_app;
  GRANT EXECUTE ON FUNCTION idem_emit(text, jsonb, text, jsonb, idem_key) TO step_app;
  ALTER EXTENSION idempotency UPDATE TO '1.3';
  REVOKE EXECUTE ON FUNCTION idem_apply_version(text, text, bigint, interval) FROM PUBLIC;
  GRANT EXECUTE ON FUNCTION idem_apply_version(text, text, bigint, interval) TO step_app WITH GRANT OPTION;
  ALTER EXTENSION idempotency UPDATE TO '1.4';
  REVOKE EXECUTE ON FUNCTION idem_stats(boolean) FROM pg_monitor;
  GRANT EXECUTE ON FUNCTION idem_stats(boolean) TO monitor_app;});
# Every function of the extension with its ACL, by signature.
my $all_acls = sprintf(q{
  SELECT string_agg(p.oid::regprocedure || ' ' || %s, E'\n' ORDER BY p.oid::regprocedure::text)
  FROM pg_proc p JOIN pg_depend d ON d.classid = 'pg_proc'::regclass AND d.objid = p.oid
  WHERE d.deptype = 'e' AND d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'idempotency')},
	sprintf($sorted_acl, 'p.proacl', 'p.proacl'));
my %acls_14 = map { /^(.*) (\S+)$/ } split /\n/, $node->safe_psql('stepwise', $all_acls);
like($acls_14{$claim}, qr/step_app=X\//, '1.0 to 1.4 step by step: idem_claim kept step_app\'s grant');
$node->safe_psql('stepwise', q{ALTER EXTENSION idempotency UPDATE TO '1.5'});
my $acls_15 = $node->safe_psql('stepwise', $all_acls);
my %acls_15 = map { /^(.*) (\S+)$/ } split /\n/, $acls_15;
is_deeply({ map { $_ => $acls_15{$_} } keys %acls_14 }, \%acls_14,
	'1.4 -> 1.5 leaves the ACL of every function it keeps or makes again exactly as it was');
dump_and_restore('stepwise', 'restored_stepwise');
is($node->safe_psql('restored_stepwise', $all_acls), $acls_15,
	'restored into a fresh install, every function has exactly the ACL of the updated database');
$node->safe_psql('stepwise', qq{
  GRANT EXECUTE ON FUNCTION $claim, idem_apply_version(text, text, bigint, interval, "any") TO PUBLIC;
  REVOKE ALL ON FUNCTION $claim, idem_emit(text, jsonb, text, jsonb, idem_key, "any"),
                         idem_apply_version(text, text, bigint, interval, "any") FROM step_app;
  GRANT EXECUTE ON FUNCTION idem_stats(boolean) TO pg_monitor;
  REVOKE ALL ON FUNCTION idem_stats(boolean) FROM monitor_app;});
is($node->safe_psql('stepwise', $catalog), $fresh,
	'with those grants undone, the database updated step by step from 1.0 has exactly the objects '
	  . 'of a fresh 1.5 install');

# pg_dump of database `from` restored into a new database `to`, where CREATE EXTENSION
# makes a fresh install of 1.5.
sub dump_and_restore {
	my ($from, $to) = @_;
	my $dump_file = $node->basedir . "/$from.sql";
	$node->command_ok([ 'pg_dump', '-f', $dump_file, '-d', $node->connstr($from) ],
		"pg_dump of $from");
	$node->safe_psql('postgres', "CREATE DATABASE $to");
	$node->command_ok([ 'psql', '-X', '-q', '-v', 'ON_ERROR_STOP=1', '-f', $dump_file,
		'-d', $node->connstr($to) ], "$from restored into a fresh install of 1.5");
}

$node->stop;
done_testing();
