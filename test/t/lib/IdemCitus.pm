# A Citus cluster for the scale-out tests (017_citus.pl, 025_citus_transactions.pl,
# 026_citus_messaging.pl, 027_citus_outbox_upkeep.pl, 028_citus_relay.pl): a
# coordinator and two workers on loopback, Citus and the extension preloaded, the
# extension created on the coordinator (Citus creates it on the workers).
package IdemCitus;
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use Test::More;

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

1;
