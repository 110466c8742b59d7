# The SQL-only edition under load (installed as plain SQL by the database owner, so
# that this runs with or without pg_tle): four sessions send every payment request
# at once (4 concurrent duplicates per key) while VACUUM and ANALYZE run beside them:
# one payment per key. Then an immediate shutdown in the middle of such a load:
# nothing pending survives, nothing is lost or doubled, and the retries finish the
# rest once. Then another role tries every function on the first role's keys: refused
# or sees nothing, and nothing of them changes. amcheck at the end.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IPC::Run;
use FindBin;
use lib "$FindBin::RealBin/lib";
use IdemSqlOnly;

IdemSqlOnly::require_no_native();
my $script = IdemSqlOnly::dist_file('sql');

my $node = PostgreSQL::Test::Cluster->new('load');
$node->init;
$node->append_conf('postgresql.conf', "max_connections = 40\nrestart_after_crash = on\n");
$node->start;
$node->safe_psql('postgres', q{
  CREATE ROLE app_owner LOGIN NOSUPERUSER;
  CREATE ROLE alice LOGIN NOSUPERUSER;
  CREATE ROLE bob LOGIN NOSUPERUSER;
  CREATE DATABASE app OWNER app_owner;});
IdemSqlOnly::safe_as($node, 'app_owner', 'app', undef, file => $script);
IdemSqlOnly::safe_as($node, 'app_owner', 'app', q{
  CREATE TABLE payments (id bigserial PRIMARY KEY, key text NOT NULL, amount int NOT NULL);
  -- One request per key, in order, each its own transaction: claim (waiting for a
  -- duplicate in flight), pay, complete; a duplicate replays.
  CREATE PROCEDURE pay_all(first int, last int) LANGUAGE plpgsql AS $$
  DECLARE c idem_claim_result;
  BEGIN
    FOR i IN first..last LOOP
      c := idem_claim('pay', ('key-' || i)::idem_key, idem_fingerprint(i::text), wait => '60 seconds');
      IF c.outcome = 'claimed' THEN
        INSERT INTO payments (key, amount) VALUES ('key-' || i, i);
        PERFORM idem_complete('pay', ('key-' || i)::idem_key, jsonb_build_object('amount', i));
      ELSIF c.outcome <> 'replay' THEN
        RAISE EXCEPTION 'key-%: % after waiting', i, c.outcome;
      END IF;
      COMMIT;
    END LOOP;
  END $$;});

# start_load(FIRST, LAST): four sessions over the same keys, and one running VACUUM
# and ANALYZE over the store and the payments until stopped.
sub start_load {
	my ($first, $last) = @_;
	my @clients;
	for my $n (1 .. 4) {
		my ($out, $err) = ('', '');
		push @clients, {
			out => \$out, err => \$err,
			h => IPC::Run::start(
				[ 'psql', '-X', '-q', '-v', 'ON_ERROR_STOP=1', '-h', $node->host, '-p', $node->port,
				  '-U', 'app_owner', '-d', 'app', '-c', "CALL pay_all($first, $last)" ],
				'>', \$out, '2>', \$err) };
	}
	my $maintenance = "$PostgreSQL::Test::Utils::tmp_check/maintenance.sql";
	PostgreSQL::Test::Utils::append_to_file($maintenance,
		"VACUUM idempotency.keys; ANALYZE idempotency.keys; VACUUM payments; ANALYZE payments;\n" x 2000)
	  unless -f $maintenance;
	my ($vout, $verr) = ('', '');
	my $vacuum = IPC::Run::start(
		[ 'psql', '-X', '-q', '-h', $node->host, '-p', $node->port, '-U', 'app_owner', '-d', 'app',
		  '-f', $maintenance ],
		'>', \$vout, '2>', \$verr);
	return (\@clients, $vacuum, \$verr);
}

