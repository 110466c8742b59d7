# The SQL-only edition has no background worker: where pg_cron exists, one documented
# call schedules idem_reap(). Here, as on a managed host: pg_cron in the application's
# database "app" (cron.database_name), the edition installed there as plain SQL by the
# database owner, who schedules reaping with idem_schedule_reaping(); and a second
# database "other", where pg_cron is not, whose owner schedules it as the
# function's HINT says (cron.schedule_in_database, called in "app"). On schedule, in
# both, expired keys of every role are deleted and stale leases marked abandoned, and
# a retry then takes the abandoned claim over.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::RealBin/lib";
use IdemSqlOnly;

IdemSqlOnly::require_sqlonly_addon('pg_cron');
IdemSqlOnly::require_no_native();
my $script = IdemSqlOnly::dist_file('sql');

my $node = PostgreSQL::Test::Cluster->new('cron');
$node->init;
# Jobs run in background workers (no connection over TCP needed by the test's server).
$node->append_conf('postgresql.conf', qq{
shared_preload_libraries = 'pg_cron'
cron.database_name = 'app'
cron.use_background_workers = on
max_worker_processes = 16
});
$node->start;
$node->safe_psql('postgres', q{
  CREATE ROLE app_owner LOGIN NOSUPERUSER;
  CREATE ROLE app_user LOGIN NOSUPERUSER;
  CREATE DATABASE app OWNER app_owner;
  CREATE DATABASE other OWNER app_owner;});
$node->safe_psql('app', q{
  CREATE EXTENSION pg_cron;
  -- What a host grants its administrator role: scheduling its own jobs.
  GRANT USAGE ON SCHEMA cron TO app_owner;
  GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA cron TO app_owner;});
my ($ret, $out, $err) = IdemSqlOnly::psql_as($node, 'app_owner', 'app', undef, file => $script);
is($ret, 0, 'the owner installs the plain script where pg_cron is') or diag($err);
like($err, qr/NOTICE: .*nothing reaps.*\n.*HINT: .*pg_cron is installed: SELECT idem_schedule_reaping\(\)/,
	'the install says nothing reaps yet, and the call that schedules it');
($ret, $out, $err) = IdemSqlOnly::psql_as($node, 'app_owner', 'other', undef, file => $script);
is($ret, 0, 'the owner installs the plain script where pg_cron is not') or diag($err);
like($err, qr/NOTICE: .*nothing reaps.*\n.*HINT: .*CREATE EXTENSION pg_cron/,
	'the install says nothing reaps, and what to do');

# Keys of two roles in both databases: one that expires at once (ttl 1 s) and a lease
# claim left pending whose lease runs out after 1 s.
for my $db ('app', 'other') {
	for my $role ('app_owner', 'app_user') {
		($ret, $out, $err) = IdemSqlOnly::psql_as($node, $role, $db, q{
		  BEGIN;
		  SELECT idem_claim('orders', 'short-lived', ttl => '1 second');
		  SELECT idem_complete('orders', 'short-lived', '{"done": true}');
		  COMMIT;
		  SELECT outcome FROM idem_claim('jobs', 'lease-1', lease => '1 second');});
		is($ret, 0, "$db, $role: an expiring key and a lease claim") or diag($err);
	}
	is($node->safe_psql($db, q{SELECT count(*) FROM idempotency.keys}), '4', "$db: four rows stored");
}

# A role with CREATE on the database only makes look-alikes of the edition's functions
# in a schema of its own: pg_cron would run its idem_reap as the scheduling owner, who
# is not under the store's row-level security, if the edition looked its own up by name.
$node->safe_psql('postgres', q{
  CREATE ROLE mallory LOGIN NOSUPERUSER;
  GRANT CREATE ON DATABASE app TO mallory;});
($ret, $out, $err) = IdemSqlOnly::psql_as($node, 'mallory', 'app', q{
  CREATE SCHEMA m;
  GRANT USAGE ON SCHEMA m TO PUBLIC;
  CREATE TABLE m.loot AS SELECT * FROM idempotency.keys WITH NO DATA;
  GRANT INSERT ON m.loot TO PUBLIC;
  CREATE FUNCTION m.idem_schedule_reaping() RETURNS bigint LANGUAGE sql AS 'SELECT 0::bigint';
  CREATE FUNCTION m.idem_reap(bigint) RETURNS bigint LANGUAGE sql
    AS 'INSERT INTO m.loot SELECT * FROM idempotency.keys; SELECT 0::bigint';
  GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA m TO PUBLIC;});
is($ret, 0, 'app: mallory (CREATE on the database only) makes m.idem_schedule_reaping and m.idem_reap')
  or diag($err);

