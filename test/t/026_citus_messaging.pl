# Messaging on a distributed store (SPEC v1.3, "Scale-out with Citus"; issue 34), the
# part that works: a coordinator and two workers, `payments` distributed by `account`
# in 4 shards, the key store and the messaging tables distributed with it.
#
#   (d) idem_distribute makes routed_outbox, routed_outbox_aggregates and
#       routed_applied_versions, co-located with payments, and the two twins;
#   (e) idem_emit with a route in a delegated procedure (with idem_once, retried:
#       one event per payment), and in transaction blocks on the coordinator from 4
#       concurrent clients on the same aggregates: each event in the shard of its
#       route, beside its payment, none node-local; seq gapless per aggregate; an
#       event id given twice (and by 4 clients at once) stores one event; a
#       rolled-back block stores none;
#   (a) idem_apply_version with a route, in a block on the coordinator and in a
#       delegated procedure: applied once per version, older versions skipped;
#   (v) no route: 22023; a mistyped one: 42804 (the relay: 028_citus_relay.pl);
#   (w) a block on a worker, for a shard of the other worker: forwarded there;
#   (r) expired applied versions reaped by idem_reap on each worker, from its shards;
#   (m) a shard moved (block_writes, then back in logical mode): its events and
#       counters go with it, seq continues gapless;
#   (t) a forwarded emit or apply waits under its caller's idempotency.wait_timeout;
#   (k) amcheck on every shard of the routed messaging tables.
#
# Needs Citus installed in the PostgreSQL under test, like 017_citus.pl (IDEM_CITUS).
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::RealBin/lib";
use IdemCitus;
use IdemCheck;

IdemCitus::require_citus();

my $accounts = $ENV{IDEM_CITUS_MSG_ACCOUNTS} // 20;

# ---------------------------------------------------------------------------------
# The cluster (as 017_citus.pl)
# ---------------------------------------------------------------------------------

my ($coordinator, $worker1, $worker2) = IdemCitus::start_cluster();
my @nodes = ($coordinator, $worker1, $worker2);
my @workers = ($worker1, $worker2);
# idem_emit is not granted to PUBLIC (1.2): the producer's grant, on every node (where
# a delegated call runs it), before idem_distribute (which gives the twins the grants
# of the functions they stand for).
$coordinator->safe_psql('postgres', 'CREATE ROLE app LOGIN');
$_->safe_psql('postgres', 'GRANT EXECUTE ON FUNCTION idem_emit TO app') for @nodes;
$coordinator->safe_psql('postgres', 'SET citus.shard_count = 4;'
	  . PostgreSQL::Test::Utils::slurp_file("$FindBin::RealBin/../../examples/create_payment_citus.sql"));
$coordinator->safe_psql('postgres', q{
  GRANT ALL ON payments TO app; GRANT USAGE ON SEQUENCE payments_id_seq TO app;
  -- The README's procedure, emitting its event (README, "Messaging").
  CREATE PROCEDURE pay_and_emit(p_key idem_key, p_account bigint, p_amount numeric)
  LANGUAGE plpgsql AS $$
  BEGIN
    IF NOT idem_once('payments', p_key, route => p_account) THEN RETURN; END IF;
    INSERT INTO payments(account, amount) VALUES (p_account, p_amount);
    PERFORM idem_emit('payment.created', jsonb_build_object('account', p_account, 'amount', p_amount),
                      'account-' || p_account, event_id => p_key, route => p_account);
  END $$;
  SELECT create_distributed_function('pay_and_emit(idem_key, bigint, numeric)',
                                     distribution_arg_name => 'p_account', colocate_with => 'payments');
  CREATE PROCEDURE apply_balance(p_account bigint, p_version bigint, INOUT applied boolean DEFAULT NULL)
  LANGUAGE plpgsql AS $$
  BEGIN
    applied := idem_apply_version('balances', 'account-' || p_account, p_version, route => p_account);
  END $$;
  SELECT create_distributed_function('apply_balance(bigint, bigint, boolean)',
                                     distribution_arg_name => 'p_account', colocate_with => 'payments');});

