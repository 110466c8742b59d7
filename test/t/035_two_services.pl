# Effectively once between two services (SPEC "Delivery", README "Effectively once between
# two services"), end to end with examples/two_services/: first the README's shell block
# run as pasted (one order sent twice: one order, one shipment); then service A (FastAPI behind the
# repository's Python middleware) takes orders with an Idempotency-Key, writes each and
# emits its event in the claim's transaction; idem-relay --sink=http posts the events to
# service B (FastAPI behind the same middleware, its own database), which applies each
# event once. Checked:
#   - N orders sent to A, a fifth of them sent again (replayed, nothing written or
#     emitted twice), every order exactly one event;
#   - B losing every 7th answer after its commit (the relay posts again) and B killed
#     with SIGKILL and restarted mid-run, the relay killed with SIGKILL and restarted
#     mid-run (its events handed out again, attempt + 1: the same request to B, since
#     the attempt travels in the Idem-Attempt header, not the body, so B's middleware
#     replays them; with the attempt in the body they were 422s and dead letters): every
#     event applied exactly once in B's database, nothing dead, each customer's events
#     applied in order;
#   - the same run against B without the middleware (NO_MIDDLEWARE=1) applies repeats:
#     the failure the middleware prevents, shown to be caught by these counts.
use strict;
use warnings;
use Cwd qw(abs_path);
use IO::Socket::INET;
use Time::HiRes qw(time sleep);
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::RealBin/lib";
use IdemProcesses;

my $repo = abs_path('.');
my $python = '/usr/bin/python3';
plan skip_all => 'needs python3-fastapi, python3-uvicorn, python3-psycopg, python3-psycopg-pool'
  unless system($python, '-c', 'import fastapi, uvicorn, psycopg, psycopg_pool') == 0;

my $orders = $ENV{IDEM_TWO_SERVICES_ORDERS} // 300;

my $node = PostgreSQL::Test::Cluster->new('two_services');
$node->init;
$node->append_conf('postgresql.conf', "shared_preload_libraries = 'idempotency'\nmax_connections = 60\n"
	  . "unix_socket_directories = '" . $node->host . ", /var/run/postgresql, /tmp'\n");
$node->start;

# --- the README's block, as pasted ------------------------------------------------------
# Run by bash from the repository's root as a user would: the server also listens where
# psql and the relay look by default (libpq's socket directory: Debian's
# /var/run/postgresql, or /tmp for PostgreSQL built from source), and only PGPORT is
# set, so every connection the block makes is the block's own doing.
{
	my ($block) = slurp_file("$repo/README.md") =~ /^### Effectively once between two services\n.*?^```sh\n(.*?)^```$/ms
	  or die 'README.md: no shell block under "Effectively once between two services"';
	local $ENV{PGPORT} = $node->port;
	local $ENV{PGHOST};
	delete $ENV{PGHOST};
	my ($out, $err) = ('', '');
	my $ok = eval { IPC::Run::run([ 'bash', '-c', $block ], '>', \$out, '2>', \$err, IPC::Run::timeout(300)) };
	ok($ok, 'README: the two services block runs as pasted') or diag("stdout:\n$out\nstderr:\n$err\n$@");
	my @answers = $out =~ /^(\{.*"order_id".*\})$/mg;
	ok(@answers == 2 && $answers[0] eq $answers[1], 'README: the retry got the first answer again')
	  or diag($out);
	like($out, qr/^\(1 row\)$/m, 'README: one shipment in service B, as its comment says') or diag($err);
	is($node->safe_psql('service_a', 'SELECT count(*) FROM orders'), 1, 'README: one order in service A');
	$node->safe_psql('postgres', 'DROP DATABASE service_a WITH (FORCE)');
	$node->safe_psql('postgres', 'DROP DATABASE service_b WITH (FORCE)');
}

$node->safe_psql('postgres', 'CREATE DATABASE service_a');
$node->safe_psql('postgres', 'CREATE DATABASE service_b');
$node->safe_psql('service_a', slurp_file("$repo/examples/two_services/a.sql"));
$node->safe_psql('service_b', slurp_file("$repo/examples/two_services/b.sql"));
$node->safe_psql('service_a', q{
  CREATE ROLE relay LOGIN;
  GRANT EXECUTE ON FUNCTION idem_outbox_claim(text, integer, interval, text[]),
      idem_outbox_ack(text, idem_key[]), idem_outbox_dead(text, idem_key[], text) TO relay;});

my $tmp = PostgreSQL::Test::Utils::tempdir();
sub listening { my ($port) = @_; return IO::Socket::INET->new(PeerAddr => "127.0.0.1:$port"); }

# --- the relay binary ---------------------------------------------------------------
my $relay_bin = "$tmp/idem-relay";
{
	my ($out, $err);
	my $ok = IPC::Run::run([ 'make', '-s', '-C', "$repo/relay", "OUT=$relay_bin" ],
		'>', \$out, '2>', \$err);
	ok($ok && -x $relay_bin, 'idem-relay builds') or BAIL_OUT("the relay did not build: $out$err");
}

# --- the services ---------------------------------------------------------------------
my $a_port = PostgreSQL::Test::Cluster::get_free_port();
my $b_port = PostgreSQL::Test::Cluster::get_free_port();
my $dsn = 'host=' . $node->host . ' port=' . $node->port;

sub start_service {
	my ($which, $port, %env) = @_;
	my $p = spawn("service_$which", {
		DATABASE_URL => "$dsn dbname=service_$which", PORT => $port,
		PYTHONPATH => "$repo/middleware/python", %env },
		undef, $python, "$repo/examples/two_services/service_$which.py");
	wait_until(30, sub { listening($port) }) or die "service $which did not listen";
	return $p;
}

