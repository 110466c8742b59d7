# The HTTP example (examples/http/payments_service.py) end to end: real HTTP
# requests against the service, which calls the SPEC's procedure. Sequential
# retries, bad requests, concurrent duplicates, and a client that disconnects
# mid-request and retries.
use strict;
use warnings;
use IO::Socket::INET;
use IPC::Run;
use HTTP::Tiny;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('http');
$node->init;
# Duplicates give up waiting for the first attempt soon, so they answer 409 while
# the test holds the first one back.
$node->append_conf('postgresql.conf', "idempotency.wait_timeout = '300ms'\n");
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION idempotency');
$node->safe_psql('postgres', slurp_file('examples/create_payment.sql'));

# The service, on a free port, logging to the test's log directory.
my $port = PostgreSQL::Test::Cluster::get_free_port();
my $log = "$PostgreSQL::Test::Utils::log_path/payments_service.log";
my $service;
{
	local $ENV{DATABASE_URL} =
	  'host=' . $node->host . ' port=' . $node->port . ' dbname=postgres';
	local $ENV{PORT} = $port;
	$service = IPC::Run::start([ '/usr/bin/python3', 'examples/http/payments_service.py' ],
		'<', \undef, '>', $log, '2>', $log);
}
END {
	$service->kill_kill if $service;
	diag("the service's log:\n" . slurp_file($log))
	  if -e $log && !Test::More->builder->is_passing;
}

my $deadline = time + 60;
until (IO::Socket::INET->new(PeerAddr => "127.0.0.1:$port")) {
	if (time > $deadline or !$service->pumpable) {
		diag(slurp_file($log));
		BAIL_OUT('the service did not start');
	}
	select(undef, undef, undef, 0.1);
}

my $http = HTTP::Tiny->new(timeout => 30);
my $url = "http://127.0.0.1:$port/payments";

sub post {
	my ($key, $body) = @_;
	my %headers = ('Content-Type' => 'application/json');
	$headers{'Idempotency-Key'} = $key if defined $key;
	return $http->post($url, { headers => \%headers, content => $body });
}

sub payments { return $node->safe_psql('postgres', 'SELECT count(*) FROM payments'); }

# Raw requests, for many at once and for a client that leaves without reading.
sub send_raw {
	my ($key, $body) = @_;
	my $socket = IO::Socket::INET->new(PeerAddr => "127.0.0.1:$port") or die "connect: $!";
	print $socket "POST /payments HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
	  . "Idempotency-Key: $key\r\nContent-Type: application/json\r\n"
	  . 'Content-Length: ' . length($body) . "\r\n\r\n$body";
	return $socket;
}

sub read_raw {
	my ($socket) = @_;
	local $/;
	my $response = <$socket>;
	close $socket;
	my ($head, $body) = split /\r\n\r\n/, $response, 2;
	my ($status) = $head =~ m{^HTTP/1\.[01] (\d+)};
	my %headers = map { /^([^:]+):\s*(.*)$/ ? (lc $1 => $2) : () } split /\r\n/, $head;
	return { status => $status, headers => \%headers, content => $body };
}

# Holds back every payment insert (and so every first attempt) until released.
sub hold_inserts {
	my $holder = $node->background_psql('postgres');
	$holder->query_safe('BEGIN; LOCK TABLE payments IN EXCLUSIVE MODE');
	return $holder;
}

sub wait_for_blocked_insert {
	$node->poll_query_until('postgres', q{
		SELECT count(*) = 1 FROM pg_stat_activity
		WHERE wait_event_type = 'Lock' AND query LIKE 'CALL create_payment%'})
	  or die 'no attempt reached the payment insert';
}

my $body = '{"account": 42, "amount": 10}';

# Sequential retries.
my $first = post('order-1', $body);
is($first->{status}, 201, 'a first request creates the payment');
like($first->{content}, qr/"payment_id": \d+/, 'and answers with it');
ok(!defined $first->{headers}{'idempotent-replayed'}, 'not marked as a replay');
like($first->{headers}{location}, qr{^/payments/\d+$}, 'with its Location');
my $retry = post('order-1', $body);
is($retry->{status}, 201, 'a retry gets the same status');
is($retry->{content}, $first->{content}, 'and the same body');
is($retry->{headers}{'idempotent-replayed'}, 'true', 'marked as a replay');
is(payments(), 1, 'one payment for two requests');

