# pg_dump and pg_restore into a fresh cluster whose roles were created in another
# order: keys, responses, fingerprints and states come back and behave as before.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $old = PostgreSQL::Test::Cluster->new('old');
$old->init;
$old->start;
$old->safe_psql('postgres', q{
  CREATE ROLE alice; CREATE ROLE bob;
  CREATE DATABASE app;});
$old->safe_psql('app', q{
  CREATE EXTENSION idempotency;
  SET ROLE alice;
  BEGIN;
  SELECT idem_claim('pay', 'a1', idem_fingerprint('{"amount": 10}'::jsonb)),
         idem_complete('pay', 'a1', '{"payment": 1}');
  SELECT idem_claim('pay', 'a2'), idem_fail('pay', 'a2', '{"error": "declined"}');
  COMMIT;
  SELECT idem_claim('job', 'lease', lease => '1 hour');
  SET ROLE bob;
  SELECT idem_once('inbox', 'm1');
  RESET ROLE;});
my $dump = "$PostgreSQL::Test::Utils::tmp_check/app.dump";
$old->command_ok([ 'pg_dump', '-Fc', '-d', $old->connstr('app'), '-f', $dump ], 'pg_dump');

my $new = PostgreSQL::Test::Cluster->new('new');
$new->init;
$new->start;
# Roles first, in the other order, so their OIDs differ.
$new->safe_psql('postgres', q{CREATE ROLE bob; CREATE ROLE alice; CREATE DATABASE app;});
$new->command_ok([ 'pg_restore', '-d', $new->connstr('app'), $dump ], 'pg_restore');

is($new->safe_psql('app', q{
	SELECT string_agg(role::text || ' ' || scope || ' ' || key || ' ' || state::text, ', ' ORDER BY key)
	FROM idempotency.keys}),
	'alice pay a1 c, alice pay a2 f, alice job lease p, bob inbox m1 c', 'every key came back');
is($new->safe_psql('app', q{
	SET ROLE alice;
	SELECT outcome || ' ' || response FROM idem_claim('pay', 'a1', idem_fingerprint('{"amount": 10}'::jsonb))}),
	'replay {"payment": 1}', 'a completed key replays its response for its role');
is($new->safe_psql('app', q{SET ROLE alice; SELECT outcome || ' ' || response FROM idem_claim('pay', 'a2')}),
	'replay {"error": "declined"}', 'a failed key replays its error');
my ($ret, $stdout, $stderr) = $new->psql('app',
	"\\set VERBOSITY verbose\nSET ROLE alice;\nSELECT idem_claim('pay', 'a1', idem_fingerprint('{\"amount\": 99}'::jsonb))");
like($stderr, qr/ERROR:  IK001/, 'its fingerprint still guards it');
is($new->safe_psql('app', q{SET ROLE alice; SELECT outcome FROM idem_claim('job', 'lease')}),
	'in_progress', 'a lease claim is still held');
is($new->safe_psql('app', q{SET ROLE bob; SELECT idem_once('inbox', 'm1')}),
	'f', "bob's message is still applied");
is($new->safe_psql('app', q{SET ROLE bob; SELECT count(*) FROM idem_lookup('pay', 'a1')}),
	'0', "and bob still cannot see alice's keys");

$old->stop;
$new->stop;
done_testing();
