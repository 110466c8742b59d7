# Structural checks of the extension's tables after a test: amcheck over every B-tree
# index of idempotency.keys (and, from 1.1, of the messaging tables), so a test that
# loads, crashes or fuzzes the store also proves that its indexes agree with the
# table and with the key type's ordering.
package IdemCheck;
use strict;
use warnings;
use Test::More;

# bt_index_parent_check with heapallindexed on each index of $table in $dbname, found
# through the catalog (so an index added later is checked too), each a test named
# with $label. It takes a ShareLock on the table: call it after the load.
sub amcheck_table {
	my ($node, $table, $label, $dbname) = @_;
	$dbname //= 'postgres';
	$node->safe_psql($dbname, 'CREATE EXTENSION IF NOT EXISTS amcheck');
	# amcheck checks B-trees only; every index of the extension's tables is one today.
	my @indexes = map { [ split /\|/ ] } split /\n/, $node->safe_psql($dbname, qq{
		SELECT i.indexrelid, c.relname
		FROM pg_catalog.pg_index i
		JOIN pg_catalog.pg_class c ON c.oid = i.indexrelid
		JOIN pg_catalog.pg_am a ON a.oid = c.relam
		WHERE i.indrelid = '$table'::pg_catalog.regclass AND a.amname = 'btree'
		ORDER BY c.relname});
	# Found none would make the checks below pass vacuously.
	cmp_ok(scalar @indexes, '>', 0, "$label: $table has B-tree indexes to check");
	for my $index (@indexes) {
		my ($oid, $name) = @$index;
		my ($stdout, $stderr);
		my $ret = $node->psql($dbname,
			"SELECT bt_index_parent_check(index => $oid, heapallindexed => true)",
			stdout => \$stdout, stderr => \$stderr);
		is($ret, 0, "$label: amcheck finds $name consistent with $table")
		  or diag($stderr);
	}
}

# The key store's indexes.
sub amcheck_keys {
	my ($node, $label, $dbname) = @_;
	amcheck_table($node, 'idempotency.keys', $label, $dbname);
}

# The indexes of the messaging tables (1.1): the outbox, the aggregates' counters and
# idem_apply_version's records.
sub amcheck_messaging {
	my ($node, $label, $dbname) = @_;
	for my $table ('idempotency.outbox', 'idempotency.outbox_aggregates',
		'idempotency.applied_versions')
	{
		amcheck_table($node, $table, $label, $dbname);
	}
}

# On each worker of a Citus cluster, bt_index_parent_check (heapallindexed) on every
# index matching $pattern of the shards placed there (of the co-located tables of a
# distributed store), one test per worker: $per_shard indexes for each shard of $table
# on it, as the coordinator counts them.
sub amcheck_routed {
	my ($coordinator, $workers, $pattern, $table, $per_shard) = @_;
	for my $worker (@$workers) {
		my $checked = $worker->safe_psql('postgres', qq{
			SET citus.override_table_visibility = off;
			SELECT count(bt_index_parent_check(c.oid, true))
			FROM pg_class c JOIN pg_index i ON i.indexrelid = c.oid
			WHERE c.relnamespace = 'idempotency'::regnamespace AND c.relname ~ '$pattern'
			  AND substring(c.relname from '_([0-9]+)\$')::bigint IN (
			        SELECT shardid FROM pg_dist_placement
			        WHERE groupid = (SELECT groupid FROM pg_dist_local_group))});
		my $shards = $coordinator->safe_psql('postgres', sprintf(q{
			SELECT count(*) FROM citus_shards
			WHERE table_name = '%s'::regclass AND nodeport = %d}, $table, $worker->port));
		is($checked, $per_shard * $shards,
			$worker->name . ": amcheck passed on $per_shard indexes for each of its $shards shards of $table");
	}
}

# The 4 indexes of every shard of the distributed key store.
sub amcheck_routed_keys {
	my ($coordinator, @workers) = @_;
	amcheck_routed($coordinator, \@workers, '^routed_keys.*_[0-9]+$', 'idempotency.routed_keys', 4);
}

1;
