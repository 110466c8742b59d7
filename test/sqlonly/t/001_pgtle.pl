# The SQL-only edition through pg_tle, as on a managed host: a role that is no
# superuser, only a member of pgtle_admin, registers it with the file `make sql-only`
# wrote; the database owner (no superuser) creates the extension; the claim pattern;
# an update path registered the same way and ALTER EXTENSION ... UPDATE.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::RealBin/lib";
use IdemSqlOnly;

IdemSqlOnly::require_sqlonly_addon('pg_tle');
IdemSqlOnly::require_no_native();
my $installer = IdemSqlOnly::dist_file('pgtle');

my $node = PostgreSQL::Test::Cluster->new('pgtle');
$node->init;
$node->append_conf('postgresql.conf', "shared_preload_libraries = 'pg_tle'\n");
$node->start;
# What a host's administrator does: pg_tle in the database, a tle admin, an owner.
$node->safe_psql('postgres', q{
  CREATE ROLE tle_admin LOGIN NOSUPERUSER;
  CREATE ROLE app_owner LOGIN NOSUPERUSER;
  CREATE ROLE app_user LOGIN NOSUPERUSER;
  CREATE DATABASE app OWNER app_owner;});
$node->safe_psql('app', q{CREATE EXTENSION pg_tle; GRANT pgtle_admin TO tle_admin;});
is($node->safe_psql('app', q{
  SELECT string_agg(rolname || ':' || rolsuper, ',' ORDER BY rolname) FROM pg_roles
  WHERE rolname IN ('tle_admin', 'app_owner', 'app_user')}),
	'app_owner:false,app_user:false,tle_admin:false', 'none of the roles is a superuser');

# A role without pgtle_admin cannot register it.
my ($ret, $out, $err) = IdemSqlOnly::psql_as($node, 'app_owner', 'app', undef, file => $installer);
isnt($ret, 0, 'the installer fails for a role without pgtle_admin');
like($err, qr/permission denied/, '... with permission denied');

# Why the SQL-only edition is tested in a PostgreSQL without the native files: pg_tle
# refuses a name that has a control file on disk (shown with plpgsql's).
($ret, $out, $err) = IdemSqlOnly::psql_as($node, 'tle_admin', 'app',
	q{SELECT pgtle.install_extension('plpgsql', '1.0', 'x', 'SELECT 1')});
like($err, qr/control file already exists for the plpgsql extension/,
	'pg_tle refuses a name that has a control file on disk');
is(IdemSqlOnly::safe_as($node, 'tle_admin', 'app', q{
  SELECT count(*) FROM pg_available_extensions WHERE name = 'idempotency'}),
	'0', 'this PostgreSQL has no control file of the native edition');

# The member of pgtle_admin registers it.
($ret, $out, $err) = IdemSqlOnly::psql_as($node, 'tle_admin', 'app', undef, file => $installer);
is($ret, 0, 'a member of pgtle_admin runs the pg_tle installer') or diag($err);
is($node->safe_psql('app', q{
  SELECT string_agg(version, ',') FROM pgtle.available_extension_versions() WHERE name = 'idempotency'}),
	'1.5', 'pg_tle offers idempotency 1.5');

# A role with CREATE on the database only (no superuser, not the owner) prepares
# look-alikes of the edition's functions in a schema of its own, which
# idem_schedule_reaping() once found by name among all schemas.
$node->safe_psql('postgres', q{
  CREATE ROLE mallory LOGIN NOSUPERUSER;
  GRANT CREATE ON DATABASE app TO mallory;});
($ret, $out, $err) = IdemSqlOnly::psql_as($node, 'mallory', 'app', q{
  CREATE SCHEMA m;
  GRANT USAGE ON SCHEMA m TO PUBLIC;
  CREATE FUNCTION m.idem_schedule_reaping() RETURNS bigint LANGUAGE sql AS 'SELECT 0::bigint';
  CREATE FUNCTION m.idem_reap(bigint) RETURNS bigint LANGUAGE sql AS 'SELECT 0::bigint';
  CREATE FUNCTION m.idem_reap(text) RETURNS bigint LANGUAGE sql AS 'SELECT 0::bigint';});
is($ret, 0, 'mallory, with CREATE on the database only, makes m.idem_schedule_reaping and m.idem_reap')
  or diag($err);

# The database owner creates the extension; it says at once what reaps the database
# (an extension script runs with client_min_messages at WARNING: the NOTICE waits for
# the commit, as the native edition's does).
($ret, $out, $err) = IdemSqlOnly::psql_as($node, 'app_owner', 'app', 'BEGIN; CREATE EXTENSION idempotency; ROLLBACK');
is($ret, 0, 'CREATE EXTENSION rolled back') or diag($err);
unlike($err, qr/NOTICE/, '... says nothing');
($ret, $out, $err) = IdemSqlOnly::psql_as($node, 'app_owner', 'app', 'CREATE EXTENSION idempotency');
is($ret, 0, 'CREATE EXTENSION idempotency by the database owner (no superuser)') or diag($err);
like($err, qr/NOTICE: +idempotency \(SQL-only edition\): nothing reaps expired keys .*\n.*HINT: .*run SELECT public\.idem_reap\(NULL::pg_catalog\.int8\)/,
	'CREATE EXTENSION through pg_tle says that nothing reaps the database, and what to run');
