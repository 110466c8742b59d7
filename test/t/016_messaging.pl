# Messaging (1.1) end to end: the worker's retention sweep of the outbox and of
# idem_apply_version's records; producers, relays and a consumer under load beside
# VACUUM, ANALYZE and CHECKPOINT, with a relay killed while it holds a batch; a hot
# standby that refuses every writing function and a promotion after which relaying
# goes on; and a crash with events emitted, leased, acknowledged and uncommitted.
#
# Longer by hand: IDEM_MESSAGING_SECONDS=60 IDEM_MESSAGING_RATE=200
use strict;
use warnings;
use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);
use FindBin;
use lib "$FindBin::RealBin/lib";
use IdemCheck;

# Every wait of the test library (poll_query_until, wait_for_catchup, background
# psql) gives up after this long: a hang fails the test instead of blocking it.
$PostgreSQL::Test::Utils::timeout_default = 30;

my $seconds = $ENV{IDEM_MESSAGING_SECONDS} // 10;
# Producer transactions per second, all clients together (each emits about four events).
my $rate = $ENV{IDEM_MESSAGING_RATE} // 120;

# Polls $query until it returns true, for at most $limit seconds.
sub wait_until {
	my ($node, $query, $limit) = @_;
	my $deadline = time() + $limit;
	while (time() < $deadline) {
		return 1 if $node->safe_psql('postgres', $query) eq 't';
		usleep(100_000);
	}
	return 0;
}

# The SQLSTATE $sql fails with, or a description of what it did instead.
sub sqlstate_of {
	my ($node, $sql) = @_;
	my ($ret, $stdout, $stderr) = $node->psql('postgres', "\\set VERBOSITY verbose\n$sql");
	return $stderr =~ /ERROR:  ([0-9A-Z]{5}):/ ? $1 : "no error (exit $ret: $stdout $stderr)";
}

# Waits until a pass of the worker ends 300 ms (three naptimes) after this call: a
# pass records last_reap_at as it ends, and passes here take milliseconds, so at
# least one whole pass has run since.
sub wait_for_passes {
	my ($node, $limit) = @_;
	my $now = $node->safe_psql('postgres', 'SELECT clock_timestamp()');
	return wait_until($node, qq{
		SELECT last_reap_at > '$now'::timestamptz + interval '300 ms' FROM idem_stats()}, $limit);
}

###############################################################################
# 1. The worker's retention: delivered events go once idempotency.outbox_retention
#    has passed since delivery; pending, leased and dead events never go, however
#    old; expired applied versions go.
###############################################################################

my $primary = PostgreSQL::Test::Cluster->new('messaging');
$primary->init(allows_streaming => 1);
$primary->append_conf('postgresql.conf', q{
shared_preload_libraries = 'idempotency'
idempotency.reaper_naptime = '100ms'
idempotency.outbox_retention = '1h'
});
$primary->start;
$primary->safe_psql('postgres', q{
  CREATE EXTENSION idempotency;
  SELECT idem_emit('ret-pending', jsonb_build_object('n', g), 'p') FROM generate_series(1, 2) g;
  SELECT idem_emit('ret-leased', '{}', 'l');
  SELECT idem_emit('ret-dead', '{}', event_id => 'ret-dead');
  SELECT idem_emit('ret-done', jsonb_build_object('n', g), 'd') FROM generate_series(1, 20) g;});
is($primary->safe_psql('postgres', q{
	SELECT idem_outbox_ack('ra', array_agg(event_id))
	FROM idem_outbox_claim('ra', 100, '1h', ARRAY['ret-done'])}),
	'20', 'retention: 20 events delivered');
is($primary->safe_psql('postgres', q{
	SELECT count(*) FROM idem_outbox_claim('rl', 10, '1h', ARRAY['ret-leased'])}),
	'1', 'retention: one event leased for an hour');
is($primary->safe_psql('postgres', q{
	SELECT idem_outbox_dead('rd', array_agg(event_id), 'poison')
	FROM idem_outbox_claim('rd', 10, '1h', ARRAY['ret-dead'])}),
	'1', 'retention: one event dead');
# Far older than any retention: a sweep that went by emission time would take them.
$primary->safe_psql('postgres', q{
  UPDATE idempotency.outbox SET emitted_at = emitted_at - interval '30 days'});
is($primary->safe_psql('postgres', q{
	SELECT idem_apply_version('ret', 'short', 1, ttl => '1s'), idem_apply_version('ret', 'long', 1)}),
	't|t', 'retention: two versions applied, one for a second');

ok(wait_for_passes($primary, 10), 'retention: the worker makes passes');
is($primary->safe_psql('postgres', q{
	SELECT count(*) FROM idempotency.outbox WHERE topic = 'ret-done' AND state = 'd'}),
	'20', 'retention 1h: delivered events are kept across passes');
