# The middleware's own cost per request, per language: requests/s and the app server's
# CPU per request for a new key and for a replay, through the middleware (POST
# /payments) and through the same handler calling idem_claim and idem_complete by hand
# (POST /manual), in the apps of test/middleware/ against one cluster. Not part of the
# test suite; run it as a TAP file, as PostgreSQL's installcheck runs one:
#
#   make installcheck REGRESS= ISOLATION= PROVE_TESTS=test/bench/middleware/bench.pl PROVE_FLAGS=-v
#
# (as a user that may start a cluster, with the extension installed and the packages of
# test/t/029_middleware.pl there). BENCH_SECONDS (default 5) per measurement, BENCH_CLIENTS
# (default 8) concurrent clients, BENCH_WARMUP (default 3) seconds of warm-up before each.
# It prints one table, which docs/performance.md quotes.
use strict;
use warnings;
use Cwd qw(abs_path);
use File::Copy qw(copy);
use File::Path qw(make_path);
use IO::Socket::INET;
use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $repo = abs_path('.');
my $seconds = $ENV{BENCH_SECONDS} // 5;
my $clients = $ENV{BENCH_CLIENTS} // 8;
my $warmup = $ENV{BENCH_WARMUP} // 3;  # seconds before each measurement (the JVM's JIT)
my $node = PostgreSQL::Test::Cluster->new('bench');
$node->init;
$node->append_conf('postgresql.conf', "listen_addresses = '127.0.0.1'\nmax_connections = 100\n");
$node->start;
$node->safe_psql('postgres', q{
	CREATE EXTENSION idempotency;
	CREATE TABLE payments (id bigserial PRIMARY KEY, account bigint, amount numeric);
	CREATE TABLE declines (id bigserial PRIMARY KEY, account bigint);});
my $user = scalar getpwuid($<);
my $tmp = PostgreSQL::Test::Utils::tempdir();

sub run_ok {
	my ($command, $dir, %env) = @_;
	local %ENV = (%ENV, %env);
	my ($out, $err) = ('', '');
	my $ok = IPC::Run::run($command, '<', \undef, '>', \$out, '2>', \$err,
		init => sub { chdir $dir if $dir });
	die "@$command: $out$err" unless $ok;
	return $out;
}

sub copy_tree {
	my ($from, $to) = @_;
	run_ok([ 'cp', '-r', $from, $to ]);
}

make_path("$tmp/repo/middleware", "$tmp/repo/test/middleware");
copy_tree("$repo/middleware/node", "$tmp/repo/middleware/node");
copy_tree("$repo/middleware/go", "$tmp/repo/middleware/go");
copy_tree("$repo/test/middleware/express", "$tmp/repo/test/middleware/express");
copy_tree("$repo/test/middleware/gohttp", "$tmp/repo/test/middleware/gohttp");
run_ok([ 'npm', 'ci', '--no-audit', '--no-fund', '--cache', "$tmp/npm-cache" ], "$tmp/repo/test/middleware/express");
my %go_env = (GOFLAGS => '-mod=mod -buildvcs=false', GOPROXY => 'off', GOPATH => "$tmp/gopath", GOCACHE => "$tmp/gocache");
run_ok([ 'go', 'build', '-o', "$tmp/go-payments", '.' ], "$tmp/repo/test/middleware/gohttp", %go_env);
run_ok([ 'go', 'build', '-o', "$tmp/loadgen", '.' ], "$repo/test/bench/middleware", %go_env);
my $java_classpath = join(':', map { "/usr/share/java/$_.jar" }
	qw(tomcat10-embed-core jakarta-annotation-api jackson-databind jackson-core jackson-annotations postgresql));
run_ok([ 'make', '-s', '-C', "$repo/middleware/java", "OUT=$tmp/java" ]);
run_ok([ 'javac', '-d', "$tmp/java/app", '-cp', "$tmp/java/idempotency-servlet.jar:$java_classpath",
	"$repo/test/middleware/tomcat/PaymentsApp.java" ]);

my %pg = (PGHOST => '127.0.0.1', PGPORT => $node->port, PGDATABASE => 'postgres', PGUSER => $user,
	PGSSLMODE => 'disable');
my @apps = (
	[ 'Python (FastAPI, uvicorn)', [ '/usr/bin/python3', "$repo/test/middleware/fastapi/payments_app.py" ],
	  { PYTHONPATH => "$repo/middleware/python", PYTHONDONTWRITEBYTECODE => 1,
		DATABASE_URL => 'host=127.0.0.1 port=' . $node->port . " dbname=postgres user=$user" } ],
	[ 'Node.js (Express 5)', [ 'node', "$tmp/repo/test/middleware/express/payments_app.js" ], {} ],
	[ 'Go (net/http)', ["$tmp/go-payments"], {} ],
	[ 'JVM (Tomcat 10)', [ 'java', '-cp', "$tmp/java/app:$tmp/java/idempotency-servlet.jar:$java_classpath", 'PaymentsApp' ], {} ]);

my @rows;
my $run = 0;
for my $app (@apps) {
	my ($name, $command, $env) = @$app;
	my $port = PostgreSQL::Test::Cluster::get_free_port();
	my $handle;
	{
		local %ENV = (%ENV, %pg, %$env, PORT => $port);
		$handle = IPC::Run::start($command, '<', \undef, '>>', "$tmp/app.log", '2>>', "$tmp/app.log");
	}
	my $deadline = time + 60;
	until (IO::Socket::INET->new(PeerAddr => "127.0.0.1:$port")) {
		die "$name did not start" if time > $deadline;
		select(undef, undef, undef, 0.1);
	}
	my $pid = $handle->{KIDS}[0]{PID};
	my %result;
	for my $route ('payments', 'manual') {
		for my $mode ('new', 'replay') {
			$run++;
			# A warm-up, then the measurement.
			run_ok([ "$tmp/loadgen", '-url', "http://127.0.0.1:$port/$route", '-mode', $mode, '-c', $clients,
				'-d', "${warmup}s", '-pid', $pid, '-key', "warm$run" ]);
			my ($rate, $cpu, $errors) = split ' ', run_ok([ "$tmp/loadgen", '-url', "http://127.0.0.1:$port/$route",
				'-mode', $mode, '-c', $clients, '-d', "${seconds}s", '-pid', $pid, '-key', "run$run" ]);
			$result{"$route $mode"} = [ $rate, $cpu, $errors ];
		}
	}
	$handle->kill_kill;
	push @rows, [ $name, \%result ];
}

my $table = "| language | key | middleware: requests/s | by hand: requests/s | middleware: app CPU µs/request | by hand: app CPU µs/request | the middleware's own CPU µs/request |\n"
  . "| --- | --- | ---: | ---: | ---: | ---: | ---: |\n";
my $errors = 0;
for my $row (@rows) {
	my ($name, $r) = @$row;
	for my $mode ('new', 'replay') {
		my ($m, $h) = ($r->{"payments $mode"}, $r->{"manual $mode"});
		$errors += $m->[2] + $h->[2];
		$table .= sprintf("| %s | %s | %d | %d | %d | %d | %d |\n", $name, $mode eq 'new' ? 'new' : 'replay',
			$m->[0], $h->[0], $m->[1], $h->[1], $m->[1] - $h->[1]);
	}
}
diag("\n$clients clients, ${seconds}s each:\n\n$table");
is($errors, 0, 'every request answered 201');
$node->stop;
done_testing();
