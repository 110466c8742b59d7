# Exactly once with Citus (SPEC v1.2, "Scale-out with Citus"; issue 27): a coordinator
# and two workers on loopback, `payments` distributed by `account` in 4 shards, the key
# store distributed with it (idem_distribute), and the README's Citus procedure
# (examples/create_payment_citus.sql) distributed by its p_account argument. Every
# scenario counts the payments of each key (one account per key) and the keys stored.
#
#   (a) delegated CALLs, 4 concurrent duplicates per key: one payment and one key per key;
#   (b) the CALL inside BEGIN ... COMMIT on the coordinator (Citus does not delegate
#       it; its key functions are forwarded to the shard's node, 1.4): paid once;
#       retried delegated, replays; and the other way round (025_citus_transactions.pl
#       has the transaction blocks of applications);
#   (c) every shard moved (block_writes), then every key of (a) retried: replays;
#   (d) every shard moved back with logical replication while 4 clients pay, then
#       every key retried: one payment per key, as many keys as paid accounts;
#   (e) every shard split in two (block_writes and force_logical), then every key
#       retried; (r) the rebalancer under load, then every key retried;
#   (l) a lease claim moved with its shard and finished after the move; a stale lease
#       taken over after a move; (o) idem_once and idem_once_many under duplicates;
#       (w) reaping on the workers, idem_stats; (k) a worker killed during load;
#   (i) IK002 raised when the worker commits, one-phase and two-phase;
#   (v) bad input: a route of another type, none, a key with two routes (22023 in one
#       shard; across shards a key in each), the store distributed twice, a business
#       table not distributed, undistributing with keys;
#   (f) the C lookup of a value's shard agrees with Citus's, follows a move, and its
#       lock makes a concurrent move wait;
#   (n) a worker session's cache of its shard rebuilt 300 times keeps no memory;
#   (m) amcheck on every shard of the store after all of it;
#   (g) idempotency.keys or a messaging table distributed by hand: refused (0A000);
#       messaging with a distributed store without a route: 22023;
#   (u) undistributing an empty store; distributing again refused while the
#       node-local outbox holds an undelivered event.
#
# Needs Citus installed in the PostgreSQL under test (scripts/citus.sh's citus_for,
# which test/run_all.sh calls): skipped without it, unless IDEM_CITUS=1 (run_all sets
# it when citus_for succeeded) makes a missing Citus a failure. IDEM_CITUS=0 skips.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::RealBin/lib";
use IdemCheck;
use IdemCitus;
use IPC::Run;

IdemCitus::require_citus();

my $keys = $ENV{IDEM_CITUS_KEYS} // 200;    # (a) and (c)
my $tx_keys = $ENV{IDEM_CITUS_TX_KEYS} // 50;    # each half of (b)

# ---------------------------------------------------------------------------------
# The cluster
# ---------------------------------------------------------------------------------

my ($coordinator, $worker1, $worker2) = IdemCitus::start_cluster();
my @nodes = ($coordinator, $worker1, $worker2);
my @workers = ($worker1, $worker2);
my %name_of = map { ($_->port => $_->name) } @nodes;
is($coordinator->safe_psql('postgres',
		q{SELECT count(*) FROM pg_dist_node WHERE noderole = 'primary' AND groupid > 0}),
	'2', 'two workers in the Citus cluster');

# CREATE EXTENSION on the coordinator only (IdemCitus): Citus creates it on the workers.
for my $worker (@workers) {
	is($worker->safe_psql('postgres',
			q{SELECT count(*) FROM pg_extension WHERE extname = 'idempotency'}),
		'1', $worker->name . ': Citus created the extension there');
}

my ($ret, $stdout, $stderr);

# Before anything is distributed, the extension works on the coordinator as on one
# node; a messaging table distributed by hand is refused there (0A000), never written
# node-locally.
is($coordinator->safe_psql('postgres', q{SELECT idem_once('local', 'k1')}), 't',
	'nothing distributed: idem_once works on the coordinator as on one node');
$coordinator->safe_psql('postgres', q{
  SELECT create_distributed_table('idempotency.applied_versions', 'scope',
                                  colocate_with => 'none')});
($stdout, $stderr) = ('', '');
$coordinator->psql('postgres',
	"\\set VERBOSITY verbose\nSELECT idem_apply_version('orders', 'order-1', 1);",
	stdout => \$stdout, stderr => \$stderr);
like($stderr,
	qr/0A000: the messaging table idempotency.applied_versions is distributed with Citus/,
	'a messaging table distributed by hand: idem_apply_version fails with 0A000');
$coordinator->safe_psql('postgres', q{
  ALTER EXTENSION idempotency DROP TABLE idempotency.applied_versions;
  SELECT undistribute_table('idempotency.applied_versions');
  ALTER EXTENSION idempotency ADD TABLE idempotency.applied_versions;});
is($coordinator->safe_psql('postgres', q{SELECT idem_apply_version('orders', 'order-1', 1)}),
	't', 'undistributed again: idem_apply_version applies');

# Bad input before the store is distributed.
sub sqlstate_of {
	my ($node, $sql) = @_;
	my ($out, $err) = ('', '');
	$node->psql('postgres', "\\set VERBOSITY verbose\n$sql", stdout => \$out, stderr => \$err);
	return $err =~ /ERROR:\s+([0-9A-Z]{5}):/ ? $1 : "no error ($out)";
}
is(sqlstate_of($coordinator, q{SELECT idem_claim('s', 'k', route => 1)}), '55000',
	'(v) a route while the store is not distributed: 55000');
$coordinator->safe_psql('postgres', q{CREATE TABLE plain (account bigint)});
is(sqlstate_of($coordinator, q{SELECT idem_distribute('plain')}), '22023',
	'(v) idem_distribute of a table Citus does not distribute: 22023');
is(sqlstate_of($coordinator, q{SELECT idem_distribute('payments_missing')}), '42P01',
	'(v) idem_distribute of no table: 42P01');
is(sqlstate_of($coordinator, q{SELECT idem_distribute('payments')}), '42P01',
	'(v) (payments does not exist yet)');
is(sqlstate_of($coordinator, q{SELECT idem_distribute('pg_class')}), '22023',
	'(v) idem_distribute of a catalog: 22023');
# The store holds the key of idem_once above: distributing would strand it.
$coordinator->safe_psql('postgres', q{
  SET citus.shard_count = 4;
  CREATE TABLE payments (id bigserial, account bigint NOT NULL, amount numeric,
                         PRIMARY KEY (account, id));
  SELECT create_distributed_table('payments', 'account');});
is(sqlstate_of($coordinator, q{SELECT idem_distribute('payments')}), '55000',
	'(v) idem_distribute while idempotency.keys holds keys: 55000, nothing changed');
is($coordinator->safe_psql('postgres', q{SELECT count(*) FROM idem_lookup('local', 'k1')}), '1',
	'(v) and the key is still there');
