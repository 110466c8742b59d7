# Upgrading PostgreSQL by dump and restore: a database of an older server (the
# installation in IDEM_OLD_INSTALL, PostgreSQL 15 in CI, with this extension
# installed there too) is dumped with the newer pg_dump, as PostgreSQL's manual
# advises, and restored into a cluster of the PostgreSQL under test. The keys come
# back and behave as before. Skipped when IDEM_OLD_INSTALL is unset or is the
# installation under test.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Cwd ();

my $old_install = $ENV{IDEM_OLD_INSTALL} // '';
my $new_bindir = `pg_config --bindir`;
chomp $new_bindir;
if ($old_install eq '' || !-x "$old_install/bin/postgres") {
	plan skip_all => 'IDEM_OLD_INSTALL names no older PostgreSQL installation';
}
if (Cwd::realpath("$old_install/bin") eq Cwd::realpath($new_bindir)) {
	plan skip_all => 'IDEM_OLD_INSTALL is the installation under test';
}

my $old = PostgreSQL::Test::Cluster->new('old', install_path => $old_install);
$old->init;
$old->start;
my $new = PostgreSQL::Test::Cluster->new('new');
$new->init;
$new->start;
my ($old_version, $new_version) =
	map { $_->safe_psql('postgres', 'SHOW server_version_num') } ($old, $new);
cmp_ok($old_version, '<', $new_version, "dumping $old_version, restoring into $new_version");

$old->safe_psql('postgres', q{CREATE ROLE alice; CREATE ROLE bob; CREATE DATABASE app;});
$old->safe_psql('app', q{
  CREATE EXTENSION idempotency;
  SET ROLE alice;
  BEGIN;
  SELECT idem_claim('pay', 'a1', idem_fingerprint('{"amount": 10}'::jsonb)),
         idem_complete('pay', 'a1', '{"payment": 1}');
  SELECT idem_claim('pay', 'a2'), idem_fail('pay', 'a2', '{"error": "declined"}');
  COMMIT;
  SELECT idem_claim('job', 'lease', lease => '1 hour');
  SELECT idem_checkpoint('job', 'lease', 'charged', '{"charge": "ch_1"}', attempt => 1);
  SET ROLE bob;
  SELECT idem_once('inbox', '7b5d0c5e-4a61-4a7e-9d55-0d6f7cba2c11');
  RESET ROLE;});
my $dump = "$PostgreSQL::Test::Utils::tmp_check/app-across.dump";
# The newer pg_dump, reading the older server.
$new->command_ok([ "$new_bindir/pg_dump", '-Fc', '-d', $old->connstr('app'), '-f', $dump ],
	'pg_dump of the newer version reads the older server');

$new->safe_psql('postgres', q{CREATE ROLE bob; CREATE ROLE alice; CREATE DATABASE app;});
$new->command_ok([ "$new_bindir/pg_restore", '-d', $new->connstr('app'), $dump ],
	'pg_restore into the newer server');

is($new->safe_psql('app', q{
	SELECT string_agg(role::text || ' ' || scope || ' ' || key || ' ' || state::text, ', ' ORDER BY key)
	FROM idempotency.keys}),
	'bob inbox 7b5d0c5e-4a61-4a7e-9d55-0d6f7cba2c11 c, alice pay a1 c, alice pay a2 f, alice job lease p',
	'every key came back, a UUID key as typed');
is($new->safe_psql('app', q{
	SET ROLE alice;
	SELECT outcome || ' ' || response FROM idem_claim('pay', 'a1', idem_fingerprint('{"amount": 10}'::jsonb))}),
	'replay {"payment": 1}', 'a completed key replays its response');
is($new->safe_psql('app', q{SET ROLE alice; SELECT outcome || ' ' || response FROM idem_claim('pay', 'a2')}),
	'replay {"error": "declined"}', 'a failed key replays its error');
my ($ret, $stdout, $stderr) = $new->psql('app',
	"\\set VERBOSITY verbose\nSET ROLE alice;\nSELECT idem_claim('pay', 'a1', idem_fingerprint('{\"amount\": 99}'::jsonb))");
like($stderr, qr/ERROR:  IK001/, 'its fingerprint still guards it');
is($new->safe_psql('app', q{SET ROLE alice; SELECT outcome FROM idem_claim('job', 'lease', wait => '0')}),
	'in_progress', 'the lease claim is still held');
is($new->safe_psql('app', q{
	SET ROLE alice; SELECT idem_complete('job', 'lease', '"shipped"', attempt => 1);
	SELECT state || ' ' || checkpoint FROM idem_lookup('job', 'lease')}),
	"\ncompleted charged", 'and its holder finishes it with its attempt');
is($new->safe_psql('app', q{SET ROLE bob; SELECT idem_once('inbox', '7b5d0c5e-4a61-4a7e-9d55-0d6f7cba2c11'::uuid::idem_key)}),
	'f', "bob's message is still applied, also given as a uuid");
is($new->safe_psql('app', q{SELECT count(*) FROM idempotency.lock_secret}), '1',
	'the restored database has a lock secret of its own');
# pg_dump writes CREATE EXTENSION without a version: the restore installs the newest
# (the default version, by the shortest path of scripts), which the old server has too.
my $extversion = q{SELECT extversion FROM pg_extension WHERE extname = 'idempotency'};
is($new->safe_psql('app', $extversion), $old->safe_psql('app', $extversion),
	'the restored extension has the version of the dumped one');
is($new->safe_psql('app', $extversion),
	$new->safe_psql('app', q{SELECT default_version FROM pg_available_extensions WHERE name = 'idempotency'}),
	'which is the installed default');
is($new->safe_psql('app', q{
	SET ROLE alice;
	BEGIN; SELECT outcome FROM idem_claim('pay', 'a3'); SELECT idem_complete('pay', 'a3'); COMMIT;
	SELECT state FROM idem_lookup('pay', 'a3')}), "claimed\n\ncompleted", 'new keys work');

$old->stop;
$new->stop;
done_testing();