# 1. Four duplicates per key, 300 keys.
my ($clients, $vacuum, $vacuum_err) = start_load(1, 300);
my $failures = 0;
for my $client (@$clients) {
	$client->{h}->finish or do { $failures++; diag(${ $client->{err} }) };
}
$vacuum->kill_kill;
is($failures, 0, '4 sessions x 300 keys: every request claimed or replayed');
like($$vacuum_err, qr/^\s*$/, 'VACUUM and ANALYZE beside them: no error')
  or diag($$vacuum_err);
is($node->safe_psql('app', q{
  SELECT count(*) || ' ' || count(DISTINCT key) FROM payments WHERE key LIKE 'key-%'}),
	'300 300', 'one payment per key');
is(IdemSqlOnly::safe_as($node, 'app_owner', 'app', q{
  SELECT count(*) FROM generate_series(1, 300) i,
         LATERAL idem_claim('pay', ('key-' || i)::idem_key, idem_fingerprint(i::text)) c
  WHERE c.outcome <> 'replay' OR c.response <> jsonb_build_object('amount', i)}),
	'0', 'every key replays its stored response');

# 2. An immediate shutdown in the middle of the same load over 600 new keys.
crash_phase() if $failures == 0;
fail('the crash under load: not run, the load without a crash failed already') if $failures;
sub crash_phase {
# A transaction holds key-700's claim open, so that the load stops there and the crash
# is sure to come in the middle of it (all keys before it paid, the four clients
# waiting on key-700), however fast the machine.
my ($bout, $berr) = ('', '');
my $blocker = IPC::Run::start(
	[ 'psql', '-X', '-q', '-h', $node->host, '-p', $node->port, '-U', 'app_owner', '-d', 'app',
	  '-c', q{BEGIN; SELECT idem_claim('pay', 'key-700', idem_fingerprint('700')); SELECT pg_sleep(600);} ],
	'>', \$bout, '2>', \$berr);
$node->poll_query_until('app', q{
  SELECT count(*) = 1 FROM pg_stat_activity WHERE query LIKE '%pg_sleep(600)%' AND wait_event = 'PgSleep'})
  or die 'the blocker did not hold key-700';
($clients, $vacuum) = start_load(301, 900);
$node->poll_query_until('app', q{SELECT count(*) = 699 FROM payments}) or die 'the load did not reach key-700';
$node->stop('immediate');
eval { $blocker->finish };
eval { $_->{h}->finish } for @$clients;    # they fail with the server gone
eval { $vacuum->finish };
$node->start;
is($node->safe_psql('app', q{
  SELECT count(*) FROM idempotency.keys k WHERE k.scope = 'pay'
  AND k.state NOT IN ('c', 'completed')}),
	'0', 'after the crash: nothing pending survives');
is($node->safe_psql('app', q{
  SELECT (SELECT count(*) FROM payments) = (SELECT count(*) FROM idempotency.keys WHERE scope = 'pay')}),
	't', 'after the crash: exactly one payment per stored key');
my $paid = $node->safe_psql('app', 'SELECT count(*) FROM payments');
cmp_ok($paid, '<', 900, "the crash came before the end ($paid of 900 paid)");
# The clients retry everything.
($clients, $vacuum, $vacuum_err) = start_load(301, 900);
$failures = 0;
for my $client (@$clients) {
	$client->{h}->finish or do { $failures++; diag(${ $client->{err} }) };
}
$vacuum->kill_kill;
is($failures, 0, 'the retries after the crash: every request claimed or replayed');
is($node->safe_psql('app', q{
  SELECT count(*) || ' ' || count(DISTINCT key) FROM payments}), '900 900',
	'nothing lost, nothing doubled: one payment for each of the 900 keys');
}