ok(wait_until($primary, q{
	SELECT count(*) = 0 FROM idempotency.applied_versions WHERE entity = 'short'}, 15),
	'an expired applied version is removed by the worker');
is($primary->safe_psql('postgres', q{
	SELECT version FROM idempotency.applied_versions WHERE entity = 'long'}),
	'1', 'an applied version within its ttl is kept');

# The retention is a sighup setting: postgresql.conf and a reload.
$primary->append_conf('postgresql.conf', "idempotency.outbox_retention = '2s'\n");
$primary->reload;
ok(wait_until($primary, q{SELECT current_setting('idempotency.outbox_retention') = '2s'}, 10),
	'retention: reloaded as 2s');
$primary->safe_psql('postgres', q{
  SELECT idem_emit('ret-done2', jsonb_build_object('n', g), 'd2') FROM generate_series(1, 20) g});
my ($acked, $kept, $delivered_at) = split /\|/, $primary->safe_psql('postgres', q{
	SELECT idem_outbox_ack('ra', array_agg(event_id))
	FROM idem_outbox_claim('ra', 100, '1h', ARRAY['ret-done2']);
	SELECT count(*), max(delivered_at) FROM idempotency.outbox
	WHERE topic = 'ret-done2' AND state = 'd';}) =~ s/\n/|/r;
is("$acked|$kept", '20|20', 'retention 2s: delivered events are still there right after the ack');
# Until 2s after delivery all 20 must be there at every look; then they must go.
my ($early_loss, $gone) = (0, 0);
my $deadline = time() + 20;
while (time() < $deadline) {
	my ($left, $early) = split /\|/, $primary->safe_psql('postgres', qq{
		SELECT count(*), clock_timestamp() < '$delivered_at'::timestamptz + interval '2 s'
		FROM idempotency.outbox WHERE topic = 'ret-done2'});
	$early_loss = 1 if $early eq 't' && $left < 20;
	if ($left == 0) { $gone = 1; last; }
	usleep(100_000);
}
ok(!$early_loss, 'retention 2s: no delivered event is removed before 2s have passed since delivery');
ok($gone, 'retention 2s: delivered events are removed by the worker after the retention');
is($primary->safe_psql('postgres', q{
	SELECT count(*) FROM idempotency.outbox WHERE topic = 'ret-done'}),
	'0', 'retention 2s: so are those delivered earlier');
ok(wait_for_passes($primary, 10), 'retention: the worker makes more passes');
is($primary->safe_psql('postgres', q{
	SELECT string_agg(concat_ws(':', topic, state, attempt, coalesce(relay, '-')), ' '
	                  ORDER BY position)
	FROM idempotency.outbox}),
	'ret-pending:p:0:- ret-pending:p:0:- ret-leased:p:1:rl ret-dead:x:1:rd',
	'retention: pending, leased and dead events, 30 days old, are never removed');
is($primary->safe_psql('postgres', q{
	SELECT outbox_undelivered, outbox_dead,
	       outbox_oldest_undelivered_at < now() - interval '29 days' FROM idem_stats()}),
	'3|1|t', 'retention: idem_stats counts the undelivered and the dead');

###############################################################################
# 2. A streaming standby (with the extension at 1.1) refuses every writing function
#    with 25006 and lists the dead letters it replayed; after promotion relaying goes
#    on where the old primary left it.
###############################################################################

$primary->backup('base');
my $standby = PostgreSQL::Test::Cluster->new('standby');
$standby->init_from_backup($primary, 'base', has_streaming => 1);
$standby->append_conf('postgresql.conf', "idempotency.outbox_retention = '1h'\n");
$standby->start;
$primary->safe_psql('postgres', q{
  SELECT idem_emit('fo', jsonb_build_object('n', g), 'a1', event_id => ('fo-' || g)::idem_key)
  FROM generate_series(1, 4) g;
  SELECT idem_emit('fo-dead', '{"poison": true}', event_id => 'fo-poison');
  SELECT idem_outbox_dead('old', array_agg(event_id), 'cannot parse')
  FROM idem_outbox_claim('old', 10, '1h', ARRAY['fo-dead']);
  SELECT idem_apply_version('fo', 'a1', 1);});
is($primary->safe_psql('postgres', q{
	SELECT string_agg(event_id || ':' || seq || ':' || attempt, ' ')
	FROM idem_outbox_claim('old', 2, '2s', ARRAY['fo'])}),
	'fo-1:1:1 fo-2:2:1', 'failover: the old primary hands out two events with a short lease');
$primary->wait_for_catchup($standby);

