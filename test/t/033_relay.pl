# idem-relay (relay/, SPEC "Delivery") against a real cluster, end to end: the program is
# built here from relay/ with Debian's Go packages, then
#   - configuration errors (flag, environment, config file) exit 2 naming the setting
#     and where it came from; --help lists every flag; a role without the relay
#     functions' grants gets one clear error and exit 2;
#   - the stdout sink: every event exactly once, each aggregate's in seq order;
#   - the main run (relay_run), once through each sink: 10,000 events over 200
#     aggregates, two relay copies, the relay killed (SIGKILL) three times and the sink
#     restarted once mid-run, PostgreSQL stopped -m immediate once: every event reaches
#     the consumer, which applies it with idem_once, exactly once (counts checked), each
#     aggregate's events first applied in seq order, nothing dead. The sinks: http into
#     a receiving service (test/relay/consumer.py, restarted as the sink's restart;
#     Idempotency-Key and the HMAC signature on every request); RabbitMQ (publisher
#     confirms, mandatory) read live by test/relay/amqpread.py's consumer (manual acks
#     after the commit), the broker restarted; NATS JetStream (Nats-Msg-Id, the
#     stream's ack) read live by a durable pull consumer (test/relay/natsread), the
#     server restarted, the stream holding each event once;
#   - dead letters with their reasons (a permanent 422; max_attempts reached on 500s; a
#     wrong HMAC secret), Retry-After waited as told, the SIGTERM drain (exit 0, what was
#     published is acked), /healthz following the sink and the database, metric values;
#   - the alert rules of relay/alerts.yml (promtool check rules, promtool test rules);
#   - RabbitMQ: an unroutable event is dead, with the reason.
use strict;
use warnings;
use Cwd qw(abs_path);
use IO::Socket::INET;
use Time::HiRes qw(time sleep);
use JSON::PP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::RealBin/lib";
use IdemProcesses;

my $repo = abs_path('.');
my $python = '/usr/bin/python3';
die "$python cannot import psycopg: install python3-psycopg"
  unless system($python, '-c', 'import psycopg') == 0;

# Scale of the main run through each sink (relay_run); IDEM_RELAY_EVENTS and
# IDEM_RELAY_AGGREGATES change it.
my $events = $ENV{IDEM_RELAY_EVENTS} // 10000;
my $aggregates = $ENV{IDEM_RELAY_AGGREGATES} // 200;

my $node = PostgreSQL::Test::Cluster->new('relay');
$node->init;
$node->append_conf('postgresql.conf', q{
shared_preload_libraries = 'idempotency'
max_connections = 100
});
$node->start;
$node->safe_psql('postgres', 'CREATE DATABASE shop');
$node->safe_psql('postgres', 'CREATE DATABASE service_b');
$node->safe_psql('shop', 'CREATE EXTENSION idempotency');
$node->safe_psql('service_b', q{
  CREATE EXTENSION idempotency;
  CREATE TABLE applied(n bigserial PRIMARY KEY, event_id text, topic text, aggregate text, seq bigint);
  CREATE TABLE arrivals(n bigserial PRIMARY KEY, event_id text, topic text, aggregate text, seq bigint,
                        attempt int, status int, idem_key text, path text, at timestamptz DEFAULT clock_timestamp());});
$node->safe_psql('shop', q{
  CREATE ROLE relay LOGIN;
  CREATE ROLE stranger LOGIN;
  GRANT EXECUTE ON FUNCTION idem_outbox_claim(text, integer, interval, text[]),
      idem_outbox_ack(text, idem_key[]), idem_outbox_dead(text, idem_key[], text) TO relay;});

my $log_path = $PostgreSQL::Test::Utils::log_path;
my $tmp = PostgreSQL::Test::Utils::tempdir();

sub free_port { return PostgreSQL::Test::Cluster::get_free_port(); }

# --- the relay ---------------------------------------------------------------------
my $relay_bin = "$tmp/idem-relay";
{
	my ($out, $err);
	my $ok = IPC::Run::run(
		[ 'make', '-s', '-C', "$repo/relay", "OUT=$relay_bin" ],
		'>', \$out, '2>', \$err);
	ok($ok && -x $relay_bin, 'idem-relay builds from relay/ with Debian\'s Go packages')
	  or BAIL_OUT("the relay did not build: $out$err");
}
{
	my ($out, $err);
	my $ok = IPC::Run::run([ 'make', '-s', '-C', "$repo/relay", 'test', 'vet', 'fmt-check' ],
		'>', \$out, '2>', \$err);
	ok($ok, 'the relay\'s unit tests pass (go test), go vet and gofmt are clean') or diag("$out$err");
}

my %pgenv = (
	PGHOST => $node->host, PGPORT => $node->port, PGDATABASE => 'shop',
	PGUSER => 'relay', PGSSLMODE => 'disable');

# Runs the relay to its end (IdemProcesses::relay_once); returns (exit code, stdout, stderr).
sub relay_once { return IdemProcesses::relay_once($relay_bin, @_) }

# Starts a relay (IdemProcesses::start_relay) as the relay role.
sub start_relay { return IdemProcesses::start_relay($relay_bin, \%pgenv, @_) }

