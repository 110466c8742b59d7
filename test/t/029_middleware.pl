# The Idempotency-Key middleware of middleware/ (docs/middleware.md) in the real
# frameworks against a real cluster: for Python, FastAPI under uvicorn with
# idempotency_http and psycopg 3; for Node.js, Express 5 and Express 4 with
# idempotency-express and node-postgres (installed here by `npm ci` from the lock files of
# test/middleware/express and express4); for Go, net/http with idemhttp and lib/pq
# (Debian's); for the JVM, embedded Tomcat 10 with the servlet filter of middleware/java
# and the JDBC driver (Debian's jars, the filter built by its Makefile). Each serves the
# payments app of test/middleware/, and for each:
#   - its canonical JSON is right for every fingerprint vector, and its request
#     fingerprint equals the server's idem_fingerprint of the same document; its key
#     parser takes or refuses every field of test/middleware/key_vectors.json as it says;
#   - 4 concurrent duplicates of each of 20 keys: one payment per key (counted in the
#     table), one new 201 per key, the others replays of it (a 409 is retried);
#   - a replay (stored status, Location, body, Idempotent-Replayed: true), a reused key
#     (422), a missing key (400), a bare key and the same key quoted (one key), every
#     malformed field over HTTP (400, the problem's detail), an optional key left out;
#   - the response-size rule under a 64kB idempotency.max_response_size (and a route's
#     own 32kB): a response that fits is stored and replayed whole; one over the limit,
#     one whose stored document is over it, and a streamed one are not stored (500,
#     Idempotent-Not-Stored), rolled back, the key free;
#   - 409 with Retry-After while another request holds the key (held inside its handler
#     on an advisory lock the test holds), then the replay;
#   - a handler that throws after its insert: 500, nothing stored, the retry pays once;
#   - a final error (402) stored with idem_fail and replayed;
#   - lease mode: 409 with the lease's time left while the handler runs, the checkpoint
#     and the completion stored;
#   - the server killed while a handler is inside its transaction: the claim is gone with
#     it, and after a restart the retry pays once.
# Then all the apps side by side against the one database: a request made through each
# replays through every other with the same stored status, headers and body. Last, the
# whole applications of docs/middleware.md and middleware/java/README.md, as they stand.
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
	ALTER DATABASE postgres SET idempotency.max_response_size = '64kB';
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
# Embedded Tomcat 10 and the servlet filter: Debian's jars (libtomcat10-embed-java,
# libjackson2-databind-java, libpostgresql-jdbc-java, and libjakarta-annotation-api-java,
# which Tomcat needs to start a context); the filter built by its Makefile.
my $java_classpath = join(':', map { "/usr/share/java/$_.jar" }
	qw(tomcat10-embed-core jakarta-annotation-api jackson-databind jackson-core jackson-annotations postgresql));
