# The Idempotency-Key middleware of middleware/ (docs/middleware.md) in the real
# frameworks against a real cluster: for Python, FastAPI under uvicorn with
# idempotency_http and psycopg 3; for Node.js, Express 5 with idempotency-express and
# node-postgres (installed here by `npm ci` from the lock file); for Go, net/http with
# idemhttp and lib/pq (Debian's). Each serves the payments app of test/middleware/, and
# for each:
#   - its canonical JSON is right for every fingerprint vector, and its request
#     fingerprint equals the server's idem_fingerprint of the same document;
#   - 4 concurrent duplicates of each of 20 keys: one payment per key (counted in the
#     table), one new 201 per key, the others replays of it (a 409 is retried);
#   - a replay (stored status, Location, body, Idempotent-Replayed: true), a reused key
#     (422), a malformed key and a missing one (400), an optional key left out;
#   - 409 with Retry-After while another request holds the key (held inside its handler
#     on an advisory lock the test holds), then the replay;
#   - a handler that throws after its insert: 500, nothing stored, the retry pays once;
#   - a final error (402) stored with idem_fail and replayed;
#   - lease mode: 409 with the lease's time left while the handler runs, the checkpoint
#     and the completion stored;
#   - the server killed while a handler is inside its transaction: the claim is gone with
#     it, and after a restart the retry pays once.
# As in 021_clients.pl, a missing toolchain or package fails the test, never skips it.
use strict;
use warnings;
use Cwd qw(abs_path);
use File::Copy qw(copy);
use File::Path qw(make_path);
use IO::Socket::INET;
use IPC::Run;
use JSON::PP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $repo = abs_path('.');
my ($keys, $duplicates) = (20, 4);

my $node = PostgreSQL::Test::Cluster->new('middleware');
$node->init;
# Duplicates give up waiting for a request in flight soon (409); a backend whose client
# died notices it within 100 ms even while it waits for a lock.
$node->append_conf('postgresql.conf', qq{
listen_addresses = '127.0.0.1'
idempotency.wait_timeout = '300ms'
client_connection_check_interval = '100ms'
});
$node->start;
$node->safe_psql('postgres', q{
	CREATE EXTENSION idempotency;
	CREATE TABLE payments (id bigserial PRIMARY KEY, account bigint, amount numeric);
	CREATE TABLE declines (id bigserial PRIMARY KEY, account bigint);});
my $user = scalar getpwuid($<);
my $tmp = PostgreSQL::Test::Utils::tempdir();

sub copy_dir {
	my ($from, $to) = @_;
	make_path($to);
	opendir(my $dir, $from) or die "opendir $from: $!";
	for my $file (grep { -f "$from/$_" } readdir $dir) {
		copy("$from/$file", "$to/$file") or die "copy $from/$file: $!";
	}
}

