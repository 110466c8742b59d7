# The postgres_exporter query of docs/operations.md, taken from the page as it is,
# run by the real exporter (Debian's prometheus-postgres-exporter) as a pg_monitor
# role against a database with known figures: keys by state, the worker serving it,
# the outbox's pending events, dead letters and relay lag, and the answer counters.
use strict;
use warnings;
use HTTP::Tiny;
use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;

my $exporter = '/usr/bin/prometheus-postgres-exporter';
die "$exporter is missing: apt-get install prometheus-postgres-exporter" unless -x $exporter;

# The queries.yaml block of docs/operations.md.
my $page = slurp_file("$FindBin::RealBin/../../docs/operations.md");
my ($queries) = $page =~ /```yaml\n(# postgres_exporter custom query.*?)```/s;
ok(defined $queries, 'docs/operations.md has the queries.yaml block');
my $dir = PostgreSQL::Test::Utils::tempdir();
PostgreSQL::Test::Utils::append_to_file("$dir/queries.yaml", $queries // '');

my $node = PostgreSQL::Test::Cluster->new('exported');
$node->init;
$node->append_conf('postgresql.conf', q{
shared_preload_libraries = 'idempotency'
idempotency.reaper_naptime = '100ms'
});
$node->start;
$node->safe_psql('postgres', q{
  CREATE EXTENSION idempotency;
  CREATE ROLE exporter LOGIN IN ROLE pg_monitor;
  -- 3 completed, 1 failed, 1 pending lease claim.
  SELECT idem_once('x', ('done-' || g)::idem_key) FROM generate_series(1, 3) g;
  BEGIN; SELECT idem_claim('x', 'declined'); SELECT idem_fail('x', 'declined', '{}'); COMMIT;
  SELECT idem_claim('x', 'leased', '\x01', lease => '1 hour');
  -- Answers: 5 claims above; 2 replays, 1 in_progress, 1 IK001 below.
  SELECT idem_once('x', 'done-1');
  SELECT idem_claim('x', 'declined');
  SELECT idem_claim('x', 'leased', lease => '1 hour');
  DO $$ BEGIN PERFORM idem_claim('x', 'leased', '\x02'); EXCEPTION WHEN SQLSTATE 'IK001' THEN NULL; END $$;
  -- 3 events: one becomes a dead letter, two wait for a relay.
  SELECT idem_emit('orders', jsonb_build_object('n', g)) FROM generate_series(1, 3) g;
  SELECT idem_outbox_dead('relay-1', ARRAY(SELECT event_id FROM idem_outbox_claim('relay-1', 1)),
                          'poison');});
ok($node->poll_query_until('postgres', q{SELECT worker_pid IS NOT NULL FROM idem_stats()}),
	'the worker serves the database');

my $port = PostgreSQL::Test::Cluster::get_free_port();
my $log = "$PostgreSQL::Test::Utils::log_path/postgres_exporter.log";
local $ENV{DATA_SOURCE_NAME} = sprintf('host=%s port=%d user=exporter dbname=postgres sslmode=disable',
	$node->host, $node->port);
my $handle = IPC::Run::start(
	[ $exporter, "--extend.query-path=$dir/queries.yaml", '--disable-default-metrics',
	  '--disable-settings-metrics', '--no-collector.database', '--no-collector.bgwriter',
	  "--web.listen-address=127.0.0.1:$port" ],
	'<', \undef, '>>', $log, '2>>', $log);
END { $handle->kill_kill if $handle; }

# Scrapes until the idempotency series are there (the exporter connects at a scrape).
my $http = HTTP::Tiny->new(timeout => 10);
my $metrics = '';
my $deadline = time + 60;
until ($metrics =~ /^idempotency_outbox_pending\{/m) {
	die 'postgres_exporter gave no idempotency series: ' . slurp_file($log) . "\n$metrics"
	  if time > $deadline or !$handle->pumpable;
	select(undef, undef, undef, 0.2);
	my $response = $http->get("http://127.0.0.1:$port/metrics");
	$metrics = $response->{content} if $response->{success};
}

# The value of a series, or undef.
sub series {
	my ($name) = @_;
	return $metrics =~ /^idempotency_\Q$name\E\{[^}]*\} (\S+)$/m ? $1 : undef;
}
is(series('completed'), 3, 'completed');
is(series('failed'), 1, 'failed');
is(series('pending'), 1, 'pending');
is(series('stale_leases'), 0, 'stale_leases');
is(series('expired_awaiting_reap'), 0, 'expired_awaiting_reap');
is(series('worker_serving'), 1, 'worker_serving');
is(series('outbox_pending'), 2, 'outbox_pending');
is(series('outbox_dead'), 1, 'outbox_dead');
my $lag = series('outbox_relay_lag_seconds');
ok(defined $lag && $lag > 0 && $lag < 600, "outbox_relay_lag_seconds is the oldest pending event's age ($lag)");
is(series('claims_total'), 5, 'claims_total');
is(series('replays_total'), 2, 'replays_total');
is(series('in_progress_total'), 1, 'in_progress_total');
is(series('fingerprint_mismatches_total'), 1, 'fingerprint_mismatches_total');
like($metrics, qr/^# TYPE idempotency_reaped_total counter$/m, 'reaped_total is a counter');
like($metrics, qr/^# TYPE idempotency_replays_total counter$/m, 'replays_total is a counter');
unlike($metrics, qr/^idempotency_\w+\{[^}]*\} NaN$/m, 'no series is NaN');
unlike(slurp_file($log), qr/level=error/, 'the exporter logged no error');

$handle->kill_kill;
$node->stop;

# The alert rules of the same page: valid for Prometheus (promtool check rules), and the
# counters' rules firing on known series (promtool test rules): the replay ratio, a
# reused key, retries while in flight.
SKIP: {
	my $promtool = '/usr/bin/promtool';
	skip "$promtool is missing (apt-get install prometheus): the rules are not checked", 6
	  unless -x $promtool;
	my ($rules) = $page =~ /```yaml\n(groups:.*?)```/s;
	ok(defined $rules, 'docs/operations.md has the alert rules block');
	PostgreSQL::Test::Utils::append_to_file("$dir/rules.yml", $rules // '');
	my ($out, $err);
	IPC::Run::run([ $promtool, 'check', 'rules', "$dir/rules.yml" ], '>', \$out, '2>', \$err);
	like($out, qr/SUCCESS/, 'promtool accepts the rules') or diag("$out$err");
	my %summary = ($rules // '') =~ /- alert: (\w+)\n(?:.*\n)*?\s+annotations: \{summary: ("[^"]*")\}/g;
	# Per minute: 80 claims and 30 replays (a replay ratio of 30/110), a mismatch at
	# minute 11 only, and from minute 5 on 20 in_progress answers.
	PostgreSQL::Test::Utils::append_to_file("$dir/rules_test.yml", qq{
rule_files: [rules.yml]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      - {series: 'idempotency_claims_total{instance="db"}', values: '0+80x40'}
      - {series: 'idempotency_replays_total{instance="db"}', values: '0+30x40'}
      - {series: 'idempotency_fingerprint_mismatches_total{instance="db"}', values: '0x10 1x30'}
      - {series: 'idempotency_in_progress_total{instance="db"}', values: '0x5 0+20x35'}
    promql_expr_test:
      - expr: round(idempotency:replay_ratio:rate5m, 0.001)
        eval_time: 30m
        exp_samples: [{labels: '{instance="db"}', value: 0.273}]
    alert_rule_test:
      - {eval_time: 15m, alertname: IdempotencyKeyReused,
         exp_alerts: [{exp_labels: {instance: db}, exp_annotations: {summary: $summary{IdempotencyKeyReused}}}]}
      - {eval_time: 30m, alertname: IdempotencyKeyReused, exp_alerts: []}
      - {eval_time: 10m, alertname: IdempotencyHighReplayRate, exp_alerts: []}
      - {eval_time: 30m, alertname: IdempotencyHighReplayRate,
         exp_alerts: [{exp_labels: {instance: db}, exp_annotations: {summary: $summary{IdempotencyHighReplayRate}}}]}
      - {eval_time: 30m, alertname: IdempotencyRetriesWhileInFlight,
         exp_alerts: [{exp_labels: {instance: db}, exp_annotations: {summary: $summary{IdempotencyRetriesWhileInFlight}}}]}
});
	IPC::Run::run([ $promtool, 'test', 'rules', "$dir/rules_test.yml" ], '>', \$out, '2>', \$err);
	like($out, qr/SUCCESS/, 'the counters\' rules fire as meant on known series') or diag("$out$err");
	ok(exists $summary{$_}, "the rules have $_") for qw(IdempotencyKeyReused IdempotencyHighReplayRate
	  IdempotencyRetriesWhileInFlight);
}
done_testing();
