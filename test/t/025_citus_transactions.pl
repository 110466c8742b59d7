# Key functions in the caller's transaction block on the Citus coordinator (SPEC v1.3,
# "Scale-out with Citus"; issue 34): a coordinator and two workers, `payments`
# distributed by `account` in 4 shards, the key store distributed with it, and the
# README's procedure distributed by its account. A key function called on the
# coordinator, whose shard is on a worker, runs there through Citus inside the
# caller's transaction. Every scenario counts payments and keys per key.
#
#   (t) BEGIN; idem_claim; INSERT; idem_complete; COMMIT with literal values, 4
#       concurrent duplicates per key: one payment and one key each, no error;
#   (p) the same with bound parameters (extended protocol, prepared statements,
#       plan_cache_mode = force_generic_plan);
#   (c) CALL of the distributed procedure inside BEGIN, 4 duplicates per key;
#   (r) retries of all of them, in blocks and delegated: replays, nothing paid again;
#   (i) a claim left pending at COMMIT: IK002 (one phase, two phases, a finish rolled
#       back to a savepoint), nothing stored on the worker;
#   (w) the same block on a worker, for a shard of the other worker;
#   (x) a business write that fails after the claim: nothing stored, the retry pays;
#   (v) NULL routing values of any type: 22023; a mistyped one: 42804; idem_lookup,
#       idem_once, idem_once_many, idem_forget, idem_checkpoint and idem_release
#       forwarded too;
#   (s) shard moves (block_writes, force_logical) during an open transaction block,
#       the transaction first and the move first; a worker stopped between claim and
#       COMMIT: per key a payment exactly when its key is completed, retries replay;
#   (m) amcheck on every shard of the store;
#   (u) a store distributed with 1.3 updated to the newest version: keys kept, blocks
#       work, the routed messaging tables made (emit, relay), the twins executable by
#       PUBLIC.
#
# Needs Citus installed in the PostgreSQL under test, like 017_citus.pl (IDEM_CITUS).
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::RealBin/lib";
use IdemCheck;
use IdemCitus;

IdemCitus::require_citus();

my $keys = $ENV{IDEM_CITUS_TX_KEYS} // 50;

# ---------------------------------------------------------------------------------
# The cluster (as 017_citus.pl)
# ---------------------------------------------------------------------------------

my ($coordinator, $worker1, $worker2) = IdemCitus::start_cluster();
my @nodes = ($coordinator, $worker1, $worker2);
my @workers = ($worker1, $worker2);
$coordinator->safe_psql('postgres', 'SET citus.shard_count = 4;'
	  . PostgreSQL::Test::Utils::slurp_file("$FindBin::RealBin/../../examples/create_payment_citus.sql"));
$coordinator->safe_psql('postgres', q{
  CREATE ROLE app LOGIN;
  GRANT ALL ON payments TO app; GRANT USAGE ON SEQUENCE payments_id_seq TO app;
  CREATE TABLE audit (note text);
  SELECT create_reference_table('audit');
  GRANT ALL ON audit TO app;});
is($coordinator->safe_psql('postgres', q{
		SELECT count(*) FROM pg_dist_object o JOIN pg_proc p ON p.oid = o.objid
		WHERE p.proname LIKE 'idem\_%\_routed' AND o.force_delegation
		  AND p.proargnames[o.distribution_argument_index + 1] = 'route'}),
	'16', 'idem_distribute distributed the 16 routed twins (9 key functions, idem_emit, idem_apply_version, the 5 relay functions), by their route, force-delegated');
is($coordinator->safe_psql('postgres', q{
		SELECT count(*) FROM citus_shards
		WHERE table_name = 'idempotency.routed_keys'::regclass AND nodeport <> }
		  . $coordinator->port),
	'4', 'no shard of the key store on the coordinator: every call there is forwarded');

# ---------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------

# "once|twice_or_more|none" over the accounts $base + 1 .. $base + $n.
sub paid {
	my ($base, $n) = @_;
	return $coordinator->safe_psql('postgres', qq{
		SELECT count(*) FILTER (WHERE c = 1), count(*) FILTER (WHERE c > 1), $n - count(*)
		FROM (SELECT account, count(*) AS c FROM payments
		      WHERE account BETWEEN $base + 1 AND $base + $n GROUP BY account) p});
}

