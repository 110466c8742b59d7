# Many producers on one hot aggregate (and one entity of idem_apply_version) on a busy
# server, with the users' idempotency.wait_timeout (5 s): every emit gets through, in
# seq order without a gap (issue 41, item 6).
#
# Each such write looks at its row under a brief lock. Waiters used to wait only until
# that lock was free and then try it again without queueing; the waiter the lock was
# handed to let it go at once and lost it to the next, so with two or more waiters it
# passed from waiter to waiter and no one took it, until every wait ran out together
# (IK005). Where the server's processes run one at a time (a loaded machine; here all
# of them on one CPU) that happened within seconds: 6 clients got 40 to 2,000 emits
# through, then all failed, or some waited for over a second. Waiters now take the
# lock in the queue's order.
use strict;
use warnings;
use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $seconds = $ENV{IDEM_HOT_SECONDS} // 10;

plan skip_all => 'taskset (util-linux) is needed to run the server on one CPU'
  unless system('taskset -p 1 >/dev/null 2>&1') == 0;

my $node = PostgreSQL::Test::Cluster->new('hot');
$node->init;
$node->append_conf('postgresql.conf', qq{
shared_preload_libraries = 'idempotency'
idempotency.reaper_enabled = off
synchronous_commit = off
log_line_prefix = '%m [%p] %e '
});
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION idempotency');
is($node->safe_psql('postgres', 'SHOW idempotency.wait_timeout'), '5s',
	'the users\' wait_timeout');
# Backends inherit the postmaster's CPU: all of them run on one, one at a time (the
# first it may use).
my $postmaster = $node->{_pid};
my ($cpu) = `taskset -p -c $postmaster` =~ /list:\s*(\d+)/;
ok(defined $cpu && system("taskset -p -c $cpu $postmaster >/dev/null") == 0,
	'the server runs on one CPU');

my $script = $node->basedir . '/hot.sql';
PostgreSQL::Test::Utils::append_to_file($script, q{
\set v random(1, 1000000)
BEGIN;
SELECT idem_emit('hot', '{}', 'one-aggregate');
SELECT idem_apply_version('hot', 'one-entity', :v);
COMMIT;
});
my $log_offset = -s $node->logfile;
my ($out, $err) = ('', '');
my $ok = IPC::Run::run(
	[ 'pgbench', '--no-vacuum', '--client=6', '--jobs=2', "--time=$seconds", '--latency-limit=1000',
	  '-f', $script,
	  '-h', $node->host, '-p', $node->port, 'postgres' ],
	'>', \$out, '2>', \$err);
note($out);
my ($processed) = $out =~ /number of transactions actually processed: (\d+)/;
ok($ok && $err eq '' && $out =~ /number of failed transactions: 0 /,
	"6 clients emit to one aggregate for ${seconds}s: no failed transaction")
  or diag("stderr:\n$err\nserver log:\n"
	  . join("\n", grep { /IK005|ERROR/ } split /\n/, slurp_file($node->logfile, $log_offset)));
# Each waits for the few ahead of it: taken in turn, none waits a second (a lock passed
# between waiters kept some of them waiting for seconds, when it did not end in IK005).
like($out, qr/number of transactions above the 1000\.0 ms latency limit: 0\//,
	'none took a second');
cmp_ok($processed // 0, '>', 100 * $seconds, 'and more than 100 a second got through');
is($node->safe_psql('postgres', q{
  SELECT count(*) || ' ' || (min(seq) = 1 AND max(seq) = count(*) AND count(DISTINCT seq) = count(*))
  FROM idempotency.outbox WHERE topic = 'hot'}), ($processed // 0) . ' true',
	'one event per transaction, numbered 1..n without a gap');

$node->stop;
done_testing();