sub http_get {
	my ($port, $path) = @_;
	my $s = IO::Socket::INET->new(PeerAddr => "127.0.0.1:$port", Timeout => 5) or return (0, '');
	print $s "GET $path HTTP/1.0\r\nHost: x\r\n\r\n";
	local $/;
	my $resp = <$s> // '';
	my ($code) = $resp =~ m{^HTTP/\S+ (\d+)};
	my ($body) = $resp =~ m{\r\n\r\n(.*)}s;
	return ($code // 0, $body // '');
}

# The value of one metric sample (0 when absent).
sub metric {
	my ($relay, $name, $labels) = @_;
	my (undef, $text) = http_get($relay->{port}, '/metrics');
	for my $line (split /\n/, $text) {
		next if $line =~ /^#/;
		my ($n, $l, $v) = $line =~ /^(\w+)(\{[^}]*\})?\s+(\S+)$/ or next;
		next unless $n eq $name;
		next if defined $labels && ($l // '') !~ /\Q$labels\E/;
		return $v;
	}
	return 0;
}

sub undelivered {
	return $node->safe_psql('shop', 'SELECT outbox_undelivered FROM idem_stats()');
}

# Emits $n events over aggregates a0..a($k-1) of $topic, $per events per transaction,
# round-robin over the aggregates so that batches mix them.
# With $first, the events numbered $first to $first + $n - 1 (event g goes to aggregate
# g % $k).
sub emit {
	my ($topic, $n, $k, $prefix, $first) = @_;
	$prefix //= 'a';
	$first //= 1;
	my $last = $first + $n - 1;
	my $per = 500;
	for (my $from = $first; $from <= $last; $from += $per) {
		my $to = $from + $per - 1;
		$to = $last if $to > $last;
		$node->safe_psql('shop', qq{
		  SELECT idem_emit('$topic', jsonb_build_object('n', g), '$prefix' || (g % $k),
		                   jsonb_build_object('h', 'v', 'nested', jsonb_build_object('x', g)))
		  FROM generate_series($from, $to) g ORDER BY g});
	}
}

# --- configuration errors ----------------------------------------------------------
{
	my ($code, $out, $err) = relay_once({}, '--help');
	is($code, 0, '--help exits 0');
	my @missing = grep { $out !~ /--\Q$_\E \(IDEM_RELAY_/ }
	  qw(database name sink topics batch-size lease concurrency max-attempts http-url
	  http-route http-timeout http-hmac-secret amqp-url amqp-exchange nats-url nats-subject-prefix listen);
	is("@missing", '', '--help documents every flag with its environment variable');

	($code, $out, $err) = relay_once({}, '--database=x');
	ok($code == 2 && $err =~ /--sink \(default\): required/, 'no --sink: exit 2, says --sink is required')
	  or diag($err);
	($code, $out, $err) = relay_once({}, '--sink=stdout', '--batch-size=0', '--lease=soon');
	ok($code == 2 && $err =~ /--batch-size \(flag --batch-size\): want an integer >= 1, got "0"/
		  && $err =~ /--lease \(flag --lease\): want a duration/,
		'bad flags: exit 2, every bad setting named with its source') or diag($err);
	($code, $out, $err) = relay_once({ IDEM_RELAY_SINK => 'kafka' });
	ok($code == 2 && $err =~ /--sink \(environment IDEM_RELAY_SINK\): want stdout, http, amqp or nats, got "kafka"/,
		'a bad environment variable is named') or diag($err);
	append_to_file("$tmp/bad.conf", "sink = http\n# a comment\nhttp-url = ftp://x/\n");
	($code, $out, $err) = relay_once({}, "--config=$tmp/bad.conf");
	ok($code == 2 && $err =~ m{--http-url \(\Q$tmp\E/bad.conf:3\): the scheme must be http or https},
		'a bad line of the config file is named with file and line') or diag($err);
	append_to_file("$tmp/unknown.conf", "sink = stdout\nbatchsize = 5\n");
	($code, $out, $err) = relay_once({}, "--config=$tmp/unknown.conf");
	ok($code == 2 && $err =~ m{unknown.conf:2: unknown setting "batchsize"}, 'an unknown setting in the file')
	  or diag($err);
	($code, $out, $err) = relay_once({}, '--sink=http', '--http-url=http://127.0.0.1:1/', '--lease=5s', '--http-timeout=10s');
	ok($code == 2 && $err =~ /--lease .*twice the timeout/, 'a lease shorter than two request timeouts is refused')
	  or diag($err);
	($code, $out, $err) = relay_once({ %pgenv, PGUSER => 'stranger' }, '--sink=stdout', '--listen=');
	ok($code == 2 && $err =~ /role \\"stranger\\" may not execute .*GRANT EXECUTE ON FUNCTION idem_outbox_claim/,
		'a role without the grants: exit 2 and the GRANT to run') or diag($err);
}

# --- the alert rules (relay/alerts.yml): valid, and firing as meant on known series ----------
SKIP: {
	my $promtool = '/usr/bin/promtool';
	skip "$promtool is missing (apt-get install prometheus)", 2 unless -x $promtool;
	append_to_file("$tmp/alerts.yml", slurp_file("$repo/relay/alerts.yml"));
	append_to_file("$tmp/alerts_test.yml", <<'YAML');
rule_files: [alerts.yml]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      - {series: 'idem_relay_oldest_undelivered_age_seconds{job="relay",instance="a"}', values: '0x10 60+60x30'}
      - {series: 'idem_relay_oldest_undelivered_age_seconds{job="relay",instance="b"}', values: '0x40'}
      - {series: 'idem_relay_up{job="relay",instance="a",component="sink"}', values: '1x10 0x30'}
      - {series: 'idem_relay_events_dead_total{job="relay",instance="a",topic="t",sink="http"}', values: '0x20 1x20'}
      - {series: 'idem_relay_lease_headroom_seconds{job="relay",instance="a"}', values: '10x20 0.5x20'}
    alert_rule_test:
      - {eval_time: 14m, alertname: IdemRelayFallingBehind, exp_alerts: []}
      - {eval_time: 25m, alertname: IdemRelayFallingBehind,
         exp_alerts: [{exp_labels: {job: relay, severity: warning}, exp_annotations: {summary: "events wait more than 5 minutes in the outbox"}}]}
      - {eval_time: 12m, alertname: IdemRelayDown, exp_alerts: []}
      - {eval_time: 20m, alertname: IdemRelayDown,
         exp_alerts: [{exp_labels: {job: relay, component: sink, severity: critical}, exp_annotations: {summary: "no relay reaches its sink or database"}}]}
      - {eval_time: 15m, alertname: IdemRelayDeadLetters, exp_alerts: []}
      - {eval_time: 25m, alertname: IdemRelayDeadLetters,
         exp_alerts: [{exp_labels: {job: relay, topic: t, severity: warning}, exp_annotations: {summary: "events moved to the dead letters (idem_outbox_dead_letters())"}}]}
      - {eval_time: 25m, alertname: IdemRelayLeaseTight, exp_alerts: []}
      - {eval_time: 35m, alertname: IdemRelayLeaseTight,
         exp_alerts: [{exp_labels: {job: relay, severity: info}, exp_annotations: {summary: "batches end less than 1 s before their lease"}}]}
YAML
	my ($out, $err);
	IPC::Run::run([ $promtool, 'check', 'rules', "$tmp/alerts.yml" ], '>', \$out, '2>', \$err);
	like($out, qr/SUCCESS: 4 rules found/, 'promtool accepts relay/alerts.yml') or diag("$out$err");
	IPC::Run::run([ $promtool, 'test', 'rules', "$tmp/alerts_test.yml" ], '>', \$out, '2>', \$err);
	like($out, qr/SUCCESS/, 'the relay alerts (falling behind, down, dead letters, lease tight) fire as meant')
	  or diag("$out$err");
}

# --- stdout ------------------------------------------------------------------------
{
	emit('stdout.t', 600, 15);
	my $out = "$tmp/stdout.jsonl";
	my $r = start_relay('s1', $out, '--sink=stdout', '--batch-size=64');
	ok(wait_until(60, sub { undelivered() == 0 }), 'stdout: all delivered');
	is(stop_process($r, 'TERM', 20), 0, 'stdout: SIGTERM exits 0');
	my (%seen, %last, $dups, $disorder);
	($dups, $disorder) = (0, 0);
	for my $line (split /\n/, slurp_file($out)) {
		my $e = decode_json($line);
		$dups++ if $seen{ $e->{id} }++;
		$disorder++ if $e->{seq} != ($last{ $e->{aggregate} } // 0) + 1;
		$last{ $e->{aggregate} } = $e->{seq};
		$disorder++ unless $e->{topic} eq 'stdout.t' && $e->{attempt} == 1 && $e->{headers}{nested}{x} == $e->{payload}{n};
	}
	is(scalar(keys %seen), 600, 'stdout: 600 events written');
	is($dups, 0, 'stdout: none twice');
	is($disorder, 0, 'stdout: each aggregate in seq order, with topic, attempt, headers and payload');
}

# --- the receiving service -----------------------------------------------------------
my $b_port = free_port();
my $secret = 's3cret-' . int(rand(1e9));
my $consumer;
sub start_consumer {
	my (%env) = @_;
	$consumer = spawn('consumer', {
		DATABASE_URL => 'host=' . $node->host . ' port=' . $node->port . ' dbname=service_b',
		PORT => $b_port, SECRET => $secret, %env }, undef,
		$python, "$repo/test/relay/consumer.py");
	wait_until(20, sub { IO::Socket::INET->new(PeerAddr => "127.0.0.1:$b_port") })
	  or die 'the consumer did not listen';
}
start_consumer(DELAY_MS => 2);
my @http = ('--sink=http', "--http-url=http://127.0.0.1:$b_port/events/{topic}",
	'--http-timeout=2s', "--http-hmac-secret=$secret");

sub b { return $node->safe_psql('service_b', $_[0]); }

# --- the main run, one for each sink ---------------------------------------------------------
# relay_run(%o): $events events over $aggregates aggregates of topic $o{topic} through
# two relay copies ($o{relays}: their names; $o{start}->(NAME) starts one) into the
# sink $o{sink}, whose consumer applies each with idem_once(scope, event id) into
# service_b's applied (a row per event applied, in the order applied) and records each
# message it gets in arrivals (so a repeat rejected by idem_once is an arrival
# without its applied row). The events are emitted during the run, in transactions of
# up to 500 (event g to aggregate g % $aggregates), keeping at most a tenth of them
# (1,000 at most) undelivered in the outbox: so the relays have work at each
# disruption, whatever the speed of the machine. Each disruption comes once another
# sixth of the events is delivered by the relays (acked in the outbox; for http that
# is applied by the consumer, a broker's consumer may lag behind):
#   1. relay 1 killed (SIGKILL) and started again;
#   2. the sink restarted: $o{stop_sink}, events emitted while it is down and
#      /healthz seen at 503 "sink down", then $o{start_sink};
#   3. relay 2 killed and started again;
#   4. PostgreSQL stopped -m immediate and started again;
#   5. relay 1 killed again and started again.
# Then: the outbox empties; every event applied exactly once (count, count distinct);
# each aggregate's events first applied in seq order (1, 2, 3, ...: no gap, no
# inversion); nothing dead. Returns the relays (a hash by name).
sub relay_run {
	my (%o) = @_;
	my ($sink, $topic, $prefix, $what) = @o{qw(sink topic prefix what)};
	my ($n1, $n2) = @{ $o{relays} };
	my $t0 = time;
	my $applied = sub { b("SELECT count(*) FROM applied WHERE topic = '$topic'") };
	# The run ends once every event is applied (a consumer applying one twice ends it no sooner).
	my $distinct = sub { b("SELECT count(DISTINCT event_id) FROM applied WHERE topic = '$topic'") };
	my %relays = map { $_ => $o{start}->($_) } ($n1, $n2);
	my $kill = sub {
		my ($name) = @_;
		kill 'KILL', $relays{$name}{pid};
		waitpid($relays{$name}{pid}, 0);
		$relays{$name}{status} = $?;
		$relays{$name} = $o{start}->($name);
	};
	my $window = int($events / 10);
	$window = 1000 if $window > 1000;
	$window = 1 if $window < 1;
	my $chunk = $window < 500 ? $window : 500;
	my $emitted = 0;
	my $emit_more = sub {
		my $c = $events - $emitted;
		$c = $chunk if $c > $chunk;
		return 0 if $c <= 0;
		emit($topic, $c, $aggregates, $prefix, $emitted + 1);
		$emitted += $c;
		return $c;
	};
	my @steps = (
		[ "kill $n1", sub { $kill->($n1) } ],
		[ "restart the $what", sub {
			$o{stop_sink}->();
			$emit_more->();
			ok(wait_until(30, sub {
				grep { my ($c, $b) = http_get($_->{port}, '/healthz'); $c == 503 && $b =~ /^sink down: / } values %relays }),
				"$sink: /healthz 503 \"sink down\" while the $what is down");
			$o{start_sink}->() } ],
		[ "kill $n2", sub { $kill->($n2) } ],
		[ 'stop PostgreSQL -m immediate', sub { $node->stop('immediate'); sleep 1; $node->start } ],
		[ "kill $n1 again", sub { $kill->($n1) } ]);
	my ($step, @late) = (0);
	my ($last_progress, $seen) = (time, '');
	while (1) {
		my $undelivered = eval { undelivered() };
		my $n = eval { $distinct->() } // 0;
		my $delivered = $emitted - ($undelivered // $emitted);
		($last_progress, $seen) = (time, "$delivered $n") if "$delivered $n" ne $seen;
		if ($step < @steps && $delivered >= int($events * ($step + 1) / (@steps + 1))) {
			my $label = $steps[$step][0];
			note(sprintf('%s: %s at %.1f s: %d emitted, %d delivered, %d applied', $sink, $label, time - $t0,
				$emitted, $delivered, $n));
			push @late, "$label ($emitted emitted, $delivered delivered)" unless $emitted < $events;
			$steps[$step++][1]->();
			next;
		}
		last if $step == @steps && $emitted == $events && $n >= $events;
		next if defined $undelivered && $undelivered < $window && $emit_more->();
		if (time - $last_progress > 60) {
			diag("$sink: no progress for 60 s: $emitted emitted, $delivered delivered, $n applied, step $step");
			last;
		}
		sleep 0.05;
	}
	ok(wait_until(180, sub { (eval { undelivered() } // 1) == 0 }), "$sink: the outbox empties")
	  or diag('undelivered: ' . (eval { undelivered() } // '?'));
	my $where = "WHERE topic = '$topic'";
	is($applied->(), $events, "$sink: $events events applied, each exactly once (idem_once), through 2 relays killed 3 times, "
		  . "the $what restarted and PostgreSQL stopped -m immediate");
	is(b("SELECT count(DISTINCT event_id) FROM applied $where"), $events, "$sink: $events distinct events, none applied twice");
	is(b("SELECT count(DISTINCT aggregate) FROM applied $where"), $aggregates, "$sink: over $aggregates aggregates");
	is(b(qq{SELECT count(*) FROM (SELECT seq, row_number() OVER (PARTITION BY aggregate ORDER BY n) AS rn
	        FROM applied $where) x WHERE seq <> rn}), 0,
		"$sink: each aggregate's events first applied in seq order (no gap, no inversion)");
	is($node->safe_psql('shop', "SELECT count(*) FROM idem_outbox_dead_letters('$topic')"), 0, "$sink: nothing dead");
	ok(!@late, "$sink: each disruption came mid-run (more events to emit)") or diag(join "\n", @late);
	my $repeats = b("SELECT (SELECT count(*) FROM arrivals $where AND status = 200) - (SELECT count(*) FROM applied $where)");
	note(sprintf('%s: %d events in %.1f s; the consumer got %d repeats, rejected by idem_once', $sink, $events,
		time - $t0, $repeats));
	return \%relays;
}

# --- http: the main run ----------------------------------------------------------------
{
	my $relays = relay_run(sink => 'http', topic => 'orders', prefix => 'a', what => 'receiving service',
		relays => [qw(r1 r2)],
		start => sub { start_relay($_[0], undef, @http, '--lease=5s', '--batch-size=100') },
		stop_sink => sub { stop_process($consumer, 'KILL', 5) },
		start_sink => sub { start_consumer(DELAY_MS => 2) });
	is(b(q{SELECT count(*) FROM arrivals WHERE topic = 'orders' AND (idem_key <> '"' || event_id || '"' OR status = 401)}), 0,
		'http: every request carried Idempotency-Key: "<event id>" and a valid HMAC signature');
	like(b(q{SELECT min(path) || ' ' || max(path) FROM arrivals WHERE topic = 'orders'}), qr{^/events/orders /events/orders$},
		'http: the URL chosen by topic');
	cmp_ok(b(q{SELECT count(*) FROM arrivals WHERE topic = 'orders'}), '>=', $events, 'http: (arrivals counted, repeats allowed)');
	my $sum = 0;
	$sum += metric($relays->{$_}, 'idem_relay_events_delivered_total', 'topic="orders"') for qw(r1 r2);
	cmp_ok($sum, '>', 0, 'metrics: delivered counted per topic and sink');
	for (qw(r1 r2)) { is(stop_process($relays->{$_}, 'TERM', 20), 0, "http: $_ exits 0 on SIGTERM") }
}

# --- dead letters, Retry-After, metrics ----------------------------------------------------
{
	emit('poison', 1, 1, 'p');
	emit('flaky', 2, 1, 'f');
	emit('busy', 1, 1, 'b');
	emit('after', 3, 1, 'f');    # another topic: not held back by flaky's aggregate
	my $r = start_relay('d1', undef, @http, '--lease=5s', '--max-attempts=2');
	ok(wait_until(60, sub { undelivered() == 0 }), 'dead letters: the outbox empties');
	my %reason = map { split /\|/, $_, 2 } split /\n/,
	  $node->safe_psql('shop', q{SELECT topic || '|' || string_agg(reason, ' ; ') FROM idem_outbox_dead_letters() GROUP BY topic});
	like($reason{poison} // '', qr/^HTTP 422 Unprocessable Entity from http\S+\/events\/poison: refused$/, 'a 422: dead at once, the status as reason');
	like($reason{flaky} // '', qr/max_attempts \(2\) reached: HTTP 500 .* ; max_attempts \(2\) reached: HTTP 500/, 'max_attempts: both 500 events dead, with the reason');
	is(b(q{SELECT count(*) FROM arrivals WHERE topic = 'flaky'}), 4, 'max_attempts 2: each refused event tried twice');
	is(b(q{SELECT string_agg(status::text, ',' ORDER BY n) FROM arrivals WHERE topic = 'busy'}), '429,200', 'busy: 429 then delivered');
	cmp_ok(b(q{SELECT extract(epoch FROM max(at) - min(at)) FROM arrivals WHERE topic = 'busy'}), '>=', 1.95,
		'Retry-After: 2 waited as told');
	is(b(q{SELECT count(*) FROM applied WHERE topic = 'after'}), 3, 'other topics delivered meanwhile');
	is(metric($r, 'idem_relay_events_dead_total', 'sink="http",topic="flaky"'), 2, 'metrics: dead per topic and sink');
	is(metric($r, 'idem_relay_events_dead_total', 'sink="http",topic="poison"'), 1, 'metrics: the poison event dead');
	is(metric($r, 'idem_relay_events_retried_total', 'sink="http",topic="busy"'), 1, 'metrics: the 429 retried once');
	is(metric($r, 'idem_relay_events_delivered_total', 'sink="http",topic="after"'), 3, 'metrics: delivered per topic');
	cmp_ok(metric($r, 'idem_relay_publish_seconds_count', 'sink="http"'), '>=', 9, 'metrics: publish latency histogram');
	cmp_ok(metric($r, 'idem_relay_batch_seconds_count'), '>=', 1, 'metrics: batch latency histogram');
	my $headroom = metric($r, 'idem_relay_lease_headroom_seconds');
	ok($headroom > 0 && $headroom < 5, "metrics: lease headroom ($headroom s of 5 s)");
	is(metric($r, 'idem_relay_up', 'component="database"'), 1, 'metrics: database up');

	# /healthz follows the sink and the database.
	my ($code, $body) = http_get($r->{port}, '/healthz');
	is("$code $body", "200 ok\n", '/healthz: 200 while all is up');
	stop_process($consumer, 'KILL', 5);
	emit('after', 1, 1, 'g');
	ok(wait_until(20, sub { my ($c, $b) = http_get($r->{port}, '/healthz'); $c == 503 && $b =~ /^sink down: / }),
		'/healthz: 503 "sink down" with the receiver gone');
	start_consumer(DELAY_MS => 2);
	ok(wait_until(20, sub { (http_get($r->{port}, '/healthz'))[0] == 200 }), '/healthz: 200 again once it is back');
	$node->stop('immediate');
	ok(wait_until(20, sub { my ($c, $b) = http_get($r->{port}, '/healthz'); $c == 503 && $b =~ /^database down: / }),
		'/healthz: 503 "database down" with PostgreSQL stopped');
	$node->start;
	ok(wait_until(20, sub { (http_get($r->{port}, '/healthz'))[0] == 200 }), '/healthz: 200 again after its restart');
	ok(wait_until(30, sub { undelivered() == 0 }), 'the event emitted meanwhile is delivered');
	my @lines = grep { /"msg":"(sink|database) (up|down)"/ } split /\n/, slurp_file($r->{log});
	is(scalar(@lines), 6, 'one log line per state change: database and sink up, then down and up again each') or diag(join "\n", @lines);
	is(stop_process($r, 'TERM', 20), 0, 'exit 0 on SIGTERM');

	# A wrong shared secret: the receiver refuses (401), a dead letter.
	emit('signed', 1, 1, 's');
	$r = start_relay('d2', undef, @http, '--lease=5s', '--http-hmac-secret=wrong');
	ok(wait_until(30, sub { undelivered() == 0 }), 'wrong secret: handled');
	like($node->safe_psql('shop', q{SELECT reason FROM idem_outbox_dead_letters('signed')}), qr/^HTTP 401 /,
		'wrong secret: the receiver refuses it, a dead letter');
	stop_process($r, 'TERM', 20);
}

# --- SIGTERM drain ----------------------------------------------------------------------
{
	stop_process($consumer, 'KILL', 5);
	start_consumer(DELAY_MS => 300);
	emit('drain', 60, 60, 'd');
	my $r = start_relay('t1', undef, @http, '--lease=20s', '--batch-size=30', '--concurrency=10');
	ok(wait_until(20, sub { b(q{SELECT count(*) FROM arrivals WHERE topic = 'drain'}) > 0 }), 'drain: publishing');
	my $t0 = time;
	is(stop_process($r, 'TERM', 30), 0, 'drain: SIGTERM mid-batch exits 0');
	my $arrived = b(q{SELECT count(DISTINCT event_id) FROM arrivals WHERE topic = 'drain' AND status = 200});
	is($arrived, 30, 'drain: the batch in flight was finished (30 published), no new claim');
	# Nothing stays leased: another relay gets every undelivered event at once.
	my $left = 60 - $arrived;
	is($node->safe_psql('shop', q{WITH c AS (SELECT event_id FROM idem_outbox_claim('probe', 1000, '1min', ARRAY['drain']))
	    SELECT count(*) || ' ' || idem_outbox_ack('probe', array_agg(event_id)) FROM c}),
		"$left $left", 'drain: what was published is acked, the rest free for the next relay');
	stop_process($consumer, 'KILL', 5);
	start_consumer(DELAY_MS => 0);
}

# --- brokers ----------------------------------------------------------------------------
# Checks the messages a broker holds (JSON lines {id, aggregate, seq}): $want distinct
# events, each aggregate's first held in seq order, and (with $exactly) no repeat held.
sub check_received {
	my ($what, $lines, $want, $exactly) = @_;
	my (%first, %last, $disorder);
	$disorder = 0;
	my @msgs = map { decode_json($_) } grep { /\S/ } split /\n/, $lines;
	for my $m (@msgs) {
		next if $first{ $m->{id} }++;
		# A missing event shows here too: seq has no gap.
		$disorder++ if $m->{seq} != ($last{ $m->{aggregate} } // 0) + 1;
		$last{ $m->{aggregate} } = $m->{seq};
	}
	is(scalar(keys %first), $want, "$what: all $want events held by the stream");
	is($disorder, 0, "$what: each aggregate's events first held in seq order, none missing");
	is(scalar(@msgs), $want, "$what: no repeat kept (the stream dropped them by Nats-Msg-Id)") if $exactly;
}

my $service_b_url = 'host=' . $node->host . ' port=' . $node->port . ' dbname=service_b sslmode=disable';

{
	my $nats_port = free_port();
	my $nats_url = "nats://127.0.0.1:$nats_port";
	mkdir "$tmp/nats";
	my $start_nats = sub {
		my $p = spawn('nats-server', {}, undef, '/usr/sbin/nats-server', '-js', '-a', '127.0.0.1',
			'-p', $nats_port, '-sd', "$tmp/nats");
		wait_until(20, sub { IO::Socket::INET->new(PeerAddr => "127.0.0.1:$nats_port") })
		  or die 'nats-server did not listen';
		return $p;
	};
	my $nats = $start_nats->();
	my ($out, $err);
	IPC::Run::run([ 'make', '-s', '-C', "$repo/relay", "natsread", "NATSREAD_OUT=$tmp/natsread" ],
		'>', \$out, '2>', \$err) or die "natsread: $out$err";
	IPC::Run::run([ "$tmp/natsread", $nats_url, 'create', 'IDEM', 'ev.>' ], '>', \$out, '2>', \$err)
	  or die "stream: $err";
	# The consumer: a durable JetStream pull consumer applying each message with idem_once.
	my $reader = spawn('natsread-consume', { DATABASE_URL => $service_b_url, SCOPE => 'nats' }, undef,
		"$tmp/natsread", $nats_url, 'consume', 'IDEM', 'apply', 'ev.js.orders');
	my @nats = ('--sink=nats', "--nats-url=$nats_url", '--nats-subject-prefix=ev.', '--nats-stream=IDEM',
		'--lease=5s', '--batch-size=50', '--nats-timeout=2s', '--topics=js.orders');
	my $r = relay_run(sink => 'nats', topic => 'js.orders', prefix => 'n', what => 'NATS server',
		relays => [qw(n1 n2)],
		start => sub { start_relay($_[0], undef, @nats) },
		stop_sink => sub { ok(defined stop_process($nats, 'TERM', 20), 'nats: the server stopped') },
		start_sink => sub { $nats = $start_nats->() });
	IPC::Run::run([ "$tmp/natsread", $nats_url, 'dump', 'IDEM' ], '>', \$out, '2>', \$err) or die "dump: $err";
	check_received('nats', $out, $events, 1);
	like($out, qr/"subject":"ev\.js\.orders"/, 'nats: subject from the prefix and the topic');
	cmp_ok(metric($r->{n1}, 'idem_relay_events_delivered_total', 'sink="nats",topic="js.orders"')
		  + metric($r->{n2}, 'idem_relay_events_delivered_total', 'sink="nats",topic="js.orders"'), '>', 0,
		'nats: metrics per sink');
	is(stop_process($r->{$_}, 'TERM', 20), 0, "nats: $_ exits 0 on SIGTERM") for qw(n1 n2);
	stop_process($reader, 'TERM', 20);
	stop_process($nats, 'TERM', 20);
}

{
	my $rabbit_bin = '/usr/lib/rabbitmq/bin';
	my $rabbit_dir = "$tmp/rabbit";
	my ($amqp_port, $dist_port, $epmd_port) = map { free_port() } 1 .. 3;
	mkdir $rabbit_dir;
	mkdir "$rabbit_dir/home";
	mkdir "$rabbit_dir/mnesia";
	append_to_file("$rabbit_dir/home/.erlang.cookie", join('', map { ('A' .. 'Z')[ int(rand(26)) ] } 1 .. 20));
	chmod 0400, "$rabbit_dir/home/.erlang.cookie";
	append_to_file("$rabbit_dir/rabbitmq.conf",
		"disk_free_limit.absolute = 1MB\nvm_memory_high_watermark.relative = 0.9\n");
	my %rabbit_env = (
		HOME => "$rabbit_dir/home",
		ERL_EPMD_PORT => $epmd_port,
		ERL_EPMD_ADDRESS => '127.0.0.1',
		RABBITMQ_NODENAME => 'relay@localhost',
		RABBITMQ_NODE_IP_ADDRESS => '127.0.0.1',
		RABBITMQ_NODE_PORT => $amqp_port,
		RABBITMQ_DIST_PORT => $dist_port,
		RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS => '-kernel inet_dist_use_interface {127,0,0,1}',
		RABBITMQ_CTL_ERL_ARGS => '-kernel inet_dist_use_interface {127,0,0,1}',
		RABBITMQ_MNESIA_BASE => "$rabbit_dir/mnesia",
		RABBITMQ_LOG_BASE => "$log_path/rabbitmq",
		RABBITMQ_CONFIG_FILE => "$rabbit_dir/rabbitmq.conf",
		RABBITMQ_ADVANCED_CONFIG_FILE => "$rabbit_dir/advanced.config",
		RABBITMQ_CONF_ENV_FILE => "$rabbit_dir/rabbitmq-env.conf",
		RABBITMQ_ENABLED_PLUGINS_FILE => "$rabbit_dir/enabled_plugins",
		RABBITMQ_PLUGINS_EXPAND_DIR => "$rabbit_dir/plugins",
		RABBITMQ_PID_FILE => "$rabbit_dir/rabbitmq.pid");
	spawn('epmd', \%rabbit_env, undef, '/usr/bin/epmd', '-port', $epmd_port);
	my $starts = 0;
	my $start_rabbit = sub {
		$starts++;
		my $p = spawn("rabbitmq-$starts", \%rabbit_env, undef, "$rabbit_bin/rabbitmq-server");
		wait_until(90, sub {
			die "rabbitmq-server exited with status $p->{status}" unless running($p);
			return IO::Socket::INET->new(PeerAddr => "127.0.0.1:$amqp_port");
		}) or die 'RabbitMQ did not accept connections within 90 s';
		return $p;
	};
	my $rabbit = $start_rabbit->();
	my $url = "amqp://guest:guest\@127.0.0.1:$amqp_port/";
	my ($out, $err);
	# The AMQP port opens before the node takes clients: retried for a while.
	wait_until(60, sub {
		IPC::Run::run([ $python, "$repo/test/relay/amqpread.py", $url, 'bind', 'idem.events', 'orders-q', 'amqp.orders' ],
			'>', \$out, '2>', \$err) });
	# The consumer: manual acks, each after its idem_once transaction commits.
	my $reader = spawn('amqp-consume', { DATABASE_URL => $service_b_url, SCOPE => 'amqp' }, undef,
		$python, "$repo/test/relay/amqpread.py", $url, 'consume', 'orders-q');
	my @amqp = ('--sink=amqp', "--amqp-url=$url", '--lease=5s', '--batch-size=50', '--amqp-timeout=2s',
		'--topics=amqp.orders,amqp.nowhere');
	my $r = relay_run(sink => 'amqp', topic => 'amqp.orders', prefix => 'q', what => 'RabbitMQ broker',
		relays => [qw(a1 a2)],
		# a2 publishes up to 8 of an aggregate's events before the first confirm.
		start => sub { start_relay($_[0], undef, @amqp, $_[0] eq 'a2' ? '--amqp-pipeline=8' : ()) },
		stop_sink => sub { ok(defined stop_process($rabbit, 'TERM', 60), 'amqp: the broker stopped') },
		start_sink => sub { $rabbit = $start_rabbit->() });
	# Unroutable (no queue bound for the routing key, published mandatory): a dead letter.
	emit('amqp.nowhere', 1, 1, 'u');
	ok(wait_until(30, sub { undelivered() == 0 }), 'amqp: the unroutable event handled');
	like($node->safe_psql('shop', q{SELECT reason FROM idem_outbox_dead_letters('amqp.nowhere')}),
		qr/^unroutable: .*NO_ROUTE.*routing key "amqp.nowhere"/, 'amqp: unroutable: a dead letter with the reason');
	# An idle relay notices the broker going away and coming back (/healthz), with nothing
	# to publish.
	stop_process($rabbit, 'TERM', 60);
	ok(wait_until(30, sub { my ($c, $b) = http_get($r->{a1}{port}, '/healthz'); $c == 503 && $b =~ /^sink down: / }),
		'amqp: an idle relay\'s /healthz turns 503 "sink down" when the broker stops');
	$rabbit = $start_rabbit->();
	ok(wait_until(60, sub { my ($c) = http_get($r->{a1}{port}, '/healthz'); $c == 200 }),
		'amqp: and 200 again once it is back');
	# The broker closing an idle relay's connection: logged at once, "sink down" then
	# "sink up" once reconnected, not found only at the next publication.
	my $sink_downs = sub { my $n = () = slurp_file($r->{a1}{log}) =~ /"msg":"sink down"/g; $n };
	my $downs = $sink_downs->();
	{
		local @ENV{ keys %rabbit_env } = values %rabbit_env;
		IPC::Run::run([ "$rabbit_bin/rabbitmqctl", 'close_all_connections', 'cut by the test' ], '>', \$out, '2>', \$err)
		  or die "rabbitmqctl close_all_connections: $err";
	}
	ok(wait_until(10, sub { $sink_downs->() > $downs }),
		'amqp: an idle relay logs the connection the broker closed ("sink down")');
	ok(wait_until(20, sub { my ($c) = http_get($r->{a1}{port}, '/healthz'); $c == 200 }),
		'amqp: and reconnects (/healthz 200)');
	# --amqp-pipeline against a queue that nacks: full-q holds 5 messages and refuses more
	# (reject-publish), no one consumes it. Of 12 events of one aggregate published 4 at a
	# time, the first 5 are confirmed, in order; each later one is nacked, never acked,
	# and after --max-attempts a dead letter with the broker's refusal as the reason.
	IPC::Run::run([ $python, "$repo/test/relay/amqpread.py", $url, 'bind', 'idem.events', 'full-q', 'amqp.full', 5 ],
		'>', \$out, '2>', \$err) or die "bind full-q: $err";
	emit('amqp.full', 12, 1, 'p');
	my $p1 = start_relay('p1', undef, '--sink=amqp', "--amqp-url=$url", '--lease=5s', '--amqp-timeout=2s',
		'--topics=amqp.full', '--amqp-pipeline=4', '--max-attempts=2');
	ok(wait_until(60, sub { undelivered() == 0 }), 'amqp pipeline: every event delivered or dead');
	is($node->safe_psql('shop', q{SELECT count(*) FROM idem_outbox_dead_letters('amqp.full')
	                              WHERE reason LIKE 'max_attempts (2) reached: rejected by the broker (basic.nack)%'}),
		7, 'amqp pipeline: the 7 events the full queue refused are dead letters, with the reason');
	IPC::Run::run([ $python, "$repo/test/relay/amqpread.py", $url, 'dump', 'full-q' ], '>', \$out, '2>', \$err)
	  or die "dump full-q: $err";
	is(join(',', map { decode_json($_)->{seq} } grep { /\S/ } split /\n/, $out), '1,2,3,4,5',
		'amqp pipeline: the queue holds seq 1 to 5, in order');
	is(stop_process($p1, 'TERM', 20), 0, 'amqp pipeline: the relay exits 0 on SIGTERM');
	# The sink's writes: the frames of the publications in flight leave together
	# (sink_amqp_conn.go), not each in a system call of its own, three per message.
	IPC::Run::run([ $python, "$repo/test/relay/amqpread.py", $url, 'bind', 'idem.events', 'bulk-q', 'amqp.bulk' ],
		'>', \$out, '2>', \$err) or die "bind bulk-q: $err";
	emit('amqp.bulk', 2000, 200, 'w');
	my $w1 = start_relay('w1', undef, '--sink=amqp', "--amqp-url=$url", '--topics=amqp.bulk',
		'--batch-size=1000', '--concurrency=200');
	ok(wait_until(60, sub { undelivered() == 0 }), 'amqp writes: 2,000 events delivered');
	my ($writes) = slurp_file("/proc/$w1->{pid}/io") =~ /^syscw: (\d+)/m;
	cmp_ok($writes, '<', 2000, "amqp writes: fewer write calls than messages ($writes for 2,000; 6,000 and more unbatched)");
	is(stop_process($w1, 'TERM', 20), 0, 'amqp writes: the relay exits 0 on SIGTERM');
	cmp_ok(metric($r->{a1}, 'idem_relay_events_delivered_total', 'sink="amqp",topic="amqp.orders"')
		  + metric($r->{a2}, 'idem_relay_events_delivered_total', 'sink="amqp",topic="amqp.orders"'), '>', 0,
		'amqp: metrics per sink');
	is(metric($r->{a1}, 'idem_relay_events_dead_total', 'sink="amqp",topic="amqp.nowhere"')
		  + metric($r->{a2}, 'idem_relay_events_dead_total', 'sink="amqp",topic="amqp.nowhere"'), 1,
		'amqp: the dead letter counted');
	is(stop_process($r->{$_}, 'TERM', 20), 0, "amqp: $_ exits 0 on SIGTERM") for qw(a1 a2);
	stop_process($reader, 'TERM', 20);
	stop_process($rabbit, 'TERM', 60);
}

done_testing();