# Requests that are refused.
is(post('order-1', '{"account": 42, "amount": 99}')->{status},
	422, 'the same key with a different body: 422');
is(post(undef, $body)->{status}, 400, 'no Idempotency-Key: 400');
my $invalid = post('x' x 300, $body);
is($invalid->{status}, 400, 'an invalid key (over 255 bytes): 400');
like($invalid->{content}, qr/invalid Idempotency-Key/, 'saying why');
is(post('order-2', '{"account": 42,')->{status}, 400, 'a body that is not JSON: 400');
is(payments(), 1, 'no payment from refused requests');

# Amounts with a fraction are numeric, not float, all the way to the table.
my $cents = post('order-5', '{"account": 42, "amount": 10.25}');
is($cents->{status}, 201, 'a fractional amount is taken');
is(post('order-5', '{"account": 42, "amount": 10.250}')->{headers}{'idempotent-replayed'},
	'true', 'and the same amount written differently replays it');
is($node->safe_psql('postgres', 'SELECT amount FROM payments ORDER BY id DESC LIMIT 1'),
	'10.25', 'stored exactly');
is(post('order-6', '{"account": 99999999999999999999, "amount": 1}')->{status},
	400, 'an account outside bigint: 400');
is(post('order-6', '{"account": 42, "amount": NaN}')->{status}, 400, 'NaN: 400');

# Concurrent duplicates: eight at once while the first attempt is held back.
my $holder = hold_inserts();
my @sockets = map { send_raw('order-3', $body) } 1 .. 8;
wait_for_blocked_insert();
sleep 1;  # the duplicates' waits (300 ms) run out meanwhile
$holder->query_safe('COMMIT');
$holder->quit;
my @responses = map { read_raw($_) } @sockets;
my @created = grep { $_->{status} == 201 && !$_->{headers}{'idempotent-replayed'} } @responses;
my @busy = grep { $_->{status} == 409 } @responses;
is(scalar @created, 1, 'of eight concurrent duplicates, exactly one creates the payment');
is(scalar(@busy) + scalar(@created), 8,
	'the others are told it is in progress')
  or diag(explain([ map { "$_->{status} $_->{content}" } @responses ]));
ok(!grep({ ($_->{headers}{'retry-after'} // '') !~ /^[1-9]\d*$/ } @busy),
	'each 409 says when to retry (Retry-After, whole seconds)');
my $later = post('order-3', $body);
is($later->{status} . ' ' . $later->{content}, '201 ' . $created[0]{content},
	'a later retry replays the created payment');
is(payments(), 3, 'one payment for nine requests');

# A client that disconnects mid-request, then retries.
$holder = hold_inserts();
my $gone = send_raw('order-4', $body);
wait_for_blocked_insert();
close $gone;
my $meanwhile = post('order-4', $body);
is($meanwhile->{status}, 409, 'a retry while the abandoned request still runs: 409');
ok(($meanwhile->{headers}{'retry-after'} // '') =~ /^[1-9]\d*$/, 'with Retry-After');
$holder->query_safe('COMMIT');
$holder->quit;
my $resumed;
$node->poll_query_until('postgres',
	q{SELECT state = 'completed' FROM idem_lookup('payments', 'order-4')})
  or die 'the abandoned request never completed';
$resumed = post('order-4', $body);
is($resumed->{status}, 201, 'the retry after it finished: 201');
is($resumed->{headers}{'idempotent-replayed'}, 'true', 'replaying the abandoned request');
my $last_id = $node->safe_psql('postgres', 'SELECT max(id) FROM payments');
like($resumed->{content}, qr/"payment_id": $last_id\b/,
	'whose payment is the one the disconnected client caused');
is(payments(), 4, 'and no second payment');

$service->kill_kill;
undef $service;
unlike(slurp_file($log), qr/Traceback/, 'the service logged no Python traceback');
done_testing();
