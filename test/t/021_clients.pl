# The clients of examples/clients (docs/clients.md), each with its ecosystem's usual
# driver: Python with psycopg 3, Node.js with node-postgres (installed here by `npm ci`
# from the lock file), Java with JDBC, Go with database/sql and lib/pq. Each is built
# first: a missing toolchain or driver fails the test, it is never skipped. No client is
# told PGSSLMODE (the server has no TLS), and the Python one runs by its shebang with
# another python3 first on PATH. Then, for each, against a real cluster:
#   - 4 workers pay the same 50 keys at once: exactly one payment per key, one "new"
#     201 per key and replays of that same payment for the others, each key completed
#     with it; the same under REPEATABLE READ (database rr);
#   - a replay, a reused key (IK001: 422, its SQLSTATE and message in the body), an
#     invalid key (22P02: 400) and a key under a live lease (in_progress: 409 with
#     Retry-After) answer as docs/clients.md says;
#   - under REPEATABLE READ a claim that waits for another transaction's payment of its
#     key fails with 40001 when that commits; the client retries and gets the replay.
use strict;
use warnings;
use File::Copy qw(copy);
use IPC::Run;
use JSON::PP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my ($workers, $keys) = (4, 50);

my $node = PostgreSQL::Test::Cluster->new('clients');
$node->init;
# JDBC connects over TCP only.
$node->append_conf('postgresql.conf', "listen_addresses = '127.0.0.1'\n");
$node->start;
$node->safe_psql('postgres', 'CREATE DATABASE rr');
# In rr every transaction is REPEATABLE READ, and a claim waits long enough for the
# test to commit the transaction it waits for.
$node->safe_psql('postgres', q{
	ALTER DATABASE rr SET default_transaction_isolation = 'repeatable read';
	ALTER DATABASE rr SET idempotency.wait_timeout = '60s';});
for my $database ('postgres', 'rr') {
	$node->safe_psql($database, 'CREATE EXTENSION idempotency');
	$node->safe_psql($database, slurp_file('examples/create_payment.sql'));
}

# The clients read the PG* variables. No PGSSLMODE: each must reach a server without
# TLS as it is (lib/pq's own default would ask for TLS; the Go client falls back).
$ENV{PGHOST} = '127.0.0.1';
$ENV{PGPORT} = $node->port;
$ENV{PGUSER} = scalar getpwuid($<);
delete $ENV{PGSSLMODE};

my $tmp = PostgreSQL::Test::Utils::tempdir();

# Another python3 first on PATH, one without psycopg, as a user's virtualenv or pyenv
# may put there: the Python client, run as ./payments.py, must not depend on it.
mkdir "$tmp/other-python" or die "mkdir: $!";
open(my $fake, '>', "$tmp/other-python/python3") or die "python3: $!";
print $fake "#!/bin/sh\necho 'not the python3 with psycopg' >&2\nexit 97\n";
close $fake;
chmod 0755, "$tmp/other-python/python3";
$ENV{PATH} = "$tmp/other-python:$ENV{PATH}";
my $jdbc = '/usr/share/java/postgresql.jar';

sub copy_dir {
	my ($from, $to) = @_;
	mkdir $to or die "mkdir $to: $!";
	opendir(my $dir, $from) or die "opendir $from: $!";
	for my $file (grep { -f "$from/$_" } readdir $dir) {
		copy("$from/$file", "$to/$file") or die "copy $from/$file: $!";
	}
}