is($standby->safe_psql('postgres', q{SELECT extversion FROM pg_extension WHERE extname = 'idempotency'}),
	$primary->safe_psql('postgres', q{SELECT default_version FROM pg_available_extensions WHERE name = 'idempotency'}),
	'failover: the standby has the extension at the installed default version');
is($standby->safe_psql('postgres', q{
	SELECT string_agg(event_id || ':' || topic || ':' || attempt || ':' || reason, ' ')
	FROM idem_outbox_dead_letters()}),
	'ret-dead:ret-dead:1:poison fo-poison:fo-dead:1:cannot parse',
	'on the standby, idem_outbox_dead_letters lists the dead letters it replayed, oldest first');
is($standby->safe_psql('postgres', q{SELECT count(*) FROM idem_outbox_dead_letters('fo-dead')}),
	'1', 'on the standby, idem_outbox_dead_letters filters by topic');

my @writers = (
	q{SELECT idem_emit('fo', '{}')},
	q{SELECT idem_emit('fo', '{}', 'a1')},
	q{SELECT idem_emit('fo', '{}', 'a1', event_id => 'fo-1')},
	q{SELECT * FROM idem_outbox_claim('new')},
	q{SELECT * FROM idem_outbox_claim('new', 1, '1s', ARRAY['no-such-topic'])},
	q{SELECT idem_outbox_ack('old', ARRAY['fo-1']::idem_key[])},
	q{SELECT idem_outbox_dead('old', ARRAY['fo-1']::idem_key[], 'why')},
	q{SELECT idem_outbox_retry()},
	q{SELECT idem_outbox_retry(ARRAY['fo-poison']::idem_key[])},
	q{SELECT idem_apply_version('fo', 'a1', 2)},
	q{SELECT idem_apply_version('fo', 'a1', 1)});
for my $call (@writers) {
	is(sqlstate_of($standby, $call), '25006', "on the standby, $call fails with 25006");
}
for my $call (@writers) {
	is(sqlstate_of($primary, "SET default_transaction_read_only = on;\n$call"), '25006',
		"in a read-only transaction, $call fails with 25006");
}

$primary->stop;
$standby->promote;
# The old primary's lease (2s) holds the aggregate until it runs out; then the new
# primary hands its events out again, attempt + 1, in seq order.
my $handed = '';
$deadline = time() + 15;
while (time() < $deadline) {
	$handed = $standby->safe_psql('postgres', q{
		SELECT string_agg(event_id || ':' || seq || ':' || attempt, ' ')
		FROM idem_outbox_claim('new', 10, '1h', ARRAY['fo'])});
	last if $handed ne '';
	usleep(100_000);
}
is($handed, 'fo-1:1:2 fo-2:2:2 fo-3:3:1 fo-4:4:1',
	'after promotion the events pending on the old primary are handed out, attempt continuing');
is($standby->safe_psql('postgres', q{SELECT idem_outbox_ack('old', ARRAY['fo-1', 'fo-2']::idem_key[])}),
	'0', 'after promotion a late ack of the old relay is ignored');
is($standby->safe_psql('postgres', q{
	SELECT idem_outbox_ack('new', ARRAY['fo-1', 'fo-2', 'fo-3', 'fo-4']::idem_key[])}),
	'4', 'after promotion the new relay acks them');
is($standby->safe_psql('postgres', q{SELECT idem_outbox_retry(ARRAY['fo-poison']::idem_key[])}),
	'1', 'after promotion idem_outbox_retry puts the dead letter back');
is($standby->safe_psql('postgres', q{
	SELECT string_agg(event_id || ':' || attempt, ' ') FROM idem_outbox_claim('new', 10, '1h', ARRAY['fo-dead']);
	SELECT idem_outbox_ack('new', ARRAY['fo-poison']::idem_key[]);
	SELECT count(*) FROM idem_outbox_dead_letters('fo-dead');}),
	"fo-poison:2\n1\n0", 'after promotion the retried dead letter is handed out (attempt 2) and acked');
$standby->safe_psql('postgres', q{SELECT idem_emit('fo', '{}', 'a1', event_id => 'fo-5')});
is($standby->safe_psql('postgres', q{
	SELECT concat_ws(':', seq, state) FROM idempotency.outbox WHERE event_id = 'fo-5'}),
	'5:p', 'after promotion the aggregate continues at seq 5');
is($standby->safe_psql('postgres', q{
	SELECT idem_apply_version('fo', 'a1', 1), idem_apply_version('fo', 'a1', 2)}),
	'f|t', 'after promotion idem_apply_version knows the version applied on the old primary');
$standby->stop;

###############################################################################
# 3. Producers, relays and a consumer under load, beside VACUUM, ANALYZE, CHECKPOINT
#    and the worker; one relay is killed while it holds a batch.
###############################################################################

