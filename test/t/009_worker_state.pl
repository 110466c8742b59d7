# The reaper's shared state: a pause is lifted however its command ends, commands
# that will fail or need no pause leave the worker alone, and many databases do not
# crowd out those with the extension.
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

$node->stop;
done_testing();
