# The SQL-only edition as plain SQL, for hosts without pg_tle: the database owner (no
# superuser) runs the one file `make sql-only` wrote with psql -f; the claim pattern by
# the owner and by another role; the script run twice changes nothing; an update file.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::RealBin/lib";
use IdemSqlOnly;

IdemSqlOnly::require_no_native();
my $script = IdemSqlOnly::dist_file('sql');

my $node = PostgreSQL::Test::Cluster->new('plain');
$node->init;
$node->start;
$node->safe_psql('postgres', q{
  CREATE ROLE app_owner LOGIN NOSUPERUSER;
  CREATE ROLE app_user LOGIN NOSUPERUSER;
  CREATE DATABASE app OWNER app_owner;});

my ($ret, $out, $err) = IdemSqlOnly::psql_as($node, 'app_owner', 'app', undef, file => $script);
is($ret, 0, 'the database owner (no superuser) runs the plain script with psql -f') or diag($err);
is($node->safe_psql('app', q{
  SELECT count(*) FROM pg_proc p JOIN pg_roles r ON r.oid = p.proowner
  WHERE p.proname = 'idem_claim' AND p.pronamespace = 'public'::regnamespace AND r.rolname = 'app_owner'}),
	'1', 'idem_claim is in public, owned by the database owner');
is($node->safe_psql('app', q{SELECT count(*) FROM pg_extension WHERE extname = 'idempotency'}),
	'0', 'no extension: plain objects');

my $pattern = q{
  BEGIN;
  SELECT outcome, attempt FROM idem_claim('payments', 'order-1', idem_fingerprint('{"amount": 10}'::jsonb));
  SELECT idem_complete('payments', 'order-1', '{"payment": 1}');
  COMMIT;
  SELECT outcome || ' ' || response::text FROM idem_claim('payments', 'order-1', idem_fingerprint('{"amount": 10}'::jsonb));};
for my $role ('app_owner', 'app_user') {
	($ret, $out, $err) = IdemSqlOnly::psql_as($node, $role, 'app', $pattern);
	is($ret, 0, "$role: claim, complete, replay") or diag($err);
	is($out, "claimed|1\n\nreplay {\"payment\": 1}", "$role: claimed once (its own key), then the stored response");
}
like(IdemSqlOnly::error_as($node, 'app_user', 'app', q{SELECT idem_claim('payments', 'x y')}),
	qr/^22P02: /, 'an invalid key: 22P02');
like(IdemSqlOnly::error_as($node, 'app_user', 'app', q{SELECT idem_claim('payments', 'order-2')}),
	qr/^IK002: /, 'a bare autocommit claim: IK002 at commit');

# Run a second time: it fails (everything exists) and leaves everything as it was.
($ret, $out, $err) = IdemSqlOnly::psql_as($node, 'app_owner', 'app', undef, file => $script);
isnt($ret, 0, 'the plain script run a second time fails');
is(IdemSqlOnly::safe_as($node, 'app_user', 'app',
		q{SELECT outcome || ' ' || response::text FROM idem_claim('payments', 'order-1')}),
	'replay {"payment": 1}', '... and changes nothing');

# An update: the edition's update files (dist/idempotency-sql--1.5--B.sql, in order)
# when it has any; until then (its first version is 1.5) a file made here that
# replaces a function in place and adds one, as an update does, run by the owner.
my $dist = $ENV{IDEM_SQLONLY_DIST} || 'dist';
my @updates = sort glob("$dist/idempotency-sql--1.5--*.sql");
if (@updates) {
	for my $update (@updates) {
		($ret, $out, $err) = IdemSqlOnly::psql_as($node, 'app_owner', 'app', undef, file => $update);
		is($ret, 0, "the owner runs $update") or diag($err);
	}
}
else {
	my $update = "$PostgreSQL::Test::Utils::tmp_check/idempotency-sql--1.5--1.5.1.sql";
	my $definition = $node->safe_psql('app', q{
	  SELECT pg_get_functiondef('idem_lookup'::regproc)});
	PostgreSQL::Test::Utils::append_to_file($update, "BEGIN;\n$definition;\n"
		  . "CREATE FUNCTION idem_update_marker() RETURNS text LANGUAGE sql AS \$\$SELECT '1.5.1'\$\$;\n"
		  . "COMMIT;\n");
	($ret, $out, $err) = IdemSqlOnly::psql_as($node, 'app_owner', 'app', undef, file => $update);
	is($ret, 0, 'no update file yet: a test-made update run by the owner') or diag($err);
	is(IdemSqlOnly::safe_as($node, 'app_user', 'app', 'SELECT idem_update_marker()'), '1.5.1',
		'its new function is there');
}
is(IdemSqlOnly::safe_as($node, 'app_user', 'app',
		q{SELECT outcome || ' ' || response::text FROM idem_claim('payments', 'order-1')}),
	'replay {"payment": 1}', 'after the update: the keys replay, for the other role too');
($ret, $out, $err) = IdemSqlOnly::psql_as($node, 'app_user', 'app', q{
  BEGIN; SELECT outcome FROM idem_claim('payments', 'order-3'); SELECT idem_complete('payments', 'order-3'); COMMIT;});
is($ret, 0, 'after the update: a new claim') or diag($err);

$node->stop;
done_testing();
