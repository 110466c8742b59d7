# The SQL-only edition has no background worker: where pg_cron exists, one documented
# call schedules idem_reap(). Here, as on a managed host: pg_cron in its own database
# ("postgres"), the edition installed as plain SQL by the owner of another database,
# who schedules the reaping there (cron.schedule_in_database, run as that owner); on
# schedule, expired keys of every role are deleted and stale leases marked abandoned,
# and a retry then takes the abandoned claim over.
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
cron.database_name = 'postgres'
cron.use_background_workers = on
max_worker_processes = 16
});
$node->start;
$node->safe_psql('postgres', q{
  CREATE EXTENSION pg_cron;
  CREATE ROLE app_owner LOGIN NOSUPERUSER;
  CREATE ROLE app_user LOGIN NOSUPERUSER;
  CREATE DATABASE app OWNER app_owner;
  -- What a host grants its administrator role: scheduling its own jobs.
  GRANT USAGE ON SCHEMA cron TO app_owner;
  GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA cron TO app_owner;});
my ($ret, $out, $err) = IdemSqlOnly::psql_as($node, 'app_owner', 'app', undef, file => $script);
is($ret, 0, 'the owner installs the plain script') or diag($err);

# Keys of two roles: one that expires at once (ttl 1 s) and a lease claim left
# pending whose lease runs out after 1 s.
for my $role ('app_owner', 'app_user') {
	($ret, $out, $err) = IdemSqlOnly::psql_as($node, $role, 'app', q{
	  BEGIN;
	  SELECT idem_claim('orders', 'short-lived', ttl => '1 second');
	  SELECT idem_complete('orders', 'short-lived', '{"done": true}');
	  COMMIT;
	  SELECT outcome FROM idem_claim('jobs', 'lease-1', lease => '1 second');});
	is($ret, 0, "$role: an expiring key and a lease claim") or diag($err);
}
is($node->safe_psql('app', q{SELECT count(*) FROM idempotency.keys}), '4', 'four rows stored');

# The documented call (docs/sql-only.md), here every second so that the test is short
# (the documented schedule is the user's choice).
my $schedule = q{SELECT cron.schedule_in_database('idempotency-reap-app', '1 seconds',
  'SELECT idem_reap()', 'app')};
($ret, $out, $err) = IdemSqlOnly::psql_as($node, 'app_owner', 'postgres', $schedule);
is($ret, 0, 'the database owner schedules idem_reap() with pg_cron')
  or die "nothing to wait for: $err";

ok($node->poll_query_until('app', q{SELECT count(*) = 0 FROM idempotency.keys WHERE scope = 'orders'}),
	'on schedule: both roles\' expired keys are deleted');
ok($node->poll_query_until('app', q{
	SELECT count(*) = 2 FROM idempotency.keys WHERE scope = 'jobs' AND key = 'lease-1'
	  AND state IN ('a', 'abandoned')}),
	'on schedule: both roles\' stale leases are marked abandoned')
  or diag($node->safe_psql('app', q{SELECT * FROM idempotency.keys}));
for my $role ('app_owner', 'app_user') {
	is(IdemSqlOnly::safe_as($node, $role, 'app', q{SELECT state FROM idem_lookup('jobs', 'lease-1')}),
		'abandoned', "$role sees its claim abandoned");
	is(IdemSqlOnly::safe_as($node, $role, 'app', q{
	  SELECT outcome || ' ' || attempt FROM idem_claim('jobs', 'lease-1', lease => '1 hour')}),
		'claimed 2', "$role: a retry takes the abandoned claim over (attempt 2)");
}
is(IdemSqlOnly::safe_as($node, 'app_owner', 'app', q{
  SELECT reaped_total >= 2 AND reclaimed_total >= 2 AND last_reap_at IS NOT NULL
         AND worker_pid IS NULL AND edition = 'sql'
  FROM idem_stats()}),
	't', 'idem_stats: reaped and reclaimed counted, when it last ran; no worker; edition sql');
is($node->safe_psql('postgres', q{
  SELECT count(*) > 0 AND bool_and(d.status = 'succeeded')
  FROM cron.job_run_details d JOIN cron.job j USING (jobid)
  WHERE j.jobname = 'idempotency-reap-app' AND d.status IN ('succeeded', 'failed')}),
	't', 'pg_cron ran the job as the owner and every run succeeded')
  or diag($node->safe_psql('postgres', q{SELECT status, return_message FROM cron.job_run_details}));
is($node->safe_psql('postgres', q{
  SELECT username || ' ' || database FROM cron.job WHERE jobname = 'idempotency-reap-app'}),
	'app_owner app', 'the job runs as the owner in its database');

$node->stop;
done_testing();