my @java_app = ('java', '-cp', "$tmp/java/app:$tmp/java/idempotency-servlet.jar:$java_classpath", 'PaymentsApp');
my $express_dir = "$tmp/repo/test/middleware/express";
my $express4_dir = "$tmp/repo/test/middleware/express4";
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
		# Prints the vectors of test/middleware/key_vectors.json it parses otherwise.
		keys => [
			'/usr/bin/python3', '-c',
			join("\n",
				'import json, sys',
				'from idempotency_http import parse_idempotency_key as p, MalformedKey',
				'def parse(v):',
				'  try: return [p(v["fields"]), None]',
				'  except MalformedKey as e: return [None, str(e)]',
				'for v in json.load(open(sys.argv[1], encoding="utf-8")):',
				'  if parse(v) != [v.get("key"), v.get("error")]: print(v["name"], parse(v))')
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
		build => [
			[ 'npm', 'ci', '--no-audit', '--no-fund', '--cache', "$tmp/npm-cache" ],
			[ 'node', '-e', 'process.exit(/^5\./.test(require("express/package.json").version) ? 0 : 1)' ] ],
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
		keys => [
			'node', '-e',
			"const { parseIdempotencyKey: p } = require('$tmp/repo/middleware/node/index.js');"
			  . 'for (const v of JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"))) {'
			  . ' let got; try { got = [p(v.fields), null] } catch (e) { got = [null, e.message] }'
			  . ' if (got[0] !== (v.key ?? null) || got[1] !== (v.error ?? null)) console.log(v.name, got) }'
		],
	},
	{
		# The same app and middleware on Express 4.
		name => 'express4',
		app_name => 'express4-payments',
		base => 40000,
		prepare => sub {
			copy_dir("$repo/middleware/node", "$tmp/repo/middleware/node");
			copy_dir("$repo/test/middleware/express4", $express4_dir);
			copy("$repo/test/middleware/express/payments_app.js", "$express4_dir/payments_app.js")
			  or die "copy payments_app.js: $!";
		},
		dir => $express4_dir,
		build => [
			[ 'npm', 'ci', '--no-audit', '--no-fund', '--cache', "$tmp/npm-cache" ],
			[ 'node', '-e', 'process.exit(/^4\./.test(require("express/package.json").version) ? 0 : 1)' ] ],
		command => [ 'node', "$express4_dir/payments_app.js" ],
		env => sub {
			my ($port) = @_;
			return {
				PORT => $port,
				PGHOST => '127.0.0.1',
				PGPORT => $node->port,
				PGDATABASE => 'postgres',
				PGUSER => $user,
				PGAPPNAME => 'express4-payments' };
		},
		# Only the framework differs from the Express 5 app: the module's own checks
		# ran there.
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
		keys => [ "$tmp/go-payments", 'keys' ],
	},
	{
		name => 'tomcat',
		app_name => 'tomcat-payments',
		base => 50000,
		build => [
			[ 'make', '-s', '-C', "$repo/middleware/java", "OUT=$tmp/java" ],
			[ 'javac', '-d', "$tmp/java/app", '-cp', "$tmp/java/idempotency-servlet.jar:$java_classpath",
			  "$repo/test/middleware/tomcat/PaymentsApp.java" ] ],
		command => \@java_app,
		env => sub {
			my ($port) = @_;
			return {
				PORT => $port,
				PGHOST => '127.0.0.1',
				PGPORT => $node->port,
				PGDATABASE => 'postgres',
				PGUSER => $user,
				PGAPPNAME => 'tomcat-payments' };
		},
		fingerprint => [ @java_app, 'fingerprint' ],
		vectors => [ @java_app, 'vectors' ],
		keys => [ @java_app, 'keys' ],
	});

