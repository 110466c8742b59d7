# Failover: a streaming standby answers idem_lookup, refuses every writing function
# with 25006, and after promotion replays every committed key and still refuses a
# reused key with a different fingerprint.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $primary = PostgreSQL::Test::Cluster->new('primary');
$primary->init(allows_streaming => 1);
$primary->start;
$primary->safe_psql('postgres', q{
  CREATE EXTENSION idempotency;
  BEGIN;
  SELECT idem_claim('pay', ('k' || g)::idem_key, idem_fingerprint(('request ' || g)::text)),
         idem_complete('pay', ('k' || g)::idem_key, jsonb_build_object('payment', g))
  FROM generate_series(1, 100) g;
  COMMIT;});
$primary->backup('base');
my $standby = PostgreSQL::Test::Cluster->new('standby');
$standby->init_from_backup($primary, 'base', has_streaming => 1);
$standby->start;
$primary->safe_psql('postgres', q{SELECT idem_once('pay', 'after-backup')});
$primary->wait_for_catchup($standby);

is($standby->safe_psql('postgres', q{SELECT state || ' ' || response FROM idem_lookup('pay', 'k7')}),
	'completed {"payment": 7}', 'the standby serves idem_lookup');
is($standby->safe_psql('postgres', q{SELECT count(*) FROM idem_lookup('pay', 'after-backup')}),
	'1', 'with what it has replayed');

for my $call (
	q{SELECT idem_claim('pay', 'k7')},
	q{SELECT idem_claim('pay', 'new')},
	q{SELECT idem_complete('pay', 'k7')},
	q{SELECT idem_fail('pay', 'k7')},
	q{SELECT idem_release('pay', 'k7')},
	q{SELECT idem_checkpoint('pay', 'k7', 'p')},
	q{SELECT idem_once('pay', 'k7')},
	q{SELECT idem_forget('pay', 'k7')},
	q{SELECT idem_reap()})
{
	my ($ret, $stdout, $stderr) = $standby->psql('postgres', "\\set VERBOSITY verbose\n$call");
	like($stderr, qr/ERROR:  25006/, "on the standby, $call fails with 25006");
}

$primary->stop;
$standby->promote;
is($standby->safe_psql('postgres', q{
	SELECT count(*) FROM generate_series(1, 100) g,
	       LATERAL idem_claim('pay', ('k' || g)::idem_key, idem_fingerprint(('request ' || g)::text)) c
	WHERE c.outcome = 'replay' AND c.response = jsonb_build_object('payment', g)}),
	'100', 'after promotion every committed key replays its response');
my ($ret, $stdout, $stderr) = $standby->psql('postgres',
	"\\set VERBOSITY verbose\nSELECT idem_claim('pay', 'k7', idem_fingerprint('another request'::text))");
like($stderr, qr/ERROR:  IK001/, 'and a reused key with a different request is refused');

$standby->stop;
done_testing();
