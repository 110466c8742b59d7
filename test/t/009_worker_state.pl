# The reaper's shared state: a pause is lifted however its command ends, commands
# that will fail or need no pause leave the worker alone, many databases do not
# crowd out those with the extension, and an unserved database keeps its counters.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

my $node = PostgreSQL::Test::Cluster->new('main');
$node->init;
$node->append_conf('postgresql.conf', q{
shared_preload_libraries = 'idempotency'
idempotency.reaper_naptime = '100ms'
idempotency.max_workers = 4
max_worker_processes = 16
});
$node->start;
# Each part has a database of its own, so that a failure does not spill over.
for my $db ('doomed', 'app') {
	$node->safe_psql('postgres', "CREATE DATABASE $db");
	$node->safe_psql($db, 'CREATE EXTENSION idempotency');
}

# Polls $query in $db until true, for at most $seconds: the reaper serves a database
# within a few naptimes, so a long wait means it never will.
sub wait_until {
	my ($db, $query, $seconds) = @_;
	my $deadline = time() + ($seconds // 20);
	while (time() < $deadline) {
		return 1 if $node->safe_psql($db, $query) eq 't';
		usleep(100_000);
	}
	return 0;
}

sub expire_one_key {
	my ($db, $key) = @_;
	$node->safe_psql($db, qq{SELECT idem_once('s', '$key', ttl => '1 millisecond')});
}

# 1. A session terminated while its DROP DATABASE or SET TABLESPACE waits for other
#    sessions to leave the database: its pause must not outlive it.
my $elsewhere = PostgreSQL::Test::Utils::tempdir_short();
$node->safe_psql('postgres', "CREATE TABLESPACE elsewhere LOCATION '$elsewhere'");
for my $command ('DROP DATABASE doomed', 'ALTER DATABASE doomed SET TABLESPACE elsewhere') {
	my $holder = $node->background_psql('doomed');
	$holder->query_safe('SELECT 1');
	my $session = $node->background_psql('postgres', on_error_stop => 0);
	my $pid = $session->query_safe('SELECT pg_backend_pid()');
	$session->query_until(qr//, "$command;\n");
	# The command locks the database, then waits up to 5 s for the holder to leave.
	wait_until('postgres', qq{
		SELECT count(*) = 1 FROM pg_locks
		WHERE pid = $pid AND locktype = 'object' AND granted
		  AND classid = 'pg_database'::regclass AND mode = 'AccessExclusiveLock'}, 5)
	  or die "$command did not start waiting";
	$node->safe_psql('postgres', "SELECT pg_terminate_backend($pid)");
	wait_until('postgres', "SELECT count(*) = 0 FROM pg_stat_activity WHERE pid = $pid")
	  or die "the session running $command did not end";
	eval { $session->quit };  # its psql may be gone with its backend
	$holder->quit;
	expire_one_key('doomed', 'after-fatal');
	ok(wait_until('doomed', 'SELECT count(*) = 0 FROM idempotency.keys'),
		"a database is reaped again after a terminated $command");
}

# 2. Statements that will fail a permission check, and ALTER DATABASE options other
#    than TABLESPACE, loop while the worker makes a long pass (small batches at the
#    pace it keeps while a client is busy): none of them may terminate it.
$node->safe_psql('postgres', q{
  CREATE ROLE mallory LOGIN;
  CREATE ROLE carol LOGIN CREATEDB;
  ALTER SYSTEM SET idempotency.reaper_enabled = off;
  ALTER SYSTEM SET idempotency.reaper_batch_size = 20;
  SELECT pg_reload_conf();});
wait_until('postgres', q{
	SELECT count(*) = 0 FROM pg_stat_activity WHERE backend_type = 'idempotency reaper'})
  or die 'a reaper still runs';
$node->safe_psql('app', q{
  SELECT count(*) FROM generate_series(1, 150000) g
    WHERE idem_once('bulk', ('b' || g)::idem_key, ttl => '1 millisecond');});
my $sleeper = $node->background_psql('postgres', on_error_stop => 0);
my $sleeper_pid = $sleeper->query_safe('SELECT pg_backend_pid()');
$sleeper->query_until(qr//, "SELECT pg_sleep(600);\n");
$node->safe_psql('postgres', q{
  ALTER SYSTEM SET idempotency.reaper_enabled = on; SELECT pg_reload_conf();});
my $app_reaper = q{
	SELECT string_agg(pid::text, ',') FROM pg_stat_activity
	WHERE backend_type = 'idempotency reaper' AND datname = 'app'};
wait_until('postgres', "SELECT ($app_reaper) IS NOT NULL", 10) or die 'no reaper started for app';
my $reaper_pid = $node->safe_psql('postgres', $app_reaper);
my $bulk_left = q{SELECT count(*) FROM idempotency.keys WHERE scope = 'bulk'};
my $left = $node->safe_psql('app', $bulk_left);

# Runs 50 rounds of $statements in postgres as $role; returns psql's stderr and how
# many reapers were terminated meanwhile, as the server log tells.
sub terminations_during {
	my ($role, $statements) = @_;
	my $offset = -s $node->logfile;
	my ($stdout, $stderr);
	$node->psql('postgres', join('', map { "$statements\nSELECT pg_sleep(0.01);\n" } 1 .. 50),
		extra_params => [ '-U', $role ], on_error_stop => 0,
		stdout => \$stdout, stderr => \$stderr);
	my $terminated =
	  () = slurp_file($node->logfile, $offset) =~ /terminating background worker "idempotency reaper"/g;
	return ($stderr, $terminated);
}

my ($stderr, $terminated) = terminations_during('mallory', q{
	ALTER DATABASE app RENAME TO x;
	DROP DATABASE app;
	CREATE DATABASE z TEMPLATE app;});
like($stderr, qr/must be owner of database app/, 'RENAME and DROP fail for a non-owner');
like($stderr, qr/permission denied to create database/, 'CREATE DATABASE fails without CREATEDB');
is($terminated, 0, 'RENAME, DROP and CREATE ... TEMPLATE without the privileges leave the reaper alone');

($stderr, $terminated) = terminations_during('carol', 'CREATE DATABASE z TEMPLATE app;');
like($stderr, qr/permission denied to copy database "app"/,
	'CREATE DATABASE fails for a non-owner of a database that is no template');
is($terminated, 0, 'so does CREATE ... TEMPLATE of a database one may not copy');

($stderr, $terminated) = terminations_during($node->safe_psql('postgres', 'SELECT current_user'), q{
	ALTER DATABASE app CONNECTION LIMIT 5;
	ALTER DATABASE app CONNECTION LIMIT -1;
	ALTER DATABASE app ALLOW_CONNECTIONS true;
	ALTER DATABASE app IS_TEMPLATE false;});
is($stderr, '', 'the superuser changes options of app');
is($terminated, 0, 'ALTER DATABASE options other than TABLESPACE leave the reaper alone');
is($node->safe_psql('postgres', $app_reaper), $reaper_pid, 'one reaper worked through all of it');
my $left_after = $node->safe_psql('app', $bulk_left);
note "expired keys left: $left before the statements, $left_after after";
cmp_ok($left_after, '<', $left, 'and made progress');

# A command that may run still stops the worker: else it would wait 5 s and fail.
$node->safe_psql('postgres', q{
  ALTER SYSTEM RESET idempotency.reaper_batch_size; SELECT pg_reload_conf();});
$node->safe_psql('postgres', 'ALTER DATABASE app RENAME TO app_renamed');
$node->safe_psql('postgres', 'ALTER DATABASE app_renamed RENAME TO app');
pass("the owner's RENAME takes the database from its reaper");
$node->safe_psql('postgres', "SELECT pg_cancel_backend($sleeper_pid)");
$sleeper->quit;
ok(wait_until('app', "SELECT ($bulk_left) = 0", 60), 'the backlog is reaped');

# 3. More databases than the shared table (128 entries) holds: those with the
#    extension are served however many others there are. The reaper is off while
#    they are made, and its first pass then meets them all. (FILE_COPY and the
#    reaper off make the databases about four times as fast.)
$node->safe_psql('postgres', q{
  ALTER SYSTEM SET idempotency.reaper_enabled = off; SELECT pg_reload_conf();});
$node->safe_psql('postgres',
	join '', map { "CREATE DATABASE d$_ TEMPLATE template0 STRATEGY FILE_COPY;\n" } 1 .. 150);
my @served = map { "d$_" } 146 .. 150;
for my $db (@served) {
	$node->safe_psql($db, 'CREATE EXTENSION idempotency');
	expire_one_key($db, 'many');
}
$node->safe_psql('postgres', q{
  ALTER SYSTEM SET idempotency.reaper_enabled = on; SELECT pg_reload_conf();});
my @waiting = @served;
my $deadline = time() + 30;
while (@waiting && time() < $deadline) {
	@waiting = grep { $node->safe_psql($_, 'SELECT count(*) FROM idempotency.keys') ne '0' } @waiting;
	usleep(100_000) if @waiting;
}
is("@waiting", '', 'every database with the extension is served among 150 others');

# 4. The counters of a database no worker serves (a template) count since server start:
#    the launcher's passes forget only the entries of dropped databases.
$node->safe_psql('postgres', 'CREATE DATABASE tmpl');
$node->safe_psql('tmpl', 'CREATE EXTENSION idempotency');
expire_one_key('tmpl', 'by-hand');
$node->safe_psql('postgres', 'ALTER DATABASE tmpl IS_TEMPLATE true');
is($node->safe_psql('tmpl', 'SELECT idem_reap()'), '1', 'idem_reap deletes in a template database');
is($node->safe_psql('tmpl', 'SELECT reaped_total, worker_pid IS NULL FROM idem_stats()'), '1|t',
	'which no worker serves, and counts it');
# Two passes of the launcher after this point: app's reaper ends a pass twice.
for my $pass (1, 2) {
	my $before = $node->safe_psql('app', 'SELECT last_reap_at FROM idem_stats()');
	wait_until('app', "SELECT last_reap_at > '$before' FROM idem_stats()")
	  or die "the launcher made no pass $pass";
}
is($node->safe_psql('tmpl', 'SELECT reaped_total FROM idem_stats()'), '1',
	"the launcher's passes keep an unserved database's counters");

$node->stop;
done_testing();