# Runs a command (in DIR, with ENV); returns (success, stdout, stderr).
sub run_step {
	my ($command, %options) = @_;
	my ($out, $err) = ('', '');
	local %ENV = (%ENV, %{ $options{env} // {} });
	my $ok = eval {
		IPC::Run::run($command, '<', \undef, '>', \$out, '2>', \$err,
			init => sub { chdir $options{dir} or die "chdir $options{dir}: $!" if $options{dir} },
			IPC::Run::timeout(300));
	};
	$err .= $@ if $@;
	return ($ok, $out, $err);
}

# The app's fingerprint of (method, path, body) as hex: a command that prints it.
my $express_dir = "$tmp/repo/test/middleware/express";
my @apps = (
	{
		name => 'fastapi',
		app_name => 'fastapi-payments',
		base => 10000,
		build => [ [ '/usr/bin/python3', '-c', 'import fastapi, uvicorn, psycopg, psycopg_pool' ] ],
		command => [ '/usr/bin/python3', "$repo/test/middleware/fastapi/payments_app.py" ],
		env => sub {
			my ($port) = @_;
			return {
				PYTHONPATH => "$repo/middleware/python",
				PYTHONDONTWRITEBYTECODE => 1,
				PORT => $port,
				DATABASE_URL => 'host=127.0.0.1 port=' . $node->port
				  . " dbname=postgres user=$user application_name=fastapi-payments" };
		},
		fingerprint => [
			'/usr/bin/python3', '-c',
			'import sys; from idempotency_http import request_fingerprint as f; '
			  . 'print(f(sys.argv[1], sys.argv[2], sys.argv[3].encode()).hex())'
		],
		# Prints the names of the vectors whose canonical text it gets wrong.
		vectors => [
			'/usr/bin/python3', '-c',
			'import json, sys; from idempotency_http import canonical_json as c; '
			  . '[print(v["name"]) for v in json.load(open(sys.argv[1], encoding="utf-8")) '
			  . 'if c(v["input"]) != v["canonical"]]'
		],
	},
	{
		name => 'express',
		app_name => 'express-payments',
		base => 20000,
		prepare => sub {
			# The app depends on the middleware by a relative path: keep the layout.
			copy_dir("$repo/middleware/node", "$tmp/repo/middleware/node");
			copy_dir("$repo/test/middleware/express", $express_dir);
		},
		dir => $express_dir,
		build => [ [ 'npm', 'ci', '--no-audit', '--no-fund', '--cache', "$tmp/npm-cache" ] ],
		command => [ 'node', "$express_dir/payments_app.js" ],
		env => sub {
			my ($port) = @_;
			return {
				PORT => $port,
				PGHOST => '127.0.0.1',
				PGPORT => $node->port,
				PGDATABASE => 'postgres',
				PGUSER => $user,
				PGAPPNAME => 'express-payments' };
		},
		fingerprint => [
			'node', '-e',
			"const { requestFingerprint: f } = require('$tmp/repo/middleware/node/fingerprint.js');"
			  . 'const [m, p, b] = process.argv.slice(1); console.log(f(m, p, Buffer.from(b)).toString("hex"))'
		],
		vectors => [
			'node', '-e',
			"const { canonicalJson: c } = require('$tmp/repo/middleware/node/fingerprint.js');"
			  . 'for (const v of JSON.parse(require("fs").readFileSync(process.argv[1], "utf8")))'
			  . ' if (c(v.input) !== v.canonical) console.log(v.name)'
		],
	},
	{
		name => 'go',
		app_name => 'go-payments',
		base => 30000,
		prepare => sub {
			copy_dir("$repo/middleware/go", "$tmp/repo/middleware/go");
			copy_dir("$repo/test/middleware/gohttp", "$tmp/repo/test/middleware/gohttp");
		},
		dir => "$tmp/repo/test/middleware/gohttp",
		build => [ [ 'go', 'build', '-o', "$tmp/go-payments", '.' ] ],
		build_env => {
			# No VCS stamp: the copy may lie in a git work tree of another owner.
			GOFLAGS => '-mod=mod -buildvcs=false',
			GOPROXY => 'off',
			GOPATH => "$tmp/gopath",
			GOCACHE => "$tmp/gocache" },
		command => ["$tmp/go-payments"],
		env => sub {
			my ($port) = @_;
			return {
				PORT => $port,
				PGHOST => '127.0.0.1',
				PGPORT => $node->port,
				PGDATABASE => 'postgres',
				PGUSER => $user,
				PGSSLMODE => 'disable',
				PGAPPNAME => 'go-payments' };
		},
		fingerprint => [ "$tmp/go-payments", 'fingerprint' ],
		vectors => [ "$tmp/go-payments", 'vectors' ],
	});

# Starts the app on a free port; returns (handle, port, log).
sub start_app {
	my ($app) = @_;
	my $port = PostgreSQL::Test::Cluster::get_free_port();
	my $log = "$PostgreSQL::Test::Utils::log_path/$app->{name}.log";
	my $handle;
	{
		local %ENV = (%ENV, %{ $app->{env}->($port) });
		$handle = IPC::Run::start($app->{command}, '<', \undef, '>>', $log, '2>>', $log);
	}
	my $deadline = time + 60;
	until (IO::Socket::INET->new(PeerAddr => "127.0.0.1:$port")) {
		if (time > $deadline or !$handle->pumpable) {
			diag(slurp_file($log));
			BAIL_OUT("$app->{name}: the app did not start");
		}
		select(undef, undef, undef, 0.1);
	}
	return ($handle, $port, $log);
}

# A raw request, so that many can be in flight at once and the test controls the
# bytes of the header. `key` is the Idempotency-Key field value (none if undef).
sub send_request {
	my ($port, $path, $key, $body, %headers) = @_;
	my $socket = IO::Socket::INET->new(PeerAddr => "127.0.0.1:$port") or die "connect: $!";
	binmode $socket;
	$headers{'Idempotency-Key'} = $key if defined $key;
	print $socket "POST $path HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
	  . join('', map { "$_: $headers{$_}\r\n" } sort keys %headers)
	  . "Content-Type: application/json\r\nContent-Length: " . length($body) . "\r\n\r\n$body";
	return $socket;
}

sub read_response {
	my ($socket) = @_;
	local $/;
	my $response = <$socket> // '';
	close $socket;
	my ($head, $body) = split /\r\n\r\n/, $response, 2;
	my ($status) = ($head // '') =~ m{^HTTP/1\.[01] (\d+)};
	my %headers = map { /^([^:]+):\s*(.*)$/ ? (lc $1 => $2) : () } split /\r\n/, $head // '';
	return {
		status => $status // 0,
		headers => \%headers,
		replayed => ($headers{'idempotent-replayed'} // '') eq 'true',
		json => eval { decode_json($body // '') } // {} };
}

sub post { return read_response(send_request(@_)); }

sub payments {
	my ($account) = @_;
	return $node->safe_psql('postgres', "SELECT count(*) FROM payments WHERE account = $account");
}

sub lookup {
	my ($scope, $key) = @_;
	return $node->safe_psql('postgres',
		"SELECT state || ' ' || coalesce(checkpoint, '-') FROM idem_lookup('$scope', '$key')");
}

# A session that holds advisory lock 43, which every handler takes shared: a request
# then waits inside its handler, in its transaction, after its claim.
sub hold_handlers {
	my $gate = $node->background_psql('postgres');
	$gate->query_safe('SELECT pg_advisory_lock(43)');
	return $gate;
}

sub handler_waiting {
	my ($app_name) = @_;
	return $node->poll_query_until('postgres', qq{
		SELECT count(*) > 0 FROM pg_stat_activity
		WHERE application_name = '$app_name' AND wait_event = 'advisory'});
}

for my $app (@apps) {
	my $name = $app->{name};
	my $base = $app->{base};
	my $app_name = $app->{app_name};
	$app->{prepare}->() if $app->{prepare};
	my ($built, $log) = (1, '');
	for my $step (@{ $app->{build} }) {
		my ($ok, $out, $err) = run_step($step, dir => $app->{dir}, env => $app->{build_env});
		$log .= "\$ @$step\n$out$err";
		$built &&= $ok;
		last unless $ok;
	}
	ok($built, "$name: the app's packages are there") or diag($log);
	next unless $built;

	# The fingerprint, computed in the app, is the server's for the same document.
	for my $case ([ '{"b": 1.50, "a": [1e3, "x"]}', q{'body', '{"b": 1.50, "a": [1e3, "x"]}'::jsonb} ],
		[ '', q{'body', NULL::jsonb} ],
		[ 'not json', q{'raw', encode(sha256('not json'), 'hex')} ])
	{
		my ($body, $member) = @$case;
		my ($ok, $out, $err) = run_step(
			[ @{ $app->{fingerprint} }, 'POST', '/payments?x=1', $body ],
			env => $app->{env}->(0));
		my $server = $node->safe_psql('postgres', qq{
			SELECT encode(idem_fingerprint(jsonb_build_object('method', 'POST',
			  'path', '/payments?x=1', $member)), 'hex')});
		is($out =~ s/\s+//gr, $server, "$name: the fingerprint of body '$body' is the server's")
		  or diag($err);
	}

	my ($vectors_ok, $wrong_vectors, $vectors_err) =
	  run_step([ @{ $app->{vectors} }, "$repo/test/fingerprint_vectors.json" ], env => $app->{env}->(0));
	ok($vectors_ok && $wrong_vectors eq '',
		"$name: its canonical JSON is right for every vector of test/fingerprint_vectors.json")
	  or diag("$wrong_vectors$vectors_err");

	my ($server, $port, $server_log) = start_app($app);

	# 4 concurrent duplicates of each key.
	my @sockets;
	for my $i (1 .. $keys) {
		for (1 .. $duplicates) {
			push @sockets,
			  [ $i, send_request($port, '/payments', qq{"$name-race-$i"},
				  encode_json({ account => $base + $i, amount => 5 })) ];
		}
	}
	my %answers;
	for (@sockets) {
		my ($i, $socket) = @$_;
		my $response = read_response($socket);
		# A 409 (the first was still in flight after 300 ms): back after Retry-After, as
		# a client would, but sooner.
		for (1 .. 50) {
			last unless $response->{status} == 409 && $response->{headers}{'retry-after'};
			select(undef, undef, undef, 0.2);
			$response = post($port, '/payments', qq{"$name-race-$i"},
				encode_json({ account => $base + $i, amount => 5 }));
		}
		push @{ $answers{$i} }, $response;
	}
	my %paid = map { split /\|/ } split /\n/, $node->safe_psql('postgres', qq{
		SELECT account - $base, string_agg(id::text, ',') FROM payments
		WHERE account BETWEEN $base + 1 AND $base + $keys GROUP BY account});
	my @wrong = grep { ($paid{$_} // '') !~ /^\d+$/ } 1 .. $keys;
	is("@wrong", '', "$name: $duplicates concurrent duplicates of $keys keys: one payment per key")
	  or diag(explain(\%paid));
	@wrong = ();
	for my $i (1 .. $keys) {
		my @a = @{ $answers{$i} // [] };
		push @wrong, $i
		  if @a != $duplicates
		  || grep({ $_->{status} != 201 } @a)
		  || scalar(grep { !$_->{replayed} } @a) != 1
		  || grep { ($_->{json}{payment_id} // '') ne ($paid{$i} // '-') } @a;
	}
	is("@wrong", '', "$name: each key one new 201, the others replays of that payment")
	  or diag(explain(\%answers));

	# A replay, a reused key, malformed and missing keys, an optional key.
	my $body = encode_json({ account => $base + 101, amount => 10 });
	my $first = post($port, '/payments', qq{"$name-1"}, $body);
	my $again = post($port, '/payments', qq{"$name-1"}, qq{ {"amount": 10.0, "account": @{[$base + 101]}} });
	ok( $first->{status} == 201
		  && !$first->{replayed}
		  && $again->{status} == 201
		  && $again->{replayed}
		  && ($again->{json}{payment_id} // '') eq ($first->{json}{payment_id} // '-')
		  && ($again->{headers}{location} // '') eq "/payments/$first->{json}{payment_id}",
		"$name: a retry (the same JSON value, written otherwise) replays: 201, Location, "
		  . "Idempotent-Replayed: true")
	  or diag(explain([ $first, $again ]));
	my $reused = post($port, '/payments', qq{"$name-1"}, encode_json({ account => $base + 101, amount => 11 }));
	ok( $reused->{status} == 422
		  && $reused->{headers}{'content-type'} =~ m{^application/problem\+json}
		  && ($reused->{json}{status} // 0) == 422,
		"$name: the key with another body (IK001): 422, a JSON error")
	  or diag(explain($reused));
	my $spelled = post($port, '/payments', qq{ "$name-1";v=2 }, $body);
	ok($spelled->{status} == 201 && $spelled->{replayed},
		"$name: the key with spaces around it and a parameter after it is the same key")
	  or diag(explain($spelled));
	my $malformed = post($port, '/payments', "$name-2", $body);
	ok($malformed->{status} == 400 && ($malformed->{json}{detail} // '') =~ /Structured Field String/,
		"$name: a malformed key (not a String): 400, a JSON error saying why")
	  or diag(explain($malformed));
	is(post($port, '/payments', '"a b"', $body)->{status}, 400, "$name: a String that is no key: 400");
	is(post($port, '/payments', undef, $body)->{status}, 400, "$name: no key on a route that requires one: 400");
	is(payments($base + 101), 1, "$name: one payment among them");
	my $tip = encode_json({ account => $base + 102, amount => 1 });
	ok(post($port, '/tips', undef, $tip)->{status} == 201 && post($port, '/tips', undef, $tip)->{status} == 201
		  && payments($base + 102) == 2,
		"$name: no key on a route where it is optional: the handler runs each time");

	# 409 with Retry-After while another request holds the key.
	my $gate = hold_handlers();
	$body = encode_json({ account => $base + 201, amount => 10 });
	my $held = send_request($port, '/payments', qq{"$name-held"}, $body);
	ok(handler_waiting($app_name),
		"$name: a request waits inside its handler");
	my $busy = post($port, '/payments', qq{"$name-held"}, $body);
	ok( $busy->{status} == 409
		  && ($busy->{headers}{'retry-after'} // '') =~ /^[1-9]\d*$/
		  && ($busy->{json}{status} // 0) == 409,
		"$name: its duplicate meanwhile: 409 with Retry-After")
	  or diag(explain($busy));
	$gate->query_safe('SELECT pg_advisory_unlock(43)');
	my $done = read_response($held);
	my $after = post($port, '/payments', qq{"$name-held"}, $body);
	ok( $done->{status} == 201
		  && !$done->{replayed}
		  && $after->{status} == 201
		  && $after->{replayed}
		  && payments($base + 201) == 1,
		"$name: the held request pays once; the retry after it replays")
	  or diag(explain([ $done, $after ]));

	# A handler that throws after its insert: rolled back, the claim with it.
	$body = encode_json({ account => $base + 301, amount => 10 });
	my $failed = post($port, '/payments', qq{"$name-fail"}, $body, 'X-Test-Fail' => 1);
	ok( $failed->{status} == 500
		  && payments($base + 301) == 0
		  && lookup('POST /payments', "$name-fail") eq '',
		"$name: a handler that throws: 500, its insert and the claim rolled back")
	  or diag(explain($failed));
	my $retry = post($port, '/payments', qq{"$name-fail"}, $body);
	my $retry2 = post($port, '/payments', qq{"$name-fail"}, $body);
	ok( $retry->{status} == 201
		  && !$retry->{replayed}
		  && $retry2->{replayed}
		  && payments($base + 301) == 1
		  && lookup('POST /payments', "$name-fail") eq 'completed -',
		"$name: its retry runs afresh and pays once; the next replays")
	  or diag(explain([ $retry, $retry2 ]));

	# A final error: stored with idem_fail, with the handler's writes, and replayed.
	$body = encode_json({ account => $base + 401, amount => 5000 });
	my $declined = post($port, '/payments', qq{"$name-declined"}, $body);
	my $declined2 = post($port, '/payments', qq{"$name-declined"}, $body);
	ok( $declined->{status} == 402
		  && !$declined->{replayed}
		  && $declined2->{status} == 402
		  && $declined2->{replayed}
		  && ($declined2->{json}{error} // '') eq 'declined'
		  && lookup('POST /payments', "$name-declined") eq 'failed -'
		  && $node->safe_psql('postgres', "SELECT count(*) FROM declines WHERE account = $base + 401") == 1,
		"$name: a final error (402): stored failed with the handler's write, replayed")
	  or diag(explain([ $declined, $declined2 ]));

	# Lease mode: the claim commits first; a duplicate meanwhile gets the lease's time.
	$gate->query_safe('SELECT pg_advisory_lock(43)');
	$body = encode_json({ account => $base + 501, amount => 10 });
	$held = send_request($port, '/orders', qq{"$name-order"}, $body);
	ok(handler_waiting($app_name),
		"$name: lease mode: a request waits inside its handler");
	is(lookup('POST /orders', "$name-order"), 'pending -', "$name: lease mode: its claim is committed");
	$busy = post($port, '/orders', qq{"$name-order"}, $body);
	ok( $busy->{status} == 409
		  && ($busy->{headers}{'retry-after'} // 0) > 50
		  && $busy->{headers}{'retry-after'} <= 60,
		"$name: lease mode: a duplicate meanwhile: 409, Retry-After the lease's time left")
	  or diag(explain($busy));
	$gate->query_safe('SELECT pg_advisory_unlock(43)');
	$done = read_response($held);
	$after = post($port, '/orders', qq{"$name-order"}, $body);
	ok( $done->{status} == 201
		  && $after->{replayed}
		  && ($after->{json}{payment_id} // '') eq ($done->{json}{payment_id} // '-')
		  && payments($base + 501) == 1
		  && lookup('POST /orders', "$name-order") eq 'completed charged',
		"$name: lease mode: completed with its checkpoint, one payment, replayed")
	  or diag(explain([ $done, $after ]));

	# The server killed while a handler is inside its transaction.
	$gate->query_safe('SELECT pg_advisory_lock(43)');
	$body = encode_json({ account => $base + 601, amount => 10 });
	$held = send_request($port, '/payments', qq{"$name-crash"}, $body);
	ok(handler_waiting($app_name),
		"$name: crash: a request waits inside its handler");
	$server->signal('KILL');
	eval { $server->finish };
	ok( $node->poll_query_until('postgres', qq{
			SELECT count(*) = 0 FROM pg_stat_activity
			WHERE application_name = '$app_name' AND wait_event = 'advisory'}),
		"$name: crash: its backend ends with it");
	$gate->query_safe('SELECT pg_advisory_unlock(43)');
	$gate->quit;
	ok(read_response($held)->{status} == 0 && lookup('POST /payments', "$name-crash") eq ''
		  && payments($base + 601) == 0,
		"$name: crash: no answer, no payment, no key");
	($server, $port) = start_app($app);
	$retry = post($port, '/payments', qq{"$name-crash"}, $body);
	$retry2 = post($port, '/payments', qq{"$name-crash"}, $body);
	ok( $retry->{status} == 201
		  && !$retry->{replayed}
		  && $retry2->{replayed}
		  && payments($base + 601) == 1,
		"$name: crash: after a restart the retry pays once")
	  or diag(explain([ $retry, $retry2 ]));
	$server->kill_kill;
	diag("${name}'s log:\n" . slurp_file($server_log)) unless Test::More->builder->is_passing;
}

$node->stop;
done_testing();
