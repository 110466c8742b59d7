# Routine index maintenance beside the load: claims, completions, replays, idem_once,
# look-ups and emits from several clients while other sessions loop
#   - REINDEX INDEX CONCURRENTLY of the store's and the outbox's primary keys (the new
#     index is a second unique index until the swap, and the old OID then goes away),
#   - CREATE [UNIQUE] INDEX CONCURRENTLY and DROP INDEX CONCURRENTLY of extra indexes
#     (an index becomes ready for inserts between two calls, or during one),
#   - ANALYZE and VACUUM, and DDL on the store rolled back in a savepoint with writes
#     through the extension inside it.
# (one after another in one session, beside the load).
# The only errors allowed are deadlocks (40P01) between the DDL and the load, which
# pgbench retries; then the load's exact
# invariants, the outbox's per-aggregate order, and amcheck over every index.
#
# Why a CREATE INDEX CONCURRENTLY cannot leave an index without our entries: CIC marks
# the index ready for inserts, then waits for every transaction holding a lock on the
# table that conflicts with its ShareLock (our RowExclusiveLock) before it fills the
# index; the catalog update sends a relcache invalidation that a writer absorbs when it
# next locks the table, and the extension reads the index list (RelationGetIndexList)
# only after locking, once per transaction. A transaction that read the list before
# the index was ready is one CIC waits for, and its rows are in the snapshot CIC then
# takes to fill the index.
#
# Longer by hand: IDEM_MAINTENANCE_SECONDS=60 IDEM_LOAD_CLIENTS=8
use strict;
use warnings;
use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::RealBin/lib";
use IdemLoad;
use IdemCheck;

my $seconds = $ENV{IDEM_MAINTENANCE_SECONDS} // 20;
my $clients = $ENV{IDEM_LOAD_CLIENTS} // 6;
my $keys = 5000;

my $node = PostgreSQL::Test::Cluster->new('maintenance');
$node->init;
$node->append_conf('postgresql.conf', qq{
shared_preload_libraries = 'idempotency'
max_connections = 64
synchronous_commit = off
deadlock_timeout = 100ms
log_line_prefix = '%m [%p] %e '
});
$node->start;
IdemLoad::setup($node);
$node->safe_psql('postgres', q{
  CREATE TABLE emitted (id bigserial PRIMARY KEY, aggregate text NOT NULL);
});

sub pgbench {
	my ($name, $nclients, $script, @options) = @_;
	my $file = $node->basedir . "/$name.sql";
	PostgreSQL::Test::Utils::append_to_file($file, $script);
	my %run = (name => $name, out => '', err => '');
	$run{handle} = IPC::Run::start(
		[ 'pgbench', '--no-vacuum', "--client=$nclients", "--time=$seconds",
		  '--max-tries=1000', '--latency-limit=60000', @options, '-f', $file,
		  '-h', $node->host, '-p', $node->port, 'postgres' ],
		'>', \$run{out}, '2>', \$run{err});
	return \%run;
}

my $log_offset = -s $node->logfile;

# The maintenance, in one session: PostgreSQL's concurrent index builds deadlock with
# each other on one table (one of them then fails, and a REINDEX leaves an invalid
# index behind), so a DBA runs them one after another, and so does this loop.
# CONCURRENTLY cannot run in a transaction block: pgbench sends each line as a
# transaction of its own.
my @maintenance = (
	pgbench('maintenance', 1, q{
REINDEX INDEX CONCURRENTLY idempotency.keys_pkey;
REINDEX INDEX CONCURRENTLY idempotency.outbox_pkey;
REINDEX INDEX CONCURRENTLY idempotency.outbox_aggregates_pkey;
CREATE UNIQUE INDEX CONCURRENTLY keys_extra_unique ON idempotency.keys (key, scope, role);
CREATE INDEX CONCURRENTLY keys_extra_idx ON idempotency.keys (expires_at, state);
CREATE INDEX CONCURRENTLY outbox_extra_idx ON idempotency.outbox (aggregate, seq);
ANALYZE idempotency.keys;
VACUUM idempotency.keys;
VACUUM idempotency.outbox;
\sleep 100 ms
DROP INDEX CONCURRENTLY idempotency.keys_extra_unique;
DROP INDEX CONCURRENTLY idempotency.keys_extra_idx;
DROP INDEX CONCURRENTLY idempotency.outbox_extra_idx;
\set k random(1, 1000000)
BEGIN;
SAVEPOINT ddl;
DROP INDEX idempotency.keys_leased_idx;
SELECT idem_once('ddl', ('inside-' || :k)::idem_key);
SELECT idem_claim('ddl', ('leased-' || :k)::idem_key, lease => '1 hour');
ROLLBACK TO ddl;
SELECT idem_once('ddl', ('after-' || :k)::idem_key);
COMMIT;
}),
);

