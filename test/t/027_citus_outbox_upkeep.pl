# The upkeep of a distributed outbox (SPEC v1.3, "Scale-out with Citus"; issue 34): a
# coordinator and two workers, `accounts` distributed by `account` in 4 shards, the key
# store and the messaging tables distributed with it, events emitted with routing values
# spread over the shards of both workers, then made delivered (long ago and recently),
# dead or left pending by direct updates on the coordinator.
#
#   (s) idem_stats() on the coordinator counts the whole cluster's undelivered and dead
#       events and its oldest undelivered one; idem_node_stats() each node's shards;
#   (r) idem_reap() on each worker removes the delivered events of its shards older
#       than idempotency.outbox_retention, never pending or dead ones, nor one this
#       transaction marked delivered; the removals count in reaped_total;
#   (b) the background worker's pass on each worker does the same;
#   (c) idem_stats()'s answer counters: a key function called on the coordinator is
#       counted once, on the node that holds its shard, and the coordinator's
#       idem_stats() adds up the nodes';
#   (k) amcheck on every shard of routed_outbox.
#
# Needs Citus installed in the PostgreSQL under test, like 017_citus.pl (IDEM_CITUS).
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use Test::More;
use FindBin;
use lib "$FindBin::RealBin/lib";
use IdemCitus;
use IdemCheck;

IdemCitus::require_citus();

my $accounts = 20;

my ($coordinator, $worker1, $worker2) = IdemCitus::start_cluster();
my @nodes = ($coordinator, $worker1, $worker2);
my @workers = ($worker1, $worker2);

sub query { return $coordinator->safe_psql('postgres', $_[0]) }

query(q{SET citus.shard_count = 4;
	CREATE TABLE accounts (account bigint PRIMARY KEY);
	SELECT create_distributed_table('accounts', 'account');
	SELECT idem_distribute('accounts');});

# Round `n` of events: one per account, in its aggregate (seq n).
sub emit_round {
	my ($n) = @_;
	query(join("\n", map {
		"SELECT idem_emit('payment.created', '{\"round\": $n}', 'account-$_', event_id => 'e-$_-$n', route => $_);"
	} 1 .. $accounts));
}

# Per worker port, from where each event's shard is placed: "port:undelivered|dead|oldest
# undelivered emitted_at" (the events read to the coordinator first, then placed).
sub expected_by_node {
	return query(q{
		WITH e AS MATERIALIZED (SELECT route, state, emitted_at FROM idempotency.routed_outbox),
		placed AS (SELECT s.nodeport, e.state, e.emitted_at FROM e
		           JOIN citus_shards s
		             ON s.shardid = get_shard_id_for_distribution_column('idempotency.routed_outbox', e.route))
		SELECT string_agg(nodeport || ':' || figures, ',' ORDER BY nodeport)
		FROM (SELECT nodeport, count(*) FILTER (WHERE state = 'p') || '|' || count(*) FILTER (WHERE state = 'x')
		                       || '|' || coalesce(min(emitted_at) FILTER (WHERE state = 'p')::text, '') AS figures
		      FROM placed GROUP BY nodeport) n});
}

# The same, as idem_node_stats reports it for the workers.
sub reported_by_node {
	return query(sprintf(q{
		SELECT string_agg(nodeport || ':' || outbox_undelivered || '|' || outbox_dead || '|'
		                  || coalesce(outbox_oldest_undelivered_at::text, ''), ',' ORDER BY nodeport)
		FROM idem_node_stats() WHERE nodeport <> %d}, $coordinator->port));
}

# The whole cluster's, from the table, and as idem_stats() on the coordinator says.
sub expected_cluster {
	return query(q{
		SELECT count(*) FILTER (WHERE state = 'p') || '|' || count(*) FILTER (WHERE state = 'x')
		       || '|' || coalesce(min(emitted_at) FILTER (WHERE state = 'p')::text, '')
		FROM idempotency.routed_outbox});
}
sub reported_cluster {
	return query(q{
		SELECT outbox_undelivered || '|' || outbox_dead || '|' || coalesce(outbox_oldest_undelivered_at::text, '')
		FROM idem_stats()});
}

sub count_state { return query("SELECT count(*) FROM idempotency.routed_outbox WHERE state = '$_[0]'") }
sub reaped_total { return query('SELECT sum(reaped_total) FROM idem_node_stats()') }

# Sets a sighup setting on the workers and waits until new sessions see it.
sub set_on_workers {
	my ($name, $value, $shown) = @_;
	for my $worker (@workers) {
		$worker->safe_psql('postgres', "ALTER SYSTEM SET $name = '$value'");
		$worker->reload;
		$worker->poll_query_until('postgres', "SELECT current_setting('$name') = '$shown'")
		  or die "$name not set on " . $worker->name;
	}
}