# Starts the app on a free port; returns (handle, port, log).
sub start_app {
	my ($app) = @_;
	my $port = PostgreSQL::Test::Cluster::get_free_port();
	my $log = "$PostgreSQL::Test::Utils::log_path/$app->{name}.log";
	my $handle;
	{
		local %ENV = (%ENV, %{ $app->{env}->($port) });
		my @command = (@{ $app->{command} }, $app->{port_argument} ? ($port) : ());
		$handle = IPC::Run::start(\@command, '<', \undef, '>>', $log, '2>>', $log);
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
# bytes of the header. `key` is the Idempotency-Key field value (none if undef; an
# array of values: a field line each).
sub send_request {
	my ($port, $path, $key, $body, %headers) = @_;
	my $socket = IO::Socket::INET->new(PeerAddr => "127.0.0.1:$port") or die "connect: $!";
	binmode $socket;
	my @keys = !defined $key ? () : ref $key ? @$key : ($key);
	print $socket "POST $path HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
	  . join('', map { "Idempotency-Key: $_\r\n" } @keys)
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
		body => $body // '',
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
	$app->{built} = 1;

	# The fingerprint, computed in the app, is the server's for the same document.
	my @fingerprint_cases = (
		[ '{"b": 1.50, "a": [1e3, "x"]}', q{'body', '{"b": 1.50, "a": [1e3, "x"]}'::jsonb} ],
		[ '', q{'body', NULL::jsonb} ],
		[ 'not json', q{'raw', encode(sha256('not json'), 'hex')} ]);
	for my $case ($app->{fingerprint} ? @fingerprint_cases : ())
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

	if ($app->{vectors}) {
		my ($vectors_ok, $wrong_vectors, $vectors_err) =
		  run_step([ @{ $app->{vectors} }, "$repo/test/fingerprint_vectors.json" ], env => $app->{env}->(0));
		ok($vectors_ok && $wrong_vectors eq '',
			"$name: its canonical JSON is right for every vector of test/fingerprint_vectors.json")
		  or diag("$wrong_vectors$vectors_err");
		my ($keys_ok, $wrong_keys, $keys_err) =
		  run_step([ @{ $app->{keys} }, "$repo/test/middleware/key_vectors.json" ], env => $app->{env}->(0));
		ok($keys_ok && $wrong_keys eq '',
			"$name: it takes or refuses every Idempotency-Key field of test/middleware/key_vectors.json "
			  . "as the vectors say, with their messages")
		  or diag("$wrong_keys$keys_err");
	}

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
	is(post($port, '/payments', undef, $body)->{status}, 400, "$name: no key on a route that requires one: 400");

	# Keys as clients send them: bare, or a String; the quotes are not part of the key.
	my $bare_body = encode_json({ account => $base + 111, amount => 10 });
	my $bare = post($port, '/payments', "$name-bare", $bare_body);
	my $quoted = post($port, '/payments', qq{"$name-bare"}, $bare_body);
	ok( $bare->{status} == 201
		  && !$bare->{replayed}
		  && $quoted->{status} == 201
		  && $quoted->{replayed}
		  && ($quoted->{json}{payment_id} // '') eq ($bare->{json}{payment_id} // '-')
		  && lookup('POST /payments', "$name-bare") eq 'completed -'
		  && payments($base + 111) == 1,
		"$name: a bare key, then the same key as a String: one key (no quotes in it), one payment")
	  or diag(explain([ $bare, $quoted ]));
	my $escaped = post($port, '/payments', qq{"$name-q\\"x"}, $bare_body);
	ok($escaped->{status} == 201 && lookup('POST /payments', qq{$name-q"x}) eq 'completed -',
		"$name: a String with an escaped quote: the key holds the quote")
	  or diag(explain($escaped));
	my $long = ('k' x (255 - length $name)) . $name;
	ok( post($port, '/payments', $long, $bare_body)->{status} == 201
		  && post($port, '/payments', qq{"$long"}, $bare_body)->{replayed}
		  && lookup('POST /payments', $long) eq 'completed -',
		"$name: a bare key of 255 characters, then as a String: taken, one key");
	is(payments($base + 111), 3, "$name: three keys, three payments");
	# Every way to get the field wrong: 400, a problem saying what is wrong, nothing done.
	my $bad_body = encode_json({ account => $base + 112, amount => 10 });
	for my $case (
		[ 'a bare key with a double quote', qq{$name-b"c}, qr/a bare key cannot hold a double quote \(at position ${\(length($name) + 3)}\)/ ],
		[ 'a String not closed', qq{"$name-c}, qr/not one Structured Field String/ ],
		[ 'a String with something after it', qq{"$name-c"x}, qr/not one Structured Field String/ ],
		[ 'two Strings in one field', qq{"$name-c", "$name-d"}, qr/not one Structured Field String/ ],
		[ 'an empty String', '""', qr/^the key is empty/ ],
		[ 'an empty field', '', qr/^the Idempotency-Key field is empty$/ ],
		[ 'a bare key with a space', "$name c", qr/not visible ASCII .* at position ${\(length($name) + 1)}$/ ],
		[ 'a String with a space', qq{"$name c"}, qr/not visible ASCII .* at position ${\(length($name) + 1)}$/ ],
		[ 'a bare key with a tab', "$name\tc", qr/not visible ASCII .* at position ${\(length($name) + 1)}$/ ],
		[ 'a bare key with a non-ASCII character', "$name-caf\xc3\xa9", qr/not visible ASCII .* at position ${\(length($name) + 5)}$/ ],
		[ 'a bare key of 256 characters', "k$long", qr/^the key is 256 characters long: at most 255$/ ],
		[ 'a String of 256 characters', qq{"k$long"}, qr/^the key is 256 characters long: at most 255$/ ],
		[ 'two fields', [ "$name-e", "$name-f" ], qr/^more than one Idempotency-Key field/ ])
	{
		my ($what, $field, $detail) = @$case;
		my $refused = post($port, '/payments', $field, $bad_body);
		ok( $refused->{status} == 400
			  && ($refused->{headers}{'content-type'} // '') =~ m{^application/problem\+json}
			  && ($refused->{json}{type} // '') eq 'about:blank#malformed-key'
			  && ($refused->{json}{status} // 0) == 400
			  && ($refused->{json}{detail} // '') =~ $detail,
			"$name: $what: 400, a problem that says what is wrong")
		  or diag(explain($refused));
	}
	is(payments($base + 112), 0, "$name: none of those ran the handler");
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

	# The response-size rule (idempotency.max_response_size is 64kB in this database): a
	# response over it, or a streamed one, is not stored; the request's work is rolled
	# back, the key left free; 500 with Idempotent-Not-Stored saying why.
	$body = encode_json({ account => $base + 701, amount => 1 });
	my $fits = post($port, '/payments', "$name-fits", $body, 'X-Test-Size' => 60000);
	my $fits2 = post($port, '/payments', "$name-fits", $body, 'X-Test-Size' => 60000);
	ok( $fits->{status} == 201
		  && !$fits->{replayed}
		  && length($fits->{body}) == 60000
		  && $fits2->{replayed}
		  && $fits2->{body} eq $fits->{body}
		  && payments($base + 701) == 1,
		"$name: a response of 60000 bytes (under 64kB): stored, and replayed whole")
	  or diag(explain([ $fits->{status}, length $fits->{body}, $fits2->{status}, length $fits2->{body} ]));
	# The middleware holds no more than the limit it read (the detail names it); a body
	# under it whose stored document (the headers, the JSON around it) is over it, the
	# server refuses (54000), and the answer is the same.
	for my $case (
		[ 'of 70000 bytes', 702, 'too-large', qr/^the response is larger than idempotency.max_response_size \(65536 bytes\)/,
		  'X-Test-Size' => 70000 ],
		[ 'of 65530 bytes', 703, 'too-large', qr/^the response as stored .* is larger than idempotency.max_response_size/,
		  'X-Test-Size' => 65530 ],
		[ 'streamed', 704, 'streamed', qr/^the response was streamed/, 'X-Test-Stream' => 1 ])
	{
		my ($what, $account, $reason, $detail, @hook) = @$case;
		$body = encode_json({ account => $base + $account, amount => 1 });
		my $refused = post($port, '/payments', "$name-$account", $body, @hook);
		ok( $refused->{status} == 500
			  && ($refused->{headers}{'idempotent-not-stored'} // '') eq $reason
			  && ($refused->{headers}{'content-type'} // '') =~ m{^application/problem\+json}
			  && ($refused->{json}{type} // '') eq 'about:blank#response-not-stored'
			  && ($refused->{json}{detail} // '') =~ $detail
			  && ($refused->{json}{detail} // '') =~ /: it was not stored, and the request's work was rolled back$/
			  && payments($base + $account) == 0
			  && lookup('POST /payments', "$name-$account") eq '',
			"$name: a response $what: 500, Idempotent-Not-Stored: $reason, a detail that says so, its "
			  . "payment rolled back, the key free")
		  or diag(explain($refused));
		my $again = post($port, '/payments', "$name-$account", $body);
		ok($again->{status} == 201 && !$again->{replayed} && payments($base + $account) == 1,
			"$name: its retry (a response that fits) runs afresh and pays once")
		  or diag(explain($again));
	}

	# A route's own, lower limit (32768 bytes on /tips): the same rule under it.
	$body = encode_json({ account => $base + 705, amount => 1 });
	my $capped = post($port, '/tips', "$name-705", $body, 'X-Test-Size' => 40000);
	my $capped_again = post($port, '/tips', "$name-705", $body, 'X-Test-Size' => 30000);
	ok( $capped->{status} == 500
		  && ($capped->{headers}{'idempotent-not-stored'} // '') eq 'too-large'
		  && ($capped->{json}{detail} // '') =~ /^the response is larger than idempotency.max_response_size \(32768 bytes\)/
		  && $capped_again->{status} == 201
		  && !$capped_again->{replayed}
		  && payments($base + 705) == 1,
		"$name: a route's own limit (32768 bytes): 40000 bytes not stored, rolled back; 30000 stored")
	  or diag(explain([ $capped, $capped_again->{status} ]));

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

# One answer across languages: every app side by side against this database, one scope
# (POST /payments), one fingerprint. A request made through one replays through every
# other (and itself) with the stored status, headers and body: those the first answer
# had, byte for byte (Content-Type as one media type: Tomcat writes every one as
# "type;charset=x", without the space others keep).
sub media_type { return lc(($_[0] // '-') =~ s/\s*;\s*/;/gr); }
my @running = grep { $_->{built} } @apps;
my @names = map { $_->{name} } @running;
my %port;
for my $app (@running) {
	($app->{handle}, $port{ $app->{name} }) = start_app($app);
}
my $account = 800000;
for my $origin (@running) {
	for my $case ([ 'a payment', 201, 7 ], [ 'a final error', 402, 5000 ]) {
		my ($what, $status, $amount) = @$case;
		$account++;
		my $key = "cross-$origin->{name}-$status";
		my $body = encode_json({ account => $account, amount => $amount });
		my $first = post($port{ $origin->{name} }, '/payments', $key, $body);
		my @wrong;
		for my $other (@running) {
			my $again = post($port{ $other->{name} }, '/payments', qq{"$key"}, $body);
			push @wrong, [ $other->{name}, $again ]
			  unless $again->{replayed}
			  && $again->{status} == $first->{status}
			  && $again->{body} eq $first->{body}
			  && ($again->{headers}{location} // '-') eq ($first->{headers}{location} // '-')
			  && media_type($again->{headers}{'content-type'}) eq media_type($first->{headers}{'content-type'});
		}
		my $table = $status == 201 ? 'payments' : 'declines';
		ok( $first->{status} == $status
			  && !$first->{replayed}
			  && !@wrong
			  && $node->safe_psql('postgres', "SELECT count(*) FROM $table WHERE account = $account") == 1,
			"one answer across languages: $what ($status) made through $origin->{name} replays through "
			  . join(', ', @names) . ': its status, Location, Content-Type and body; one effect')
		  or diag(explain([ $first, @wrong ]));
		my @not_422 = grep {
			post($port{$_}, '/payments', $key, encode_json({ account => $account, amount => 8 }))->{status} != 422
		} @names;
		is("@not_422", '', "one answer across languages: $origin->{name}'s key with another body: 422 in every app")
		  if $status == 201;
	}
}
$_->{handle}->kill_kill for @running;

# docs/middleware.md's examples as they stand (its blocks marked "<!-- run: NAME -->"):
# the table in a database "shop", then each language's whole application, run as the
# text says; a payment through it, and its replay.
# middleware/java/README.md's Tomcat program the same way.
my %doc;
for my $file ('docs/middleware.md', 'middleware/java/README.md') {
	my $text = slurp_file("$repo/$file");
	while ($text =~ /<!-- run: (\S+) -->\n```[a-z]*\n(.*?)\n```\n/sg) { $doc{$1} = "$2\n"; }
}
is(join(' ', sort keys %doc), 'go go.mod java node python sql',
	'docs/middleware.md, middleware/java/README.md: the blocks that run are there');
$node->safe_psql('postgres', 'CREATE DATABASE shop');
$node->safe_psql('shop', $doc{sql} // '');
my $docs = "$tmp/docs";
make_path("$docs/python", "$docs/go", "$docs/java");
PostgreSQL::Test::Utils::append_to_file("$docs/java/Payments.java", $doc{java} // '');
my ($java_built, $java_out, $java_err) = run_step(
	[ 'javac', '-d', "$docs/java", '-cp', "$tmp/java/idempotency-servlet.jar:$java_classpath", "$docs/java/Payments.java" ]);
ok($java_built, 'middleware/java/README.md: the Tomcat program builds') or diag("$java_out$java_err");
PostgreSQL::Test::Utils::append_to_file("$docs/python/payments.py", $doc{python} // '');
PostgreSQL::Test::Utils::append_to_file("$docs/go/main.go", $doc{go} // '');
PostgreSQL::Test::Utils::append_to_file("$docs/go/go.mod",
	($doc{'go.mod'} // '') =~ s{/path/to/idempotency}{$tmp/repo}gr);
my ($go_built, $go_out, $go_err) = run_step([ 'go', 'build', '-o', "$tmp/docs-go", '.' ],
	dir => "$docs/go", env => (grep { $_->{name} eq 'go' } @apps)[0]{build_env});
ok($go_built, 'docs/middleware.md: the Go example builds with its go.mod') or diag("$go_out$go_err");
my %pg_env = (PGHOST => '127.0.0.1', PGPORT => $node->port, PGDATABASE => 'shop', PGUSER => $user);
my @doc_apps = (
	{
		name => 'docs-python',
		command => [ '/usr/bin/python3', '-m', 'uvicorn', 'payments:app', '--host', '127.0.0.1', '--port' ],
		env => {
			PYTHONPATH => "$repo/middleware/python:$docs/python",
			PYTHONDONTWRITEBYTECODE => 1,
			DATABASE_URL => 'host=127.0.0.1 port=' . $node->port . " dbname=shop user=$user" } },
	# In the two Express apps' directories: Express 5, then Express 4.
	{ name => 'docs-express', file => "$express_dir/payments.js", command => [ 'node', "$express_dir/payments.js" ] },
	{ name => 'docs-express4', file => "$express4_dir/payments.js", command => [ 'node', "$express4_dir/payments.js" ] },
	{ name => 'docs-go', command => ["$tmp/docs-go"], env => { PGSSLMODE => 'disable' } },
	{
		name => 'docs-tomcat',
		command => [ 'java', '-cp', "$docs/java:$tmp/java/idempotency-servlet.jar:$java_classpath", 'Payments' ],
		env => { JDBC_URL => 'jdbc:postgresql://127.0.0.1:' . $node->port . "/shop?user=$user" } });
my $doc_account = 0;
for my $app (@doc_apps) {
	PostgreSQL::Test::Utils::append_to_file($app->{file}, $doc{node} // '') if $app->{file};
	next if $app->{name} eq 'docs-go' && !$go_built;
	next if $app->{name} eq 'docs-tomcat' && !$java_built;
	my $command = $app->{command};
	$doc_account++;
	my ($handle, $port) = start_app({
		name => $app->{name},
		command => $command,
		port_argument => $app->{name} eq 'docs-python',
		env => sub {
			my ($p) = @_;
			return { %pg_env, %{ $app->{env} // {} }, PORT => $p, ADDR => "127.0.0.1:$p" };
		} });
	my $body = encode_json({ account => $doc_account, amount => 10 });
	my $first = post($port, '/payments', "doc-$app->{name}", $body);
	my $again = post($port, '/payments', qq{"doc-$app->{name}"}, $body);
	ok( $first->{status} == 201
		  && !$first->{replayed}
		  && ($first->{headers}{location} // '') eq "/payments/" . ($first->{json}{payment_id} // '-')
		  && $again->{status} == 201
		  && $again->{replayed}
		  && $again->{body} eq $first->{body}
		  && $node->safe_psql('shop', "SELECT count(*) FROM payments WHERE account = $doc_account") == 1,
		"docs/middleware.md: $app->{name} as pasted: a payment (201, Location), its retry replayed, one row")
	  or diag(explain([ $first, $again ]));
	$handle->kill_kill;
}

$node->stop;
done_testing();