# 3. Another role's keys. alice: a completed key, a failed one, a checkpointed lease
# claim, and an in-transaction claim held open while bob tries.
IdemSqlOnly::safe_as($node, 'alice', 'app', q{
  BEGIN;
  SELECT idem_claim('secret', 'a-done'); SELECT idem_complete('secret', 'a-done', '{"alice": 1}');
  SELECT idem_claim('secret', 'a-fail'); SELECT idem_fail('secret', 'a-fail', '{"declined": true}');
  COMMIT;
  SELECT idem_claim('secret', 'a-lease', lease => '1 hour');
  SELECT idem_checkpoint('secret', 'a-lease', 'step-1', '{"alice": 2}', attempt => 1);
  SELECT idem_claim('secret', 'a-stale', lease => '1 millisecond');
  SELECT idem_apply_version('secret', 'account-1', 7);});
my $holder = $node->background_psql('app', on_error_stop => 1, extra_params => [ '-U', 'alice' ]);
$holder->query_safe(q{BEGIN});
$holder->query_safe(q{SELECT idem_claim('secret', 'a-held')});
my $snapshot_sql = q{
  SELECT md5(string_agg(k::text, ',' ORDER BY k::text)) FROM idempotency.keys k WHERE scope = 'secret'};
my $before = $node->safe_psql('app', $snapshot_sql);

# Each call by bob on alice's scope and keys, in a transaction rolled back, with the
# error it must give or the result: his own keys (a new claim), or nothing.
my @keys = ('a-done', 'a-fail', 'a-lease', 'a-stale', 'a-held');
my %tried;
sub bob {
	my ($function, $sql) = @_;
	$tried{$function} = 1;
	my $statements = "SET idempotency.wait_timeout = '0'; BEGIN; $sql; ROLLBACK;";
	my ($ret, $out, $err) = IdemSqlOnly::psql_as($node, 'bob', 'app', $statements);
	return $ret == 0 ? $out : IdemSqlOnly::error_as($node, 'bob', 'app', $statements);
}
for my $key (@keys) {
	is(bob('idem_claim', qq{SELECT outcome || ' ' || attempt || ' ' || coalesce(response::text, '-')
	  FROM idem_claim('secret', '$key', wait => '0')}),
		'claimed 1 -', "bob's idem_claim of alice's $key: a claim of his own, not waiting");
	is(bob('idem_lookup', qq{SELECT count(*) FROM idem_lookup('secret', '$key')}), '0',
		"bob's idem_lookup of $key: nothing");
	for my $call (
		[ 'idem_complete',   qq{SELECT idem_complete('secret', '$key', '{}')} ],
		[ 'idem_complete',   qq{SELECT idem_complete('secret', '$key', '{}', attempt => 1)} ],
		[ 'idem_fail',       qq{SELECT idem_fail('secret', '$key', '{}')} ],
		[ 'idem_fail',       qq{SELECT idem_fail('secret', '$key', '{}', attempt => 1)} ],
		[ 'idem_release',    qq{SELECT idem_release('secret', '$key')} ],
		[ 'idem_release',    qq{SELECT idem_release('secret', '$key', attempt => 1)} ],
		[ 'idem_checkpoint', qq{SELECT idem_checkpoint('secret', '$key', 'p')} ],
		[ 'idem_checkpoint', qq{SELECT idem_checkpoint('secret', '$key', 'p', attempt => 1)} ])
	{
		like(bob($call->[0], $call->[1]), qr/^IK00[34]: /,
			"bob's $call->[0] on alice's $key: refused (IK003/IK004)" . ($call->[1] =~ /attempt/ ? ' with an attempt' : ''));
	}
	is(bob('idem_forget', qq{SELECT idem_forget('secret', '$key')}), 'f', "bob's idem_forget of $key: false");
	is(bob('idem_once', qq{SELECT idem_once('secret', '$key', wait => '0')}), 't',
		"bob's idem_once of $key: his own key");
}
is(bob('idem_once_many', qq{SELECT idem_once_many('secret', ARRAY['a-done', 'a-held', 'a-lease']::idem_key[], wait => '0')}),
	'{t,t,t}', "bob's idem_once_many of alice's keys: his own");