sub sqlstate_of {
	my ($sql, $user) = @_;
	my ($out, $err) = ('', '');
	$coordinator->psql('postgres', "\\set VERBOSITY verbose\n$sql", stdout => \$out,
		stderr => \$err, extra_params => [ '-U', $user // 'app' ]);
	return $err =~ /ERROR:\s+([0-9A-Z]{5}):/ ? $1 : "no error ($out)";
}

sub as_app { return $coordinator->safe_psql('postgres', $_[0], extra_params => [ '-U', 'app' ]) }
sub query { return $coordinator->safe_psql('postgres', $_[0]) }

# Per aggregate: "aggregates|with seq 1..count gapless|events", over the whole outbox.
sub seq_check {
	return query(q{
		SELECT count(*) || '|' || count(*) FILTER (WHERE n = hi AND lo = 1 AND n = distinct_seq)
		       || '|' || coalesce(sum(n), 0)
		FROM (SELECT topic, aggregate, route, count(*) AS n, min(seq) AS lo, max(seq) AS hi,
		             count(DISTINCT seq) AS distinct_seq
		      FROM idempotency.routed_outbox WHERE aggregate IS NOT NULL
		      GROUP BY topic, aggregate, route) a});
}

# Events stored in the shard of their route: the co-located join with the accounts'
# payments finds every one; and none in any node's own idempotency.outbox.
sub placement {
	my $joined = query(q{
		SELECT count(*) FROM idempotency.routed_outbox o
		JOIN (SELECT account FROM payments GROUP BY account) p ON p.account = o.route});
	my $local = 0;
	$local += $_->safe_psql('postgres', 'SELECT count(*) FROM idempotency.outbox') for @nodes;
	return "$joined|$local";
}

# ---------------------------------------------------------------------------------
# (d) What idem_distribute made
# ---------------------------------------------------------------------------------

is(query(q{
		SELECT string_agg(logicalrelid::text, ',' ORDER BY logicalrelid::text)
		FROM pg_dist_partition
		WHERE colocationid = (SELECT colocationid FROM pg_dist_partition WHERE logicalrelid = 'payments'::regclass)
		  AND logicalrelid::text LIKE 'idempotency.routed%'}),
	'idempotency.routed_applied_versions,idempotency.routed_keys,idempotency.routed_outbox,idempotency.routed_outbox_aggregates',
	'(d) the routed messaging tables are distributed, co-located with payments');
is(query(q{
		SELECT string_agg(p.proname, ',' ORDER BY p.proname) FROM pg_dist_object o JOIN pg_proc p ON p.oid = o.objid
		WHERE p.proname IN ('idem_emit_routed', 'idem_apply_version_routed') AND o.force_delegation
		  AND p.proargnames[o.distribution_argument_index + 1] = 'route'}),
	'idem_apply_version_routed,idem_emit_routed', '(d) and the twins of idem_emit and idem_apply_version');

# ---------------------------------------------------------------------------------
# (e) idem_emit with a route
# ---------------------------------------------------------------------------------

# Delegated: three payments per account, each call retried once (idem_once: the
# retry neither pays nor emits).
my @calls;
for my $n (1 .. 3) {
	for my $a (1 .. $accounts) {
		push @calls, "CALL pay_and_emit('d-$a-$n', $a, $n);" for 1 .. 2;
	}
}
as_app(join("\n", @calls));
is(query(q{SELECT count(*) FROM payments}), 3 * $accounts, '(e) delegated: 3 payments per account, retries paid nothing');
is(query(q{SELECT count(*) || '|' || count(DISTINCT event_id) FROM idempotency.routed_outbox}),
	3 * $accounts . '|' . 3 * $accounts, '(e) delegated: one event per payment');
is(seq_check(), "$accounts|$accounts|" . 3 * $accounts, '(e) delegated: seq 1..3 gapless per aggregate');
is(query(q{
		SELECT count(*) FROM idempotency.routed_outbox o
		WHERE o.payload = jsonb_build_object('account', o.route, 'amount', substring(o.event_id::text from '-([0-9]+)$')::numeric)
		  AND o.seq = substring(o.event_id::text from '-([0-9]+)$')::bigint AND o.state = 'p'}),
	3 * $accounts, '(e) delegated: each event with its payload, in call order, pending');

# Transaction blocks on the coordinator, 4 concurrent clients on the same aggregates:
# each block pays and emits for one account; per aggregate the 4 clients' events take
# seq 4..7 in commit order.
$coordinator->pgbench(
	'--no-vacuum --client=4 --jobs=2 --transactions=1 --username=app',
	0, [qr{processed: 4/4}], [qr{^$}],
	"(e) 4 clients x $accounts blocks emitting on the coordinator: no error",
	{ 'idem_msg_e' => join('', map { qq{BEGIN;
INSERT INTO payments(account, amount) VALUES ($_, 100);
SELECT idem_emit('payment.created', jsonb_build_object('account', $_, 'block', true), 'account-$_', route => $_);
COMMIT;
} } 1 .. $accounts) });
is(query(q{SELECT count(*) FROM payments}), 7 * $accounts, '(e) blocks: 4 more payments per account');
is(seq_check(), "$accounts|$accounts|" . 7 * $accounts, '(e) blocks: seq 1..7 gapless per aggregate, one event per payment');
is(placement(), 7 * $accounts . '|0', '(e) every event in the shard of its route, beside its payments; none node-local');

# 4 clients emitting the same event ids at once (one per account, with its aggregate):
# one event per id, each taking one seq.
$coordinator->pgbench(
	'--no-vacuum --client=4 --jobs=2 --transactions=1 --username=app',
	0, [qr{processed: 4/4}], [qr{^$}],
	"(e) 4 clients x $accounts blocks emitting the same event ids: no error",
	{ 'idem_msg_dup' => join('', map { qq{BEGIN;
SELECT idem_emit('payment.created', '{"dup": true}', 'account-$_', event_id => 'dup-$_', route => $_);
COMMIT;
} } 1 .. $accounts) });
is(query(q{SELECT count(*) || '|' || count(DISTINCT event_id) || '|' || min(seq) || '|' || max(seq)
           FROM idempotency.routed_outbox WHERE event_id::text LIKE 'dup-%'}),
	"$accounts|$accounts|8|8", '(e) 4 duplicates of each event id: one event each, seq 8');
is(seq_check(), "$accounts|$accounts|" . 8 * $accounts, '(e) still gapless per aggregate');

# An event id given twice (in one block, and again in another): one event. A block
# rolled back: none, and its seq is not taken.
as_app(q{BEGIN;
	SELECT idem_emit('payment.created', '{"twice": 1}', 'account-1', event_id => 'twice-1', route => 1);
	SELECT idem_emit('payment.created', '{"twice": 2}', 'account-1', event_id => 'twice-1', route => 1);
	COMMIT;
	SELECT idem_emit('payment.created', '{"twice": 3}', 'account-1', event_id => 'twice-1', route => 1);
	BEGIN;
	SELECT idem_emit('payment.created', '{"rolled": "back"}', 'account-2', route => 2);
	ROLLBACK;});
is(query(q{SELECT string_agg(payload::text || ':' || seq, ',') FROM idempotency.routed_outbox WHERE event_id = 'twice-1'}),
	'{"twice": 1}:9', '(e) an event id given three times: the first event, once');
is(query(q{SELECT count(*) FROM idempotency.routed_outbox WHERE payload ? 'rolled'}), '0',
	'(e) a rolled-back block stores no event');
as_app(q{SELECT idem_emit('payment.created', '{"after": "rollback"}', 'account-2', route => 2)});
is(seq_check(), "$accounts|$accounts|" . (8 * $accounts + 2), '(e) and takes no seq: still gapless');

# Without an aggregate: no seq.
as_app(q{SELECT idem_emit('account.touched', '{}', route => 3)});
is(query(q{SELECT count(*) FROM idempotency.routed_outbox WHERE topic = 'account.touched' AND seq IS NULL AND route = 3}),
	'1', '(e) an event without aggregate has no seq');

# ---------------------------------------------------------------------------------
# (a) idem_apply_version with a route
# ---------------------------------------------------------------------------------

is(as_app(q{BEGIN;
	SELECT idem_apply_version('balances', 'account-5', 2, route => 5);
	SELECT idem_apply_version('balances', 'account-5', 2, route => 5);
	SELECT idem_apply_version('balances', 'account-5', 1, route => 5);
	COMMIT;
	SELECT idem_apply_version('balances', 'account-5', 2, route => 5);
	SELECT idem_apply_version('balances', 'account-5', 3, route => 5);}),
	"t\nf\nf\nf\nt", '(a) in blocks on the coordinator: version 2 applied once, 1 skipped, 3 applied');
is(as_app(q{CALL apply_balance(6, 1); CALL apply_balance(6, 1); CALL apply_balance(6, 0); CALL apply_balance(6, 4);}),
	"t\nf\nf\nt", '(a) delegated: applied once per newer version');
is(query(q{
		SELECT string_agg(entity || ':' || version || ':' || role::text, ',' ORDER BY entity)
		FROM idempotency.routed_applied_versions a
		JOIN (SELECT account FROM payments GROUP BY account) p ON p.account = a.route}),
	'account-5:3:app,account-6:4:app', '(a) the records in the shards of their routes, with their role');
my $local_applied = 0;
$local_applied += $_->safe_psql('postgres', 'SELECT count(*) FROM idempotency.applied_versions') for @nodes;
is($local_applied, 0, '(a) none node-local');

# ---------------------------------------------------------------------------------
# (v) What is refused
# ---------------------------------------------------------------------------------

is(sqlstate_of(q{SELECT idem_emit('t', '{}', 'account-1')}), '22023', '(v) idem_emit without a route: 22023');
is(sqlstate_of(q{SELECT idem_emit('t', '{}', 'account-1', route => NULL::bigint)}), '22023',
	'(v) idem_emit with a NULL route: 22023');
is(sqlstate_of(q{SELECT idem_apply_version('s', 'e', 1)}), '22023', '(v) idem_apply_version without a route: 22023');
is(sqlstate_of(q{SELECT idem_emit('t', '{}', 'account-1', route => 'x'::text)}), '42804',
	'(v) a route of another type: 42804');

# ---------------------------------------------------------------------------------
# (m) A shard moved: events and counters go with it
# ---------------------------------------------------------------------------------

my ($shard, $from_port) = split /\|/, query(q{
	SELECT shardid || '|' || nodeport FROM citus_shards
	WHERE table_name = 'idempotency.routed_outbox'::regclass
	  AND shardid = get_shard_id_for_distribution_column('idempotency.routed_outbox', 1::bigint)});
my $to_port = $from_port == $worker1->port ? $worker2->port : $worker1->port;
IdemCitus::move_shard($coordinator, $shard, $from_port, $to_port, 'block_writes');
is(query(qq{SELECT nodeport FROM citus_shards WHERE shardid = $shard}), $to_port, '(m) the shard of account 1 moved');
as_app(join("\n", map { "CALL pay_and_emit('m-$_', $_, 9);" } 1 .. $accounts));
as_app(join("\n", map { "BEGIN; SELECT idem_emit('payment.created', '{}', 'account-$_', route => $_); COMMIT;" } 1 .. $accounts));
is(seq_check(), "$accounts|$accounts|" . (10 * $accounts + 2), '(m) after the move: seq still gapless per aggregate');
is(query(q{SELECT max(seq) FROM idempotency.routed_outbox WHERE aggregate = 'account-1'}), '11',
	'(m) account 1 continues its sequence on the node its shard moved to');
is(placement(), 10 * $accounts + 3 . '|0', '(m) every event in the shard of its route');
# Back, in logical mode.
# (IdemCitus cleans up the placement the first move left behind before moving back.)
IdemCitus::move_shard($coordinator, $shard, $to_port, $from_port, 'force_logical');
is(query(qq{SELECT nodeport FROM citus_shards WHERE shardid = $shard}), $from_port, '(m) moved back in logical mode');
as_app(join("\n", map { "BEGIN; SELECT idem_emit('payment.created', '{}', 'account-$_', route => $_); COMMIT;" } 1 .. $accounts));
is(seq_check(), "$accounts|$accounts|" . (11 * $accounts + 2), '(m) after the logical move: seq still gapless per aggregate');
is(query(q{SELECT max(seq) FROM idempotency.routed_outbox WHERE aggregate = 'account-1'}), '12',
	'(m) account 1 continues its sequence back on its first node');
is(placement(), 11 * $accounts + 3 . '|0', '(m) every event in the shard of its route');

# ---------------------------------------------------------------------------------
# (w) A transaction block on a worker, for a shard of the other worker
# ---------------------------------------------------------------------------------

my $acc_w = query(sprintf(q{
	SELECT min(a) FROM generate_series(1001, 2000) a
	WHERE (SELECT nodeport FROM citus_shards s
	       WHERE s.shardid = get_shard_id_for_distribution_column('payments', a::bigint)) = %d},
	$worker2->port));
is($worker1->safe_psql('postgres', qq{BEGIN;
	SELECT idem_emit('from.worker', '{}', 'account-$acc_w', event_id => 'w-1', route => $acc_w);
	SELECT idem_apply_version('balances', 'account-$acc_w', 1, route => $acc_w);
	INSERT INTO payments(account, amount) VALUES ($acc_w, 1);
	COMMIT;}, extra_params => [ '-U', 'app' ]), "w-1\nt", '(w) a block on worker1 emits and applies for a shard of worker2');
# A router query by route reads only the route's shard, which is on worker2.
is(query(qq{SELECT count(*) FROM idempotency.routed_outbox WHERE route = $acc_w AND event_id = 'w-1' AND seq = 1}),
	'1', '(w) the event is stored in the shard of its route (on worker2), with seq 1');
my $w_local = 0;
$w_local += $_->safe_psql('postgres', q{SELECT count(*) FROM idempotency.outbox}) for @nodes;
is($w_local, 0, '(w) and nowhere node-local');

# ---------------------------------------------------------------------------------
# (r) Expired applied versions are reaped from the shards, on their nodes
# ---------------------------------------------------------------------------------

as_app(join("\n", map { "SELECT idem_apply_version('ttl', 'account-$_', 1, ttl => '1 millisecond', route => $_);" } 1 .. $accounts));
is(query(q{SELECT count(*) FROM idempotency.routed_applied_versions WHERE scope = 'ttl'}), $accounts,
	"(r) $accounts applied versions with a ttl of 1 ms");
my ($reaped, $left) = (0, -1);
for (1 .. 100) {
	$reaped += $_->safe_psql('postgres', 'SELECT idem_reap()') for @workers;
	$left = query(q{SELECT count(*) FROM idempotency.routed_applied_versions WHERE scope = 'ttl'});
	last if $left == 0;
}
is("$left|$reaped", "0|$accounts", '(r) idem_reap on each worker removed them from its shards, and only them');
is(query(q{SELECT count(*) FROM idempotency.routed_applied_versions WHERE scope = 'balances'}), '3',
	'(r) the live records are kept');

# ---------------------------------------------------------------------------------
# (t) A forwarded call waits as long as its caller's idempotency.wait_timeout says
# ---------------------------------------------------------------------------------

# The workers wait 20 s by default; the caller on the coordinator, 200 ms.
for my $worker (@workers) {
	$worker->safe_psql('postgres', q{ALTER SYSTEM SET idempotency.wait_timeout = '20s'; SELECT pg_reload_conf();});
}
my $holder = $coordinator->background_psql('postgres', extra_params => [ '-U', 'app' ]);
$holder->query_safe(q{BEGIN; SELECT idem_emit('held', '{}', 'held-1', route => 1);
                      SELECT idem_apply_version('held', 'held-1', 1, route => 1);});
for my $call (
	[ 'idem_emit', q{SELECT idem_emit('held', '{}', 'held-1', route => 1)} ],
	[ 'idem_apply_version', q{SELECT idem_apply_version('held', 'held-1', 2, route => 1)} ]) {
	my $started = time;
	is(sqlstate_of(qq{SET idempotency.wait_timeout = '200ms'; BEGIN; $call->[1]; COMMIT;}), 'IK005',
		"(t) $call->[0] forwarded while another block holds the aggregate or entity: IK005");
	cmp_ok(time - $started, '<', 10, "(t) $call->[0]: after the caller's 200 ms, not the worker's 20 s");
}
$holder->query_safe('ROLLBACK');
$holder->quit;
$_->safe_psql('postgres', q{ALTER SYSTEM RESET idempotency.wait_timeout; SELECT pg_reload_conf();}) for @workers;

# ---------------------------------------------------------------------------------
# (k) amcheck on every shard of the routed messaging tables
# ---------------------------------------------------------------------------------

# 4 indexes of routed_outbox, 1 of the aggregates, 2 of the applied versions.
IdemCheck::amcheck_routed($coordinator, \@workers, '^routed_(outbox|applied).*_[0-9]+$',
	'idempotency.routed_outbox', 7);

$_->stop for @nodes;
done_testing();
