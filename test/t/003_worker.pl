# The background reaper: every database with the extension is served, database
# commands keep working, signals are honoured, and a standby writes nothing until
# it is promoted.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);

my $node = PostgreSQL::Test::Cluster->new('primary');
$node->init(allows_streaming => 1);
$node->append_conf('postgresql.conf', q{
shared_preload_libraries = 'idempotency'
idempotency.reaper_naptime = '100ms'
});
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION idempotency');

sub reaper_pids {
	my ($db) = @_;
	return $node->safe_psql('postgres', qq{
		SELECT string_agg(pid::text, ',') FROM pg_stat_activity
		WHERE backend_type = 'idempotency reaper' AND datname = '$db'});
}

my $launcher = $node->safe_psql('postgres',
	q{SELECT pid FROM pg_stat_activity WHERE backend_type = 'idempotency launcher'});
like($launcher, qr/^\d+$/, 'one launcher shows in pg_stat_activity');

# Expiry without idem_reap.
$node->safe_psql('postgres', q{
  BEGIN;
  SELECT idem_claim('w', ('k' || g)::idem_key, ttl => '1 millisecond'),
         idem_complete('w', ('k' || g)::idem_key) FROM generate_series(1, 1000) g;
  COMMIT;});
ok($node->poll_query_until('postgres', q{SELECT count(*) = 0 FROM idempotency.keys WHERE scope = 'w'}),
	'expired keys are reaped by the worker');
ok($node->poll_query_until('postgres', q{SELECT reaped_total >= 1000 FROM idem_stats()}),
	'idem_stats counts what the worker reaped');

# A database created after start is served within a naptime, with no restart.
$node->safe_psql('postgres', 'CREATE DATABASE second');
$node->safe_psql('second', q{
  CREATE EXTENSION idempotency;
  SELECT idem_once('w', 'short-lived', ttl => '1 millisecond');});
ok($node->poll_query_until('second', q{SELECT count(*) = 0 FROM idempotency.keys}),
	'a database created later is served');

# A lease claim left by a terminated session becomes abandoned; a retry takes over.
my $holder = $node->background_psql('second', on_error_stop => 0);
$holder->query_safe(q{SELECT idem_claim('w', 'leased', lease => '200 milliseconds')});
$node->safe_psql('second', q{
  SELECT pg_terminate_backend(pid) FROM pg_stat_activity
  WHERE datname = 'second' AND backend_type = 'client backend' AND pid <> pg_backend_pid()});
eval { $holder->quit };  # its psql may be gone with its backend
ok($node->poll_query_until('second', q{SELECT state = 'abandoned' FROM idem_lookup('w', 'leased')}),
	'the stale lease is marked abandoned');
like($node->safe_psql('second', q{
  BEGIN;
  SELECT outcome || ' ' || attempt FROM idem_claim('w', 'leased');
  SELECT idem_complete('w', 'leased');
  COMMIT;}), qr/^claimed 2$/m, 'a retry takes the abandoned claim over');
ok($node->poll_query_until('second', q{SELECT reclaimed_total >= 1 FROM idem_stats()}),
	'idem_stats counts the reclaimed claim');

# Database commands that need the database alone work while it is served.
for my $round (1 .. 3) {
	$node->safe_psql('postgres', "CREATE DATABASE churn$round");
	$node->safe_psql("churn$round", 'CREATE EXTENSION idempotency');
	$node->poll_query_until('postgres', qq{
		SELECT last_reap_at IS NOT NULL FROM idem_stats()}) or die;
	$node->safe_psql('postgres', "ALTER DATABASE churn$round RENAME TO churned$round");
	$node->safe_psql('postgres', "CREATE DATABASE copy$round TEMPLATE churned$round");
	$node->safe_psql('churned' . $round, 'DROP EXTENSION idempotency');
	$node->safe_psql('postgres', "DROP DATABASE churned$round");
	$node->safe_psql('postgres', "DROP DATABASE copy$round");
}
pass('RENAME, CREATE ... TEMPLATE, DROP EXTENSION and DROP DATABASE succeed while the reaper runs');
ok($node->poll_query_until('postgres', q{
	SELECT count(*) = 0 FROM pg_stat_activity
	WHERE backend_type = 'idempotency reaper' AND datname NOT IN ('postgres', 'second')}),
	'no reaper stays connected to a database without the extension');