# ---------------------------------------------------------------------------------
# The events: per account seq 1 delivered two hours ago, 2 ten minutes ago, 3 dead,
# 4 pending; emitted_at spread in emission order (so the first pending event by
# position is the oldest one of its shard, as a relay sees it).
# ---------------------------------------------------------------------------------

emit_round($_) for 1 .. 4;
query(q{
	UPDATE idempotency.routed_outbox
	SET emitted_at = to_timestamp(1767225600 + (seq * 100 + route) * 60);  -- from 2026-01-01 00:00 UTC
	UPDATE idempotency.routed_outbox
	SET state = 'd', attempt = 1, delivered_at = now() - interval '2 hours' WHERE seq = 1;
	UPDATE idempotency.routed_outbox
	SET state = 'd', attempt = 1, delivered_at = now() - interval '10 minutes' WHERE seq = 2;
	UPDATE idempotency.routed_outbox
	SET state = 'x', attempt = 3, reason = 'poison' WHERE seq = 3;});
is(count_state('d') . '|' . count_state('x') . '|' . count_state('p'), 2 * $accounts . "|$accounts|$accounts",
	'the events: delivered, dead and pending');
my @placed = split /,/, expected_by_node();
is(scalar(grep { /^\d+:[1-9]\d*\|[1-9]\d*\|.+$/ } @placed), 2,
	'both workers hold shards with pending and dead events');

# ---------------------------------------------------------------------------------
# (s) idem_stats counts the shards' events
# ---------------------------------------------------------------------------------

is(reported_by_node(), expected_by_node(), '(s) idem_node_stats: each worker counts the events of its shards');
is(expected_cluster(), "$accounts|$accounts|" . query(q{SELECT to_timestamp(1767225600 + 401 * 60)}),
	'(s) the cluster: oldest pending is account 1, seq 4');
is(reported_cluster(), expected_cluster(),
	'(s) idem_stats() on the coordinator: the whole cluster\'s undelivered, dead and oldest undelivered');

# ---------------------------------------------------------------------------------
# (r) idem_reap on each worker
# ---------------------------------------------------------------------------------

# Retention 30 minutes: only the events delivered two hours ago go.
set_on_workers('idempotency.outbox_retention', '30min', '30min');
my $before = reaped_total();
my @reaped = map { $_->safe_psql('postgres', 'SELECT idem_reap()') } @workers;
is(scalar(grep { $_ > 0 } @reaped), 2, '(r) idem_reap removed events on both workers (' . join(', ', @reaped) . ')');
is($reaped[0] + $reaped[1], $accounts, '(r) retention 30min: as many as were delivered two hours ago');
is(query(q{SELECT count(*) FROM idempotency.routed_outbox WHERE seq = 1}), '0', '(r) namely those');
is(count_state('d') . '|' . count_state('x') . '|' . count_state('p'), "$accounts|$accounts|$accounts",
	'(r) the recently delivered, dead and pending events are kept');
is(reaped_total() - $before, $accounts, '(r) counted in reaped_total');

# An event this transaction marks delivered is not removed by its own idem_reap.
my ($route, $shard) = split /\|/, query(sprintf(q{
	SELECT a || '|' || s.shardid FROM generate_series(1, %d) a
	JOIN citus_shards s ON s.shardid = get_shard_id_for_distribution_column('idempotency.routed_outbox', a::bigint)
	WHERE s.nodeport = %d ORDER BY a LIMIT 1}, $accounts, $worker1->port));
is($worker1->safe_psql('postgres', qq{
	SET citus.override_table_visibility = off;
	BEGIN;
	UPDATE idempotency.routed_outbox_$shard SET state = 'd', delivered_at = now() - interval '2 hours'
	WHERE event_id = 'e-$route-4';
	SELECT idem_reap();
	COMMIT;}), '0', '(r) an event marked delivered two hours ago by the calling transaction: not removed');
is(query(qq{SELECT state FROM idempotency.routed_outbox WHERE event_id = 'e-$route-4'}), 'd', '(r) it is kept, delivered');

# Retention 0: every delivered event goes, and nothing else.
set_on_workers('idempotency.outbox_retention', '0', '0');
$before = reaped_total();
@reaped = map { $_->safe_psql('postgres', 'SELECT idem_reap()') } @workers;
is($reaped[0] + $reaped[1], $accounts + 1, '(r) retention 0: idem_reap on the workers removed the delivered events');
is(count_state('d') . '|' . count_state('x') . '|' . count_state('p'), '0|' . $accounts . '|' . ($accounts - 1),
	'(r) none delivered left; dead and pending kept');
