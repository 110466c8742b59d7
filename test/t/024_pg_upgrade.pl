# A major upgrade with pg_upgrade, as large databases take it: a cluster of an older
# PostgreSQL (IDEM_UPGRADE_FROM, an installation prefix with this extension installed;
# test/run_all.sh passes PostgreSQL 17's when it tests 18) with data checksums and the
# library preloaded, holding keys completed, failed, held under a lease and left under a
# lease that runs out, outbox events delivered, pending, leased and dead, applied
# versions, and a second database still at extension version 1.0; stopped, checked and
# upgraded (--link) into a new cluster of the PostgreSQL under test with checksums and
# the preload. Every row is as it was (no worker may run while pg_upgrade has a
# server), every key replays (for its own role only), the held lease is still
# held and its holder finishes, the lapsed one is marked abandoned by the new cluster's
# worker and taken over with its checkpoint, the events are relayed in order, the
# applied versions hold, ALTER EXTENSION idempotency UPDATE takes the 1.0 database to
# the newest version with its keys, and amcheck finds the store's indexes consistent.
# Skipped, with the reason, when IDEM_UPGRADE_FROM names no installation with the
# extension.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use PostgreSQL::Version;
use Test::More;
use FindBin;
use lib "$FindBin::RealBin/lib";
use IdemCheck;

my $old_install = $ENV{IDEM_UPGRADE_FROM} // '';
if ($old_install eq '') {
	plan skip_all => 'IDEM_UPGRADE_FROM names no older PostgreSQL installation';
}
if (!-x "$old_install/bin/postgres" || !-x "$old_install/bin/pg_config") {
	plan skip_all => "IDEM_UPGRADE_FROM=$old_install is no PostgreSQL installation";
}
my %old_dir = map {
	my $dir = `$old_install/bin/pg_config --$_`;
	chomp $dir;
	($_ => $dir)
} qw(pkglibdir sharedir bindir);
if (!-f "$old_dir{pkglibdir}/idempotency.so"
	|| !-f "$old_dir{sharedir}/extension/idempotency.control")
{
	plan skip_all => "the extension is not installed in IDEM_UPGRADE_FROM=$old_install";
}
my $new_bindir = `pg_config --bindir`;
chomp $new_bindir;
my ($old_version, $new_version) = map {
	my ($number) = `$_/pg_config --version` =~ /PostgreSQL (\S+)/;
	PostgreSQL::Version->new($number)
} ($old_dir{bindir}, $new_bindir);
if ($old_version > $new_version) {
	plan skip_all => "IDEM_UPGRADE_FROM has PostgreSQL $old_version, newer than $new_version under test";
}
my $new_sharedir = `pg_config --sharedir`;
chomp $new_sharedir;

# The newest version is the one the new installation's control file names.
sub default_version {
	my ($control) = @_;
	my ($version) = slurp_file($control) =~ /^default_version\s*=\s*'([^']+)'/m;
	return $version;
}
my $newest = default_version("$new_sharedir/extension/idempotency.control");
is(default_version("$old_dir{sharedir}/extension/idempotency.control"), $newest,
	"the old installation has the extension at the newest version, $newest");

# Data checksums on both: 17's initdb leaves them off unless asked, 18's turns them
# on, and pg_upgrade requires the two clusters to agree.
my $old = PostgreSQL::Test::Cluster->new('old', install_path => $old_install);
$old->init(extra => ['--data-checksums']);
# No reaper passes in the old cluster: what is reaped and marked below is the new
# cluster's worker's doing.
$old->append_conf('postgresql.conf', q{
shared_preload_libraries = 'idempotency'
idempotency.reaper_enabled = off
});
$old->start;
my $new = PostgreSQL::Test::Cluster->new('new');
$new->init(extra => ['--data-checksums']);
# pg_upgrade copies no configuration: the new cluster preloads the library itself.
$new->append_conf('postgresql.conf', q{
shared_preload_libraries = 'idempotency'
idempotency.reaper_naptime = '100ms'
});
note("upgrading PostgreSQL $old_version to $new_version");
is($old->safe_psql('postgres', 'SHOW data_checksums'), 'on', 'the old cluster has data checksums');

# ---------------------------------------------------------------------------------
# The old cluster's contents
# ---------------------------------------------------------------------------------

$old->safe_psql('postgres', q{CREATE ROLE alice; CREATE ROLE bob; CREATE DATABASE app;
  CREATE DATABASE legacy;});
$old->safe_psql('app', 'CREATE EXTENSION idempotency');
is($old->safe_psql('app', q{SELECT extversion FROM pg_extension WHERE extname = 'idempotency'}),
	$newest, "app is at $newest");