# The documented call, here every second so that the test is short.
($ret, $out, $err) = IdemSqlOnly::psql_as($node, 'app_owner', 'app', q{SELECT idem_schedule_reaping('1 seconds')});
is($ret, 0, 'app: the database owner schedules idem_reap() with idem_schedule_reaping()')
  or die "nothing to wait for: $err";
is($node->safe_psql('app', q{SELECT command FROM cron.job WHERE database = 'app'}),
	'SELECT public.idem_reap(NULL::pg_catalog.int8)',
	"app: the job runs this install's idem_reap, never mallory's");
($ret, $out, $err) = IdemSqlOnly::psql_as($node, 'app_owner', 'app', q{SELECT idempotency._install_notice()});
like($err, qr/pg_cron job \d+ runs idem_reap\(\) in this database \(schedule "1 seconds"\)/,
	'installing (or updating) now says the pg_cron job serves the database');
# In "other", pg_cron is loaded but not created. A database owner that may not read
# cron.database_name (a superuser-only setting) gets 55000 and both ways out.
is(IdemSqlOnly::error_as($node, 'app_owner', 'other', q{SELECT idem_schedule_reaping('1 seconds')}),
	'55000: pg_cron is not installed in this database',
	'other, without pg_read_all_settings: idem_schedule_reaping() fails with 55000');
($ret, $out, $err) = IdemSqlOnly::psql_as($node, 'app_owner', 'other', q{SELECT idem_schedule_reaping('1 seconds')});
like($err, qr/HINT: +Where this server loads pg_cron, in the database its setting cron\.database_name names run: SELECT cron\.schedule_in_database\('idempotency-reap-other', '1 seconds', 'SELECT public\.idem_reap\(NULL::pg_catalog\.int8\)', 'other'\); Otherwise have an application job run SELECT public\.idem_reap/,
	'... with the call to run in pg_cron\'s database, or the application job') or diag($err);
# To a role that may read cron.database_name (hosts' administrator roles may:
# pg_read_all_settings) it says where.
$node->safe_psql('postgres', 'GRANT pg_read_all_settings TO app_owner');
($ret, $out, $err) = IdemSqlOnly::psql_as($node, 'app_owner', 'other', q{SELECT idem_schedule_reaping('1 seconds')});
my ($hint) = $err =~ /HINT:\s+In database app run: (SELECT cron\.schedule_in_database\(.*\);)/;
ok(defined $hint, 'other: idem_schedule_reaping() says to call cron.schedule_in_database in app') or diag($err);
($ret, $out, $err) = IdemSqlOnly::psql_as($node, 'app_owner', 'app', $hint // 'SELECT 1/0');
is($ret, 0, 'other: the owner runs that call in app') or die "nothing to wait for: $err";

for my $db ('app', 'other') {
	ok($node->poll_query_until($db, q{SELECT count(*) = 0 FROM idempotency.keys WHERE scope = 'orders'}),
		"$db, on schedule: both roles' expired keys are deleted");
	ok($node->poll_query_until($db, q{
		SELECT count(*) = 2 FROM idempotency.keys WHERE scope = 'jobs' AND key = 'lease-1' AND state = 'a'}),
		"$db, on schedule: both roles' stale leases are marked abandoned")
	  or diag($node->safe_psql($db, q{SELECT * FROM idempotency.keys}));
	for my $role ('app_owner', 'app_user') {
		is(IdemSqlOnly::safe_as($node, $role, $db, q{SELECT state FROM idem_lookup('jobs', 'lease-1')}),
			'abandoned', "$db: $role sees its claim abandoned");
		is(IdemSqlOnly::safe_as($node, $role, $db, q{
		  SELECT outcome || ' ' || attempt FROM idem_claim('jobs', 'lease-1', lease => '1 hour')}),
			'claimed 2', "$db: $role: a retry takes the abandoned claim over (attempt 2)");
	}
	is(IdemSqlOnly::safe_as($node, 'app_owner', $db, q{
	  SELECT reaped_total >= 2 AND reclaimed_total >= 2 AND last_reap_at IS NOT NULL
	         AND worker_pid IS NULL AND edition = 'sql'
	  FROM idem_stats()}),
		't', "$db: idem_stats counts what was reaped and reclaimed, when; no worker; edition sql");
}
is($node->safe_psql('app', q{
  SELECT string_agg(username || ' ' || database, ',' ORDER BY database) FROM cron.job}),
	'app_owner app,app_owner other', 'the jobs run as the owner, each in its database');
is($node->safe_psql('app', q{SELECT count(*) FROM m.loot}), '0', "mallory's function never ran");
is($node->safe_psql('app', q{
  SELECT count(*) > 0 AND bool_and(d.status = 'succeeded')
  FROM cron.job_run_details d WHERE d.status IN ('succeeded', 'failed')}),
	't', 'every run pg_cron finished succeeded')
  or diag($node->safe_psql('app', q{SELECT status, return_message FROM cron.job_run_details}));

$node->stop;
done_testing();
