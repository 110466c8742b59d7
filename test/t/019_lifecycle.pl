# Installing and uninstalling. Without the preloaded library, CREATE EXTENSION and
# ALTER EXTENSION ... UPDATE say with a NOTICE that nothing reaps, and idem_stats()'s
# worker_pid is NULL; preloaded, they are silent and worker_pid is the launcher's pid
# exactly while the launcher serves the database (not in a template database, not with
# reaper_enabled off). DROP EXTENSION removes the functions, the types, the schema
# idempotency and its data; objects of the user's that depend on it need CASCADE; the
# worker leaves the database, and a later CREATE EXTENSION is served again.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $notice = qr/NOTICE:  idempotency is not in shared_preload_libraries: no background worker reaps expired keys or reclaims stale leases in this database\n.*HINT:  Set shared_preload_libraries = 'idempotency' and restart the server, or schedule SELECT idem_reap\(\); in each database\./;

my $node = PostgreSQL::Test::Cluster->new('lifecycle');
$node->init;
$node->start;

# psql's standard error for SQL (where the NOTICEs go); dies if the SQL fails.
sub stderr_of {
	my ($db, $sql) = @_;
	my ($ret, $out, $err) = $node->psql($db, $sql);
	die "$sql failed: $err" if $ret != 0;
	return $err;
}

# --- Not preloaded -----------------------------------------------------------------
like(stderr_of('postgres', 'CREATE EXTENSION idempotency'), $notice,
	'CREATE EXTENSION without the preloaded library says so');
$node->safe_psql('postgres', 'CREATE DATABASE rolled_back');
is(stderr_of('rolled_back', q{
	BEGIN; CREATE EXTENSION idempotency; ROLLBACK;
	BEGIN; SAVEPOINT s; CREATE EXTENSION idempotency; ROLLBACK TO s; COMMIT;}), '',
	'a CREATE EXTENSION rolled back, or rolled back to a savepoint, says nothing');
like(stderr_of('rolled_back', q{
	BEGIN; SAVEPOINT s; CREATE EXTENSION idempotency; RELEASE s; SAVEPOINT t; ROLLBACK TO t; COMMIT;}),
	$notice, 'a released savepoint keeps the notice for the commit');
$node->safe_psql('postgres', 'CREATE DATABASE updated');
unlike(stderr_of('updated', q{CREATE EXTENSION idempotency VERSION '1.3'}), qr/NOTICE/,
	'1.3 installs silently');
like(stderr_of('updated', 'ALTER EXTENSION idempotency UPDATE'), $notice,
	'ALTER EXTENSION ... UPDATE without the preloaded library says so');
is($node->safe_psql('updated', q{
	SELECT count(*) FROM pg_proc WHERE proname = 'idem_install_notice'}),
	'0', 'the notice leaves no function behind');
is($node->safe_psql('postgres', q{SELECT worker_pid IS NULL FROM idem_stats()}),
	't', 'not preloaded: worker_pid is NULL');

# --- Preloaded -----------------------------------------------------------------------
$node->append_conf('postgresql.conf', q{
shared_preload_libraries = 'idempotency'
idempotency.reaper_naptime = '100ms'
});
$node->restart;
my $launcher = $node->safe_psql('postgres',
	q{SELECT pid FROM pg_stat_activity WHERE backend_type = 'idempotency launcher'});
like($launcher, qr/^\d+$/, 'the launcher runs');

$node->safe_psql('postgres', 'CREATE DATABASE app');
is(stderr_of('app', 'CREATE EXTENSION idempotency'), '', 'preloaded: CREATE EXTENSION is silent');
$node->safe_psql('postgres', 'CREATE DATABASE updated2');
$node->safe_psql('updated2', q{CREATE EXTENSION idempotency VERSION '1.3'});
is(stderr_of('updated2', 'ALTER EXTENSION idempotency UPDATE'), '',
	'preloaded: ALTER EXTENSION ... UPDATE is silent');
ok($node->poll_query_until('app', qq{SELECT worker_pid = $launcher FROM idem_stats()}),
	'preloaded: worker_pid is the launcher serving the database');
$node->safe_psql('app', q{SELECT idem_once('life', 'short', ttl => '1 millisecond')});
ok($node->poll_query_until('app', q{SELECT count(*) = 0 FROM idempotency.keys WHERE scope = 'life'}),
	'and the worker does reap there');

# A template database is not served: the launcher lists only the others.
$node->safe_psql('postgres', 'CREATE DATABASE tmpl IS_TEMPLATE true');
$node->safe_psql('tmpl', 'CREATE EXTENSION idempotency');
is($node->safe_psql('tmpl', q{SELECT worker_pid IS NULL FROM idem_stats()}),
	't', 'a template database is not served: worker_pid is NULL');

