# Concurrency under load: many clients, a small key space with many duplicates,
# random aborts; then exact invariants. Also the 100,000-key batch.
#
# Larger by hand: IDEM_LOAD_CLIENTS=32 IDEM_LOAD_TRANSACTIONS=5000 IDEM_LOAD_KEYS=20000
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::RealBin/lib";
use IdemLoad;
use IdemCheck;

my $clients = $ENV{IDEM_LOAD_CLIENTS} // 16;
my $transactions = $ENV{IDEM_LOAD_TRANSACTIONS} // 300;
my $keys = $ENV{IDEM_LOAD_KEYS} // 1000;

my $node = PostgreSQL::Test::Cluster->new('load');
$node->init;
$node->append_conf('postgresql.conf', "max_connections = 64\nsynchronous_commit = off\n");
$node->start;
IdemLoad::setup($node);

my $total = $clients * $transactions;
$node->pgbench(
	"--no-vacuum --client=$clients --jobs=2 --transactions=$transactions",
	0,
	[qr{processed: $total/$total}],
	[qr{^$}],
	"$clients clients, $total operations over $keys keys, no errors",
	{ 'idem_load' => IdemLoad::script($keys) });
IdemLoad::check_invariants($node, $keys, 'load');

# Hot fresh keys: every 50 ms four new keys that all clients race to claim at once,
# so claims meet each other's identity locks and freshly inserted rows, not only
# committed ones. One round trip per operation (a procedure, as users call it) makes
# the races tight. Run twice: without the library preloaded (a claim that waited for
# the identity lock always looks again) and preloaded (it looks again only when the
# shared insert counts say a row may have been inserted meanwhile).
$node->safe_psql('postgres', q{
  CREATE PROCEDURE hot_op(p_key idem_key) LANGUAGE plpgsql AS $$
  DECLARE c idem_claim_result;
  BEGIN
    c := idem_claim('hot', p_key);
    IF c.outcome <> 'claimed' THEN RETURN; END IF;
    INSERT INTO business (key, amount) VALUES (p_key::text, 0);
    PERFORM idem_complete('hot', p_key, '0');
  END $$;});
my $hot_seconds = $ENV{IDEM_HOT_SECONDS} // 5;
for my $preloaded (0, 1) {
	if ($preloaded) {
		$node->append_conf('postgresql.conf',
			"shared_preload_libraries = 'idempotency'\nidempotency.reaper_enabled = off\n");
		$node->restart;
	}
	my $round = $preloaded ? 'preloaded' : 'not preloaded';
	my $hot = qq{
\\set k random(1, 4)
CALL hot_op(('hot-$preloaded-' || (extract(epoch FROM clock_timestamp()) * 20)::bigint || '-' || :k)::idem_key);
};
	$node->pgbench(
		"--no-vacuum --client=$clients --jobs=2 --time=$hot_seconds",
		0,
		[qr{number of failed transactions: 0}],
		[qr{^$}],
		"$clients clients racing for fresh hot keys for ${hot_seconds}s ($round), no errors",
		{ "idem_hot_$preloaded" => $hot });
	is($node->safe_psql('postgres', qq{
			SELECT (SELECT count(*) FROM business WHERE key LIKE 'hot-$preloaded-%')
			     = (SELECT count(*) FROM idempotency.keys
			        WHERE scope = 'hot' AND key::text LIKE 'hot-$preloaded-%' AND state = 'c')}),
		't', "hot keys ($round): business rows == completed keys");
	is($node->safe_psql('postgres', qq{
			SELECT count(*) FROM (SELECT key FROM business WHERE key LIKE 'hot-$preloaded-%'
			                      GROUP BY key HAVING count(*) > 1) d}),
		'0', "hot keys ($round): none applied twice");
}

# One transaction claims and completes 100,000 distinct keys with the default
# max_locks_per_transaction: at most 32 claims wait unwritten, holding a lock each.
$node->safe_psql('postgres', q{
  BEGIN;
  SELECT count(*) FROM generate_series(1, 100000) g,
         LATERAL idem_claim('batch', ('m-' || g)::idem_key) c WHERE c.outcome = 'claimed';
  SELECT count(*) FROM generate_series(1, 100000) g,
         LATERAL idem_complete('batch', ('m-' || g)::idem_key, to_jsonb(g));
  COMMIT;
});
is($node->safe_psql('postgres',
		q{SELECT count(*) FROM idempotency.keys WHERE scope = 'batch' AND state = 'c'}),
	'100000', 'a 100,000-key batch ends with every key completed');
is($node->safe_psql('postgres', q{
		SELECT count(*) FROM generate_series(1, 100000) g
		WHERE idem_once('inbox', ('m-' || g)::idem_key)}),
	'100000', 'idem_once applies 100,000 messages in one transaction');
is($node->safe_psql('postgres', q{
		SELECT count(*) FROM generate_series(1, 100000) g
		WHERE idem_once('inbox', ('m-' || g)::idem_key)}),
	'0', 'and skips all of them when redelivered');

# The indexes after all of it: the load, the hot-key races and the batches.
IdemCheck::amcheck_keys($node, 'after the loads');

$node->stop;
done_testing();