is(bob('idem_abandoned', q{SELECT count(*) FROM idem_abandoned('secret')}), '0', "bob's idem_abandoned: nothing");
is(bob('idem_abandoned', q{SELECT count(*) FROM idem_abandoned()}), '0', "bob's idem_abandoned(): nothing");
is(bob('idem_apply_version', q{SELECT idem_apply_version('secret', 'account-1', 3)}), 't',
	"bob's idem_apply_version: alice's version 7 is not his");
like(bob('idem_reap', q{SELECT idem_reap()}), qr/^42501: /, 'idem_reap is not granted to bob');
like(bob('idem_stats', q{SELECT * FROM idem_stats()}), qr/^42501: /, 'idem_stats is not granted to bob');
like(bob('idem_schedule_reaping', q{SELECT idem_schedule_reaping()}), qr/^42501: /,
	'idem_schedule_reaping is not granted to bob');
is(bob('the table', q{SELECT count(*) FROM idempotency.keys}), '0', 'bob reads no row of the store');
is(bob('the table', q{UPDATE idempotency.keys SET attempt = attempt + 1 RETURNING 1}), '',
	'bob updates no row of the store');
is(bob('the table', q{DELETE FROM idempotency.keys RETURNING 1}), '', 'bob deletes no row of the store');
is(bob('pg_locks', q{SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'}), '0',
	'no advisory lock shows alice\'s keys');
# Also covered: the functions with no role's key to take (fingerprints, derive, key
# casts) and messaging, whose events belong to the database (docs/reference.md).
my @not_keyed = qw(idem_fingerprint idem_derive idem_key idem_key_send idem_key_recv idem_key_in
  idem_key_out idem_emit idem_outbox_claim idem_outbox_ack idem_outbox_dead idem_outbox_retry
  idem_outbox_dead_letters);
my @functions = split /\n/, $node->safe_psql('app', q{
  SELECT DISTINCT proname FROM pg_proc WHERE pronamespace = 'public'::regnamespace AND proname LIKE 'idem\_%'
  ORDER BY 1});
my %not_keyed = map { $_ => 1 } @not_keyed;
my @untried = grep { !$tried{$_} && !$not_keyed{$_} } @functions;
is("@untried", '', 'bob tried every function that takes a role\'s key');
$holder->query_safe(q{SELECT idem_complete('secret', 'a-held')});
$holder->query_safe(q{ROLLBACK});
$holder->quit;
is($node->safe_psql('app', $snapshot_sql), $before, 'alice\'s keys are exactly as before');
is(IdemSqlOnly::safe_as($node, 'alice', 'app', q{
  SELECT outcome || ' ' || response::text FROM idem_claim('secret', 'a-done')}),
	'replay {"alice": 1}', 'alice still replays her response');

# 4. The store's and the payments' indexes agree with their tables; the heaps are sound.
$node->safe_psql('app', 'CREATE EXTENSION amcheck');
my @relations = split /\n/, $node->safe_psql('app', q{
  SELECT c.oid::regclass FROM pg_class c
  WHERE c.relkind = 'r' AND (c.relnamespace = 'idempotency'::regnamespace OR c.oid = 'payments'::regclass)
  ORDER BY 1});
cmp_ok(scalar @relations, '>=', 2, 'tables to check');
for my $relation (@relations) {
	is($node->safe_psql('app', "SELECT count(*) FROM verify_heapam('$relation')"), '0',
		"verify_heapam: $relation");
	my @indexes = split /\n/, $node->safe_psql('app', qq{
	  SELECT i.indexrelid::regclass FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
	  JOIN pg_am a ON a.oid = c.relam WHERE i.indrelid = '$relation'::regclass AND a.amname = 'btree'});
	for my $index (@indexes) {
		my ($ret, $out, $err) = $node->psql('app',
			"SELECT bt_index_parent_check('$index', heapallindexed => true)");
		is($ret, 0, "bt_index_parent_check: $index") or diag($err);
	}
}

$node->stop;
done_testing();