$old->safe_psql('app', q{
  SET ROLE alice;
  BEGIN;
  SELECT idem_claim('pay', 'done', idem_fingerprint('{"amount": 10}'::jsonb)),
         idem_complete('pay', 'done', '{"payment_id": 1}');
  SELECT idem_claim('pay', 'declined'), idem_fail('pay', 'declined', '{"error": "card declined"}');
  COMMIT;
  SELECT idem_claim('job', 'held', lease => '1 hour');
  SELECT idem_checkpoint('job', 'held', 'charged', '{"charge": "ch_1"}', attempt => 1);
  SELECT idem_claim('job', 'lapsed', lease => '1 second');
  SELECT idem_checkpoint('job', 'lapsed', 'reserved', '{"stock": 3}', attempt => 1);
  SELECT idem_once('inbox', 'message-1');
  SELECT idem_once('short', ('s' || g)::idem_key, ttl => '1 millisecond') FROM generate_series(1, 100) g;
  SELECT idem_apply_version('ledger', 'acct-1', 5);
  RESET ROLE;});
# Events: one delivered, one dead, one leased to a relay for an hour, one pending.
$old->safe_psql('app', q{
  SELECT idem_emit('order.paid', '{"n": 1}', 'order-1', event_id => 'ev-1');
  SELECT idem_emit('order.paid', '{"n": 1}', 'order-2', event_id => 'ev-poison');});
is($old->safe_psql('app', q{
  SELECT string_agg(event_id::text, ' ' ORDER BY event_id) FROM idem_outbox_claim('relay-1', 10)}),
	'ev-1 ev-poison', 'a relay claims the first two events');
$old->safe_psql('app', q{
  SELECT idem_outbox_ack('relay-1', '{ev-1}');
  SELECT idem_outbox_dead('relay-1', '{ev-poison}', 'schema 3 unknown');
  SELECT idem_emit('order.paid', '{"n": 2}', 'order-1', event_id => 'ev-2');
  SELECT idem_emit('order.paid', '{"n": 1}', 'order-3', event_id => 'ev-3');});
is($old->safe_psql('app', q{SELECT event_id FROM idem_outbox_claim('relay-old', 1, lease => '1 hour')}),
	'ev-2', 'another relay holds the next event of order-1 for an hour');

# The second database stays at 1.0, with keys stored through 1.0's functions.
$old->safe_psql('legacy', q{CREATE EXTENSION idempotency VERSION '1.0'});
$old->safe_psql('legacy', q{
  BEGIN;
  SELECT idem_claim('pay', 'done-10', idem_fingerprint('{"amount": 7}'::jsonb));
  SELECT idem_complete('pay', 'done-10', '{"payment_id": 10}');
  COMMIT;
  SELECT idem_claim('job', 'held-10', lease => '1 hour');});

# What pg_upgrade must carry over as it is, the expired keys, the lapsed lease and the
# delivered event included: no worker may change them while pg_upgrade runs a server.
my %rows = (
	keys => q{SELECT string_agg(concat_ws(' ', role::text, scope, key, state, attempt,
	    fingerprint, checkpoint, checkpoint_data, response, first_claimed_at, expires_at,
	    lease_expires_at), E'\n' ORDER BY scope, key)
	  FROM idempotency.keys},
	outbox => q{SELECT string_agg(concat_ws(' ', event_id, position, topic, aggregate, seq,
	    payload, emitted_at, state, attempt, relay, lease_expires_at, delivered_at, reason),
	    E'\n' ORDER BY event_id)
	  FROM idempotency.outbox},
	aggregates => q{SELECT string_agg(t::text, E'\n' ORDER BY t::text) FROM idempotency.outbox_aggregates t},
	position => q{SELECT last_value || ' ' || is_called FROM idempotency.outbox_position},
	applied => q{SELECT string_agg(t::text, E'\n' ORDER BY t::text) FROM idempotency.applied_versions t},
	secret => q{SELECT md5(string_agg(t::text, ',')) FROM idempotency.lock_secret t});
my %before = map { ($_ => $old->safe_psql('app', $rows{$_})) } keys %rows;
my $legacy_before = $old->safe_psql('legacy', q{
  SELECT string_agg(concat_ws(' ', role::text, scope, key, state, attempt, fingerprint,
                              response, expires_at), E'\n' ORDER BY key) FROM idempotency.keys});
$old->stop;

# ---------------------------------------------------------------------------------
# pg_upgrade
# ---------------------------------------------------------------------------------

chdir $PostgreSQL::Test::Utils::tmp_check;    # pg_upgrade writes its scripts here
my @pg_upgrade = (
	"$new_bindir/pg_upgrade", '--no-sync',
	'-d', $old->data_dir, '-D', $new->data_dir,
	'-b', $old_dir{bindir}, '-B', $new_bindir,
	'-s', $new->host, '-p', $old->port, '-P', $new->port);
