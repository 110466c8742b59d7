# Claims, completions, replays, idem_once and look-ups from several clients while
# another session runs ANALYZE and VACUUM of the key store in a loop, with the library
# preloaded. Both send relation cache invalidations for idempotency.keys, which every
# call must absorb: a regression test for claims failing with "could not open
# relation with OID 0" (the store's cached OIDs cleared under a reference while the
# table was being opened). No error of any kind is allowed; then the load's exact
# invariants and amcheck.
#
# Longer by hand: IDEM_BACKGROUND_SECONDS=60 IDEM_LOAD_CLIENTS=16 IDEM_LOAD_KEYS=50000
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

my $seconds = $ENV{IDEM_BACKGROUND_SECONDS} // 15;
my $clients = $ENV{IDEM_LOAD_CLIENTS} // 8;
# Small enough that keys repeat (replays, duplicates in flight), large enough that
# the table keeps growing, so VACUUM and ANALYZE have work and send invalidations.
my $keys = $ENV{IDEM_LOAD_KEYS} // 20000;

my $node = PostgreSQL::Test::Cluster->new('background');
$node->init;
$node->append_conf('postgresql.conf', qq{
shared_preload_libraries = 'idempotency'
max_connections = 64
synchronous_commit = off
});
$node->start;
IdemLoad::setup($node);

# The maintenance loop: pgbench with one client and a script of its own, for as long
# as the load. Separate lines, because VACUUM cannot run in the implicit transaction
# of a multi-statement query.
my $maintenance_script = $node->basedir . "/maintenance.sql";
PostgreSQL::Test::Utils::append_to_file($maintenance_script,
	"ANALYZE idempotency.keys;\nVACUUM idempotency.keys;\n");
my ($maint_out, $maint_err) = ('', '');
my $maintenance = IPC::Run::start(
	[ 'pgbench', '--no-vacuum', '--client=1', "--time=$seconds", '-f', $maintenance_script,
	  '-h', $node->host, '-p', $node->port, 'postgres' ],
	'>', \$maint_out, '2>', \$maint_err);

# The load starts once the loop has run once, so invalidations arrive from the start.
$node->poll_query_until('postgres', q{
	SELECT analyze_count > 0 AND vacuum_count > 0 FROM pg_stat_all_tables
	WHERE relid = 'idempotency.keys'::regclass})
  or die 'the ANALYZE/VACUUM loop did not start';

my $log_offset = -s $node->logfile;
my $scripts = IdemLoad::mixed_scripts($keys);
my @files;
for my $name (sort keys %$scripts) {
	my $file = $node->basedir . "/$name";
	PostgreSQL::Test::Utils::append_to_file($file =~ s/\@\d+$//r, $scripts->{$name});
	push @files, '-f', $file;
}
my ($load_out, $load_err) = ('', '');
my $load_ok = IPC::Run::run(
	[ 'pgbench', '--no-vacuum', "--client=$clients", '--jobs=2', "--time=$seconds", @files,
	  '-h', $node->host, '-p', $node->port, 'postgres' ],
	'>', \$load_out, '2>', \$load_err);
note($load_out);
# pgbench aborts a client at its first error (and says so on stderr): every
# transaction it started must have gone through.
ok($load_ok && $load_err eq '' && $load_out =~ /number of failed transactions: 0 /,
	"$clients clients claim, complete, replay, apply once and look up for ${seconds}s "
	  . 'beside ANALYZE and VACUUM, no errors')
  or diag("stderr:\n$load_err");
# Keys repeat: more claim transactions than keys ever completed, so many replayed.
my ($claims) = $load_out =~ m{/idem_claim\n - weight: \d+ .*\n - (\d+) transactions};
cmp_ok($claims // 0, '>', $node->safe_psql('postgres', 'SELECT count(*) FROM business') * 1.2,
	'the claims repeated keys (replays)');
ok($maintenance->finish && $maint_err eq '', 'the ANALYZE/VACUUM loop ended without errors')
  or diag("stdout:\n$maint_out\nstderr:\n$maint_err");
my ($loops) = $maint_out =~ /number of transactions actually processed: (\d+)/;
cmp_ok($loops // 0, '>', 10, 'ANALYZE and VACUUM ran throughout the load') or diag($maint_out);
note("ANALYZE + VACUUM loops: " . ($loops // 'none'));

# Beyond pgbench's clients: the reaper and every other session stayed clean too.
my @errors =
  grep { /ERROR|FATAL|PANIC|TRAP|terminated by signal/ }
  split /\n/, slurp_file($node->logfile, $log_offset);
is(scalar @errors, 0, 'no error in the server log during the load') or diag(join "\n", @errors);

IdemLoad::check_invariants($node, $keys, 'background');
IdemLoad::check_once_invariants($node, 'background');
IdemCheck::amcheck_keys($node, 'background');

$node->stop;
done_testing();
