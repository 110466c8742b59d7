# Upgrade from 1.0: keys stored under 1.0 survive ALTER EXTENSION idempotency UPDATE,
# the upgraded database has exactly the objects of a fresh install of the new
# version, and the stored keys replay, fence and take over as before.
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
	'1.1', 'ALTER EXTENSION UPDATE reaches 1.1');

# Every object of the extension, described without OIDs: members, columns, indexes,
# constraints, privileges and function definitions.
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
    SELECT format('function %s %s %s', p.oid::regprocedure, p.proacl, md5(pg_get_functiondef(p.oid)))
    FROM pg_proc p JOIN pg_depend d ON d.objid = p.oid AND d.classid = 'pg_proc'::regclass
    WHERE d.deptype = 'e' AND d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'idempotency')
    UNION ALL
    SELECT format('config %s %s', c.relname, e.extcondition)
    FROM pg_extension e, unnest(e.extconfig) AS cfg(oid) JOIN pg_class c ON c.oid = cfg.oid
    WHERE e.extname = 'idempotency'
  ) objects};
my $upgraded = $node->safe_psql('upgraded', $catalog);
my $fresh = $node->safe_psql('fresh', $catalog);
like($fresh, qr/keys_leased_idx/, 'the catalog description covers the new index');
like($fresh, qr/relation lock_secret/, 'and the lock secret');
is($upgraded, $fresh, 'the upgraded database has exactly the objects of a fresh 1.1 install');
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

$node->stop;
done_testing();