$coordinator->safe_psql('postgres', q{SELECT idem_forget('local', 'k1'); DROP TABLE payments});

# The README's set-up (examples/create_payment_citus.sql): payments distributed by
# account, idem_distribute('payments'), the procedure distributed by p_account.
$coordinator->safe_psql('postgres', 'SET citus.shard_count = 4;'
	  . PostgreSQL::Test::Utils::slurp_file("$FindBin::RealBin/../../examples/create_payment_citus.sql"));
is($coordinator->safe_psql('postgres', q{
		SELECT count(DISTINCT colocationid) FROM pg_dist_partition
		WHERE logicalrelid IN ('payments'::regclass, 'idempotency.routed_keys'::regclass)}),
	'1', 'idem_distribute: the key store is co-located with payments');
is($coordinator->safe_psql('postgres', q{
		SELECT distribution_argument_index, colocationid = (
		         SELECT colocationid FROM pg_dist_partition
		         WHERE logicalrelid = 'payments'::regclass)
		FROM pg_catalog.pg_dist_object
		WHERE objid = 'create_payment(idem_key, bigint, numeric, jsonb)'::regprocedure}),
	'1|t', 'create_payment is distributed by p_account, co-located with payments');
is($coordinator->safe_psql('postgres', q{
		SELECT count(*), count(DISTINCT nodeport) FROM citus_shards
		WHERE table_name = 'idempotency.routed_keys'::regclass}),
	'4|2', 'the key store has 4 shards over the 2 workers');
is(sqlstate_of($coordinator, q{SELECT idem_distribute('payments')}), '55000',
	'(v) the store distributed twice: 55000');

# A role whose OID differs between the nodes (a worker created tables first): keys
# identify roles by name across nodes, or a moved key would not be found.
$worker2->safe_psql('postgres', q{
  SET citus.enable_ddl_propagation = off; CREATE TABLE oid_burner (a int);});
$coordinator->safe_psql('postgres', q{
  CREATE ROLE app LOGIN;
  GRANT ALL ON payments TO app; GRANT USAGE ON SEQUENCE payments_id_seq TO app;});
my @role_oids = map { $_->safe_psql('postgres', q{SELECT oid FROM pg_roles WHERE rolname = 'app'}) } @nodes;
isnt($role_oids[1], $role_oids[2], 'role app has another OID on each worker');

# ---------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------

# One CALL per line, each its own statement in autocommit (so Citus delegates it).
sub calls {
	my ($prefix, $from, $to, $account_base, $amount) = @_;
	return join '', map {
		sprintf("CALL create_payment('%s-%d', %d, %s);\n", $prefix, $_, $account_base + $_, $amount)
	} $from .. $to;
}

# The same CALLs, each in a transaction block of its own.
sub calls_in_blocks {
	my ($prefix, $from, $to, $account_base, $amount) = @_;
	return join '', map {
		sprintf("BEGIN;\nCALL create_payment('%s-%d', %d, %s);\nCOMMIT;\n",
			$prefix, $_, $account_base + $_, $amount)
	} $from .. $to;
}

# "once|twice_or_more|none" over the accounts $account_base + 1 .. + $n.
sub paid {
	my ($account_base, $n) = @_;
	return $coordinator->safe_psql('postgres', qq{
		SELECT count(*) FILTER (WHERE c = 1), count(*) FILTER (WHERE c > 1),
		       $n - count(*)
		FROM (SELECT account, count(*) AS c FROM payments
		      WHERE account BETWEEN $account_base + 1 AND $account_base + $n
		      GROUP BY account) p});
}

# Keys stored with a key prefix, in the distributed store (through Citus), and in the
# node-local idempotency.keys of every node (which must hold none), "distributed|local".
sub stored_keys {
	my ($prefix) = @_;
	my $local = 0;
	$local += $_->safe_psql('postgres', qq{
		SELECT count(*) FROM idempotency.keys WHERE key::text LIKE '$prefix-%'}) for @nodes;
	return $coordinator->safe_psql('postgres', qq{
		SELECT count(*) FROM idempotency.routed_keys WHERE key::text LIKE '$prefix-%'}) . "|$local";
}

# Every shard of payments (and so of the key store) to the other worker, in `mode`.
sub move_every_shard {
	my ($mode) = @_;
	my @placements = map { [ split /\|/ ] } split /\n/, $coordinator->safe_psql('postgres', q{
		SELECT shardid, nodeport FROM citus_shards
		WHERE table_name = 'payments'::regclass ORDER BY shardid});
	for my $placement (@placements) {
		my ($shard, $from) = @$placement;
		my $to = $from == $worker1->port ? $worker2->port : $worker1->port;
		IdemCitus::move_shard($coordinator, $shard, $from, $to, $mode);
	}
	return $coordinator->safe_psql('postgres', sprintf(q{
		SELECT count(*) FROM citus_shards s
		JOIN (VALUES %s) AS before (shardid, nodeport) USING (shardid)
		WHERE s.table_name = 'payments'::regclass AND s.nodeport <> before.nodeport},
		join ',', map { "($_->[0], $_->[1])" } @placements)) == scalar @placements;
}