# reaper_enabled = off: served by no one.
$node->safe_psql('postgres', q{
  ALTER SYSTEM SET idempotency.reaper_enabled = off; SELECT pg_reload_conf();});
ok($node->poll_query_until('app', q{SELECT worker_pid IS NULL FROM idem_stats()}),
	'reaper_enabled = off: worker_pid is NULL');
$node->safe_psql('postgres', q{
  ALTER SYSTEM RESET idempotency.reaper_enabled; SELECT pg_reload_conf();});
ok($node->poll_query_until('app', qq{SELECT worker_pid = $launcher FROM idem_stats()}),
	'enabled again: worker_pid is the launcher again');

# --- DROP EXTENSION ------------------------------------------------------------------
# Data of every kind, and objects of the user's: a view over idem_stats(), a table with
# an idem_key column, and a table of its own that does not depend on the extension.
$node->safe_psql('app', q{
  SELECT idem_once('pay', 'k1');
  SELECT idem_emit('orders', '{"id": 1}');
  SELECT idem_apply_version('inventory', 'sku-1', 3);
  CREATE VIEW reaper_health AS SELECT worker_pid, expired_awaiting_reap FROM idem_stats();
  CREATE TABLE payments (id int PRIMARY KEY, request_key idem_key, amount int);
  INSERT INTO payments VALUES (1, 'k1', 10);
  CREATE TABLE audit (id int);
  INSERT INTO audit VALUES (1);});

my ($ret, $out, $err) = $node->psql('app', 'DROP EXTENSION idempotency');
isnt($ret, 0, 'DROP EXTENSION refuses while user objects depend on it');
like($err, qr/ERROR:  cannot drop extension idempotency because other objects depend on it\n.*view reaper_health depends on function idem_stats\(boolean\)/s,
	'and names them');

($ret, $out, $err) = $node->psql('app', 'DROP EXTENSION idempotency CASCADE');
is($ret, 0, 'DROP EXTENSION ... CASCADE drops it');
like($err, qr/drop cascades to view reaper_health/, 'with the dependent view');
is($node->safe_psql('app', q{
  SELECT (SELECT count(*) FROM pg_extension WHERE extname = 'idempotency') || ' ' ||
         (SELECT count(*) FROM pg_namespace WHERE nspname = 'idempotency') || ' ' ||
         (SELECT count(*) FROM pg_proc WHERE proname LIKE 'idem\_%') || ' ' ||
         (SELECT count(*) FROM pg_type WHERE typname LIKE 'idem\_%') || ' ' ||
         (SELECT count(*) FROM pg_class WHERE relname IN ('reaper_health'))}),
	'0 0 0 0 0', 'no extension, schema idempotency (its tables and data), functions, types or view remain');
is($node->safe_psql('app', q{
  SELECT string_agg(attname, ',' ORDER BY attnum) FROM pg_attribute
  WHERE attrelid = 'payments'::regclass AND attnum > 0 AND NOT attisdropped}),
	'id,amount', 'a column of type idem_key goes with it (the table stays)');
is($node->safe_psql('app', q{SELECT (SELECT count(*) FROM payments) + (SELECT count(*) FROM audit)}),
	'2', 'the rows of the user\'s tables stay');

# The worker leaves the database, and nothing of the extension stays connected to it.
ok($node->poll_query_until('postgres', q{
	SELECT count(*) = 0 FROM pg_stat_activity
	WHERE datname = 'app' AND backend_type = 'idempotency reaper'}),
	'no reaper stays connected to the database');
my $after_drop = $node->safe_psql('updated2', q{SELECT now()});
ok($node->poll_query_until('updated2', qq{
	SELECT last_reap_at > '$after_drop' FROM idem_stats()}),
	'the launcher goes on serving the other databases');

# CREATE EXTENSION again: a new, empty store, served again.
$node->safe_psql('app', 'CREATE EXTENSION idempotency');
is($node->safe_psql('app', q{
  SELECT (SELECT count(*) FROM idempotency.keys) + (SELECT count(*) FROM idempotency.outbox)
       + (SELECT count(*) FROM idempotency.applied_versions)}),
	'0', 'created again, the store starts empty: the data went with DROP EXTENSION');
$node->safe_psql('app', q{SELECT idem_once('life', 'again', ttl => '1 millisecond')});
ok($node->poll_query_until('app', q{SELECT count(*) = 0 FROM idempotency.keys WHERE scope = 'life'}),
	'created again, the database is reaped again');
ok($node->poll_query_until('app', qq{SELECT worker_pid = $launcher AND last_reap_at IS NOT NULL FROM idem_stats()}),
	'and idem_stats shows it served');

$node->stop;
done_testing();