my $load = PostgreSQL::Test::Cluster->new('relays');
$load->init;
$load->append_conf('postgresql.conf', q{
shared_preload_libraries = 'idempotency'
idempotency.reaper_naptime = '100ms'
idempotency.outbox_retention = '1h'
max_connections = 40
log_statement = none
statement_timeout = '20s'
});
$load->start;
$load->safe_psql('postgres', q{
  CREATE EXTENSION idempotency;
  -- What the producers committed: one row per event (its id) in the emitting transaction.
  CREATE TABLE produced (event_id text PRIMARY KEY, topic text NOT NULL, aggregate text);
  -- Counters that rolled-back transactions cannot undo.
  CREATE SEQUENCE doomed_transactions;
  CREATE SEQUENCE savepoint_rollbacks;
  CREATE SEQUENCE re_emits;
  -- The broker: every event a relay handed on, in the order it did (receipt), with what
  -- the consumer made of it (applied: idem_apply_version said yes).
  CREATE TABLE receipts (receipt bigserial PRIMARY KEY, batch bigint NOT NULL, relay text NOT NULL,
                         event_id text NOT NULL, topic text NOT NULL, aggregate text, seq bigint,
                         attempt int NOT NULL, payload jsonb NOT NULL, applied boolean NOT NULL,
                         received_at timestamptz NOT NULL DEFAULT clock_timestamp());
  CREATE INDEX ON receipts (event_id);
  CREATE TABLE batches (batch bigint PRIMARY KEY, relay text NOT NULL, events int NOT NULL,
                        acked bigint);
  CREATE SEQUENCE batch_ids;

  -- A producer's transaction: maybe an event with an explicit id (from a small space,
  -- so most are re-emitted and must add nothing), three events of two aggregates, maybe
  -- one without aggregate, maybe events in a savepoint rolled back. The transaction
  -- itself is rolled back by the script when doomed. Aggregates are locked in one order
  -- (explicit id, its aggregate, agg-N by N, never-N): producers taking two aggregates
  -- in opposite orders would wait for each other until IK005.
  CREATE FUNCTION produce(a int, b int, doomed boolean, dup int, kind int) RETURNS void
  LANGUAGE plpgsql AS $$
  DECLARE
    id idem_key;
    given idem_key := ('ev-' || dup)::idem_key;
    agg text;
    body jsonb := jsonb_build_object('doomed', doomed);
  BEGIN
    IF doomed THEN PERFORM nextval('doomed_transactions'); END IF;
    IF kind = 1 THEN
      IF EXISTS (SELECT FROM produced WHERE event_id = given::text) THEN
        PERFORM nextval('re_emits');
      END IF;
      id := idem_emit('orders', body, 'dup-' || dup % 3, event_id => given);
      IF id <> given THEN RAISE EXCEPTION 'idem_emit returned % for event id %', id, given; END IF;
      INSERT INTO produced VALUES (id::text, 'orders', 'dup-' || dup % 3) ON CONFLICT DO NOTHING;
    END IF;
    FOREACH agg IN ARRAY ARRAY['agg-' || least(a, b), 'agg-' || least(a, b), 'agg-' || greatest(a, b)]
    LOOP
      id := idem_emit('orders', body, agg, jsonb_build_object('producer', pg_backend_pid()));
      INSERT INTO produced VALUES (id::text, 'orders', agg);
    END LOOP;
    IF kind = 2 THEN
      id := idem_emit('audit', body);
      INSERT INTO produced VALUES (id::text, 'audit', NULL);
    END IF;
    -- kind 3: events in a savepoint rolled back (one for an aggregate this transaction
    -- emitted for, one for an aggregate only ever emitted for in such savepoints), then
    -- one more event for the first: it takes the seq the savepoint gave back.
    IF kind = 3 THEN
      BEGIN
        PERFORM idem_emit('audit', jsonb_build_object('doomed', true));
        PERFORM idem_emit('orders', jsonb_build_object('doomed', true), 'agg-' || a);
        PERFORM idem_emit('orders', jsonb_build_object('doomed', true), 'never-' || a % 2);
        RAISE SQLSTATE 'P0001' USING MESSAGE = 'to the savepoint';
      EXCEPTION WHEN SQLSTATE 'P0001' THEN
        PERFORM nextval('savepoint_rollbacks');
      END;
      id := idem_emit('orders', body, 'agg-' || a);
      INSERT INTO produced VALUES (id::text, 'orders', 'agg-' || a);
    END IF;
  END $$;

  -- A relay's claim and the broker's receipt of the batch, in one transaction; the
  -- consumer applies each event with idem_apply_version as it is received.
  CREATE FUNCTION relay_claim(p_relay text, p_max int, p_lease interval) RETURNS bigint
  LANGUAGE plpgsql AS $$
  DECLARE
    b bigint := nextval('batch_ids');
    e record;
    n int := 0;
  BEGIN
    FOR e IN SELECT * FROM idem_outbox_claim(p_relay, p_max, p_lease) LOOP
      INSERT INTO receipts (batch, relay, event_id, topic, aggregate, seq, attempt, payload, applied)
      VALUES (b, p_relay, e.event_id::text, e.topic, e.aggregate, e.seq, e.attempt, e.payload,
              e.seq IS NOT NULL
              AND idem_apply_version('consumer', e.topic || '/' || e.aggregate, e.seq));
      n := n + 1;
    END LOOP;
    IF n = 0 THEN
      PERFORM pg_sleep(0.01);  -- nothing ready: a relay would poll again later
    ELSE
      INSERT INTO batches VALUES (b, p_relay, n, NULL);
    END IF;
    RETURN b;
  END $$;

  -- The relay's ack of a batch, in a transaction of its own; every event of it must
  -- count (the lease is long).
  CREATE FUNCTION relay_ack(p_batch bigint) RETURNS void LANGUAGE plpgsql AS $$
  DECLARE
    r text;
    n int;
    done bigint;
  BEGIN
    SELECT relay, events INTO r, n FROM batches WHERE batch = p_batch;
    IF NOT FOUND THEN RETURN; END IF;
    done := idem_outbox_ack(r, ARRAY(SELECT event_id::idem_key FROM receipts WHERE batch = p_batch));
    IF done <> n THEN
      RAISE EXCEPTION 'relay % acked % of the % events of batch %', r, done, n, p_batch;
    END IF;
    UPDATE batches SET acked = done WHERE batch = p_batch;
  END $$;});

