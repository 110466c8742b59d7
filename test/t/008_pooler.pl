# The concurrent load of 001_concurrency.pl through PgBouncer in transaction pooling
# mode: 16 clients share 4 server connections, so consecutive transactions of one
# client run on different backends. Nothing may depend on session state.
use strict;
use warnings;
use IO::Socket::INET;
use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::RealBin/lib";
use IdemLoad;

my ($clients, $transactions, $keys, $pool_size) = (16, 300, 1000, 4);

my $node = PostgreSQL::Test::Cluster->new('pooled');
$node->init;
$node->append_conf('postgresql.conf', "max_connections = 64\nsynchronous_commit = off\n");
$node->start;
IdemLoad::setup($node);

# PgBouncer in the foreground (it ends with the test, logging to stderr), trusting
# local connections. "single" is a pool of one server connection, so that checks
# through it provably run on the same backend one after another.
my $user = getpwuid($<);
my $dir = PostgreSQL::Test::Utils::tempdir();
my $port = PostgreSQL::Test::Cluster::get_free_port();
my $log = "$PostgreSQL::Test::Utils::log_path/pgbouncer.log";
PostgreSQL::Test::Utils::append_to_file("$dir/userlist.txt", qq{"$user" ""\n});
PostgreSQL::Test::Utils::append_to_file("$dir/pgbouncer.ini", <<"INI");
[databases]
postgres = host=@{[ $node->host ]} port=@{[ $node->port ]} dbname=postgres user=$user
single = host=@{[ $node->host ]} port=@{[ $node->port ]} dbname=postgres user=$user pool_size=1
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $port
unix_socket_dir =
auth_type = trust
auth_file = $dir/userlist.txt
admin_users = $user
pool_mode = transaction
default_pool_size = $pool_size
max_client_conn = 100
ignore_startup_parameters = extra_float_digits,options
INI
my $bouncer = IPC::Run::start([ '/usr/sbin/pgbouncer', "$dir/pgbouncer.ini" ],
	'<', \undef, '>>', $log, '2>>', $log);
END { $bouncer->kill_kill if $bouncer; }
my $deadline = time + 30;
until (IO::Socket::INET->new(PeerAddr => "127.0.0.1:$port")) {
	die 'pgbouncer did not start: ' . slurp_file($log)
	  if time > $deadline or !$bouncer->pumpable;
	select(undef, undef, undef, 0.1);
}

# psql through the one-connection pool; each call is one client session of its own,
# and errors name their SQLSTATE.
sub via_pooler {
	my ($sql) = @_;
	my ($stdout, $stderr);
	IPC::Run::run([ $node->installed_command('psql'), '-XAtq', '-v', 'VERBOSITY=verbose',
		'-h', '127.0.0.1', '-p', $port, '-U', $user, '-d', 'single', '-c', $sql ],
		'>', \$stdout, '2>', \$stderr);
	chomp $stdout;
	return ($stdout, $stderr);
}

# The load: simple protocol (PgBouncer 1.18 keeps no prepared statements across
# transactions in this mode).
my $script = "$dir/idem_load.sql";
PostgreSQL::Test::Utils::append_to_file($script, IdemLoad::script($keys));
my $total = $clients * $transactions;
command_checks_all(
	[ $node->installed_command('pgbench'), '--no-vacuum', '--protocol=simple',
	  "--client=$clients", '--jobs=2', "--transactions=$transactions",
	  '-h', '127.0.0.1', '-p', $port, '-U', $user, '-f', $script, 'postgres' ],
	0,
	[qr{processed: $total/$total}],
	[qr{^$}],
	"$clients clients through PgBouncer (transaction pooling, $pool_size server connections): no errors");
IdemLoad::check_invariants($node, $keys, 'pooled');
my $backends = $node->safe_psql('postgres', 'SELECT count(DISTINCT pid) FROM business');
cmp_ok($backends, '<=', $pool_size, "the work ran on at most $pool_size server backends");
cmp_ok($backends, '>=', 2, 'and on more than one');

# A claim left open never reaches the next pooled transaction: a rolled-back claim
# is gone, and a commit with an unfinished claim fails (IK002) and leaves the key
# free. Each step reports its backend, which must be the pool's one connection.
my %backends;
my ($out, $err) = via_pooler(
	q{BEGIN; SELECT outcome, pg_backend_pid() FROM idem_claim('pooled', 'open-1'); ROLLBACK;});
like($out, qr/^claimed\|\d+$/, 'a claim in a transaction that rolls back');
$backends{ (split /\|/, $out)[1] }++;
($out) = via_pooler(
	q{BEGIN; SELECT outcome, pg_backend_pid() FROM idem_claim('pooled', 'open-1', wait => '0'); ROLLBACK;});
like($out, qr/^claimed\|\d+$/, 'leaves the key free for the next transaction on the pool');
$backends{ (split /\|/, $out)[1] }++;
($out, $err) = via_pooler(q{SELECT outcome FROM idem_claim('pooled', 'open-2')});
like($err, qr/^ERROR:  IK002: /m, 'an autocommit claim without completion fails at commit with IK002');
($out) = via_pooler(q{SELECT count(*), pg_backend_pid() FROM idem_lookup('pooled', 'open-2')});
like($out, qr/^0\|\d+$/, 'and stores nothing');
$backends{ (split /\|/, $out)[1] }++;
($out, $err) = via_pooler(
	q{BEGIN; SELECT outcome FROM idem_claim('pooled', 'open-2'); SELECT idem_complete('pooled', 'open-2', '{"ok": 1}'); COMMIT;});
is($err, '', 'the next pooled transaction claims and completes the key');
($out) = via_pooler(q{SELECT state, pg_backend_pid() FROM idem_lookup('pooled', 'open-2')});
like($out, qr/^completed\|\d+$/, 'and it is stored');
$backends{ (split /\|/, $out)[1] }++;
is(scalar(keys %backends), 1, 'all of these ran on one server backend')
  or diag explain \%backends;

$bouncer->kill_kill;
undef $bouncer;
done_testing();
