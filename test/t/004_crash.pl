# Crashes: a backend killed while it holds an uncommitted claim, and an immediate
# shutdown in the middle of concurrent load. Nothing pending survives, nothing is
# applied twice, and every completed key replays its response.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IPC::Run;
use FindBin;
use lib "$FindBin::RealBin/lib";
use IdemCheck;

my $node = PostgreSQL::Test::Cluster->new('crash');
$node->init;
$node->append_conf('postgresql.conf', "max_connections = 40\nrestart_after_crash = on\n");
$node->start;
$node->safe_psql('postgres', q{
  CREATE EXTENSION idempotency;
  CREATE TABLE business (key text NOT NULL, amount int NOT NULL);});

# SIGKILL a backend that holds an in-transaction claim and its business row.
my $victim = $node->background_psql('postgres', on_error_stop => 0);
$victim->query_safe(q{BEGIN});
$victim->query_safe(q{SELECT idem_claim('crash', 'k1')});
$victim->query_safe(q{INSERT INTO business VALUES ('k1', 1)});
my $pid = $victim->query_safe(q{SELECT pg_backend_pid()});
my $log_offset = -s $node->logfile;
kill 'KILL', $pid;
eval { $victim->quit };
# The postmaster notices the death a moment later: until then a new connection may
# still be taken, and then refused "in recovery mode". Wait for the restart itself.
$node->wait_for_log(qr/all server processes terminated; reinitializing/, $log_offset);
$node->poll_query_until('postgres', 'SELECT true') or die 'no recovery';
is($node->safe_psql('postgres', q{SELECT count(*) FROM business}), '0',
	'after crash recovery the business row is gone');
like($node->safe_psql('postgres', q{
  BEGIN; SELECT outcome FROM idem_claim('crash', 'k1'); SELECT idem_complete('crash', 'k1'); COMMIT;}),
	qr/^claimed$/m, 'and the key is claimable again');

# An immediate shutdown in the middle of concurrent load.
$node->safe_psql('postgres', q{
  CREATE PROCEDURE op(p_key idem_key, p_amount int) LANGUAGE plpgsql AS $$
  DECLARE c idem_claim_result;
  BEGIN
    c := idem_claim('load', p_key);
    IF c.outcome <> 'claimed' THEN RETURN; END IF;
    INSERT INTO business VALUES (p_key::text, p_amount);
    PERFORM idem_complete('load', p_key, jsonb_build_object('amount', p_amount));
  END $$;});
my $script = "$PostgreSQL::Test::Utils::tmp_check/crash_load.sql";
PostgreSQL::Test::Utils::append_to_file($script,
	"\\set k random(1, 2000)\nCALL op(('key-' || :k)::idem_key, :k);\n");
my ($out, $err) = ('', '');
my $load = IPC::Run::start(
	[ 'pgbench', '--no-vacuum', '--client=16', '--jobs=2', '--time=60', '-f', $script,
	  '-h', $node->host, '-p', $node->port, 'postgres' ],
	'>', \$out, '2>', \$err);
$node->poll_query_until('postgres', q{SELECT count(*) > 500 FROM business})
  or die 'the load did not start';
$node->stop('immediate');
$load->finish;    # its clients fail with the server gone
$node->start;

is($node->safe_psql('postgres', q{
	SELECT (SELECT count(*) FROM business WHERE key LIKE 'key-%')
	     = (SELECT count(*) FROM idempotency.keys WHERE scope = 'load' AND state = 'c')}),
	't', 'after an immediate stop: business rows == completed keys');
is($node->safe_psql('postgres', q{SELECT count(*) FROM idempotency.keys WHERE state = 'p'}),
	'0', 'nothing pending from the dead transactions');
is($node->safe_psql('postgres', q{
	SELECT count(*) FROM (SELECT key FROM business GROUP BY key HAVING count(*) > 1) d}),
	'0', 'no key applied twice');
is($node->safe_psql('postgres', q{
	SELECT count(*) FROM business b,
	       LATERAL idem_claim('load', b.key::idem_key) c
	WHERE b.key LIKE 'key-%'
	  AND (c.outcome <> 'replay' OR c.response::text <> jsonb_build_object('amount', b.amount)::text)}),
	'0', 'every completed key replays its stored response');

# WAL replay rebuilt the indexes as they were at the crash: they must still agree
# with the table.
IdemCheck::amcheck_keys($node, 'after crash recovery');

$node->stop;
done_testing();