is(reaped_total() - $before, $accounts + 1, '(r) counted in reaped_total');
is(reported_cluster(), expected_cluster(), '(r) idem_stats() on the coordinator agrees');

# ---------------------------------------------------------------------------------
# (b) The background worker's pass on each worker
# ---------------------------------------------------------------------------------

emit_round(5);
query(q{UPDATE idempotency.routed_outbox SET state = 'd', attempt = 1, delivered_at = now() - interval '1 hour'
        WHERE seq = 5});
is(count_state('d'), $accounts, '(b) a new round of delivered events');
$before = reaped_total();
set_on_workers('idempotency.reaper_naptime', '100ms', '100ms');
set_on_workers('idempotency.reaper_enabled', 'on', 'on');
ok($coordinator->poll_query_until('postgres', q{SELECT count(*) = 0 FROM idempotency.routed_outbox WHERE state = 'd'}),
	'(b) the workers\' passes removed the delivered events');
ok($coordinator->poll_query_until('postgres', 'SELECT sum(reaped_total) FROM idem_node_stats()', $before + $accounts),
	'(b) counted in reaped_total');
is(count_state('x') . '|' . count_state('p'), "$accounts|" . ($accounts - 1), '(b) dead and pending kept');
is(reported_cluster(), expected_cluster(), '(b) idem_stats() on the coordinator agrees');
is(reported_by_node(), expected_by_node(), '(b) and idem_node_stats, node by node');

# ---------------------------------------------------------------------------------
# (c) The answer counters
# ---------------------------------------------------------------------------------

sub answers {
	my ($sql) = @_;
	return query("SELECT claims_total || '|' || replays_total || '|' || fingerprint_mismatches_total
	                     || '|' || in_progress_total FROM ($sql) s");
}
my $cluster_sql = 'SELECT * FROM idem_stats()';
my $coordinator_sql = 'SELECT * FROM idem_stats(node_only => true)';
my $workers_sql = sprintf('SELECT sum(claims_total) AS claims_total, sum(replays_total) AS replays_total,
	sum(fingerprint_mismatches_total) AS fingerprint_mismatches_total,
	sum(in_progress_total) AS in_progress_total FROM idem_node_stats() WHERE nodeport <> %d',
	$coordinator->port);
my %was = map { $_ => [ split /\|/, answers($_) ] } $cluster_sql, $coordinator_sql, $workers_sql;
sub grown {
	my ($sql) = @_;
	my @now = split /\|/, answers($sql);
	return join '|', map { $now[$_] - $was{$sql}[$_] } 0 .. 3;
}
# Per account: idem_once twice (a claim, a replay); one key claimed and completed in a
# transaction block, then claimed with another fingerprint (IK001), and a live lease
# claimed again (in_progress).
query(join("\n", map { "SELECT idem_once('count', 'once-$_', route => $_);" } 1 .. $accounts));
query(join("\n", map { "SELECT idem_once('count', 'once-$_', route => $_);" } 1 .. $accounts));
query(q{BEGIN;
	SELECT idem_claim('count', 'block-1', '\x01', route => 1);
	SELECT idem_complete('count', 'block-1', '{}', route => 1);
	COMMIT;
	SELECT idem_claim('count', 'leased-2', lease => '1 hour', route => 2);
	SELECT idem_claim('count', 'leased-2', lease => '1 hour', route => 2);});
my ($ret, $out, $err) = $coordinator->psql('postgres',
	q{SELECT idem_claim('count', 'block-1', '\x02', route => 1)});
like($err, qr/different request/, '(c) a claim with another fingerprint is refused');
my $expected = ($accounts + 2) . "|$accounts|1|1";
is(grown($workers_sql), $expected, '(c) the workers counted each answer: claims, replays, IK001, in_progress');
is(grown($coordinator_sql), '0|0|0|0', '(c) the coordinator, which forwarded them, counted none');
is(grown($cluster_sql), $expected, '(c) idem_stats() on the coordinator adds up the nodes\'');
is(query(q{SELECT string_agg(DISTINCT edition, ',') FROM idem_node_stats()}) . ' '
	  . query(q{SELECT edition FROM idem_stats()}),
	'native native', '(c) every node and the cluster say edition native');

# ---------------------------------------------------------------------------------
# (k) amcheck on every shard of routed_outbox
# ---------------------------------------------------------------------------------

IdemCheck::amcheck_routed($coordinator, \@workers,
	'^routed_outbox_(pkey|pending_idx|dead_idx|delivered_idx)_[0-9]+$', 'idempotency.routed_outbox', 4);

$_->stop for @nodes;
done_testing();