is(IdemSqlOnly::safe_as($node, 'app_owner', 'app', q{
  SELECT count(*) FROM idempotency.install_notice}), '0', 'the notice is sent once');

# Without pg_cron on the server, idem_schedule_reaping() fails with 55000 and a hint
# naming this install's idem_reap, for the owner and for a superuser alike.
for my $role ('app_owner', $node->safe_psql('postgres', 'SELECT current_user')) {
	is(IdemSqlOnly::error_as($node, $role, 'app', 'SELECT idem_schedule_reaping()'),
		'55000: pg_cron is not installed in this database',
		"no pg_cron, $role: idem_schedule_reaping() fails with 55000");
	($ret, $out, $err) = IdemSqlOnly::psql_as($node, $role, 'app', 'SELECT idem_schedule_reaping()');
	like($err, qr/HINT: .*run SELECT public\.idem_reap\(NULL::pg_catalog\.int8\); every few seconds/,
		"no pg_cron, $role: the hint names this install's idem_reap") or diag($err);
	unlike($err, qr/\bm\.idem_reap/, "no pg_cron, $role: never mallory's function");
}
is($node->safe_psql('app', q{
  SELECT e.extversion || ' ' || r.rolname FROM pg_extension e JOIN pg_roles r ON r.oid = e.extowner
  WHERE e.extname = 'idempotency'}), '1.5 app_owner', 'the extension is 1.5, owned by app_owner');

# The claim pattern, by the owner and by another role.
my $pattern = q{
  BEGIN;
  SELECT outcome, attempt FROM idem_claim('payments', 'order-1', idem_fingerprint('{"amount": 10}'::jsonb));
  SELECT idem_complete('payments', 'order-1', '{"payment": 1}');
  COMMIT;
  SELECT outcome || ' ' || response::text FROM idem_claim('payments', 'order-1', idem_fingerprint('{"amount": 10}'::jsonb));};
for my $role ('app_owner', 'app_user') {
	($ret, $out, $err) = IdemSqlOnly::psql_as($node, $role, 'app', $pattern);
	is($ret, 0, "$role: claim, complete, replay") or diag($err);
	is($out, "claimed|1\n\nreplay {\"payment\": 1}", "$role: claimed once, then the stored response");
}
like(IdemSqlOnly::error_as($node, 'app_user', 'app',
		q{SELECT idem_claim('payments', 'order-1', idem_fingerprint('{"amount": 11}'::jsonb))}),
	qr/^IK001: /, 'a different request under the same key: IK001');
like(IdemSqlOnly::error_as($node, 'app_user', 'app', q{SELECT idem_claim('payments', 'x y')}),
	qr/^22P02: /, 'an invalid key: 22P02');

# An update path. The pg_tle installer registers the edition's updates
# (install_update_path, sqlonly/updates/); until the edition has one (its first version
# is 1.5), a 1.5 -> 1.5.1 path made here proves the mechanism a real update uses:
# registered by the pgtle_admin member, applied by the owner, the data kept.
my @updates = split /\n/, $node->safe_psql('app', q{
  SELECT target FROM pgtle.extension_update_paths('idempotency')
  WHERE source = '1.5' AND path IS NOT NULL ORDER BY string_to_array(target, '.')::int[]});
my $to;
if (@updates) {
	$to = $updates[-1];
	note("the installer registered updates from 1.5 to: @updates");
}
else {
	$to = '1.5.1';
	($ret, $out, $err) = IdemSqlOnly::psql_as($node, 'tle_admin', 'app', q{
	  SELECT pgtle.install_update_path('idempotency', '1.5', '1.5.1', $_u_$
	    CREATE FUNCTION idem_update_marker() RETURNS text LANGUAGE sql AS $$SELECT '1.5.1'$$;
	  $_u_$);
	  SELECT pgtle.set_default_version('idempotency', '1.5.1');});
	is($ret, 0, 'no update in the installer yet: a test-made path 1.5 -> 1.5.1 registered by the pgtle_admin member')
	  or diag($err);
}
($ret, $out, $err) = IdemSqlOnly::psql_as($node, 'app_owner', 'app', "ALTER EXTENSION idempotency UPDATE TO '$to'");
is($ret, 0, "ALTER EXTENSION idempotency UPDATE TO '$to' by the owner") or diag($err);
is($node->safe_psql('app', q{SELECT extversion FROM pg_extension WHERE extname = 'idempotency'}),
	$to, "the extension is now $to");
is(IdemSqlOnly::safe_as($node, 'app_user', 'app',
		q{SELECT outcome || ' ' || response::text FROM idem_claim('payments', 'order-1')}),
	'replay {"payment": 1}', 'the keys stored before the update still replay');
if (!@updates) {
	is($node->safe_psql('app', q{
	  SELECT count(*) FROM pg_depend d JOIN pg_extension e ON e.oid = d.refobjid
	  WHERE e.extname = 'idempotency' AND d.classid = 'pg_proc'::regclass
	    AND d.objid = 'idem_update_marker()'::regprocedure}),
		'1', 'the update\'s new function belongs to the extension');
}
# Dropped and created again, by the owner: pg_tle keeps the registration.
($ret, $out, $err) = IdemSqlOnly::psql_as($node, 'app_owner', 'app',
	'DROP EXTENSION idempotency; CREATE EXTENSION idempotency');
is($ret, 0, 'DROP EXTENSION and CREATE EXTENSION again by the owner') or diag($err);

$node->stop;
done_testing();