command_like([ @pg_upgrade, '--check' ], qr/Clusters are compatible/,
	'pg_upgrade --check finds the clusters compatible');
my $upgraded = run_log([ @pg_upgrade, '--link' ]);
ok($upgraded, 'pg_upgrade --link');
if (!$upgraded) {
	# Its logs stay in the new data directory; their errors say why.
	for my $log (glob($new->data_dir . '/pg_upgrade_output.d/*/log/*.log')) {
		my @errors = grep { /\b(?:ERROR|FATAL):/ } split /\n/, slurp_file($log);
		diag("$log:\n" . join("\n", @errors[ 0 .. ($#errors < 4 ? $#errors : 4) ])) if @errors;
	}
	done_testing();
	exit;
}
# pg_upgrade ran the new cluster with the worker's passes on (three times: to check it,
# to restore the schema, and after moving the files). The first start of our own has
# them off, so that the rows are seen as pg_upgrade left them.
$new->append_conf('postgresql.conf', 'idempotency.reaper_enabled = off');
$new->start;

# ---------------------------------------------------------------------------------
# The upgraded cluster
# ---------------------------------------------------------------------------------

is($new->safe_psql('postgres', 'SHOW data_checksums'), 'on', 'the new cluster has data checksums');
is($new->safe_psql('app', q{SELECT extversion FROM pg_extension WHERE extname = 'idempotency'}),
	$newest, "app is still at $newest");
for my $what (sort keys %rows) {
	is($new->safe_psql('app', $rows{$what}), $before{$what}, "$what: the rows are as they were");
}
$new->append_conf('postgresql.conf', 'idempotency.reaper_enabled = on');
$new->reload;

# Keys, for their own role: role OIDs, the idem_key type and the store's files all
# came across.
is($new->safe_psql('app', q{SET ROLE alice;
  SELECT outcome || ' ' || response FROM idem_claim('pay', 'done', idem_fingerprint('{"amount": 10}'::jsonb))}),
	'replay {"payment_id": 1}', 'a completed key replays its response');
is($new->safe_psql('app', q{SET ROLE alice; SELECT outcome || ' ' || response FROM idem_claim('pay', 'declined')}),
	'replay {"error": "card declined"}', 'a failed key replays its error');
my ($ret, $stdout, $stderr) = $new->psql('app', q{\set VERBOSITY verbose
SET ROLE alice;
SELECT idem_claim('pay', 'done', idem_fingerprint('{"amount": 99}'::jsonb))});
like($stderr, qr/ERROR:  IK001/, 'its fingerprint still guards it (IK001)');
is($new->safe_psql('app', q{SET ROLE bob;
  BEGIN; SELECT outcome FROM idem_claim('pay', 'done'); ROLLBACK;}),
	'claimed', "another role does not see alice's key");
is($new->safe_psql('app', q{SET ROLE alice; SELECT idem_once('inbox', 'message-1')}), 'f',
	'a message applied before the upgrade is skipped');

# Leases: the held one is still held and its holder finishes it; the lapsed one is
# marked abandoned by the new cluster's worker and taken over with its checkpoint.
like($new->safe_psql('app', q{SET ROLE alice;
  SELECT outcome || ' ' || (retry_after > interval '30 minutes') FROM idem_claim('job', 'held', wait => '0')}),
	qr/^in_progress true$/, 'the lease claim is still held');
is($new->safe_psql('app', q{SET ROLE alice;
  SELECT idem_complete('job', 'held', '"shipped"', attempt => 1);
  SELECT state || ' ' || checkpoint FROM idem_lookup('job', 'held')}),
	"\ncompleted charged", 'and its holder finishes it with its attempt');
ok($new->poll_query_until('app', q{SELECT state = 'a' FROM idempotency.keys WHERE key = 'lapsed'}),
	"the new cluster's worker marks the lapsed lease claim abandoned");
like($new->safe_psql('app', q{SET ROLE alice;
  BEGIN;
  SELECT outcome || ' ' || attempt || ' ' || checkpoint || ' ' || checkpoint_data FROM idem_claim('job', 'lapsed');
  SELECT idem_complete('job', 'lapsed', '"resumed"');
  COMMIT;}), qr/^claimed 2 reserved \{"stock": 3\}$/m,
	'a retry takes it over with its checkpoint');
ok($new->poll_query_until('app', q{
  SELECT count(*) = 0 FROM idempotency.keys WHERE scope = 'short'}),
	'and reaps the expired keys');
ok($new->poll_query_until('app', q{
  SELECT reaped_total >= 100 AND reclaimed_total >= 1 AND worker_pid IS NOT NULL FROM idem_stats()}),
	'idem_stats shows the worker serving the upgraded database')
  or diag($new->safe_psql('app', 'SELECT * FROM idem_stats()'));
like($new->safe_psql('postgres', q{
  SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'idempotency launcher'}),
	qr/^1$/, 'its launcher runs');

# Applied versions hold.
is($new->safe_psql('app', q{SET ROLE alice;
  SELECT idem_apply_version('ledger', 'acct-1', 5), idem_apply_version('ledger', 'acct-1', 6)}),
	'f|t', 'an applied version is a duplicate, the next one applies');

# The outbox: the delivered event removed by the worker (retention 0), the dead letter
# listed, the leased event still held, the pending one relayed, and order kept.
ok($new->poll_query_until('app', q{
  SELECT count(*) = 0 FROM idempotency.outbox WHERE event_id = 'ev-1'}),
	'the worker removes the delivered event');
is($new->safe_psql('app', q{
  SELECT event_id || ' ' || seq || ' ' || reason FROM idem_outbox_dead_letters()}),
	'ev-poison 1 schema 3 unknown', 'the dead letter is listed');
is($new->safe_psql('app', q{
  SELECT string_agg(event_id || ':' || seq || ':' || attempt, ' ' ORDER BY event_id)
  FROM idem_outbox_claim('relay-new', 10)}),
	'ev-3:1:1', 'a relay gets the pending event; the leased one holds its aggregate back');
is($new->safe_psql('app', q{SELECT idem_outbox_ack('relay-old', '{ev-2}')}), '1',
	'the relay that held it since before the upgrade acknowledges it');
$new->safe_psql('app', q{SELECT idem_outbox_ack('relay-new', '{ev-3}');
  SELECT idem_emit('order.paid', '{"n": 3}', 'order-1', event_id => 'ev-4');});
is($new->safe_psql('app', q{SELECT idem_outbox_retry('{ev-poison}')}), '1', 'the dead letter is retried');
is($new->safe_psql('app', q{
  SELECT string_agg(event_id || ':' || aggregate || ':' || seq || ':' || attempt, ' ')
  FROM idem_outbox_claim('relay-new', 10)}),
	'ev-poison:order-2:1:2 ev-4:order-1:3:1',
	"the retried event comes back first with its seq, and an aggregate's numbering goes on");

# New keys work.
is($new->safe_psql('app', q{SET ROLE alice;
  BEGIN; SELECT outcome FROM idem_claim('pay', 'after'); SELECT idem_complete('pay', 'after'); COMMIT;
  SELECT state FROM idem_lookup('pay', 'after')}), "claimed\n\ncompleted", 'new keys work');

IdemCheck::amcheck_keys($new, 'after pg_upgrade', 'app');
IdemCheck::amcheck_messaging($new, 'after pg_upgrade', 'app');

# The 1.0 database: still 1.0, working with the new library, then updated.
is($new->safe_psql('legacy', q{SELECT extversion FROM pg_extension WHERE extname = 'idempotency'}),
	'1.0', 'the second database is still at 1.0');
is($new->safe_psql('legacy', q{
  SELECT string_agg(concat_ws(' ', role::text, scope, key, state, attempt, fingerprint,
                              response, expires_at), E'\n' ORDER BY key) FROM idempotency.keys}),
	$legacy_before, 'its keys are as they were');
is($new->safe_psql('legacy', q{
  SELECT outcome || ' ' || response FROM idem_claim('pay', 'done-10', idem_fingerprint('{"amount": 7}'::jsonb))}),
	'replay {"payment_id": 10}', 'a key replays before the update');
$new->safe_psql('legacy', 'ALTER EXTENSION idempotency UPDATE');
is($new->safe_psql('legacy', q{SELECT extversion FROM pg_extension WHERE extname = 'idempotency'}),
	$newest, "ALTER EXTENSION idempotency UPDATE reaches $newest");
is($new->safe_psql('legacy', q{
  SELECT outcome || ' ' || response FROM idem_claim('pay', 'done-10', idem_fingerprint('{"amount": 7}'::jsonb))}),
	'replay {"payment_id": 10}', 'and the key replays after it');
is($new->safe_psql('legacy', q{SELECT outcome FROM idem_claim('job', 'held-10', wait => '0')}),
	'in_progress', 'the lease claim stored under 1.0 is still held');
is($new->safe_psql('legacy', q{SELECT idem_complete('job', 'held-10', '"ok"', attempt => 1);
  SELECT state FROM idem_lookup('job', 'held-10')}), "\ncompleted", 'and its holder finishes it');
$new->safe_psql('legacy', q{SELECT idem_once('short', 'gone', ttl => '1 millisecond')});
ok($new->poll_query_until('legacy', q{SELECT count(*) = 0 FROM idempotency.keys WHERE scope = 'short'}),
	'the worker serves the updated database');
IdemCheck::amcheck_keys($new, 'legacy after the update', 'legacy');

$new->stop;
done_testing();
