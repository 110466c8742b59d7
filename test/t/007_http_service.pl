# The HTTP example (examples/http/payments_service.py) end to end: real HTTP
# requests against the service, which calls examples/http/payments.sql. The
# Idempotency-Key field as draft-ietf-httpapi-idempotency-key-header defines it (a
# Structured Field String) and the ways it can be malformed; replays with their
# status, Location and marker; problem details for every refusal; the published
# expiry; concurrent duplicates, and a client that disconnects mid-request and retries.
use strict;
use warnings;
use IO::Socket::INET;
use IPC::Run;
use JSON::PP;
use Time::Local qw(timegm);
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
$node->safe_psql('postgres', slurp_file('examples/http/payments.sql'));

# The service, on a free port, logging to the test's log directory.
my $port = PostgreSQL::Test::Cluster::get_free_port();
my $log = "$PostgreSQL::Test::Utils::log_path/payments_service.log";
my $service;
{
	local $ENV{DATABASE_URL} =
	  'host=' . $node->host . ' port=' . $node->port . ' dbname=postgres';
	local $ENV{PORT} = $port;
	local $ENV{REQUEST_TIMEOUT} = '4';
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

# Raw requests, so that a field value goes out byte for byte (quotes, tabs, non-ASCII,
# repeated fields), many can be in flight at once, and a client can leave without
# reading. `keys` are the Idempotency-Key field values, one line each.
sub send_request {
	my (%request) = @_;
	my $body = $request{body} // '';
	my $socket = IO::Socket::INET->new(PeerAddr => "127.0.0.1:$port") or die "connect: $!";
	binmode $socket;
	print $socket ($request{method} // 'POST') . ' ' . ($request{path} // '/payments')
	  . " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
	  . join('', map { "Idempotency-Key: $_\r\n" } @{ $request{keys} // [] })
	  . "Content-Type: application/json\r\nContent-Length: " . length($body) . "\r\n\r\n$body";
	return $socket;
}

sub read_response {
	my ($socket) = @_;
	local $/;
	my $response = <$socket>;
	close $socket;
	my ($head, $body) = split /\r\n\r\n/, $response, 2;
	my ($status) = $head =~ m{^HTTP/1\.[01] (\d+)};
	my %headers = map { /^([^:]+):\s*(.*)$/ ? (lc $1 => $2) : () } split /\r\n/, $head;
	return {
		status => $status,
		headers => \%headers,
		content => $body,
		json => eval { decode_json($body) } };
}

sub post {
	my ($key, $body) = @_;
	return read_response(send_request(keys => [ defined $key ? $key : () ], body => $body));
}

sub payments { return $node->safe_psql('postgres', 'SELECT count(*) FROM payments'); }

sub key_state {
	my ($key) = @_;
	return $node->safe_psql('postgres',
		"SELECT state FROM idem_lookup('payments-service POST /payments', \$k\$$key\$k\$)");
}

# An RFC 9457 problem of the given status, whose type is the given section of the
# documentation (or about:blank).
sub is_problem {
	my ($response, $status, $kind, $name) = @_;
	my $problem = $response->{json} // {};
	my $type_ok = $kind eq 'about:blank'
	  ? ($problem->{type} // '') eq 'about:blank'
	  : ($problem->{type} // '') =~ /#\Q$kind\E\z/;
	ok( ($response->{status} // 0) == $status
		  && ($response->{headers}{'content-type'} // '') eq 'application/problem+json'
		  && ($problem->{status} // 0) == $status
		  && $type_ok
		  && length($problem->{title} // '')
		  && length($problem->{detail} // ''),
		"$name: $status, problem+json, $kind")
	  or diag(explain($response));
}

my %month;
@month{qw(Jan Feb Mar Apr May Jun Jul Aug Sep Oct Nov Dec)} = (0 .. 11);

# Seconds since the epoch of an HTTP-date (IMF-fixdate), or undef.
sub http_date {
	my ($day, $mon, $year, $h, $m, $s) = ($_[0] // '')
	  =~ /^(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun), (\d\d) (\w{3}) (\d{4}) (\d\d):(\d\d):(\d\d) GMT$/
	  or return undef;
	return timegm($s, $m, $h, $day, $month{$mon}, $year);
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
		WHERE wait_event_type = 'Lock' AND query LIKE 'CALL http_create_payment%'})
	  or die 'no attempt reached the payment insert';
}

my $body = '{"account": 42, "amount": 10}';

# The key as the draft writes it, a String; then retried.
my $first = post('"order-1"', $body);
is($first->{status}, 201, 'a first request creates the payment');
like($first->{content}, qr/"payment_id": \d+/, 'and answers with it');
is($first->{headers}{'content-type'}, 'application/json', 'as JSON');
ok(!defined $first->{headers}{'idempotent-replayed'}, 'not marked as a replay');
like($first->{headers}{location}, qr{^/payments/\d+$}, 'with its Location');
is(key_state('order-1'), 'completed', 'the key is the String without its quotes');
my $retry = post('"order-1"', $body);
is($retry->{status}, 201, 'a retry gets the same status');
is($retry->{content}, $first->{content}, 'the same body');
is($retry->{headers}{location}, $first->{headers}{location}, 'the same Location');
is($retry->{headers}{'idempotent-replayed'}, 'true', 'marked as a replay');
is(payments(), 1, 'one payment for two requests');

# The published expiry: the key's expires_at, to the second.
my $expires = http_date($first->{headers}{'idempotency-key-expires'});
is( $expires,
	$node->safe_psql('postgres',
		q{SELECT floor(extract(epoch FROM expires_at))::bigint FROM idem_lookup('payments-service POST /payments', 'order-1')}),
	'Idempotency-Key-Expires is an HTTP-date: when the key is forgotten');
my $window = $expires - (http_date($first->{headers}{date}) // 0);
ok($window > 86400 - 60 && $window <= 86400,
	'a day after the response (idempotency.default_ttl)')
  or diag("Idempotency-Key-Expires - Date = $window s");
is($retry->{headers}{'idempotency-key-expires'}, $first->{headers}{'idempotency-key-expires'},
	'a replay publishes the same expiry');

# The same String written differently is the same key; parameters are ignored.
for my $same (
	[ '   "order-1"   ', 'spaces around the String' ],
	[ "\"order-1\"\t", 'a tab after it (HTTP drops it)' ],
	[ '"order-1";v=2', 'a parameter' ],
	[ '"order-1"; a=1;b="x;\\"";c=?0;d=:AQ==:;e=tok/en;f=-1.5;g', 'parameters of every kind' ])
{
	my $response = post($same->[0], $body);
	ok( $response->{status} == 201
		  && ($response->{headers}{'idempotent-replayed'} // '') eq 'true'
		  && $response->{content} eq $first->{content},
		"the same key with $same->[1]: a replay")
	  or diag(explain($response));
}
# A String's escapes: \" and \\ stand for " and \, both valid in a key.
my $escaped = post('"o\\"rder\\\\8"', $body);
is($escaped->{status}, 201, 'a key with escapes creates a payment');
is(key_state('o"rder\\8'), 'completed', 'under the key with the escapes resolved');
is(post('"o\\"rder\\\\8"', $body)->{headers}{'idempotent-replayed'},
	'true', 'and its retry replays it');
is(payments(), 2, 'one payment per key');

# Requests that are refused, each with a problem.
is_problem(post(undef, $body), 400, 'missing-key', 'no Idempotency-Key');
my $bare = post('order-1', $body);
is_problem($bare, 400, 'malformed-key', 'a bare token, not a String');
like($bare->{json}{detail}, qr/double quotes/, 'saying why');
for my $malformed (
	[ '', 'an empty field' ],
	[ '""', 'an empty String (a key has 1 to 255 characters)' ],
	[ '"order 7"', 'a space inside (a String may hold one, a key may not)' ],
	[ '"order-7', 'no closing quote' ],
	[ '"order\\n7"', 'an escape other than \\" and \\\\' ],
	[ '"order\\', 'a backslash at the end' ],
	[ "\"caf\xc3\xa9\"", 'non-ASCII bytes' ],
	[ "\"order\t7\"", 'a tab inside' ],
	[ "\"order\x7f7\"", 'DEL inside' ],
	[ '"' . ('x' x 256) . '"', 'a key over 255 characters' ],
	[ '"order-7" x', 'something after the String' ],
	[ '"order-7", "order-8"', 'two Strings (a List, not an Item)' ],
	[ '"order-7" ;a=1', 'a space before a parameter' ],
	[ '"order-7";A=1', 'a parameter name with a capital' ],
	[ '"order-7";a=', 'a parameter without its value' ],
	[ '"order-7";a=1.2345', 'a parameter value that is not an item' ])
{
	is_problem(post($malformed->[0], $body), 400, 'malformed-key', $malformed->[1]);
}
is_problem(read_response(send_request(keys => [ '"order-7"', '"order-7"' ], body => $body)),
	400, 'malformed-key', 'two Idempotency-Key fields');
is_problem(post('"order-2"', '{"account": 42,'), 400, 'invalid-payment', 'a body that is not JSON');
my $reused = post('"order-1"', '{"account": 42, "amount": 99}');
is_problem($reused, 422, 'key-reused', 'the same key with a different body');
is($reused->{headers}{'idempotency-key-expires'}, $first->{headers}{'idempotency-key-expires'},
	'with when the key is forgotten');
is_problem(read_response(send_request(path => '/refunds', keys => ['"order-2"'], body => $body)),
	404, 'about:blank', 'another path');
is_problem(read_response(send_request(method => 'GET', path => '/payments')),
	501, 'about:blank', 'another method');
is(payments(), 2, 'no payment from refused requests');
is($node->safe_psql('postgres', q{SELECT count(*) FROM idem_lookup('payments-service POST /payments', 'order-7')}),
	'0', 'and no key');

# Amounts with a fraction are numeric, not float, all the way to the table.
my $cents = post('"order-5"', '{"account": 42, "amount": 10.25}');
is($cents->{status}, 201, 'a fractional amount is taken');
is(post('"order-5"', '{"account": 42, "amount": 10.250}')->{headers}{'idempotent-replayed'},
	'true', 'and the same amount written differently replays it');
is($node->safe_psql('postgres', 'SELECT amount FROM payments ORDER BY id DESC LIMIT 1'),
	'10.25', 'stored exactly');
is_problem(post('"order-6"', '{"account": 99999999999999999999, "amount": 1}'),
	400, 'invalid-payment', 'an account outside bigint');
is_problem(post('"order-6"', '{"account": 42, "amount": NaN}'), 400, 'invalid-payment', 'NaN');

# Concurrent duplicates: eight at once while the first attempt is held back.
my $holder = hold_inserts();
my @sockets = map { send_request(keys => ['"order-3"'], body => $body) } 1 .. 8;
wait_for_blocked_insert();
sleep 1;  # the duplicates' waits (300 ms) run out meanwhile
$holder->query_safe('COMMIT');
$holder->quit;
my @responses = map { read_response($_) } @sockets;
my @created = grep { $_->{status} == 201 && !$_->{headers}{'idempotent-replayed'} } @responses;
my @busy = grep { $_->{status} == 409 } @responses;
is(scalar @created, 1, 'of eight concurrent duplicates, exactly one creates the payment');
is(scalar(@busy) + scalar(@created), 8,
	'the others are told it is in progress')
  or diag(explain([ map { "$_->{status} $_->{content}" } @responses ]));
is_problem($busy[0] // {}, 409, 'in-progress', 'a duplicate in progress');
ok(!grep({ ($_->{headers}{'retry-after'} // '') !~ /^[1-9]\d*$/ } @busy),
	'each 409 says when to retry (Retry-After, whole seconds)');
# The time left, not the time waited: the attempt in flight held the key for the
# 300 ms each duplicate waited, so it is over within the rest of the service's
# REQUEST_TIMEOUT (4 s): ceil(4 - 0.3) = 4 (the time waited would say 1).
is(join(' ', sort map { $_->{headers}{'retry-after'} // '' } @busy), join(' ', ('4') x @busy),
	'Retry-After is the time left of the attempt in flight');
ok(!grep({ ($_->{headers}{'content-type'} // '') ne 'application/problem+json' } @busy),
	'each as a problem');
my $later = post('"order-3"', $body);
is($later->{status} . ' ' . $later->{content}, '201 ' . $created[0]{content},
	'a later retry replays the created payment');
is($later->{headers}{location}, $created[0]{headers}{location}, 'with its Location');
is(payments(), 4, 'one payment for nine requests');

# A client that disconnects mid-request, then retries.
$holder = hold_inserts();
my $gone = send_request(keys => ['"order-4"'], body => $body);
wait_for_blocked_insert();
close $gone;
my $meanwhile = post('"order-4"', $body);
is_problem($meanwhile, 409, 'in-progress', 'a retry while the abandoned request still runs');
ok(($meanwhile->{headers}{'retry-after'} // '') =~ /^[1-9]\d*$/, 'with Retry-After');
$holder->query_safe('COMMIT');
$holder->quit;
$node->poll_query_until('postgres',
	q{SELECT state = 'completed' FROM idem_lookup('payments-service POST /payments', 'order-4')})
  or die 'the abandoned request never completed';
my $resumed = post('"order-4"', $body);
is($resumed->{status}, 201, 'the retry after it finished: 201');
is($resumed->{headers}{'idempotent-replayed'}, 'true', 'replaying the abandoned request');
my $last_id = $node->safe_psql('postgres', 'SELECT max(id) FROM payments');
like($resumed->{content}, qr/"payment_id": $last_id\b/,
	'whose payment is the one the disconnected client caused');
is($resumed->{headers}{location}, "/payments/$last_id", 'and its Location');
is(payments(), 5, 'and no second payment');

$service->kill_kill;
undef $service;
unlike(slurp_file($log), qr/Traceback/, 'the service logged no Python traceback');
done_testing();
