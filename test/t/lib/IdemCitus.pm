# A Citus cluster for the scale-out tests (017_citus.pl, 025_citus_transactions.pl,
# 026_citus_messaging.pl, 027_citus_outbox_upkeep.pl, 028_citus_relay.pl): a
# coordinator and two workers on loopback, Citus and the extension preloaded, the
# extension created on the coordinator (Citus creates it on the workers); and shard
# moves that clean up after Citus first and fail loudly.
package IdemCitus;
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IPC::Run;
use Time::HiRes qw(usleep);

# Skips the whole test where the PostgreSQL under test has no Citus, unless the test
# runner said it has one (IDEM_CITUS=1: then a missing Citus is a failure).
sub require_citus {
	my $want_citus = $ENV{IDEM_CITUS} // '';
	my $pkglibdir = `pg_config --pkglibdir`;
	chomp $pkglibdir;
	if ($want_citus eq '0') {
		plan skip_all => 'IDEM_CITUS=0: no Citus for the PostgreSQL under test';
	}
	if (!-f "$pkglibdir/citus.so") {
		if ($want_citus eq '1') {
			fail("IDEM_CITUS=1 but $pkglibdir/citus.so is not installed");
			done_testing();
			exit 0;
		}
		plan skip_all => "no Citus in $pkglibdir (scripts/citus.sh: citus_for PG_PREFIX)";
	}
}

# Starts the three nodes and joins them; returns ($coordinator, $worker1, $worker2).
# Option extension_version: the version CREATE EXTENSION idempotency installs (an
# update test's), else the default.
sub start_cluster {
	my (%options) = @_;
	my @nodes = map { PostgreSQL::Test::Cluster->new($_) } qw(coordinator worker1 worker2);
	for my $node (@nodes) {
		$node->init;
		# Citus first. The nodes talk to each other over TCP on loopback (trusted by
		# initdb's pg_hba.conf); the tests themselves use the Unix socket. Two-phase
		# commit and logical decoding as Citus uses them for multi-node writes and
		# moves. No reaper passes: the tests count keys.
		$node->append_conf('postgresql.conf', qq{
shared_preload_libraries = 'citus,idempotency'
idempotency.reaper_enabled = off
listen_addresses = '127.0.0.1'
max_connections = 100
max_prepared_transactions = 100
wal_level = logical
max_replication_slots = 16
max_wal_senders = 16
max_worker_processes = 24
citus.enable_statistics_collection = off
});
		$node->start;
		# Releases with output_plugin_libraries (15.20, 17.11, 18.6 and later) let
		# logical decoding load only the plugins it names; a non-blocking shard split
		# decodes with Citus's own plugin, "citus".
		my $plugins = $node->safe_psql('postgres',
			q{SELECT current_setting('output_plugin_libraries', true)});
		if ($plugins ne '') {
			$node->append_conf('postgresql.conf', "output_plugin_libraries = '$plugins, citus'");
			$node->reload;
		}
		$node->safe_psql('postgres', 'CREATE EXTENSION citus');
	}
	my ($coordinator, $worker1, $worker2) = @nodes;
	$coordinator->safe_psql('postgres', sprintf(
		q{SELECT citus_set_coordinator_host('127.0.0.1', %d);
		  SELECT citus_add_node('127.0.0.1', %d); SELECT citus_add_node('127.0.0.1', %d);},
		$coordinator->port, $worker1->port, $worker2->port));
	my $version = $options{extension_version} ? " VERSION '$options{extension_version}'" : '';
	$coordinator->safe_psql('postgres', "CREATE EXTENSION idempotency$version; CREATE EXTENSION amcheck");
	return @nodes;
}

# Shard moves. Citus drops the placement a move leaves behind later (deferred drop: a
# row of pg_dist_cleanup, dropped by its maintenance daemon or at the start of the
# next move). A move of that shard again (back, say) that meets the daemon dropping it
# fails ("shard move failed as the orphaned shard ... leftover from the previous move
# could not be cleaned up"), so every move here cleans up first, and a failed move
# ends the test with the mover's error.

# Drops what Citus left to clean up, until pg_dist_cleanup is empty (polling: the
# maintenance daemon may be dropping a placement right now, which the call skips).
sub cleanup_orphans {
	my ($coordinator) = @_;
	my $deadline = time + $PostgreSQL::Test::Utils::timeout_default;
	while (1) {
		$coordinator->safe_psql('postgres', 'CALL citus_cleanup_orphaned_resources()');
		my $left = $coordinator->safe_psql('postgres', q{
			SELECT string_agg(object_name || ' (operation ' || operation_id || ')', ', ')
			FROM pg_dist_cleanup});
		return if $left eq '';
		die "Citus's orphaned resources were not cleaned up: $left" if time > $deadline;
		usleep(100_000);
	}
}

# The statement that moves shard $shard from the worker on port $from to the one on $to.
sub move_sql {
	my ($shard, $from, $to, $mode) = @_;
	return sprintf(q{SELECT citus_move_shard_placement(%d, '127.0.0.1', %d, '127.0.0.1', %d,
	                                                   shard_transfer_mode => '%s')},
		$shard, $from, $to, $mode);
}

# Moves it, after cleaning up; dies with the mover's error if the move fails.
sub move_shard {
	my ($coordinator, $shard, $from, $to, $mode) = @_;
	cleanup_orphans($coordinator);
	my ($out, $err) = ('', '');
	my $ret = $coordinator->psql('postgres', move_sql($shard, $from, $to, $mode),
		stdout => \$out, stderr => \$err);
	die "moving shard $shard from port $from to $to ($mode) failed (psql exit $ret): $err"
	  if $ret != 0;
	return;
}

# The same in the background (a psql of its own, after cleaning up): finish_move waits
# for it and dies with the mover's error if it failed.
sub start_move {
	my ($coordinator, $shard, $from, $to, $mode) = @_;
	cleanup_orphans($coordinator);
	my $move = { out => '', err => '', what => "moving shard $shard from port $from to $to ($mode)" };
	$move->{run} = IPC::Run::start(
		[ 'psql', '-XAtq', '-v', 'ON_ERROR_STOP=1', '-d', $coordinator->connstr('postgres'),
		  '-c', move_sql($shard, $from, $to, $mode) ],
		'>', \$move->{out}, '2>', \$move->{err});
	return $move;
}

sub finish_move {
	my ($move) = @_;
	$move->{run}->finish;
	my $ret = $move->{run}->result;
	die "$move->{what} failed (psql exit $ret): $move->{err}" if $ret != 0;
	return;
}

1;