sub write_script {
	my ($name, $text) = @_;
	my $file = $load->basedir . "/$name.sql";
	PostgreSQL::Test::Utils::append_to_file($file, $text);
	return $file;
}
my $producer_script = write_script('producer', q{
\set a random(1, 20)
\set b random(1, 20)
\set doomed random(1, 8)
\set dup random(1, 100)
\set kind random(1, 3)
BEGIN;
SELECT produce(:a, :b, :doomed = 1, :dup, :kind);
\if :doomed = 1
ROLLBACK;
\else
COMMIT;
\endif
});
my $relay_script = write_script('relay', q{
\set max 5 + :client_id * 10
SELECT relay_claim('relay-' || :client_id, :max, '30s') AS batch \gset
SELECT relay_ack(:batch);
});
# Separate lines: VACUUM cannot run in the implicit transaction of a multi-statement query.
my $maintenance_script = write_script('maintenance', q{
VACUUM idempotency.outbox;
ANALYZE idempotency.outbox;
VACUUM idempotency.outbox_aggregates;
VACUUM idempotency.applied_versions;
ANALYZE idempotency.applied_versions;
CHECKPOINT;
\sleep 100 ms
});

sub pgbench {
	my ($script, $clients, $time, @options) = @_;
	my %run = (out => '', err => '');
	$run{handle} = IPC::Run::start(
		[ 'pgbench', '--no-vacuum', "--client=$clients", "--time=$time", @options, '-f', $script,
		  '-h', $load->host, '-p', $load->port, 'postgres' ],
		'>', \$run{out}, '2>', \$run{err}, IPC::Run::timeout($time + 60));
	return \%run;
}

# Whether a pgbench run ended (within its deadline) with every transaction through.
sub pgbench_clean {
	my ($run) = @_;
	my $ok = eval { $run->{handle}->finish };
	$run->{err} .= $@ if $@;
	note($run->{out});
	return $ok && $run->{err} eq '' && $run->{out} =~ /number of failed transactions: 0 /;
}

my $log_offset = -s $load->logfile;
my $producers = pgbench($producer_script, 6, $seconds, '--jobs=2', "--rate=$rate");
ok(wait_until($load, q{SELECT count(*) >= 30 FROM idempotency.outbox WHERE state = 'p'}, 15),
	'load: producers are emitting');

# The victim: claims a batch with a short lease, hands it to the broker, and dies
# while it publishes (before its ack).
my $victim = $load->background_psql('postgres', on_error_stop => 0);
my $victim_pid = $victim->query_safe('SELECT pg_backend_pid()');
my $victim_batch = $victim->query_safe(q{SELECT relay_claim('victim', 25, '2s')});
my $victim_events = $load->safe_psql('postgres', qq{SELECT count(*) FROM receipts WHERE batch = $victim_batch});
cmp_ok($victim_events, '>', 0, 'load: the victim relay has a batch');
$victim->query_until(qr/publishing/, "\\echo publishing\nSELECT pg_sleep(15);\n");
ok(wait_until($load, qq{
	SELECT count(*) = 1 FROM pg_stat_activity
	WHERE pid = $victim_pid AND state = 'active' AND query LIKE '%pg_sleep%'}, 10),
	'load: the victim relay is publishing');