# Each client: how it is built (commands run in a directory, with extra environment)
# and the command that runs it.
my @clients = (
	{
		name => 'python',
		base => 1000,
		build => [ [ '/usr/bin/python3', '-c', 'import psycopg' ] ],
		# Run by its shebang (Debian's /usr/bin/python3), as docs/clients.md says.
		command => ['examples/clients/python/payments.py'],
	},
	{
		name => 'node',
		base => 2000,
		prepare => sub { copy_dir('examples/clients/node', "$tmp/node") },
		dir => "$tmp/node",
		build => [ [ 'npm', 'ci', '--no-audit', '--no-fund', '--cache', "$tmp/npm-cache" ] ],
		command => [ 'node', "$tmp/node/payments.js" ],
	},
	{
		name => 'java',
		base => 3000,
		build => [
			[ 'test', '-r', $jdbc ],
			[ 'javac', '-d', "$tmp/java", '-cp', $jdbc, 'examples/clients/java/Payments.java' ]
		],
		command => [ 'java', '-cp', "$tmp/java:$jdbc", 'Payments' ],
	},
	{
		name => 'go',
		base => 4000,
		prepare => sub { copy_dir('examples/clients/go', "$tmp/go") },
		dir => "$tmp/go",
		env => {
			# No VCS stamp: the copy may lie in a git work tree of another owner.
			GOFLAGS => '-mod=mod -buildvcs=false',
			GOPROXY => 'off',
			GOPATH => "$tmp/gopath",
			GOCACHE => "$tmp/gocache"
		},
		build => [ [ 'go', 'build', '-o', "$tmp/go/payments", '.' ] ],
		command => ["$tmp/go/payments"],
	});