# Keys stored with a key prefix: "in the distributed store|in any node's idempotency.keys".
sub stored_keys {
	my ($prefix) = @_;
	my $local = 0;
	$local += $_->safe_psql('postgres', qq{
		SELECT count(*) FROM idempotency.keys WHERE key::text LIKE '$prefix-%'}) for @nodes;
	return $coordinator->safe_psql('postgres', qq{
		SELECT count(*) FROM idempotency.routed_keys WHERE key::text LIKE '$prefix-%'}) . "|$local";
}

sub sqlstate_of {
	my ($sql, $user) = @_;
	my ($out, $err) = ('', '');
	$coordinator->psql('postgres', "\\set VERBOSITY verbose\n$sql", stdout => \$out,
		stderr => \$err, extra_params => [ '-U', $user // 'app' ]);
	return $err =~ /ERROR:\s+([0-9A-Z]{5}):/ ? $1 : "no error ($out)";
}

sub as_app { return $coordinator->safe_psql('postgres', $_[0], extra_params => [ '-U', 'app' ]) }

# The transaction block of an application for key "$prefix-$i" and account $base + $i,
# in literal values: pays only when it claimed, as the application would.
sub block {
	my ($prefix, $i, $base) = @_;
	my $account = $base + $i;
	return qq{BEGIN;
SELECT (outcome = 'claimed')::int AS claimed FROM idem_claim('payments', '$prefix-$i', route => $account) \\gset
\\if :claimed
INSERT INTO payments(account, amount) VALUES ($account, 10);
SELECT idem_complete('payments', '$prefix-$i', jsonb_build_object('paid', $account), route => $account);
\\endif
COMMIT;
};
}

# ---------------------------------------------------------------------------------
# (t) The transaction block with literal values, 4 duplicates per key
# ---------------------------------------------------------------------------------

# Four clients run the same blocks in the same order: each key's duplicates arrive
# together, one claims, the others wait for its COMMIT (rule 4) and replay.
$coordinator->pgbench(
	'--no-vacuum --client=4 --jobs=2 --transactions=1 --username=app',
	0, [qr{processed: 4/4}], [qr{^$}],
	"(t) 4 clients x $keys blocks on the coordinator (literal values): no error",
	{ 'idem_tx_t' => join('', map { block('t', $_, 0) } 1 .. $keys) });
is(paid(0, $keys), "$keys|0|0", "(t) each of $keys keys paid exactly once");
is(stored_keys('t'), "$keys|0", "(t) $keys keys, all in the distributed store, none node-local");
is($coordinator->safe_psql('postgres', q{
		SELECT count(*) FROM idempotency.routed_keys k JOIN payments p ON p.account = k.route
		WHERE k.key::text = 't-' || p.account AND k.state = 'c'
		  AND k.response = jsonb_build_object('paid', p.account) AND k.role::text = 'app'}),
	$keys, '(t) each key completed beside its payment, with its response and role');

# ---------------------------------------------------------------------------------
# (p) Bound parameters, generic plans
# ---------------------------------------------------------------------------------

# pgbench's extended protocol with prepared statements: each statement is prepared
# once per client and executed with the key and account as parameters; the generic
# plan is forced.
my $base_p = 1000;
my $script_p = "SET plan_cache_mode = force_generic_plan;\n" . join('', map {
	qq{\\set k $_
\\set account $base_p + :k
BEGIN;
SELECT (outcome = 'claimed')::int AS claimed FROM idem_claim('payments', ('p-' || :k)::idem_key, route => :account::bigint) \\gset
\\if :claimed
INSERT INTO payments(account, amount) VALUES (:account::bigint, 20);
SELECT idem_complete('payments', ('p-' || :k)::idem_key, jsonb_build_object('paid', :account::bigint), route => :account::bigint);
\\endif
COMMIT;
}
} 1 .. $keys);
$coordinator->pgbench(
	'--no-vacuum --client=4 --jobs=2 --transactions=1 --protocol=prepared --username=app',
	0, [qr{processed: 4/4}], [qr{^$}],
	"(p) 4 clients x $keys blocks with bound parameters, generic plans: no error",
	{ 'idem_tx_p' => $script_p });
is(paid($base_p, $keys), "$keys|0|0", "(p) each of $keys keys paid exactly once");
is(stored_keys('p'), "$keys|0", "(p) $keys keys in the distributed store");

# ---------------------------------------------------------------------------------
# (c) CALL of the distributed procedure inside BEGIN
# ---------------------------------------------------------------------------------

# Citus does not delegate a CALL inside a transaction block (commands/call.c): the
# procedure runs on the coordinator, and its key functions are forwarded.
my $base_c = 2000;
$coordinator->pgbench(
	'--no-vacuum --client=4 --jobs=2 --transactions=1 --username=app',
	0, [qr{processed: 4/4}], [qr{^$}],
	"(c) 4 clients x $keys CALLs inside BEGIN on the coordinator: no error",
	{ 'idem_tx_c' => join('', map {
		sprintf("BEGIN;\nCALL create_payment('c-%d', %d, 30);\nCOMMIT;\n", $_, $base_c + $_) } 1 .. $keys) });
is(paid($base_c, $keys), "$keys|0|0", "(c) each of $keys keys paid exactly once");
is(stored_keys('c'), "$keys|0", "(c) $keys keys in the distributed store");

# ---------------------------------------------------------------------------------
# (r) Retries anywhere replay
# ---------------------------------------------------------------------------------

my $replayed = as_app(join('', map {
	sprintf("BEGIN;\nCALL create_payment('c-%d', %d, 30);\nCOMMIT;\n", $_, $base_c + $_) } 1 .. $keys));
is($replayed, $coordinator->safe_psql('postgres', qq{
		SELECT string_agg(jsonb_build_object('payment_id', id, 'amount', amount)::text, E'\\n' ORDER BY account)
		FROM payments WHERE account BETWEEN $base_c + 1 AND $base_c + $keys}),
	'(r) the CALLs retried in blocks: each replays its payment');
is(paid($base_c, $keys), "$keys|0|0", '(r) nothing paid again');
as_app(join('', map { sprintf("CALL create_payment('c-%d', %d, 30);\n", $_, $base_c + $_) } 1 .. $keys));
is(paid($base_c, $keys), "$keys|0|0", '(r) and retried delegated (outside a block): replays');
is(as_app(q{BEGIN; SELECT outcome, response FROM idem_claim('payments', 't-7', route => 7); COMMIT;}),
	'replay|{"paid": 7}', '(r) a block retried: replay, with the stored response');
is(as_app(qq{
		SELECT string_agg(DISTINCT outcome, ',') FROM generate_series(1, $keys) i,
		  LATERAL idem_claim('payments', ('p-' || i)::idem_key, route => $base_p + i)}),
	'replay', '(r) the parameterised keys, claimed again in one statement: replays');
is(paid(0, $keys) . ' ' . paid($base_p, $keys), "$keys|0|0 $keys|0|0", '(r) nothing paid twice');

# ---------------------------------------------------------------------------------
# (i) A claim left pending at COMMIT
# ---------------------------------------------------------------------------------

# Two accounts on different workers, for a transaction that Citus commits in two phases.
my ($acc1, $acc2) = split /\|/, $coordinator->safe_psql('postgres', sprintf(q{
	SELECT min(a) FILTER (WHERE port = %d), min(a) FILTER (WHERE port = %d)
	FROM (SELECT a, (SELECT nodeport FROM citus_shards s
	                 WHERE s.shardid = get_shard_id_for_distribution_column('payments', a::bigint)
	                   AND s.table_name = 'payments'::regclass) AS port
	      FROM generate_series(3001, 3100) a) x}, $worker1->port, $worker2->port));
my %pending = (
	'one phase' => "BEGIN; SELECT idem_claim('payments', 'i-1', route => $acc1);
	                INSERT INTO payments(account, amount) VALUES ($acc1, 1); COMMIT;",
	'two phases, two workers' => "BEGIN; SELECT idem_claim('payments', 'i-2', route => $acc1);
	                INSERT INTO payments(account, amount) VALUES ($acc1, 1);
	                INSERT INTO payments(account, amount) VALUES ($acc2, 1); COMMIT;",
	'two phases, a reference table' => "BEGIN; SELECT idem_claim('payments', 'i-3', route => $acc2);
	                INSERT INTO audit VALUES ('i-3'); COMMIT;",
	'a finish rolled back to a savepoint' => "BEGIN; SELECT idem_claim('payments', 'i-4', route => $acc2);
	                INSERT INTO payments(account, amount) VALUES ($acc2, 1); SAVEPOINT s;
	                SELECT idem_complete('payments', 'i-4', route => $acc2);
	                ROLLBACK TO SAVEPOINT s; COMMIT;",
	'a claim made in a savepoint released into the transaction' => "BEGIN; SAVEPOINT s;
	                SELECT idem_claim('payments', 'i-5', route => $acc1); RELEASE SAVEPOINT s; COMMIT;",
	'a second claim left pending' => "BEGIN; SELECT idem_claim('payments', 'i-6', route => $acc1);
	                SELECT idem_claim('payments', 'i-7', route => $acc2);
	                SELECT idem_complete('payments', 'i-6', route => $acc1); COMMIT;");
for my $case (sort keys %pending) {
	my ($out, $err) = ('', '');
	$coordinator->psql('postgres', "\\set VERBOSITY verbose\n$pending{$case}", stdout => \$out,
		stderr => \$err, extra_params => [ '-U', 'app' ]);
	like($err, qr/ERROR:  IK002: idempotency key "i-\d" in scope "payments" was claimed but not finished/,
		"(i) $case: IK002 at COMMIT");
	unlike($err, qr/WARNING|XX000/, "(i) $case: no WARNING, no XX000");
}
is($coordinator->safe_psql('postgres', qq{
		SELECT (SELECT count(*) FROM payments WHERE account IN ($acc1, $acc2))
		     + (SELECT count(*) FROM audit)}),
	'0', '(i) nothing of them stays');
is(stored_keys('i'), '0|0', '(i) and no key is stored');
# A savepoint rolled back with its claim: nothing to finish; with its finish kept.
is(as_app(qq{BEGIN; SAVEPOINT s; SELECT 1 FROM idem_claim('payments', 'i-8', route => $acc1);
		ROLLBACK TO SAVEPOINT s; COMMIT;
		BEGIN; SELECT 2 FROM idem_claim('payments', 'i-9', route => $acc2); SAVEPOINT s;
		SELECT 3 FROM idem_complete('payments', 'i-9', '{}', route => $acc2); RELEASE SAVEPOINT s; COMMIT;
		SELECT count(*) FROM idem_lookup('payments', 'i-8', route => $acc1);
		SELECT state FROM idem_lookup('payments', 'i-9', route => $acc2);}),
	"1\n2\n3\n0\ncompleted",
	'(i) a claim rolled back to its savepoint commits nothing; a finish released into the transaction counts');

# A claim forwarded from the coordinator and finished by a function Citus delegates
# inside the block (force_delegation): it runs on the worker, in the same worker
# transaction, so the key is not pending at COMMIT.
$coordinator->safe_psql('postgres', q{
  CREATE FUNCTION finish_at(p_key idem_key, p_account bigint) RETURNS boolean
    LANGUAGE plpgsql AS $$
    BEGIN PERFORM idem_complete('payments', p_key, '{"by": "finish_at"}', route => p_account);
          RETURN true; END $$;
  SELECT create_distributed_function('finish_at(idem_key, bigint)', 'p_account',
                                     colocate_with => 'payments', force_delegation => true);});
is(as_app(qq{BEGIN; SELECT outcome FROM idem_claim('payments', 'i-10', route => $acc1);
		INSERT INTO payments(account, amount) VALUES ($acc1, 3);
		SELECT * FROM finish_at('i-10', $acc1); COMMIT;
		SELECT state, response FROM idem_lookup('payments', 'i-10', route => $acc1);}),
	qq{claimed\nt\ncompleted|{"by": "finish_at"}},
	'(i) a forwarded claim finished by a delegated function in the block: no IK002, committed');
$coordinator->safe_psql('postgres', "DELETE FROM payments WHERE account = $acc1");

# ---------------------------------------------------------------------------------
# (w) The block on a worker, for an account whose shard is on the other worker
# ---------------------------------------------------------------------------------

my ($acc_w) = split /\|/, $coordinator->safe_psql('postgres', sprintf(q{
	SELECT min(a) FROM generate_series(6001, 6100) a
	JOIN citus_shards s ON s.shardid = get_shard_id_for_distribution_column('payments', a::bigint)
	WHERE s.table_name = 'payments'::regclass AND s.nodeport = %d}, $worker2->port));
my $block_w = qq{BEGIN; SELECT outcome FROM idem_claim('payments', 'w-1', route => $acc_w);
	INSERT INTO payments(account, amount) VALUES ($acc_w, 9);
	SELECT 1 FROM idem_complete('payments', 'w-1', '{"w": 1}', route => $acc_w); COMMIT;};
is($worker1->safe_psql('postgres', $block_w, extra_params => [ '-U', 'app' ]), "claimed\n1",
	'(w) a block on worker1 for a shard of worker2: claimed and completed');
is($worker1->safe_psql('postgres', qq{BEGIN; SELECT outcome, response FROM idem_claim('payments', 'w-1', route => $acc_w); COMMIT;},
		extra_params => [ '-U', 'app' ]),
	'replay|{"w": 1}', '(w) retried there: replay');
is($coordinator->safe_psql('postgres', qq{
		SELECT (SELECT count(*) FROM payments WHERE account = $acc_w) || '|'
		    || (SELECT count(*) FROM idempotency.routed_keys WHERE key = 'w-1' AND state = 'c')}),
	'1|1', '(w) one payment, its key completed on worker2');

# ---------------------------------------------------------------------------------
# (x) The business write fails after the claim
# ---------------------------------------------------------------------------------

my ($out, $err) = ('', '');
$coordinator->psql('postgres', qq{BEGIN;
	SELECT idem_claim('payments', 'x-1', route => $acc1);
	INSERT INTO payments(account, amount) VALUES ($acc1, 'not a number');
	COMMIT;}, stdout => \$out, stderr => \$err, extra_params => [ '-U', 'app' ]);
is(stored_keys('x'), '0|0', '(x) a failed business write: the claim goes with it');
is(as_app(qq{BEGIN; SELECT outcome FROM idem_claim('payments', 'x-1', route => $acc1);
		INSERT INTO payments(account, amount) VALUES ($acc1, 5);
		SELECT idem_complete('payments', 'x-1', route => $acc1); COMMIT;}),
	"claimed\n", '(x) the retry claims it afresh');
is($coordinator->safe_psql('postgres', "SELECT count(*) FROM payments WHERE account = $acc1"), '1',
	'(x) and pays once');

# ---------------------------------------------------------------------------------
# (v) Routing values, and the other key functions
# ---------------------------------------------------------------------------------

for my $null ('NULL', 'NULL::bigint', 'NULL::text', 'NULL::uuid', 'NULL::numeric') {
	is(sqlstate_of("BEGIN; SELECT idem_claim('payments', 'v-1', route => $null); COMMIT;"), '22023',
		"(v) a routing value $null: 22023");
}
is(sqlstate_of("SELECT idem_complete('payments', 'v-1', route => NULL::text)"), '22023',
	'(v) idem_complete with a NULL route: 22023');
for my $mistyped (q{'abc'::text}, q{now()}, q{gen_random_uuid()}, q{'{}'::jsonb}) {
	is(sqlstate_of("BEGIN; SELECT idem_claim('payments', 'v-1', route => $mistyped); COMMIT;"),
		'42804', "(v) a routing value $mistyped: 42804");
}
is(sqlstate_of(q{SELECT idem_once('payments', 'v-0', route => 5::smallint)}), 'no error (t)',
	'(v) a smallint route, cast as an implicit cast would: accepted');
is(sqlstate_of(q{SELECT idem_claim_routed('payments', 'v-2', NULL, NULL, NULL, NULL, NULL::bigint, NULL)}),
	'22023', '(v) a twin called with a NULL route: 22023');
is(stored_keys('v'), '1|0', '(v) nothing stored but the key of idem_once');
is(as_app(qq{BEGIN;
		SELECT idem_once('payments', 'v-3', route => $acc1), idem_once('payments', 'v-3', route => $acc1);
		SELECT outcome FROM idem_claim('payments', 'v-4', lease => '1 min', route => $acc2);
		SELECT idem_checkpoint('payments', 'v-4', 'half', '{"n": 1}', route => $acc2);
		SELECT state, checkpoint, checkpoint_data FROM idem_lookup('payments', 'v-4', route => $acc2);
		SELECT idem_release('payments', 'v-4', route => $acc2);
		SELECT count(*) FROM idem_lookup('payments', 'v-4', route => $acc2);
		SELECT idem_forget('payments', 'v-3', route => $acc1), idem_forget('payments', 'v-3', route => $acc1);
		COMMIT;}),
	"t|f\nclaimed\n\npending|half|{\"n\": 1}\n\n0\nt|f",
	'(v) idem_once, a lease claim, idem_checkpoint, idem_lookup, idem_release, idem_forget in a block');
is(as_app(qq{SELECT idem_once('payments', 'v-5', route => $acc1);
		SELECT outcome FROM idem_claim('payments', 'v-5', route => $acc1)}),
	"t\nreplay", '(v) idem_once on the coordinator outside a block, then a claim: replay');
is(as_app(qq{BEGIN;
		SELECT idem_once_many('inbox', '{m-1,m-2,m-1}', route => $acc1);
		SELECT idem_once_many('inbox', '{m-2,m-3}', route => $acc1);
		COMMIT;
		SELECT idem_once_many('inbox', '{m-3,m-1}', route => $acc1);
		SELECT idem_once('inbox', 'm-2', route => $acc1)}),
	"{t,t,f}\n{f,t}\n{f,f}\nf",
	'(v) idem_once_many in a block and after it: each message once, a repeat false');

# The session's defaults go with a forwarded call: idempotency.default_ttl and
# wait_timeout set on the coordinator hold on the worker.
is(as_app(qq{SET idempotency.default_ttl = '1h';
		BEGIN; SELECT expires_at < now() + interval '2 hours' FROM idem_claim('payments', 'v-6', route => $acc1);
		SELECT 1 FROM idem_complete('payments', 'v-6', route => $acc1); COMMIT;}),
	"t\n1", '(v) a forwarded claim takes its dedup window from the coordinator session');
my $holder_v = $coordinator->background_psql('postgres', extra_params => [ '-U', 'app' ]);
$holder_v->query_safe(qq{BEGIN; SELECT idem_claim('payments', 'v-7', route => $acc1);});
is(as_app(qq{SET idempotency.wait_timeout = '200ms';
		SELECT outcome, retry_after < interval '3 s' FROM idem_claim('payments', 'v-7', route => $acc1);}),
	'in_progress|t', '(v) a forwarded claim waits as long as the coordinator session says');
$holder_v->query_safe('ROLLBACK');
$holder_v->quit;

# ---------------------------------------------------------------------------------
# (s) Shard moves and a worker killed during an open transaction on the coordinator
# ---------------------------------------------------------------------------------

# The shard of an account and the port of its node.
sub shard_of {
	my ($account) = @_;
	return split /\|/, $coordinator->safe_psql('postgres', qq{
		SELECT shardid, nodeport FROM citus_shards
		WHERE table_name = 'payments'::regclass
		  AND shardid = get_shard_id_for_distribution_column('payments', ${account}::bigint)});
}

sub other_port { return $_[0] == $worker1->port ? $worker2->port : $worker1->port }

# Locks waited for on any node: something is blocked.
sub waiting_locks {
	my $n = 0;
	$n += $_->safe_psql('postgres', 'SELECT count(*) FROM pg_locks WHERE NOT granted') for @nodes;
	return $n;
}

sub poll_until_waiting {
	my ($more_than, $what) = @_;
	my $deadline = time + $PostgreSQL::Test::Utils::timeout_default;
	while (waiting_locks() <= $more_than) {
		if (time > $deadline) { fail("timed out waiting for $what"); return; }
		select(undef, undef, undef, 0.05);
	}
	pass("$what waits");
}

# The block of key s-$n for $account, as four statements (the last, COMMIT).
sub block_steps {
	my ($n, $account) = @_;
	return (qq{BEGIN; SELECT outcome FROM idem_claim('payments', 's-$n', route => $account);},
		qq{INSERT INTO payments(account, amount) VALUES ($account, 70);},
		qq{SELECT 1 FROM idem_complete('payments', 's-$n', '{"s": $n}', route => $account);}, 'COMMIT;');
}

# A move of the shard to the other worker in the background: IdemCitus cleans up what
# earlier moves left first (a shard may move back here), and finish_move ends the test
# with the mover's error should it fail.
sub start_move {
	my ($shard, $from, $mode) = @_;
	return IdemCitus::start_move($coordinator, $shard, $from, other_port($from), $mode);
}

# Per key s-$n: one payment of $account and its key completed, or neither; then a
# retry in a block replays, from wherever the shard is now.
sub check_key {
	my ($n, $account, $what) = @_;
	is($coordinator->safe_psql('postgres', qq{
			SELECT (SELECT count(*) FROM payments WHERE account = $account) || '|'
			    || (SELECT count(*) FROM idempotency.routed_keys WHERE key = 's-$n' AND state = 'c')}),
		'1|1', "$what: one payment, its key completed");
	is(as_app(qq{BEGIN; SELECT outcome, response FROM idem_claim('payments', 's-$n', route => $account); COMMIT;}),
		qq{replay|{"s": $n}}, "$what: a retry replays");
}

my $s = 0;
for my $mode ('block_writes', 'force_logical') {
	# The transaction first: it holds the key's shard's metadata lock (and Citus's
	# own on the worker); the move waits for its COMMIT and carries key and payment.
	$s++;
	my $account = 4000 + $s;
	my ($shard, $from) = shard_of($account);
	my @steps = block_steps($s, $account);
	my $tx = $coordinator->background_psql('postgres', extra_params => [ '-U', 'app' ]);
	is($tx->query_safe($steps[0]), 'claimed', "(s) $mode, transaction first: claimed");
	$tx->query_safe($steps[1]);
	my $before = waiting_locks();
	my $mover = start_move($shard, $from, $mode);
	poll_until_waiting($before, "(s) $mode, transaction first: the move");
	$tx->query_safe($steps[2]);
	$tx->query_safe($steps[3]);
	$tx->quit;
	IdemCitus::finish_move($mover);
	is((shard_of($account))[1], other_port($from), "(s) $mode, transaction first: the shard moved");
	check_key($s, $account, "(s) $mode, transaction first");

	# The move first: held up on the source worker (a lock on the payments shard)
	# while the transaction starts; then let go.
	$s++;
	$account = 4000 + $s;
	($shard, $from) = shard_of($account);
	@steps = block_steps($s, $account);
	my ($source) = grep { $_->port == $from } @workers;
	my $holder = $source->background_psql('postgres');
	$holder->query_safe("SET citus.enable_manual_changes_to_shards = on; BEGIN; LOCK TABLE payments_$shard IN ACCESS EXCLUSIVE MODE;");
	$before = waiting_locks();
	$mover = start_move($shard, $from, $mode);
	poll_until_waiting($before, "(s) $mode, move first: the move");
	$before = waiting_locks();
	$tx = $coordinator->background_psql('postgres', extra_params => [ '-U', 'app' ], on_error_stop => 0);
	$tx->query_until(qr/paying/, "\\echo paying\n" . join("\n", @steps) . "\n\\echo paid\n");
	poll_until_waiting($before, "(s) $mode, move first: the transaction");
	$holder->query_safe('COMMIT;');
	$holder->quit;
	IdemCitus::finish_move($mover);
	$tx->quit;
	is((shard_of($account))[1], other_port($from), "(s) $mode, move first: the shard moved");
	check_key($s, $account, "(s) $mode, move first");
}

# A worker stopped (immediate) between the claim and the COMMIT, then restarted: the
# whole transaction is lost, key and payment alike; the retry pays once.
$s++;
my $account_k = 4000 + $s;
my (undef, $port_k) = shard_of($account_k);
my ($victim) = grep { $_->port == $port_k } @workers;
my @steps = block_steps($s, $account_k);
my $tx = $coordinator->background_psql('postgres', extra_params => [ '-U', 'app' ], on_error_stop => 0);
is($tx->query_safe($steps[0]), 'claimed', '(s) worker killed: claimed');
$tx->query_safe($steps[1]);
$victim->stop('immediate');
$tx->query($steps[2]);
$tx->query($steps[3]);
$tx->quit;
$victim->start;
is($coordinator->safe_psql('postgres', qq{
		SELECT (SELECT count(*) FROM payments WHERE account = $account_k) || '|'
		    || (SELECT count(*) FROM idempotency.routed_keys WHERE key = 's-$s')}),
	'0|0', '(s) worker killed between claim and COMMIT: neither payment nor key');
as_app(join("\n", @steps));
check_key($s, $account_k, '(s) worker killed, then retried');

# ---------------------------------------------------------------------------------
# (m) amcheck on every shard of the store
# ---------------------------------------------------------------------------------

IdemCheck::amcheck_routed_keys($coordinator, @workers);

# ---------------------------------------------------------------------------------
# (u) A store distributed with 1.3, updated to the newest version
# ---------------------------------------------------------------------------------

# A database of its own on every node, with Citus and the extension at 1.3: the keys
# its delegated calls stored are kept by ALTER EXTENSION ... UPDATE on the
# coordinator, which makes the twins; blocks then replay them and pay new keys.
for my $node (@nodes) {
	$node->safe_psql('postgres', 'CREATE DATABASE upgraded');
	$node->safe_psql('upgraded', 'CREATE EXTENSION citus');
}
sub on_upgraded { my ($node, $sql, @rest) = @_; return $node->safe_psql('upgraded', $sql, @rest) }
on_upgraded($coordinator, sprintf(
	q{SELECT citus_set_coordinator_host('127.0.0.1', %d);
	  SELECT citus_add_node('127.0.0.1', %d); SELECT citus_add_node('127.0.0.1', %d);
	  CREATE EXTENSION idempotency VERSION '1.3';},
	$coordinator->port, $worker1->port, $worker2->port));
on_upgraded($coordinator, 'SET citus.shard_count = 4;'
	  . PostgreSQL::Test::Utils::slurp_file("$FindBin::RealBin/../../examples/create_payment_citus.sql")
	  . q{GRANT ALL ON payments TO app; GRANT USAGE ON SEQUENCE payments_id_seq TO app;});
my $u_keys = 20;
on_upgraded($coordinator, join('', map { "CALL create_payment('u-$_', $_, 40);\n" } 1 .. $u_keys),
	extra_params => [ '-U', 'app' ]);
($out, $err) = ('', '');
$coordinator->psql('upgraded', "\\set VERBOSITY verbose\nBEGIN; CALL create_payment('u-new-1', 1001, 40); COMMIT;",
	stdout => \$out, stderr => \$err, extra_params => [ '-U', 'app' ]);
like($err, qr/IK006: .*_routed, which takes the call there, does not exist.*\n.*\nHINT:  Run ALTER EXTENSION idempotency UPDATE/s,
	'(u) 1.3 schema under the 1.4 library: a block on the coordinator fails with IK006, hint to update');
on_upgraded($coordinator, 'ALTER EXTENSION idempotency UPDATE');
my $newest = on_upgraded($coordinator, q{SELECT default_version FROM pg_available_extensions WHERE name = 'idempotency'});
is(join(',', map { on_upgraded($_, q{SELECT extversion FROM pg_extension WHERE extname = 'idempotency'}) } @nodes),
	join(',', ($newest) x 3), "(u) updated to $newest on every node");
is(join(',', map { on_upgraded($_, q{
		SELECT count(*) FILTER (WHERE has_function_privilege('public', p.oid, 'EXECUTE'))
		FROM pg_proc p WHERE p.proname LIKE 'idem\_%\_routed'}) } @nodes),
	'16,16,16', '(u) on every node the twins are executable by PUBLIC (1.5: each checks its caller)');
is(on_upgraded($coordinator, q{
		SELECT count(*) FROM pg_dist_object o JOIN pg_proc p ON p.oid = o.objid
		WHERE p.proname LIKE 'idem\_%\_routed' AND o.force_delegation}),
	'16', '(u) the update made and distributed the 16 twins');
is(join(',', map { on_upgraded($_, q{
		SELECT count(*) || '/' || count(*) FILTER (WHERE EXISTS (
		         SELECT FROM pg_depend d WHERE d.classid = 'pg_proc'::regclass
		         AND d.objid = p.oid AND d.deptype = 'e'))
		FROM pg_proc p WHERE p.proname LIKE 'idem\_%\_routed'}) } @nodes),
	'16/0,16/0,16/0', '(u) on every node, none of them a member of the extension (as idem_distribute makes them)');
my $u_blocks = join('', map {
	sprintf("BEGIN;\nCALL create_payment('u-%d', %d, 40);\nCOMMIT;\n", $_, $_) } 1 .. 2 * $u_keys);
on_upgraded($coordinator, $u_blocks, extra_params => [ '-U', 'app' ]);
is(on_upgraded($coordinator, sprintf(q{
		SELECT count(*) FILTER (WHERE c = 1), count(*) FILTER (WHERE c > 1)
		FROM (SELECT account, count(*) AS c FROM payments GROUP BY account) p})),
	2 * $u_keys . '|0', "(u) the $u_keys keys stored under 1.3 replay in blocks, $u_keys new ones pay once");
is(on_upgraded($coordinator, q{SELECT count(*) FROM idempotency.routed_keys WHERE state = 'c'}),
	2 * $u_keys, '(u) and every key is kept or stored');

# Messaging on the store distributed with 1.3: the update made its routed tables,
# distributed with it and, like the twins, not members of the extension.
on_upgraded($coordinator, q{BEGIN; SELECT idem_emit('t', '{}', 'a-1', route => 1); COMMIT;});
is(on_upgraded($coordinator, q{SELECT count(*) || '|' || max(seq) FROM idempotency.routed_outbox}),
	'1|1', '(u) idem_emit with a route after the update: the event is stored in its shard');
is(on_upgraded($coordinator, q{
		SELECT count(*) || '/' || count(*) FILTER (WHERE EXISTS (
		         SELECT FROM pg_depend d WHERE d.classid = 'pg_class'::regclass
		         AND d.objid = c.oid AND d.deptype = 'e'))
		FROM pg_dist_partition p JOIN pg_class c ON c.oid = p.logicalrelid
		WHERE c.relname IN ('routed_outbox', 'routed_outbox_aggregates', 'routed_applied_versions')}),
	'3/0', '(u) the 3 routed messaging tables distributed, none a member of the extension');
is(on_upgraded($coordinator, q{SELECT count(*) FROM idem_outbox_claim('r')}), '1',
	'(u) the relay serves it on the coordinator');
on_upgraded($coordinator, 'SELECT idempotency.distribute_messaging()');
is(on_upgraded($coordinator, q{SELECT count(*) FROM idempotency.routed_outbox}), '1',
	'(u) idempotency.distribute_messaging() again changes nothing');

$_->stop for @nodes;
done_testing();