my $relays = pgbench($relay_script, 3, $seconds + 3, '--jobs=1');
my $maintenance = pgbench($maintenance_script, 1, $seconds + 3);
is($load->safe_psql('postgres', "SELECT pg_terminate_backend($victim_pid)"), 't',
	'load: the victim relay is terminated mid-batch');
eval { $victim->quit };

ok(pgbench_clean($producers), "load: 6 producers emit for ${seconds}s, no errors")
  or diag("stderr:\n$producers->{err}");
ok(pgbench_clean($relays), '3 relays claim and ack in short transactions, every ack counts, no errors')
  or diag("stderr:\n$relays->{err}");
ok(pgbench_clean($maintenance), 'load: VACUUM, ANALYZE and CHECKPOINT ran beside them without errors')
  or diag("stderr:\n$maintenance->{err}");
my ($loops) = $maintenance->{out} =~ /number of transactions actually processed: (\d+)/;
cmp_ok($loops // 0, '>', 5, 'load: the maintenance loop ran throughout') or diag($maintenance->{out});

# What the relays left (the last events, or any the victim's lease still held).
my $drained = 0;
$deadline = time() + 20;
while (time() < $deadline) {
	if ($load->safe_psql('postgres', q{SELECT count(*) FROM idempotency.outbox WHERE state <> 'd'}) == 0) {
		$drained = 1;
		last;
	}
	$load->safe_psql('postgres', q{SELECT relay_ack(relay_claim('drain', 100, '30s'))});
}
ok($drained, 'load: nothing is left pending');

my @errors =
  grep { /\b(ERROR|PANIC|FATAL):|TRAP:|terminated by signal/ && !/terminating connection due to administrator command/ }
  split /\n/, slurp_file($load->logfile, $log_offset);
is(scalar @errors, 0, 'load: no error in the server log besides the victim\'s termination')
  or diag(join "\n", @errors[0 .. ($#errors < 20 ? $#errors : 19)]);

note('events: ' . $load->safe_psql('postgres', 'SELECT count(*) FROM produced')
	. ', receipts: ' . $load->safe_psql('postgres', 'SELECT count(*) FROM receipts')
	. ', batches: ' . $load->safe_psql('postgres', 'SELECT count(*) FROM batches'));
cmp_ok($load->safe_psql('postgres', 'SELECT count(*) FROM produced'), '>', $rate * $seconds,
	'load: the producers committed events');
is($load->safe_psql('postgres', q{
	SELECT nextval('doomed_transactions') > 10, nextval('savepoint_rollbacks') > 10,
	       nextval('re_emits') > 10}),
	't|t|t', 'load: transactions and savepoints were rolled back, explicit ids re-emitted');

# Exactly the committed events, every one delivered.
is($load->safe_psql('postgres', q{
	SELECT count(*) FROM produced p FULL JOIN idempotency.outbox o ON o.event_id::text = p.event_id
	WHERE p.event_id IS NULL OR o.event_id IS NULL OR o.topic <> p.topic
	   OR o.aggregate IS DISTINCT FROM p.aggregate}),
	'0', 'load: the outbox holds exactly the committed events');
is($load->safe_psql('postgres', q{
	SELECT count(*) FROM idempotency.outbox WHERE state <> 'd' OR delivered_at IS NULL}),
	'0', 'load: every committed event is delivered');
is($load->safe_psql('postgres', q{
	SELECT (SELECT count(*) FROM idempotency.outbox WHERE payload ->> 'doomed' = 'true')
	     + (SELECT count(*) FROM receipts WHERE payload ->> 'doomed' = 'true')}),
	'0', 'load: no event of a rolled-back transaction or savepoint exists or was relayed');
is($load->safe_psql('postgres', q{
	SELECT count(*) FROM produced p WHERE NOT EXISTS (SELECT FROM receipts r WHERE r.event_id = p.event_id)}),
	'0', 'load: the broker received every committed event');
is($load->safe_psql('postgres', q{
	SELECT count(*) FROM receipts r WHERE NOT EXISTS (SELECT FROM produced p WHERE p.event_id = r.event_id)}),
	'0', 'load: the broker received nothing else');
is($load->safe_psql('postgres', q{
	SELECT count(*) FROM idempotency.outbox o
	LEFT JOIN (SELECT event_id, count(*) AS handed_out FROM receipts GROUP BY 1) r
	       ON r.event_id = o.event_id::text
	WHERE o.attempt <> coalesce(r.handed_out, 0)}),
	'0', 'load: each event\'s attempt counts the times it was handed out');

# Order.
is($load->safe_psql('postgres', q{
	SELECT count(DISTINCT aggregate) FILTER (WHERE aggregate LIKE 'agg-%') || ' '
	    || count(DISTINCT aggregate) FILTER (WHERE aggregate LIKE 'dup-%') || ' '
	    || count(*) FILTER (WHERE aggregate IS NULL AND seq IS NOT NULL)
	FROM idempotency.outbox}),
	'20 3 0', 'load: events of 20 + 3 aggregates, and no seq without an aggregate');
is($load->safe_psql('postgres', q{
	SELECT count(*) FROM idempotency.outbox_aggregates WHERE aggregate LIKE 'never-%'}),
	'0', 'load: an aggregate emitted for only in savepoints rolled back has no counter');
is($load->safe_psql('postgres', q{
	SELECT count(*) FROM (
	  SELECT topic, aggregate FROM idempotency.outbox WHERE aggregate IS NOT NULL
	  GROUP BY topic, aggregate
	  HAVING min(seq) <> 1 OR max(seq) <> count(*) OR count(DISTINCT seq) <> count(*)
	      OR count(seq) <> count(*)) bad}),
	'0', 'load: per aggregate, seq is 1..n with no gap and no duplicate');
is($load->safe_psql('postgres', q{
	SELECT count(*) FROM idempotency.outbox_aggregates a
	FULL JOIN (SELECT topic, aggregate, max(seq) AS last FROM idempotency.outbox
	           WHERE aggregate IS NOT NULL GROUP BY 1, 2) o USING (topic, aggregate)
	WHERE a.last_seq IS DISTINCT FROM o.last}),
	'0', 'load: each aggregate\'s counter is its last seq');
is($load->safe_psql('postgres', q{
	SELECT count(*) FROM (
	  SELECT first < lag(first) OVER (PARTITION BY topic, aggregate ORDER BY seq) AS disorder
	  FROM (SELECT topic, aggregate, seq, min(receipt) AS first FROM receipts
	        WHERE aggregate IS NOT NULL GROUP BY 1, 2, 3) f) o
	WHERE disorder}),
	'0', 'load: per aggregate, the first delivery of each seq came in seq order');
is($load->safe_psql('postgres', q{
	SELECT count(*) FROM (
	  SELECT topic, aggregate, seq FROM receipts WHERE aggregate IS NOT NULL GROUP BY 1, 2, 3
	  HAVING count(*) FILTER (WHERE applied) <> 1
	      OR min(receipt) FILTER (WHERE applied) <> min(receipt)) bad}),
	'0', 'load: idem_apply_version applied each event once, at its first delivery');
is($load->safe_psql('postgres', q{
	SELECT count(*) FROM idempotency.applied_versions v
	FULL JOIN (SELECT topic || '/' || aggregate AS entity, max(seq) AS last FROM idempotency.outbox
	           WHERE aggregate IS NOT NULL GROUP BY 1) o ON o.entity = v.entity AND v.scope = 'consumer'
	WHERE v.version IS DISTINCT FROM o.last}),
	'0', 'load: the consumer\'s last applied version of each aggregate is its last seq');

# The victim's batch came back after its lease, attempt 2, to another relay.
is($load->safe_psql('postgres', qq{
	SELECT count(*) || ' ' || count(*) FILTER (WHERE attempt = 1) FROM receipts WHERE batch = $victim_batch}),
	"$victim_events $victim_events", 'load: the victim had its events at attempt 1');
is($load->safe_psql('postgres', qq{
	SELECT count(*) FROM receipts v WHERE v.batch = $victim_batch AND NOT EXISTS (
	  SELECT FROM receipts r WHERE r.event_id = v.event_id AND r.relay <> 'victim' AND r.attempt = 2)}),
	'0', 'load: each of the victim\'s events was handed out again with attempt 2');
is($load->safe_psql('postgres', qq{
	SELECT count(*) FROM receipts v JOIN receipts r ON r.event_id = v.event_id AND r.receipt <> v.receipt
	WHERE v.batch = $victim_batch AND r.received_at < v.received_at + interval '1.5 s'}),
	'0', 'load: but not before the victim\'s lease ran out');

# An event whose transaction commits after a later one was relayed is relayed too.
my $late = $load->background_psql('postgres');
$late->query_safe('BEGIN');
$late->query_safe(q{SELECT idem_emit('late', '{}', event_id => 'late-1')});
$load->safe_psql('postgres', q{SELECT idem_emit('late', '{}', event_id => 'late-2')});
is($load->safe_psql('postgres', q{
	SELECT string_agg(event_id::text, ' '), idem_outbox_ack('lr', array_agg(event_id))
	FROM idem_outbox_claim('lr', 10, '1h', ARRAY['late'])}),
	'late-2|1', 'an event of a transaction still open is not handed out, a later committed one is');
$late->query_safe('COMMIT');
$late->quit;
is($load->safe_psql('postgres', q{
	SELECT string_agg(event_id::text, ' ') FROM idem_outbox_claim('lr', 10, '1h', ARRAY['late'])}),
	'late-1', 'once committed, the earlier event is handed out: nothing is skipped');

IdemCheck::amcheck_messaging($load, 'after the load');

###############################################################################
# 4. A crash (immediate stop) with events emitted, leased, acked, dead, and an
#    uncommitted emit and ack.
###############################################################################

$load->safe_psql('postgres', q{
  SELECT idem_emit('crash', jsonb_build_object('n', g), 'c1', event_id => ('c-' || g)::idem_key)
  FROM generate_series(1, 6) g;
  SELECT idem_emit('crash', '{"free": true}', event_id => 'c-free');});
is($load->safe_psql('postgres', q{
	SELECT idem_outbox_ack('cr', array_agg(event_id) FILTER (WHERE seq <= 2))
	FROM idem_outbox_claim('cr', 3, '1h', ARRAY['crash'])}),
	'2', 'crash: c-1..3 handed out, c-1 and c-2 acked');
is($load->safe_psql('postgres', q{
	SELECT idem_outbox_dead('cr2', array_agg(event_id), 'poison')
	FROM idem_outbox_claim('cr2', 10, '1h', ARRAY['crash'])}),
	'1', 'crash: c1 is blocked behind the lease of c-3; c-free handed out and dead');
my $crash_rows = q{
	SELECT string_agg(concat_ws(':', event_id, seq, state, attempt, relay, lease_expires_at,
	                            delivered_at, reason, payload), ' ' ORDER BY position)
	FROM idempotency.outbox WHERE topic = 'crash'};
my $before_crash = $load->safe_psql('postgres', $crash_rows);

my $uncommitted_emit = $load->background_psql('postgres', on_error_stop => 0);
$uncommitted_emit->query_safe(q{BEGIN});
$uncommitted_emit->query_safe(q{SELECT idem_emit('crash', '{}', 'c1', event_id => 'c-uncommitted')});
$uncommitted_emit->query_safe(q{SELECT idem_emit('crash', '{}', event_id => 'c-uncommitted-free')});
my $uncommitted_ack = $load->background_psql('postgres', on_error_stop => 0);
$uncommitted_ack->query_safe(q{BEGIN});
is($uncommitted_ack->query_safe(q{SELECT idem_outbox_ack('cr', ARRAY['c-3']::idem_key[])}), '1',
	'crash: an ack of c-3 in a transaction left open');
# The uncommitted rows reach the data files before the crash.
$load->safe_psql('postgres', 'CHECKPOINT');
$load->stop('immediate');
eval { $uncommitted_emit->quit };
eval { $uncommitted_ack->quit };
$load->start;

is($load->safe_psql('postgres', $crash_rows), $before_crash,
	'after the crash every committed event is there in its state (delivered, leased, pending, dead)');
is($load->safe_psql('postgres', q{
	SELECT count(*) FROM idempotency.outbox WHERE event_id::text LIKE 'c-uncommitted%'}),
	'0', 'after the crash the uncommitted emits left nothing');
$load->safe_psql('postgres', q{SELECT idem_emit('crash', '{}', 'c1', event_id => 'c-7')});
$load->safe_psql('postgres', q{SELECT idem_emit('crash', '{}', 'c1', event_id => 'c-uncommitted')});
is($load->safe_psql('postgres', q{
	SELECT string_agg(event_id || ':' || seq, ' ' ORDER BY seq) FROM idempotency.outbox
	WHERE event_id IN ('c-7', 'c-uncommitted');
	SELECT last_seq FROM idempotency.outbox_aggregates WHERE topic = 'crash' AND aggregate = 'c1';}),
	"c-7:7 c-uncommitted:8\n8", 'after the crash seq continues without a gap, and the id is free');
is($load->safe_psql('postgres', q{SELECT idem_outbox_ack('cr', ARRAY['c-3']::idem_key[])}),
	'1', 'after the crash the lease holder acks c-3');
is($load->safe_psql('postgres', q{
	SELECT string_agg(event_id || ':' || seq || ':' || attempt, ' ')
	FROM idem_outbox_claim('cr', 10, '1h', ARRAY['crash'])}),
	'c-4:4:1 c-5:5:1 c-6:6:1 c-7:7:1 c-uncommitted:8:1',
	'after the crash the rest of c1 is handed out in seq order');
is($load->safe_psql('postgres', q{
	SELECT string_agg(event_id || ':' || reason, ' ') FROM idem_outbox_dead_letters('crash')}),
	'c-free:poison', 'after the crash the dead letter is kept');
IdemCheck::amcheck_messaging($load, 'after crash recovery');

$load->stop;
done_testing();