# The load: IdemLoad's claims, messages and look-ups (waits long enough that the
# maintenance's brief exclusive locks never end a wait), and emits for 40 aggregates,
# one in ten rolled back, under the users' idempotency.wait_timeout (5 s). (The emits
# once needed 30 s here: their aggregate's brief lock passed from waiter to waiter
# without anyone taking it, on a loaded machine for over 5 s, whatever the DDL did;
# issue 41, test/t/031_hot_aggregate.pl.)
my $scripts = IdemLoad::mixed_scripts($keys);
$_ =~ s/wait => '2s'/wait => '30s'/g for values %$scripts;
$scripts->{'idem_emit@3'} = q{
\set a random(1, 40)
\set fail random(1, 10)
BEGIN;
SELECT idem_emit('stress', jsonb_build_object('a', :a), 'agg-' || :a);
INSERT INTO emitted (aggregate) VALUES ('agg-' || :a);
\if :fail = 1
ROLLBACK;
\else
COMMIT;
\endif
};
my @files;
for my $name (sort keys %$scripts) {
	my $file = $node->basedir . "/$name";
	PostgreSQL::Test::Utils::append_to_file($file =~ s/\@\d+$//r, $scripts->{$name});
	push @files, '-f', $file;
}
my ($load_out, $load_err) = ('', '');
my $load_ok = IPC::Run::run(
	[ 'pgbench', '--no-vacuum', "--client=$clients", '--jobs=2', "--time=$seconds",
	  '--max-tries=1000', '--latency-limit=60000', @files,
	  '-h', $node->host, '-p', $node->port, 'postgres' ],
	'>', \$load_out, '2>', \$load_err);
note($load_out);
ok($load_ok && $load_err eq '' && $load_out =~ /number of failed transactions: 0 /,
	"$clients clients claim, replay, apply once, look up and emit for ${seconds}s beside "
	  . 'REINDEX CONCURRENTLY, CREATE/DROP INDEX CONCURRENTLY, VACUUM and rolled-back DDL: '
	  . 'no failed transaction')
  or diag("stderr:\n$load_err");

for my $run (@maintenance) {
	my $ok = $run->{handle}->finish;
	my ($done) = $run->{out} =~ /number of transactions actually processed: (\d+)/;
	ok($ok && $run->{err} eq '' && $run->{out} =~ /number of failed transactions: 0 /,
		"the $run->{name} loop ended without a failed transaction")
	  or diag("stdout:\n$run->{out}\nstderr:\n$run->{err}");
	cmp_ok($done // 0, '>=', 3, "the $run->{name} loop ran throughout the load");
	note("$run->{name}: " . ($done // 'no') . ' loops');
}

# Every error in the server log is a deadlock (40P01) between the rolled-back DDL,
# which takes an AccessExclusiveLock on the store, and the load, as the SPEC says, and
# pgbench retried it, or an autovacuum worker that the DDL's lock cancelled (57014,
# as PostgreSQL does). Routine maintenance itself causes none: not the 40001 of a
# relation dropped while in use (a stale OID of an index REINDEX CONCURRENTLY swapped).
my @errors = grep {
	/ERROR|FATAL|PANIC|TRAP|terminated by signal/
	  && !/ 40P01 +ERROR/ && !/ 57014 +ERROR: +canceling autovacuum task/
} split /\n/, slurp_file($node->logfile, $log_offset);
is(scalar @errors, 0, 'no other error in the server log') or diag(join "\n", @errors[0 .. ($#errors < 30 ? $#errors : 30)]);

IdemLoad::check_invariants($node, $keys, 'maintenance');
IdemLoad::check_once_invariants($node, 'maintenance');
is($node->safe_psql('postgres', q{
	SELECT count(*) FROM (SELECT aggregate, count(*) FROM emitted GROUP BY 1
	  EXCEPT SELECT aggregate, count(*) FROM idempotency.outbox WHERE topic = 'stress' GROUP BY 1) d}),
	'0', 'maintenance: every committed emit is in the outbox, once');
is($node->safe_psql('postgres', q{
	SELECT count(*) FROM (SELECT aggregate FROM idempotency.outbox WHERE topic = 'stress'
	  GROUP BY aggregate HAVING min(seq) <> 1 OR max(seq) <> count(*) OR count(DISTINCT seq) <> count(*)) d}),
	'0', 'maintenance: each aggregate\'s events are numbered 1..n without gaps');
is($node->safe_psql('postgres', q{
	SELECT count(*) FROM idempotency.keys WHERE scope = 'ddl' AND key::text LIKE ANY ('{inside-%,leased-%}')}),
	'0', 'maintenance: nothing written inside the rolled-back DDL survived');
cmp_ok($node->safe_psql('postgres', q{
	SELECT count(*) FROM idempotency.keys WHERE scope = 'ddl' AND key::text LIKE 'after-%'}),
	'>', 0, 'maintenance: the writes after each rolled-back DDL were kept');
is($node->safe_psql('postgres', q{
	SELECT string_agg(c.relname, ' ' ORDER BY c.relname) FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
	WHERE c.relnamespace = 'idempotency'::regnamespace AND NOT (i.indisvalid AND i.indisready)}),
	'', 'maintenance: no invalid index was left behind');

IdemCheck::amcheck_keys($node, 'maintenance');
IdemCheck::amcheck_messaging($node, 'maintenance');

$node->stop;
done_testing();
