# A lease holder that crashes after its outside call: the claim goes stale, a retry
# takes it over and resumes from the checkpoint, and the outside effect (keyed with
# idem_derive) and the local effect each happen once.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('lease');
$node->init;
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION idempotency');
$node->safe_psql('postgres', slurp_file('examples/lease_order.sql'));

# The plain flow: one charge, one shipment, and a replay.
my $first = $node->safe_psql('postgres', q{CALL fulfil_order('order-1', 10)});
like($first, qr/"attempt": 1/, 'the first call completes as attempt 1');
is($node->safe_psql('postgres', q{CALL fulfil_order('order-1', 10)}),
	$first, 'a retry replays the stored result');

# The holder stalls after charging; its session is then terminated.
my $holder = $node->background_psql('postgres', on_error_stop => 0);
$holder->query_until(qr/started/, qq{\\echo started\nCALL fulfil_order('order-2', 20, '1 hour');\n});
$node->poll_query_until('postgres',
	q{SELECT checkpoint = 'charged' FROM idem_lookup('orders', 'order-2')})
  or die 'the holder never reached its checkpoint';
is($node->safe_psql('postgres', q{SELECT outcome FROM idem_claim('orders', 'order-2', wait => '0')}),
	'in_progress', 'while the lease lives, a retry is told the order is in progress');
ok($node->safe_psql('postgres', q{
	SELECT pg_terminate_backend(pid) FROM pg_stat_activity
	WHERE query LIKE 'CALL fulfil_order(''order-2''%'}), 'the holder is terminated');
eval { $holder->quit };  # its psql may be gone with its backend

# Its lease runs out: the claim is stale, with the checkpoint of the charge.
$node->poll_query_until('postgres',
	q{SELECT count(*) = 1 FROM idem_abandoned('orders') WHERE key = 'order-2' AND checkpoint = 'charged'})
  or die 'the claim never became stale';

my $retry = $node->safe_psql('postgres', q{CALL fulfil_order('order-2', 20)});
like($retry, qr/"attempt": 2/, 'the retry takes over as attempt 2');
my $charge = $node->safe_psql('postgres',
	q{SELECT 'ch_' || left(idem_derive('order-2', 'charge')::text, 12)});
like($retry, qr/"charge": "\Q$charge\E"/, 'and resumes with the charge made by attempt 1');
is($node->safe_psql('postgres', q{SELECT count(*) FROM provider_charges WHERE order_key = 'order-2'}),
	'1', 'the provider charged once');
is($node->safe_psql('postgres', q{SELECT count(*) FROM shipments WHERE order_key = 'order-2'}),
	'1', 'the order shipped once');
is($node->safe_psql('postgres', q{SELECT state || ' ' || attempt FROM idem_lookup('orders', 'order-2')}),
	'completed 2', 'the key is completed by attempt 2');
is($node->safe_psql('postgres', q{CALL fulfil_order('order-2', 20)}), $retry,
	'later retries replay the result');

# A holder that crashes before its checkpoint: the retry calls the provider again
# with the same derived key, and the provider applies it once.
$node->safe_psql('postgres', q{SELECT idem_claim('orders', 'order-3', lease => '1 second')});
$node->safe_psql('postgres', q{SELECT provider_charge(idem_derive('order-3', 'charge'), 'order-3', 30)});
$node->poll_query_until('postgres',
	q{SELECT count(*) = 1 FROM idem_abandoned('orders') WHERE key = 'order-3'})
  or die 'order-3 never became stale';
like($node->safe_psql('postgres', q{CALL fulfil_order('order-3', 30)}), qr/"attempt": 2/,
	'a retry without a checkpoint redoes phase 1');
is($node->safe_psql('postgres', q{SELECT count(*) FROM provider_charges WHERE order_key = 'order-3'}),
	'1', 'and the provider still charged once');

$node->stop;
done_testing();