# SIGTERM mid-pass: many expired rows, tiny batches, and a kill while it works.
$node->safe_psql('postgres', q{
  ALTER SYSTEM SET idempotency.reaper_batch_size = 50;
  ALTER SYSTEM SET idempotency.reaper_enabled = off;
  SELECT pg_reload_conf();});
$node->safe_psql('second', q{
  BEGIN;
  SELECT count(*) FROM generate_series(1, 200000) g
    WHERE idem_once('bulk', ('b' || g)::idem_key, ttl => '1 millisecond');
  COMMIT;});
$node->safe_psql('postgres', q{
  ALTER SYSTEM SET idempotency.reaper_enabled = on; SELECT pg_reload_conf();});
$node->poll_query_until('postgres', q{
	SELECT count(*) > 0 FROM pg_stat_activity
	WHERE backend_type = 'idempotency reaper' AND datname = 'second'}) or die;
my $busy = reaper_pids('second');
my $start = time();
$node->safe_psql('postgres', "SELECT pg_terminate_backend($busy)");
$node->poll_query_until('postgres',
	"SELECT count(*) = 0 FROM pg_stat_activity WHERE pid = $busy") or die;
cmp_ok(time() - $start, '<', 3, 'a reaper leaves promptly on SIGTERM, mid-pass');
ok($node->poll_query_until('second', q{SELECT count(*) = 0 FROM idempotency.keys WHERE scope = 'bulk'}),
	'the next pass finishes the job');

# SIGHUP: a naptime of an hour, then a reload back to 100ms takes effect at once.
$node->safe_psql('postgres', q{
  ALTER SYSTEM SET idempotency.reaper_naptime = '1h'; SELECT pg_reload_conf();});
$node->poll_query_until('postgres', q{SELECT current_setting('idempotency.reaper_naptime') = '1h'})
  or die;
$node->safe_psql('postgres', q{SELECT idem_once('w', 'after-reload', ttl => '1 millisecond')});
$node->safe_psql('postgres', q{
  ALTER SYSTEM RESET idempotency.reaper_naptime; SELECT pg_reload_conf();});
ok($node->poll_query_until('postgres', q{SELECT count(*) = 0 FROM idempotency.keys WHERE scope = 'w'}),
	'a reloaded naptime applies without a restart');

# The launcher, terminated, comes back.
$node->safe_psql('postgres', "SELECT pg_terminate_backend($launcher)");
ok($node->poll_query_until('postgres', qq{
	SELECT count(*) = 1 FROM pg_stat_activity
	WHERE backend_type = 'idempotency launcher' AND pid <> $launcher}),
	'a terminated launcher is started again');

# A standby writes nothing; after promotion it reaps.
$node->safe_psql('postgres', q{
  ALTER SYSTEM SET idempotency.reaper_enabled = off; SELECT pg_reload_conf();});
$node->backup('base');
my $standby = PostgreSQL::Test::Cluster->new('standby');
$standby->init_from_backup($node, 'base', has_streaming => 1);
# ALTER SYSTEM on the primary came along in the backup; override it here.
$standby->append_conf('postgresql.auto.conf', "idempotency.reaper_enabled = on\n");
$standby->start;
$node->safe_psql('postgres', q{SELECT idem_once('standby', 'expired', ttl => '1 millisecond')});
$node->wait_for_catchup($standby);
is($standby->safe_psql('postgres', q{
	SELECT count(*) FROM pg_stat_activity WHERE backend_type LIKE 'idempotency%'}),
	'0', 'no reaper runs on a standby');
is($standby->safe_psql('postgres', q{SELECT count(*) FROM idempotency.keys WHERE scope = 'standby'}),
	'1', 'the standby keeps the expired key it replayed');
$node->stop;
$standby->promote;
ok($standby->poll_query_until('postgres', q{
	SELECT count(*) = 0 FROM idempotency.keys WHERE scope = 'standby'}),
	'after promotion the reaper starts and reaps');

$standby->stop;
done_testing();