# Runs a command (in DIR, with ENV); returns (success, stdout, stderr).
sub run_client_command {
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

# The client's lines: KEY STATUS new|replayed RETRY-AFTER|- BODY.
sub parse_results {
	my ($out) = @_;
	my @results;
	for (split /\n/, $out) {
		next unless /^(.+?) (\d{3}) (new|replayed) (\S+) (.*)$/;
		push @results,
		  {
			key => $1,
			status => $2,
			replayed => $3 eq 'replayed',
			retry_after => $4,
			body => eval { decode_json($5) } // {} };
	}
	return @results;
}

sub pay {
	my ($client, $database, @args) = @_;
	local $ENV{PGDATABASE} = $database;
	my ($ok, $out, $err) = run_client_command([ @{ $client->{command} }, 'pay', @args ]);
	diag("$client->{name} pay @args:\n$out$err") unless $ok;
	return (parse_results($out))[0] // {};
}

# WORKERS workers of the client pay the same KEYS keys at once in DATABASE; checks the
# answers and the payments.
sub race {
	my ($client, $database, $prefix, $base) = @_;
	my $name = "$client->{name}, $database";
	local $ENV{PGDATABASE} = $database;
	my ($ok, $out, $err) =
	  run_client_command([ @{ $client->{command} }, 'race', $prefix, $workers, $keys, $base ]);
	ok($ok, "$name: the race ran") or diag($out . $err);
	my @results = parse_results($out);
	is(scalar(grep { $_->{status} == 201 } @results), $workers * $keys,
		"$name: $workers workers got 201 for each of $keys keys")
	  or diag($out . $err);

	# The table: one payment per key (its account).
	my %paid = map { split /\|/ } split /\n/, $node->safe_psql($database, qq{
		SELECT account - $base, string_agg(id::text, ',') FROM payments
		WHERE account BETWEEN $base + 1 AND $base + $keys GROUP BY account});
	my @wrong = grep { ($paid{$_} // '') !~ /^\d+$/ } 1 .. $keys;
	is("@wrong", '', "$name: one payment per key") or diag(explain(\%paid));

	# Each key: one new answer, the others replays, all of that payment.
	my %answers;
	push @{ $answers{ $_->{key} } }, $_ for @results;
	@wrong = ();
	for my $i (1 .. $keys) {
		my $answers = $answers{"$prefix-$i"} // [];
		push @wrong, $i
		  if scalar(@$answers) != $workers
		  || scalar(grep { !$_->{replayed} } @$answers) != 1
		  || grep { ($_->{body}{payment_id} // '') ne ($paid{$i} // '-') } @$answers;
	}
	is("@wrong", '', "$name: each key answered new once, the other workers got replays of that payment");
	is( $node->safe_psql($database, qq{
			SELECT count(*) FROM generate_series(1, $keys) i,
			  idem_lookup('payments', ('$prefix-' || i)::idem_key) k
			WHERE k.state = 'completed'
			  AND (k.response->>'payment_id')::bigint =
			      (SELECT id FROM payments WHERE account = $base + i)}),
		$keys, "$name: each key completed with its payment as the response");
}

for my $client (@clients) {
	my $name = $client->{name};
	my $base = $client->{base};
	$client->{prepare}->() if $client->{prepare};
	my ($built, $log) = (1, '');
	for my $step (@{ $client->{build} }) {
		my ($ok, $out, $err) = run_client_command($step, dir => $client->{dir}, env => $client->{env});
		$log .= "\$ @$step\n$out$err";
		$built &&= $ok;
		last unless $ok;
	}
	# A missing toolchain is a failure, not a skip; the client's other checks go with it.
	ok($built, "$name: the client builds") or diag($log);
	next unless $built;

	race($client, 'postgres', "$name-race", $base);
	race($client, 'rr', "$name-race", $base + 100);

	my $first = pay($client, 'postgres', "$name-1", $base + 201, '10.00');
	ok($first->{status} == 201 && !$first->{replayed} && $first->{body}{payment_id},
		"$name: a new key pays: 201") or diag(explain($first));
	my $again = pay($client, 'postgres', "$name-1", $base + 201, '10.00');
	ok( $again->{status} == 201
		  && $again->{replayed}
		  && ($again->{body}{payment_id} // '') eq ($first->{body}{payment_id} // '-'),
		"$name: its retry replays the payment: 201, Idempotent-Replayed")
	  or diag(explain($again));
	my $reused = pay($client, 'postgres', "$name-1", $base + 201, '10.01');
	ok( ($reused->{status} // 0) == 422
		  && ($reused->{body}{sqlstate} // '') eq 'IK001'
		  && ($reused->{body}{title} // '') =~ /was used for a different request/,
		"$name: the key with another amount (IK001): 422, the SQLSTATE and the message in the body")
	  or diag(explain($reused));
	is(pay($client, 'postgres', 'not a key', $base + 202, '1')->{status},
		400, "$name: an invalid key (22P02): 400");
	$node->safe_psql('postgres',
		qq{SELECT idem_claim('payments', '$name-held', lease => '1 hour')});
	my $held = pay($client, 'postgres', "$name-held", $base + 203, '1');
	ok( $held->{status} == 409
		  && $held->{retry_after} =~ /^\d+$/
		  && $held->{retry_after} > 3500
		  && $held->{retry_after} <= 3600,
		"$name: a key under a live lease (in_progress): 409 with Retry-After, the lease's time left")
	  or diag(explain($held));
	is( $node->safe_psql('postgres', qq{
			SELECT count(*) FROM payments WHERE account BETWEEN $base + 201 AND $base + 203}),
		1, "$name: one payment among them");

	# REPEATABLE READ: the client's claim waits for another transaction that paid the
	# same key; that commits, the claim fails with 40001, the client retries: a replay.
	my $holder = $node->background_psql('rr');
	$holder->query_until(qr/held/,
		"BEGIN;\nCALL create_payment('$name-raced', $base + 301, 7.5);\n\\echo held\n");
	my ($out, $err) = ('', '');
	my $run;
	{
		local $ENV{PGDATABASE} = 'rr';
		# A client that cannot start fails its checks below, not the whole test.
		$run = eval {
			IPC::Run::start([ @{ $client->{command} }, 'pay', "$name-raced", $base + 301, '7.5' ],
				'<', \undef, '>', \$out, '2>', \$err, IPC::Run::timeout(300));
		};
		$err .= $@ if $@;
	}
	ok( $run && $node->poll_query_until('rr', q{
			SELECT count(*) > 0 FROM pg_stat_activity
			WHERE datname = 'rr' AND wait_event_type = 'Lock'}),
		"$name: its claim waits for the transaction that holds the key");
	$holder->query_until(qr/done/, "COMMIT;\n\\echo done\n");
	$holder->quit;
	eval { $run->finish } if $run;
	my ($raced) = parse_results($out);
	ok( ($raced->{status} // 0) == 201
		  && $raced->{replayed}
		  && $err =~ /retrying after 40001/,
		"$name: 40001 when it commits, retried: the replay of its payment")
	  or diag("$out$err");
	is($node->safe_psql('rr', "SELECT count(*) FROM payments WHERE account = $base + 301"),
		1, "$name: one payment for the raced key");
}

$node->stop;
done_testing();
