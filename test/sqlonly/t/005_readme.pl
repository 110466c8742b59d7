# The README's SQL-only block through pg_tle, run as pasted: on a server that preloads
# pg_tle and pg_cron (cron.database_name = 'app'), with the roles and the database the
# README's sentence before the block names, each command of the block runs in sh from
# the source tree, as the roles it names. Then the install's notice, the reaping job
# pg_cron runs, and the claim pattern by the owner.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::RealBin/lib";
use IdemSqlOnly;
use IPC::Run;

IdemSqlOnly::require_sqlonly_addon('pg_tle');
IdemSqlOnly::require_sqlonly_addon('pg_cron');
IdemSqlOnly::require_no_native();

# The block after the marker, its lines joined where they end in a backslash.
open my $fh, '<', 'README.md' or die "README.md: $!";
my $readme = do { local $/; <$fh> };
close $fh;
my ($block) = $readme =~ m{<!-- test/sqlonly/t/005_readme\.pl runs this block as pasted -->\n```sh\n(.*?)```}s;
ok(defined $block, "README.md has the SQL-only block") or BAIL_OUT('no block');
$block =~ s/\\\n//g;
my @commands = grep { /\S/ && !/^\s*#/ } split /\n/, $block;
is(scalar(grep { /^psql / } @commands), 3, 'the block has its three psql commands');

my $node = PostgreSQL::Test::Cluster->new('readme');
$node->init;
$node->append_conf('postgresql.conf', qq{
shared_preload_libraries = 'pg_tle,pg_cron'
cron.database_name = 'app'
cron.use_background_workers = on
max_worker_processes = 16
});
$node->start;
# The README's superuser is postgres; so is this cluster's when the tests run as the
# postgres OS user (test/run_all.sh). Otherwise the role is made.
$node->safe_psql('postgres', q{
  DO $$ BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'postgres') THEN
      CREATE ROLE postgres LOGIN SUPERUSER;
    END IF;
  END $$;
  CREATE ROLE tle_admin LOGIN NOSUPERUSER;
  CREATE ROLE app_owner LOGIN NOSUPERUSER;
  CREATE DATABASE app OWNER app_owner;});

local $ENV{PGHOST} = $node->host;
local $ENV{PGPORT} = $node->port;
my $all_err = '';
for my $command (@commands) {
	my ($out, $err) = ('', '');
	my $ok = IPC::Run::run([ 'sh', '-c', $command ], '>', \$out, '2>', \$err);
	ok($ok, "as pasted: $command") or diag("$out\n$err");
	$all_err .= $err;
}
like($all_err, qr/NOTICE: +idempotency \(SQL-only edition\): nothing reaps expired keys .* yet\n.*HINT: +pg_cron is installed/,
	'CREATE EXTENSION through pg_tle says what reaps the database');
is($node->safe_psql('app', q{SELECT extversion FROM pg_extension WHERE extname = 'idempotency'}),
	'1.5', 'idempotency 1.5 is installed');
is($node->safe_psql('app', q{SELECT username || ' ' || database || ' ' || command FROM cron.job}),
	'app_owner app SELECT public.idem_reap(NULL::pg_catalog.int8)',
	'pg_cron runs this install\'s idem_reap in app, as app_owner');
ok($node->poll_query_until('app', q{
  SELECT count(*) > 0 FROM cron.job_run_details WHERE status = 'succeeded'}),
	'pg_cron ran it, and it succeeded')
  or diag($node->safe_psql('app', q{SELECT status, return_message FROM cron.job_run_details}));
is(IdemSqlOnly::safe_as($node, 'app_owner', 'app', q{
  BEGIN;
  SELECT outcome FROM idem_claim('payments', 'order-1');
  SELECT idem_complete('payments', 'order-1', '{"payment": 1}');
  COMMIT;
  SELECT outcome FROM idem_claim('payments', 'order-1');}), "claimed\n\nreplay",
	'the owner claims, completes and replays a key');

$node->stop;
done_testing();