my $a = start_service('a', $a_port);
my $b = start_service('b', $b_port, LOSE_ANSWER_EVERY => 7);

my $relay_count = 0;
sub start_relay {
	$relay_count++;
	return spawn("relay-$relay_count", {
		PGHOST => $node->host, PGPORT => $node->port, PGDATABASE => 'service_a',
		PGUSER => 'relay', PGSSLMODE => 'disable' },
		undef, $relay_bin, '--name=relay-1', '--listen=', '--sink=http', '--max-backoff=1s', '--idle=100ms',
		"--http-url=http://127.0.0.1:$b_port/events/{topic}", '--http-timeout=2s', '--lease=10s');
}
my $relay = start_relay();

# POSTs to A; returns (status, headers text, body).
sub post_order {
	my ($key, $customer, $amount) = @_;
	my $body = qq({"customer": $customer, "amount": $amount});
	my $s = IO::Socket::INET->new(PeerAddr => "127.0.0.1:$a_port", Timeout => 10) or return (0, '', '');
	print $s "POST /orders HTTP/1.0\r\nHost: a\r\nContent-Type: application/json\r\n"
	  . "Idempotency-Key: \"$key\"\r\nContent-Length: " . length($body) . "\r\n\r\n$body";
	local $/;
	my $resp = <$s> // '';
	my ($code) = $resp =~ m{^HTTP/\S+ (\d+)};
	my ($head, $rbody) = split /\r\n\r\n/, $resp, 2;
	return ($code // 0, $head // '', $rbody // '');
}

sub b_sql { return $node->safe_psql('service_b', $_[0]); }
sub a_sql { return $node->safe_psql('service_a', $_[0]); }

# --- the run ------------------------------------------------------------------------------
my ($bad_first, $bad_repeat, $replayed) = (0, 0, 0);
for my $i (1 .. $orders) {
	my ($code, $head, $body) = post_order("order-$i", $i % 10, $i);
	$bad_first++ unless $code == 201 && $body =~ /"order_id":\d+/;
	if ($i % 5 == 0) {    # a client retrying: the same key, the same body
		my ($code2, $head2, $body2) = post_order("order-$i", $i % 10, $i);
		$replayed++ if $head2 =~ /^Idempotent-Replayed: true/mi;
		$bad_repeat++ unless $code2 == 201 && $body2 eq $body;
	}
	if ($i == int($orders / 2)) {    # service B dies and comes back mid-run
		stop_process($b, 'KILL', 5);
		sleep 0.5;
		$b = start_service('b', $b_port, LOSE_ANSWER_EVERY => 7);
	}
	if ($i == int($orders * 3 / 4)) {    # the relay killed mid-batch and restarted
		stop_process($relay, 'KILL', 5);
		$relay = start_relay();
	}
}
is($bad_first, 0, "A: $orders orders taken (201 with an order id)");
is($bad_repeat, 0, 'A: every repeated request answered the same as the first');
is($replayed, int($orders / 5), 'A: every repeat replayed (Idempotent-Replayed: true)');
is(a_sql('SELECT count(*) FROM orders'), $orders, 'A: one order per key, none written twice');

ok(wait_until(120, sub { b_sql('SELECT count(DISTINCT event_id) FROM shipments') >= $orders }),
	'B: every event arrived') or diag(b_sql('SELECT count(*), count(DISTINCT event_id) FROM shipments'));
ok(wait_until(30, sub { a_sql('SELECT outbox_undelivered FROM idem_stats()') == 0 }),
	'A: the outbox is drained (every event acked)');
is(a_sql('SELECT count(*) FROM idem_outbox_dead_letters()'), 0, 'no dead letters');
is(b_sql('SELECT count(*) FROM shipments'), $orders, "B: exactly $orders shipments: each event applied once");
is(b_sql('SELECT count(*) - count(DISTINCT event_id) FROM shipments'), 0, 'B: no event applied twice');
is(b_sql('SELECT string_agg(order_id::text, \',\' ORDER BY order_id) FROM shipments'),
	a_sql('SELECT string_agg(id::text, \',\' ORDER BY id) FROM orders'),
	'B: the shipments are exactly A\'s orders');
is(b_sql(q{SELECT count(*) FROM (SELECT order_id < lag(order_id) OVER (PARTITION BY customer ORDER BY n) AS back
                                  FROM shipments) s WHERE back}),
	0, 'B: each customer\'s events applied in order');
# The relay did post again: B answered 502 for every 7th POST (after its commit) and was
# killed mid-run; B's middleware stored a key per event and replayed the repeats.
my $keys = b_sql(q{SELECT count(*) FROM idempotency.keys});
cmp_ok($keys, '>=', $orders, "B: the middleware stored a key per event ($keys)");

# --- the forced failure: B without the middleware -----------------------------------------
stop_process($b, 'TERM', 10);
b_sql('TRUNCATE shipments');
$b = start_service('b', $b_port, LOSE_ANSWER_EVERY => 7, NO_MIDDLEWARE => 1);
my $more = 50;
for my $i (1 .. $more) { post_order("more-$i", $i % 10, $i); }
ok(wait_until(60, sub { a_sql('SELECT outbox_undelivered FROM idem_stats()') == 0 }),
	'without the middleware: the outbox drains too');
my ($all, $distinct) = split /\|/, b_sql('SELECT count(*), count(DISTINCT event_id) FROM shipments');
is($distinct, $more, "without the middleware: every event arrived ($distinct)");
cmp_ok($all, '>', $more, "without the middleware: B applies the repeats ($all rows for $more events): "
	  . 'the counts above catch it');

is(stop_process($relay, 'TERM', 20), 0, 'the relay stops on SIGTERM with exit 0');
done_testing();