# Four clients paying random keys of $n (accounts $base + 1 ..) through the
# coordinator until stopped: pgbench runs of 5 s one after the other, since a client
# stops at its first error (an IK006 while a shard moves, say) and the run with it.
# (It also stops when the coordinator does, should the test die before stopping it.)
sub start_load {
	my ($prefix, $n, $base, $user) = @_;
	my $dir = PostgreSQL::Test::Utils::tempdir();
	my $file = "$dir/load_$prefix.sql";
	# (The account as a pgbench variable: Citus delegates a CALL only when the
	# distribution argument is a constant, and `5000 + :k` is an expression.)
	PostgreSQL::Test::Utils::append_to_file($file, qq{\\set k random(1, $n)
\\set account $base + :k
CALL create_payment(('$prefix-' || :k)::idem_key, :account, 50);
});
	my $command = sprintf(
		q{while [ ! -e %s/stop ] && pg_isready -q --host %s --port %d; do pgbench --no-vacuum --client=4 --jobs=2 --time=5 --file %s --host %s --port %d --username %s postgres; done},
		$dir, $coordinator->host, $coordinator->port, $file, $coordinator->host, $coordinator->port,
		$user // 'postgres');
	my ($out, $err) = ('', '');
	my $run = IPC::Run::start([ 'bash', '-c', $command ], '>', \$out, '2>', \$err);
	return { run => $run, err => \$err, dir => $dir };
}

# Stops a load once its calls in flight are done; returns the errors its clients met
# (pgbench's log), as { message => count }.
sub stop_load {
	my ($load) = @_;
	PostgreSQL::Test::Utils::append_to_file("$load->{dir}/stop", '');
	$load->{run}->finish;
	my %errors;
	$errors{$1}++ while ${ $load->{err} } =~ /ERROR:\s+([^\n]*)/g;
	return \%errors;
}

sub describe { my ($errors) = @_; join('; ', map { "$_ x$errors->{$_}" } sort keys %$errors) || 'none' }

# Errors a call racing a move may meet: IK006 (the shard left the node it was routed
# to) and the procedure's own IK005 "payment ... is in progress" (a duplicate in flight).
sub unexpected {
	my ($errors) = @_;
	return grep { !/^the key's shard \d+ of the key store is on|^payment \S+ is in progress/ } keys %$errors;
}

# The calls run as role app (a key belongs to the role that claimed it).
sub as_app { return $coordinator->safe_psql('postgres', $_[0], extra_params => [ '-U', 'app' ]) }
# The same, going on after errors; returns stderr.
sub try_as_app {
	my ($sql) = @_;
	my ($out, $err) = ('', '');
	$coordinator->psql('postgres', $sql, stdout => \$out, stderr => \$err, on_error_stop => 0,
		extra_params => [ '-U', 'app' ]);
	return $err;
}

# ---------------------------------------------------------------------------------
# (a) Delegated CALLs with concurrent duplicates
# ---------------------------------------------------------------------------------

# Four clients run the same $keys CALLs in the same order, so each key's four
# duplicates arrive together; a duplicate waits for the first (rule 4) and replays.
$coordinator->pgbench(
	'--no-vacuum --client=4 --jobs=2 --transactions=1 --username=app',
	0,
	[qr{processed: 4/4}],
	[qr{^$}],
	"(a) 4 clients x $keys delegated CALLs through the coordinator, no errors",
	{ 'idem_citus_a' => calls('a', 1, $keys, 0, 10) });
is(paid(0, $keys), "$keys|0|0", "(a) each of $keys keys paid exactly once");
is(stored_keys('a'), "$keys|0", "(a) $keys keys, all in the distributed store");
is($coordinator->safe_psql('postgres', q{
		SELECT count(*) FROM idempotency.routed_keys k
		JOIN payments p ON p.account = k.route AND k.key::text = 'a-' || p.account
		WHERE k.key::text LIKE 'a-%' AND k.role::text = 'app'}),
	$keys, '(a) each key is stored with its payment\'s account as route, and its role');

# A retry replays the first attempt's response: the payment it made.
is(as_app(q{CALL create_payment('a-1', 1, 10);}),
	$coordinator->safe_psql('postgres', q{
		SELECT jsonb_build_object('payment_id', id, 'amount', amount)
		FROM payments WHERE account = 1}),
	'(a) a retry replays the payment of the first attempt');

# ---------------------------------------------------------------------------------
# (b) Transaction blocks on the coordinator
# ---------------------------------------------------------------------------------

# b: first in a block on the coordinator (the procedure runs there, its key functions
# on the shard's node through Citus), then retried delegated: replays.
$stderr = try_as_app(calls_in_blocks('b', 1, $tx_keys, 1000, 20));
is($stderr, '', "(b) $tx_keys CALLs in transaction blocks on the coordinator: no error");
is(paid(1000, $tx_keys), "$tx_keys|0|0", '(b) each paid exactly once');
as_app(calls('b', 1, $tx_keys, 1000, 20));
is(paid(1000, $tx_keys), "$tx_keys|0|0", "(b) retried delegated: replays, each still paid once");

# b2: first delegated, then retried in blocks on the coordinator: replays, never twice.
as_app(calls('b2', 1, $tx_keys, 2000, 30));
$stderr = try_as_app(calls_in_blocks('b2', 1, $tx_keys, 2000, 30));
my @other_errors = grep { /ERROR/ } split /\n/, $stderr;
is(scalar @other_errors, 0, '(b2) retries in blocks: no error')
  or diag(join "\n", @other_errors[0 .. ($#other_errors < 4 ? $#other_errors : 4)]);
is(paid(2000, $tx_keys), "$tx_keys|0|0", "(b2) each of $tx_keys keys still paid exactly once");
is(stored_keys('b') . ' ' . stored_keys('b2'), "$tx_keys|0 $tx_keys|0",
	'(b) one key per account, none node-local');

# ---------------------------------------------------------------------------------
# (c) Every shard moved (block_writes), then every key of (a) retried
# ---------------------------------------------------------------------------------

my $rows_before = $coordinator->safe_psql('postgres', 'SELECT count(*) FROM payments');
ok(move_every_shard('block_writes'), '(c) every shard moved to the other worker (block_writes)');
is($coordinator->safe_psql('postgres', 'SELECT count(*) FROM payments'), $rows_before,
	'(c) the payments moved with their shards');
is(stored_keys('a'), "$keys|0", '(c) and the keys with them');
$coordinator->pgbench('--no-vacuum --client=1 --transactions=1 --username=app', 0,
	[qr{processed: 1/1}], [qr{^$}], "(c) $keys delegated retries as app after the moves",
	{ 'idem_citus_c' => calls('a', 1, $keys, 0, 10) });
is(paid(0, $keys), "$keys|0|0", "(c) after the moves, each of $keys keys still paid exactly once");

# ---------------------------------------------------------------------------------
# (d) A logical move of every shard while clients pay
# ---------------------------------------------------------------------------------

# Four clients pay random keys of $load_keys (new keys keep coming, and duplicates)
# for as long as every shard takes to move back with logical replication; then every
# key is retried once. A call routed to the old node while the move switches over
# fails with IK006 (retry); none may pay twice.
my $load_keys = $ENV{IDEM_CITUS_LOAD_KEYS} // 2000;
my $load = start_load('d', $load_keys, 5000, 'app');
sleep 1;
ok(move_every_shard('force_logical'), '(d) every shard moved again (force_logical), under load');
sleep 1;
my $errors = stop_load($load);
note('(d) errors the clients met during the moves: ' . describe($errors));
is(join(', ', unexpected($errors)), '', '(d) no error but IK006 and in_progress');
my (undef, $d_more) = split /\|/, paid(5000, $load_keys);
is($d_more, 0, '(d) no key paid twice by the clients that ran during the moves');
try_as_app(calls('d', 1, $load_keys, 5000, 50));
is(paid(5000, $load_keys), "$load_keys|0|0",
	"(d) after retrying all $load_keys keys, each paid exactly once");
is(stored_keys('d'), "$load_keys|0", "(d) and $load_keys keys stored, none lost");

# ---------------------------------------------------------------------------------
# (e) Every shard split in two, the halves on different workers; (r) the rebalancer
# ---------------------------------------------------------------------------------

my $split_keys = $ENV{IDEM_CITUS_SPLIT_KEYS} // 100;
as_app(calls('e', 1, $split_keys, 7000, 60));
is(paid(7000, $split_keys), "$split_keys|0|0", "(e) $split_keys delegated CALLs: each paid once");
my %node_id = map { split /\|/ } split /\n/, $coordinator->safe_psql('postgres', q{
	SELECT nodeport, nodeid FROM pg_dist_node WHERE groupid > 0});
my @shards = map { [ split /\|/ ] } split /\n/, $coordinator->safe_psql('postgres', q{
	SELECT s.shardid, s.shardminvalue, s.shardmaxvalue, c.nodeport
	FROM pg_dist_shard s JOIN citus_shards c USING (shardid)
	WHERE s.logicalrelid = 'payments'::regclass ORDER BY s.shardid});
$load = start_load('e2', 500, 7500, 'app');
my %split_modes;
for my $shard (@shards) {
	my ($id, $min, $max, $port) = @$shard;
	my $middle = int(($min + $max) / 2);
	my $other = $port == $worker1->port ? $worker2->port : $worker1->port;
	my $mode = $id % 2 ? 'force_logical' : 'block_writes';
	$coordinator->safe_psql('postgres', qq{
		SELECT citus_split_shard_by_split_points($id, ARRAY['$middle'],
		         ARRAY[$node_id{$port}, $node_id{$other}], shard_transfer_mode => '$mode')});
	$split_modes{$mode}++;
}
is(join(' ', map { "$_=$split_modes{$_}" } sort keys %split_modes),
	sprintf('block_writes=%d force_logical=%d', scalar @shards / 2, scalar @shards / 2),
	'(e) split in both transfer modes');
$errors = stop_load($load);
note('(e) errors the clients met during the splits: ' . describe($errors));
is(join(', ', unexpected($errors)), '', '(e) no error but IK006 and in_progress');
is($coordinator->safe_psql('postgres', q{
		SELECT count(*) FROM citus_shards WHERE table_name = 'idempotency.routed_keys'::regclass}),
	2 * scalar @shards, '(e) every shard of the store split in two with payments');
try_as_app(calls('e', 1, $split_keys, 7000, 60) . calls('e2', 1, 500, 7500, 50));
is(paid(7000, $split_keys), "$split_keys|0|0",
	"(e) after the splits, retrying all $split_keys keys pays none twice");
is(paid(7500, 500), '500|0|0', '(e) keys paid during the splits: once each after retries');
is(stored_keys('e') . ' ' . stored_keys('e2'), "$split_keys|0 500|0", '(e) no key lost or duplicated');

# (r) every shard on worker1, then the rebalancer spreads them while clients pay.
for my $placement (map { [ split /\|/ ] } split /\n/, $coordinator->safe_psql('postgres', sprintf(q{
		SELECT shardid, nodeport FROM citus_shards
		WHERE table_name = 'payments'::regclass AND nodeport <> %d}, $worker1->port))) {
	IdemCitus::move_shard($coordinator, $placement->[0], $placement->[1], $worker1->port, 'block_writes');
}
# (The rebalancer moves them again: nothing of the moves above left to clean up.)
IdemCitus::cleanup_orphans($coordinator);
$load = start_load('r', 500, 8000, 'app');
$coordinator->safe_psql('postgres', q{
	SELECT citus_rebalance_start(shard_transfer_mode => 'force_logical');
	SELECT citus_rebalance_wait();});
$errors = stop_load($load);
note('(r) errors the clients met during the rebalance: ' . describe($errors));
is(join(', ', unexpected($errors)), '', '(r) no error but IK006 and in_progress');
is($coordinator->safe_psql('postgres', q{
		SELECT count(DISTINCT nodeport) FROM citus_shards
		WHERE table_name = 'idempotency.routed_keys'::regclass}),
	'2', '(r) the rebalancer spread the shards over both workers again');
try_as_app(calls('r', 1, 500, 8000, 50) . calls('a', 1, $keys, 0, 10));
is(paid(8000, 500), '500|0|0', '(r) keys paid during the rebalance: once each after retries');
is(paid(0, $keys), "$keys|0|0", '(r) and the keys of (a) still replay');
is(stored_keys('r'), '500|0', '(r) no key lost or duplicated');

# ---------------------------------------------------------------------------------
# (l) Leases across moves; (o) idem_once under duplicates
# ---------------------------------------------------------------------------------

$coordinator->safe_psql('postgres', q{
  CREATE FUNCTION lease_claim(p_key idem_key, p_account bigint, p_lease interval)
    RETURNS text LANGUAGE sql AS $$
      SELECT outcome || ' ' || attempt
      FROM idem_claim('jobs', p_key, lease => p_lease, route => p_account) $$;
  -- (plpgsql: a one-expression SQL function would be inlined, and Citus delegates
  -- only a function call.)
  CREATE FUNCTION lease_complete(p_key idem_key, p_account bigint, p_attempt integer)
    RETURNS void LANGUAGE plpgsql AS $$
    BEGIN
      PERFORM idem_complete('jobs', p_key, '"done"', p_attempt, route => p_account);
    END $$;
  SELECT create_distributed_function('lease_claim(idem_key, bigint, interval)', 'p_account',
                                     colocate_with => 'payments');
  SELECT create_distributed_function('lease_complete(idem_key, bigint, integer)', 'p_account',
                                     colocate_with => 'payments');});
is($coordinator->safe_psql('postgres', q{SELECT lease_claim('job-1', 42, '1 hour')}),
	'claimed 1', '(l) a lease claim in a delegated function');
is($coordinator->safe_psql('postgres', q{SELECT lease_claim('job-2', 43, '1 second')}),
	'claimed 1', '(l) a short lease claim');
ok(move_every_shard('force_logical'), '(l) every shard moved with the leases');
is($coordinator->safe_psql('postgres', q{SELECT lease_claim('job-1', 42, '1 hour')}),
	'in_progress 1', '(l) after the move the live lease still holds the key');
$coordinator->safe_psql('postgres', q{SELECT lease_complete('job-1', 42, 1)});
is($coordinator->safe_psql('postgres', q{SELECT state FROM idempotency.routed_keys WHERE key = 'job-1'}),
	'c', '(l) and its holder finishes it on the new node');
sleep 2;
is($coordinator->safe_psql('postgres', q{SELECT lease_claim('job-2', 43, '1 hour')}),
	'claimed 2', '(l) a lease that ran out before the move is taken over after it');

# idem_abandoned on the coordinator lists the role's stale and abandoned lease claims
# of every node; on a worker, its own.
$coordinator->safe_psql('postgres',
	join '', map { "SELECT lease_claim('job-$_', $_, '1 second');\n" } 100 .. 119);
sleep 2;
is($coordinator->safe_psql('postgres', q{
		SELECT count(*), min(key::text), max(key::text) FROM idem_abandoned('jobs', 100)}),
	'20|job-100|job-119', '(l) idem_abandoned on the coordinator: the stale claims of every node');
is($coordinator->safe_psql('postgres', q{SELECT count(*) FROM idem_abandoned('jobs', 5)}), '5',
	'(l) at most max_rows of them');
# A caller whose search_path puts look-alikes of what the coordinator's own queries
# over the nodes use (Citus's function, the catalog, an aggregate, a set-returning
# function) before pg_catalog: none of them runs, the answers are the same (issue 50).
$coordinator->safe_psql('postgres', q{
  SET citus.enable_ddl_propagation = off;
  CREATE SCHEMA shadow;
  CREATE FUNCTION shadow.fail(what text) RETURNS boolean LANGUAGE plpgsql
    AS $$BEGIN RAISE EXCEPTION 'shadow % ran', what; END$$;
  CREATE FUNCTION shadow.run_command_on_all_nodes(command text, parallel boolean DEFAULT true,
      give_warning_for_connection_errors boolean DEFAULT false,
      OUT nodeid integer, OUT success boolean, OUT result text) RETURNS SETOF record
    LANGUAGE sql AS $$SELECT 0, shadow.fail('run_command_on_all_nodes'), ''$$;
  CREATE FUNCTION shadow.json_to_recordset(json) RETURNS SETOF record LANGUAGE plpgsql
    AS $$BEGIN PERFORM shadow.fail('json_to_recordset'); END$$;
  CREATE FUNCTION shadow.sum_step(numeric, bigint) RETURNS numeric LANGUAGE sql
    AS $$SELECT 0 WHERE shadow.fail('sum')$$;
  CREATE AGGREGATE shadow.sum(bigint) (sfunc = shadow.sum_step, stype = numeric);
  CREATE VIEW shadow.pg_dist_node AS SELECT * FROM pg_catalog.pg_dist_node WHERE shadow.fail('pg_dist_node');});
is($coordinator->safe_psql('postgres', q{
		SET search_path = shadow, pg_catalog, public;
		SELECT count(*) FROM public.idem_abandoned('jobs', 100);
		SELECT keys_total > 0 FROM public.idem_stats()}),
	"20\nt", '(l) idem_abandoned and idem_stats on the coordinator under a hostile search_path');
$coordinator->safe_psql('postgres', q{
  SET citus.enable_ddl_propagation = off;
  DROP SCHEMA shadow CASCADE;});
my $on_workers = 0;
$on_workers += $_->safe_psql('postgres', q{SELECT count(*) FROM idem_abandoned('jobs', 100)}) for @workers;
is($on_workers, 20, '(l) on the workers, each its own shards\' ones');
$coordinator->safe_psql('postgres',
	join '', map { "SELECT lease_complete('job-$_', $_, 1);\n" } 100 .. 119);

# idem_once in a delegated function, 4 clients consuming the same messages.
$coordinator->safe_psql('postgres', q{
  CREATE TABLE consumed (account bigint, message text);
  SELECT create_distributed_table('consumed', 'account', colocate_with => 'payments');
  CREATE FUNCTION consume(p_message idem_key, p_account bigint) RETURNS boolean
    LANGUAGE plpgsql AS $$
    BEGIN
      IF NOT idem_once('inbox', p_message, route => p_account) THEN RETURN false; END IF;
      INSERT INTO consumed VALUES (p_account, p_message::text);
      RETURN true;
    END $$;
  SELECT create_distributed_function('consume(idem_key, bigint)', 'p_account',
                                     colocate_with => 'payments');});
my $messages = 200;
$coordinator->pgbench('--no-vacuum --client=4 --jobs=2 --transactions=1', 0,
	[qr{processed: 4/4}], [qr{^$}], "(o) 4 clients consume the same $messages messages",
	{ 'idem_citus_o' => join '', map { "SELECT consume('m-$_', $_);\n" } 1 .. $messages });
is($coordinator->safe_psql('postgres', q{
		SELECT count(*), count(DISTINCT message) FROM consumed}),
	"$messages|$messages", "(o) each of $messages messages consumed exactly once");
# idem_once_many (1.4) in a delegated function: an account's messages in batches of 10,
# the batch's route its account's, 4 clients consuming the same batches.
$coordinator->safe_psql('postgres', q{
  CREATE FUNCTION consume_batch(p_messages idem_key[], p_account bigint) RETURNS integer
    LANGUAGE plpgsql AS $$
    DECLARE applied integer;
    BEGIN
      INSERT INTO consumed
        SELECT p_account, u.m::text
        FROM unnest(p_messages, idem_once_many('inbox-batch', p_messages, route => p_account))
               AS u(m, first_time)
        WHERE u.first_time;
      GET DIAGNOSTICS applied = ROW_COUNT;
      RETURN applied;
    END $$;
  SELECT create_distributed_function('consume_batch(idem_key[], bigint)', 'p_account',
                                     colocate_with => 'payments');});
$coordinator->pgbench('--no-vacuum --client=4 --jobs=2 --transactions=1', 0,
	[qr{processed: 4/4}], [qr{^$}], "(o) 4 clients consume the same batches of messages",
	{ 'idem_citus_o_batch' => join '', map {
		my $account = $_;
		# A literal array: Citus delegates a call whose arguments are constants.
		"SELECT consume_batch('{" . join(',', map { "b-$account-$_" } 1 .. 10) . "}', $account);\n"
	} 1 .. 20 });
is($coordinator->safe_psql('postgres', q{
		SELECT count(*), count(DISTINCT message) FROM consumed WHERE message LIKE 'b-%'}),
	'200|200', '(o) each of 200 messages consumed exactly once in batches');

# ---------------------------------------------------------------------------------
# (w) Reaping on the workers, idem_stats
# ---------------------------------------------------------------------------------

$coordinator->safe_psql('postgres', q{
  CREATE FUNCTION short_once(p_message idem_key, p_account bigint) RETURNS boolean
    LANGUAGE plpgsql AS $$
    BEGIN
      RETURN idem_once('short', p_message, ttl => '1 millisecond', route => p_account);
    END $$;
  SELECT create_distributed_function('short_once(idem_key, bigint)', 'p_account',
                                     colocate_with => 'payments');});
$coordinator->safe_psql('postgres', join '', map { "SELECT short_once('s-$_', $_);\n" } 1 .. 100);
my $total = $coordinator->safe_psql('postgres', q{SELECT count(*) FROM idempotency.routed_keys});
my $node_totals = 0;
$node_totals += $_->safe_psql('postgres', q{SELECT keys_total FROM idem_stats()}) for @workers;
is($node_totals, $total, "(w) idem_stats on the workers counts their shards' keys ($total)");
is($coordinator->safe_psql('postgres', q{SELECT keys_total FROM idem_stats()}), $total,
	'(w) idem_stats on the coordinator counts the cluster');
is($coordinator->safe_psql('postgres', q{SELECT sum(keys_total) FROM idem_node_stats()}), $total,
	'(w) idem_node_stats: one row per node, adding up to the cluster');
sleep 1;
my $reaped = 0;
$reaped += $_->safe_psql('postgres', q{SELECT idem_reap()}) for @workers;
is($reaped, 100, '(w) idem_reap on each worker reaps its shards\' expired keys (100)');
is($coordinator->safe_psql('postgres', q{SELECT count(*) FROM idempotency.routed_keys WHERE scope = 'short'}),
	'0', '(w) none left');
# The background worker of each node reaps its shards on its own.
$coordinator->safe_psql('postgres', join '', map { "SELECT short_once('t-$_', $_);\n" } 1 .. 100);
for my $worker (@workers) {
	$worker->safe_psql('postgres', q{
	  ALTER SYSTEM SET idempotency.reaper_enabled = on;
	  ALTER SYSTEM SET idempotency.reaper_naptime = '1s';
	  SELECT pg_reload_conf();});
}
ok($coordinator->poll_query_until('postgres', q{
		SELECT count(*) = 0 FROM idempotency.routed_keys WHERE scope = 'short'}),
	'(w) the workers\' background reapers reap their shards\' expired keys');
for my $worker (@workers) {
	$worker->safe_psql('postgres', q{
	  ALTER SYSTEM RESET idempotency.reaper_enabled; SELECT pg_reload_conf();});
}

# ---------------------------------------------------------------------------------
# (k) A worker killed during load
# ---------------------------------------------------------------------------------

$load = start_load('k', 1000, 10000, 'app');
sleep 2;
$worker1->stop('immediate');
sleep 1;
$worker1->start;
sleep 2;
$errors = stop_load($load);
note('(k) errors the clients met while worker1 was down: ' . describe($errors));
try_as_app(calls('k', 1, 1000, 10000, 50));
is(paid(10000, 1000), '1000|0|0', '(k) a worker killed during load: every key paid once after retries');
is(stored_keys('k'), '1000|0', '(k) no key lost or duplicated');

# ---------------------------------------------------------------------------------
# (i) IK002 when Citus commits on the workers
# ---------------------------------------------------------------------------------

# A delegated procedure that claims and pays but does not finish: the worker's COMMIT
# fails with IK002 and nothing stays. With a write to a reference table too, Citus
# commits in two phases: PREPARE TRANSACTION fails the same way.
$coordinator->safe_psql('postgres', q{
  CREATE TABLE audit (note text);
  SELECT create_reference_table('audit');
  CREATE PROCEDURE pay_unfinished(p_key idem_key, p_account bigint, p_audit boolean)
  LANGUAGE plpgsql AS $$
  BEGIN
    PERFORM idem_claim('payments', p_key, route => p_account);
    INSERT INTO payments(account, amount) VALUES (p_account, 1);
    IF p_audit THEN INSERT INTO audit VALUES (p_key::text); END IF;
  END $$;
  SELECT create_distributed_function('pay_unfinished(idem_key, bigint, boolean)', 'p_account',
                                     colocate_with => 'payments');});
for my $case ([ 'one-phase', 'false', 'i-1', 20001 ], [ 'two-phase', 'true', 'i-2', 20002 ]) {
	my ($name, $audit, $key, $account) = @$case;
	is(sqlstate_of($coordinator, "CALL pay_unfinished('$key', $account, $audit)"), 'IK002',
		"(i) a claim left pending fails the delegated call's commit ($name)");
	is($coordinator->safe_psql('postgres', qq{
			SELECT (SELECT count(*) FROM payments WHERE account = $account)
			     + (SELECT count(*) FROM audit) + (SELECT count(*) FROM idempotency.routed_keys
			                                      WHERE key = '$key')}),
		'0', "(i) and nothing of it stays ($name)");
}

# ---------------------------------------------------------------------------------
# (v) Bad input with a distributed store
# ---------------------------------------------------------------------------------

is(sqlstate_of($coordinator, q{CALL create_payment('v-1', NULL, 1)}), '22023',
	'(v) a NULL route (no routing value) with a distributed store: 22023');
$coordinator->safe_psql('postgres', q{
  CREATE FUNCTION claim_any(p_key idem_key, p_account bigint, p_route text) RETURNS text
    LANGUAGE sql AS $$ SELECT outcome FROM idem_claim('v', p_key, route => p_route) $$;
  SELECT create_distributed_function('claim_any(idem_key, bigint, text)', 'p_account',
                                     colocate_with => 'payments');
  CREATE FUNCTION once_twice(p_key idem_key, p_account bigint, p_other bigint) RETURNS boolean
    LANGUAGE sql AS $$ SELECT idem_once('v', p_key, route => p_account);
                       SELECT idem_once('v', p_key, route => p_other) $$;
  SELECT create_distributed_function('once_twice(idem_key, bigint, bigint)', 'p_account',
                                     colocate_with => 'payments');});
is(sqlstate_of($coordinator, q{SELECT claim_any('v-2', 5, 'five')}), '42804',
	'(v) a route of another type: 42804');
# Two accounts in the same shard, so both calls run where the first is stored.
my ($first, $second) = split /\|/, $coordinator->safe_psql('postgres', q{
	SELECT min(a), max(a) FROM (SELECT a FROM generate_series(1, 1000) a
	  WHERE get_shard_id_for_distribution_column('payments', a::bigint)
	        = get_shard_id_for_distribution_column('payments', 1::bigint) LIMIT 2) s});
is(sqlstate_of($coordinator, "SELECT once_twice('v-3', $first, $second)"), '22023',
	'(v) the same key with another route: 22023');
# Across shards the identity is not checked (docs/citus.md, "One key, two routes"): the
# key under a route of another shard is another key there, and each replays its own.
$coordinator->safe_psql('postgres', q{
  CREATE FUNCTION once_at(p_key idem_key, p_account bigint) RETURNS boolean
    LANGUAGE plpgsql AS $$ BEGIN RETURN idem_once('v', p_key, route => p_account); END $$;
  SELECT create_distributed_function('once_at(idem_key, bigint)', 'p_account',
                                     colocate_with => 'payments');});
my ($here, $there) = split /\|/, $coordinator->safe_psql('postgres', q{
	SELECT min(a) FILTER (WHERE shard = first), min(a) FILTER (WHERE shard <> first)
	FROM (SELECT a, get_shard_id_for_distribution_column('payments', a::bigint) AS shard,
	             get_shard_id_for_distribution_column('payments', 1::bigint) AS first
	      FROM generate_series(1, 1000) a) s});
is(join(',', map { $coordinator->safe_psql('postgres', "SELECT once_at('v-6', $_)") }
		($here, $there, $here, $there)),
	't,t,f,f', '(v) the same key under routes of two shards: a key in each, each replays its own');
is(sqlstate_of($coordinator, q{SELECT idem_once('v', 'v-4')}), '22023',
	'(v) a call without a route on the coordinator of a distributed store: 22023');
is(sqlstate_of($worker1, q{SELECT idem_once('v', 'v-5')}), '22023',
	'(v) and on a worker: 22023, never a node-local key');
is(sqlstate_of($coordinator, q{SELECT idem_undistribute()}), '55000',
	'(v) idem_undistribute while the store holds keys: 55000');

# ---------------------------------------------------------------------------------
# (f) A value's shard found in C from Citus's catalogs, and the lock of a move
# ---------------------------------------------------------------------------------

# The first piece of docs/design-citus.md (sections 3 and 4), through a test hook of
# the library that no extension script declares: which shard holds a value and whether
# it is on this node, from a per-backend cache of Citus's catalogs, and the lock that
# orders a write to that shard with a move.
# Created on the coordinator, which propagates it to the workers.
$coordinator->safe_psql('postgres', q{
  CREATE FUNCTION idem_test_citus_route(regclass, anyelement, boolean)
    RETURNS text AS 'idempotency', 'idem_test_citus_route' LANGUAGE C STRICT;});
my $route_keys = 200;
is($coordinator->safe_psql('postgres', qq{
		SELECT count(*) FROM generate_series(1, $route_keys) a
		WHERE split_part(idem_test_citus_route('payments', a::bigint, false), ' ', 1)::bigint
		      <> get_shard_id_for_distribution_column('payments', a::bigint)}),
	'0', "(f) the shard of each of $route_keys accounts (after the splits) is Citus's");
for my $worker (@workers) {
	my $name = $worker->name;
	my $expected = $coordinator->safe_psql('postgres', sprintf(q{
		SELECT string_agg(a::text, ',' ORDER BY a) FROM generate_series(1, %d) a
		JOIN citus_shards s
		  ON s.shardid = get_shard_id_for_distribution_column('payments', a::bigint)
		WHERE s.nodeport = %d}, $route_keys, $worker->port));
	isnt($expected, '', "(f) $name holds shards of some of the $route_keys accounts");
	is($worker->safe_psql('postgres', qq{
			SELECT string_agg(a::text, ',' ORDER BY a) FROM generate_series(1, $route_keys) a
			WHERE split_part(idem_test_citus_route('payments', a::bigint, false), ' ', 3) = 't'}),
		$expected, "(f) $name: the accounts whose shard is local are those Citus places there");
}
my $wrong_type_err;
$coordinator->psql('postgres', q{SELECT idem_test_citus_route('payments', 1::int, false)},
	stderr => \$wrong_type_err);
like($wrong_type_err, qr/routing value is of type integer, the distribution column of "payments" of type bigint/,
	'(f) a routing value of another type is refused');

# The cache follows a move: a session that looked once looks again after the move.
my $account = $coordinator->safe_psql('postgres', sprintf(q{
	SELECT min(a) FROM generate_series(1, %d) a
	JOIN citus_shards s ON s.shardid = get_shard_id_for_distribution_column('payments', a::bigint)
	WHERE s.nodeport = %d}, $route_keys, $worker1->port));
my $shard = $coordinator->safe_psql('postgres',
	"SELECT get_shard_id_for_distribution_column('payments', ${account}::bigint)");
my $session = $worker1->background_psql('postgres');
is($session->query_safe("SELECT idem_test_citus_route('payments', ${account}::bigint, false)"),
	"$shard " . ($coordinator->safe_psql('postgres', qq{
		SELECT count(*) FROM pg_dist_shard WHERE logicalrelid = 'payments'::regclass
		AND shardminvalue::int < (SELECT shardminvalue::int FROM pg_dist_shard WHERE shardid = $shard)}))
	  . ' t', "(f) worker1: account $account is in local shard $shard");
IdemCitus::move_shard($coordinator, $shard, $worker1->port, $worker2->port, 'block_writes');
like($session->query_safe("SELECT idem_test_citus_route('payments', ${account}::bigint, false)"),
	qr/^$shard \d+ f$/, '(f) worker1, same session, after the move: no longer local');
$session->quit;

# The lock: a transaction on worker2 that routed with the lock makes a move of that
# shard wait until it ends, and then sees the shard gone.
$session = $worker2->background_psql('postgres');
$session->query_safe('BEGIN');
like($session->query_safe("SELECT idem_test_citus_route('payments', ${account}::bigint, true)"),
	qr/^$shard \d+ t$/, '(f) worker2: the shard is local, and its metadata lock taken');
# (The shard moves back: start_move first cleans up the placement the move above left
# on worker1, which Citus's maintenance daemon may be dropping right now.)
my $mover = IdemCitus::start_move($coordinator, $shard, $worker2->port, $worker1->port, 'block_writes');
ok($worker2->poll_query_until('postgres', q{
		SELECT count(*) > 0 FROM pg_locks
		WHERE locktype = 'advisory' AND objsubid = 8 AND mode = 'ExclusiveLock' AND NOT granted}),
	'(f) the move waits for that lock (an ExclusiveLock on the co-located shards metadata tag)');
is($coordinator->safe_psql('postgres',
		"SELECT nodeport FROM citus_shards WHERE shardid = $shard"),
	$worker2->port, '(f) and has not moved the shard while the transaction runs');
$session->query_safe('COMMIT');
IdemCitus::finish_move($mover);
is($coordinator->safe_psql('postgres',
		"SELECT nodeport FROM citus_shards WHERE shardid = $shard"),
	$worker1->port, '(f) once it ended, the move went through');
like($session->query_safe("SELECT idem_test_citus_route('payments', ${account}::bigint, true)"),
	qr/^$shard \d+ f$/, '(f) and the next lookup on worker2 sees the shard gone');
$session->quit;

# The same with a real claim: a lease claim commits on its own, with no business write
# to take Citus's lock for it, so the claim takes it. A move that starts while the
# claim's transaction runs waits for it, and then carries the key along.
my ($lease_account, $lease_port) = split /\|/, $coordinator->safe_psql('postgres', q{
	SELECT a, s.nodeport FROM generate_series(300, 400) a
	JOIN citus_shards s ON s.shardid = get_shard_id_for_distribution_column('payments', a::bigint)
	WHERE s.table_name = 'payments'::regclass ORDER BY a LIMIT 1});
my ($holder) = grep { $_->port == $lease_port } @workers;
my $other_port = $lease_port == $worker1->port ? $worker2->port : $worker1->port;
my $lease_shard = $coordinator->safe_psql('postgres',
	"SELECT get_shard_id_for_distribution_column('payments', ${lease_account}::bigint)");
$session = $holder->background_psql('postgres');
$session->query_safe('BEGIN');
is($session->query_safe(qq{SELECT outcome FROM idem_claim('jobs', 'moving-lease', lease => '1 hour',
                                                            route => ${lease_account}::bigint)}),
	'claimed', "(f) a lease claim on the shard's node, its transaction still open");
$mover = IdemCitus::start_move($coordinator, $lease_shard, $lease_port, $other_port, 'block_writes');
ok($holder->poll_query_until('postgres', q{
		SELECT count(*) > 0 FROM pg_locks
		WHERE locktype = 'advisory' AND objsubid = 8 AND mode = 'ExclusiveLock' AND NOT granted}),
	'(f) a move of its shard waits for the claim\'s transaction');
$session->query_safe('COMMIT');
$session->quit;
IdemCitus::finish_move($mover);
is($coordinator->safe_psql('postgres', "SELECT nodeport FROM citus_shards WHERE shardid = $lease_shard"),
	$other_port, '(f) then the move goes through');
is($coordinator->safe_psql('postgres', qq{
		SELECT state::text || ' ' || attempt FROM idempotency.routed_keys
		WHERE key = 'moving-lease' AND route = $lease_account}),
	'p 1', '(f) and the lease claim committed during it is on the new node');

# ---------------------------------------------------------------------------------
# (n) A session's cache of its shard, dropped and rebuilt 300 times: no memory kept
# ---------------------------------------------------------------------------------

# Each ANALYZE of the shard invalidates its relation, and the next call looks the
# shard's relations up again by name. The names are made per call, not kept.
my ($n_account, $n_shard) = split /\|/, $coordinator->safe_psql('postgres', sprintf(q{
	SELECT a, get_shard_id_for_distribution_column('idempotency.routed_keys', a::bigint)
	FROM generate_series(1, 1000) a
	JOIN citus_shards s
	  ON s.shardid = get_shard_id_for_distribution_column('idempotency.routed_keys', a::bigint)
	WHERE s.nodeport = %d ORDER BY a LIMIT 1}, $worker1->port));
my $memory = q{SELECT total_bytes FROM pg_backend_memory_contexts WHERE name = 'TopMemoryContext';};
my $once = "SELECT idem_once('n', 'n-1', route => $n_account);";
my @memory_lines = split /\n/, $worker1->safe_psql('postgres',
	"SET citus.override_table_visibility = off; $once $once $memory"
	. "ANALYZE idempotency.routed_keys_$n_shard; $once" x 300 . $memory);
is(scalar @memory_lines, 304, '(n) 302 calls and two looks at the memory');
cmp_ok($memory_lines[-1] - $memory_lines[2], '<', 8192,
	"(n) the session's top memory grew by less than 8 kB over 300 rebuilds of the shard's cache "
	. "($memory_lines[2] -> $memory_lines[-1] bytes)");

# ---------------------------------------------------------------------------------
# (m) amcheck on every shard of the store
# ---------------------------------------------------------------------------------

IdemCheck::amcheck_routed_keys($coordinator, @workers);

# ---------------------------------------------------------------------------------
# (g) The store distributed by hand: refused, never written node-locally
# ---------------------------------------------------------------------------------

# Citus accepts distributing idempotency.keys by hand. The library must not go on
# writing a node's own table then (a retry routed elsewhere would not see the key):
# every call fails, on the coordinator and in delegated calls, and pays nothing.
$coordinator->safe_psql('postgres', q{
  SELECT create_distributed_table('idempotency.keys', 'scope', colocate_with => 'none')});
$rows_before = $coordinator->safe_psql('postgres', 'SELECT count(*) FROM payments');
for my $call (
	[ 'delegated', "CALL create_payment('f-1', 9001, 40);" ],
	[ 'in a block', "BEGIN; CALL create_payment('f-2', 9002, 40); COMMIT;" ])
{
	($stdout, $stderr) = ('', '');
	$coordinator->psql('postgres', "\\set VERBOSITY verbose\n$call->[1]",
		stdout => \$stdout, stderr => \$stderr, on_error_stop => 1);
	like($stderr, qr/0A000: the key store idempotency.keys is distributed with Citus/,
		"(g) store distributed by hand: a CALL $call->[0] fails with 0A000");
	note("(g) $call->[0]: " . join(' / ', grep { /ERROR|while executing/ } split /\n/, $stderr));
}
is($coordinator->safe_psql('postgres', 'SELECT count(*) FROM payments'), $rows_before,
	'(g) and pays nothing');
# undistribute_table refuses a table that belongs to an extension: take it out of the
# extension for the time of the call.
$coordinator->safe_psql('postgres', q{
  ALTER EXTENSION idempotency DROP TABLE idempotency.keys;
  SELECT undistribute_table('idempotency.keys');
  ALTER EXTENSION idempotency ADD TABLE idempotency.keys;});
$coordinator->safe_psql('postgres', q{CALL create_payment('f-3', 9003, 40)});
is(paid(9002, 1), '1|0|0', '(g) undistributed again: the store works as before');

# Messaging with a distributed store, never stored node-locally: without a route,
# 22023 (test/t/026_citus_messaging.pl: with one; the relay: 028_citus_relay.pl).
for my $call ([ 'idem_emit', q{SELECT idem_emit('orders', '{}')},
	  qr/22023: the key store is distributed: idem_emit needs the routing value/ ],
	[ 'idem_apply_version', q{SELECT idem_apply_version('orders', 'order-2', 1)},
	  qr/22023: the key store is distributed: idem_apply_version needs the routing value/ ]) {
	($stdout, $stderr) = ('', '');
	$worker1->psql('postgres', "\\set VERBOSITY verbose\n$call->[1]",
		stdout => \$stdout, stderr => \$stderr);
	like($stderr, $call->[2], "(g) $call->[0] with a distributed key store, without a route: refused");
}

# ---------------------------------------------------------------------------------
# (u) Undistributing
# ---------------------------------------------------------------------------------

$coordinator->safe_psql('postgres', q{DELETE FROM idempotency.routed_keys});
$coordinator->safe_psql('postgres', q{SELECT idem_undistribute()});
is($coordinator->safe_psql('postgres', q{SELECT to_regclass('idempotency.routed_keys') IS NULL}),
	't', '(u) idem_undistribute of an empty store drops the distributed store');
is(sqlstate_of($worker1, q{SELECT idem_once('u', 'u-1', route => 1::bigint)}), '55000',
	'(u) then a route is refused on the workers too (55000)');
is($worker1->safe_psql('postgres', q{SELECT idem_once('u', 'u-1')}), 't',
	'(u) and the node-local store works again');

# Distributing again while the node-local outbox holds an event not delivered: refused
# (the relay would then serve the shards only); once it is relayed, distributed.
$coordinator->safe_psql('postgres', q{SELECT idem_emit('early', '{}')});
is(sqlstate_of($coordinator, q{SELECT idem_distribute('payments')}), '55000',
	'(u) idem_distribute with an undelivered event in the node-local outbox: 55000');
is($coordinator->safe_psql('postgres', q{
		SELECT idem_outbox_ack('r', array_agg(event_id)) FROM idem_outbox_claim('r')}), '1',
	'(u) the event relayed from the node-local outbox');
$coordinator->safe_psql('postgres', q{SELECT idem_distribute('payments')});
is($coordinator->safe_psql('postgres', q{SELECT to_regclass('idempotency.routed_outbox') IS NOT NULL}),
	't', '(u) then idem_distribute distributes the store again');

$_->stop for @nodes;
done_testing();
