# idem-relay (relay/) against the SQL-only edition, installed as plain SQL by the
# database owner (no superuser) in a PostgreSQL without the native edition: the relay
# calls only idem_outbox_claim, _ack and _dead, which this edition has with the native
# signatures. The program is built here from relay/ with Debian's Go packages, then
#   - its start-up check: a role without the grants (or with one of three), or a
#     database without the edition, exits 2 with one clear message naming the
#     functions, and claims nothing; the GRANT that message prints, run by the owner,
#     is all the role needs (it may execute nothing else of the edition) to relay;
#   - the stdout sink: every event written once, each aggregate in seq order, with
#     topic, attempt, headers and payload;
#   - the http sink into the receiving service of test/relay/consumer.py, which applies
#     each event with idem_once in another database with the SQL-only edition too: two
#     relay copies, one killed with SIGKILL mid-run and restarted, PostgreSQL stopped
#     -m immediate once mid-run: every event applied exactly once, each aggregate first
#     applied in seq order, nothing dead;
#   - a dead letter: an event the receiver refuses with 422 ends in
#     idem_outbox_dead_letters() with the reason, at its first attempt.
# (test/t/033_relay.pl tests the relay itself in depth against the native edition.)
use strict;
use warnings;
use Cwd qw(abs_path);
use IO::Socket::INET;
use Time::HiRes qw(time sleep);
use JSON::PP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::RealBin/lib", "$FindBin::RealBin/../../t/lib";
use IdemSqlOnly;
use IdemProcesses;

IdemSqlOnly::require_no_native();
my $script = IdemSqlOnly::dist_file('sql');
my $repo = abs_path('.');
my $python = '/usr/bin/python3';
die "$python cannot import psycopg: install python3-psycopg"
  unless system($python, '-c', 'import psycopg') == 0;

# Scale of the http run (IDEM_RELAY_EVENTS raises it).
my $events = $ENV{IDEM_RELAY_EVENTS} // 1000;
my $aggregates = $ENV{IDEM_RELAY_AGGREGATES} // 20;

my $node = PostgreSQL::Test::Cluster->new('relay');
$node->init;
$node->start;
# shop: the application's database, where events are emitted; service_b: the receiving
# service's, where it applies them with idem_once (as svc, a role of its own). Each
# database's owner installs the edition.
$node->safe_psql('postgres', q{
  CREATE ROLE shop_owner LOGIN NOSUPERUSER;
  CREATE ROLE b_owner LOGIN NOSUPERUSER;
  CREATE ROLE relay LOGIN NOSUPERUSER;
  CREATE ROLE svc LOGIN NOSUPERUSER;
  CREATE ROLE bystander LOGIN NOSUPERUSER;
  CREATE DATABASE shop OWNER shop_owner;
  CREATE DATABASE service_b OWNER b_owner;});
for my $db ([ 'shop', 'shop_owner' ], [ 'service_b', 'b_owner' ]) {
	my ($ret, $out, $err) = IdemSqlOnly::psql_as($node, $db->[1], $db->[0], undef, file => $script);
	is($ret, 0, "$db->[1] (no superuser) installs the SQL-only edition in $db->[0]")
	  or die "the plain script failed in $db->[0]: $err";
}
is(IdemSqlOnly::safe_as($node, 'b_owner', 'service_b', q{
  CREATE TABLE applied(n bigserial PRIMARY KEY, event_id text, topic text, aggregate text, seq bigint);
  CREATE TABLE arrivals(n bigserial PRIMARY KEY, event_id text, topic text, aggregate text, seq bigint,
                        attempt int, status int, idem_key text, path text, at timestamptz DEFAULT clock_timestamp());
  GRANT SELECT, INSERT ON applied, arrivals TO svc;
  GRANT USAGE ON SEQUENCE applied_n_seq, arrivals_n_seq TO svc;
  SELECT 'ok'}), 'ok', 'service_b: the receiving service\'s tables, written by svc');
is(IdemSqlOnly::safe_as($node, 'svc', 'service_b', q{
  BEGIN; SELECT idem_once('probe', 'k1'); SELECT idem_once('probe', 'k1'); COMMIT;}), "t\nf",
	'service_b: idem_once works for svc (true, then false)');
# The signatures the relay checks and calls (relay/source.go) are the edition's.
is($node->safe_psql('shop', q{
  SELECT 'idem_outbox_claim(text, integer, interval, text[])'::regprocedure::text || ' '
      || 'idem_outbox_ack(text, idem_key[])'::regprocedure::text || ' '
      || 'idem_outbox_dead(text, idem_key[], text)'::regprocedure::text}),
	'idem_outbox_claim(text,integer,interval,text[]) idem_outbox_ack(text,idem_key[]) idem_outbox_dead(text,idem_key[],text)',
	'the three relay functions exist with the signatures relay/source.go names');

my $tmp = PostgreSQL::Test::Utils::tempdir();
sub free_port { return PostgreSQL::Test::Cluster::get_free_port(); }

# --- the relay -----------------------------------------------------------------------
# Built with relay/Makefile's Go cache (relay/.gocache, ignored by git, or GOCACHE from
# the environment): a cold build takes about a minute, later ones (another PostgreSQL
# version in the same run, a rerun) a second. A tree this user may not write: a cache
# of the test's own.
my $relay_bin = "$tmp/idem-relay";
{
	my ($out, $err);
	my @gocache = ($ENV{GOCACHE} || -w "$repo/relay") ? () : ("GOCACHE=$tmp/gocache");
	my $ok = IPC::Run::run([ 'make', '-s', '-C', "$repo/relay", "OUT=$relay_bin", @gocache ],
		'>', \$out, '2>', \$err);
	ok($ok && -x $relay_bin, 'idem-relay builds from relay/ with Debian\'s Go packages')
	  or die "the relay did not build: $out$err";
}

my %pgenv = (
	PGHOST => $node->host, PGPORT => $node->port, PGDATABASE => 'shop',
	PGUSER => 'relay', PGSSLMODE => 'disable');

# Runs the relay to its end (IdemProcesses::relay_once); returns (exit code, stdout, stderr).
sub relay_once { return IdemProcesses::relay_once($relay_bin, @_) }

# The error of the relay's "cannot relay" log line (JSON), or ''.
sub cannot_relay {
	my ($stderr) = @_;
	for my $line (split /\n/, $stderr) {
		my $entry = eval { decode_json($line) } or next;
		return $entry->{error} // '' if ($entry->{msg} // '') eq 'cannot relay';
	}
	return '';
}

# Starts a relay (IdemProcesses::start_relay) as the relay role.
sub start_relay { return IdemProcesses::start_relay($relay_bin, \%pgenv, @_) }

sub undelivered { return $node->safe_psql('shop', 'SELECT outbox_undelivered FROM idem_stats()'); }

# Emits $n events over aggregates PREFIX0..PREFIX($k-1) of $topic, 500 per transaction,
# round-robin over the aggregates; as the shop's owner (idem_emit is not PUBLIC's).
sub emit {
	my ($topic, $n, $k, $prefix) = @_;
	$prefix //= 'a';
	for (my $from = 1; $from <= $n; $from += 500) {
		my $to = $from + 499;
		$to = $n if $to > $n;
		my ($ret, $out, $err) = IdemSqlOnly::psql_as($node, 'shop_owner', 'shop', qq{
		  SELECT count(idem_emit('$topic', jsonb_build_object('n', g), '$prefix' || (g % $k),
		                         jsonb_build_object('h', 'v', 'nested', jsonb_build_object('x', g))))
		  FROM (SELECT g FROM generate_series($from, $to) g ORDER BY g) s});
		die "idem_emit failed: $err" unless $ret == 0;
	}
}

# --- the start-up check ----------------------------------------------------------------
emit('stdout.t', 1000, 20);
my $all_three = qr/GRANT EXECUTE ON FUNCTION idem_outbox_claim\(text, integer, interval, text\[\]\), idem_outbox_ack\(text, idem_key\[\]\), idem_outbox_dead\(text, idem_key\[\], text\) TO "relay"$/;
my $grant;
{
	my ($code, $out, $err) = relay_once({%pgenv}, '--sink=stdout', '--listen=');
	my $error = cannot_relay($err);
	is($code, 2, 'a role without the grants: exit 2') or diag($err);
	like($error, qr/^role "relay" may not execute \[[a-z_ ]+\]: $all_three/,
		'... one error naming the role, and the GRANT to run') or diag($err);
	my ($missing) = $error =~ /may not execute \[([a-z_ ]+)\]/;
	is(join(' ', sort split / /, $missing // ''), 'idem_outbox_ack idem_outbox_claim idem_outbox_dead',
		'... naming the three functions it may not execute');
	is($out, '', '... writes no event');
	($grant) = $error =~ /: (GRANT EXECUTE ON FUNCTION .*)$/;

	# One grant of three: the two missing are named.
	IdemSqlOnly::safe_as($node, 'shop_owner', 'shop',
		'GRANT EXECUTE ON FUNCTION idem_outbox_claim(text, integer, interval, text[]) TO relay');
	($code, $out, $err) = relay_once({%pgenv}, '--sink=stdout', '--listen=');
	$error = cannot_relay($err);
	($missing) = $error =~ /may not execute \[([a-z_ ]+)\]/;
	ok($code == 2 && join(' ', sort split / /, $missing // '') eq 'idem_outbox_ack idem_outbox_dead'
		  && $error =~ $all_three,
		'EXECUTE on idem_outbox_claim only: exit 2, idem_outbox_ack and idem_outbox_dead named') or diag($err);
	IdemSqlOnly::safe_as($node, 'shop_owner', 'shop',
		'REVOKE EXECUTE ON FUNCTION idem_outbox_claim(text, integer, interval, text[]) FROM relay');

	# A database without the edition.
	($code, $out, $err) = relay_once({ %pgenv, PGDATABASE => 'postgres' }, '--sink=stdout', '--listen=');
	like(cannot_relay($err), qr/^checking the relay functions: .*does not exist: is idempotency installed in this database \(the extension, or the SQL-only edition's script\)/,
		'a database without the edition: one error asking whether it is installed');
	is($code, 2, '... and exit 2');

	is($node->safe_psql('shop', q{SELECT count(*) || ' ' || max(attempt) FROM idempotency.outbox WHERE state = 'p'}),
		'1000 0', 'the refused starts claimed nothing');
}
{
	# The GRANT the relay printed, run by the owner of the functions.
	my ($ret, $out, $err) = IdemSqlOnly::psql_as($node, 'shop_owner', 'shop', $grant // 'SELECT 1/0');
	is($ret, 0, 'the GRANT the relay printed runs as it is (the owner, no superuser)') or diag($err);
	# With it, relay may execute exactly these three of the edition's functions beyond
	# what every role may (bystander: a role with no grant), and belongs to no role.
	is($node->safe_psql('shop', q{
	  SELECT string_agg(p.oid::regprocedure::text, ' ' ORDER BY p.oid::regprocedure::text)
	  FROM pg_proc p
	  WHERE p.pronamespace IN ('public'::regnamespace, 'idempotency'::regnamespace)
	    AND has_function_privilege('relay', p.oid, 'EXECUTE')
	    AND NOT has_function_privilege('bystander', p.oid, 'EXECUTE')}),
		'idem_outbox_ack(text,idem_key[]) idem_outbox_claim(text,integer,interval,text[]) idem_outbox_dead(text,idem_key[],text)',
		'relay may execute the three relay functions, nothing else of the edition that other roles may not');
	is($node->safe_psql('shop', q{SELECT count(*) FROM pg_auth_members WHERE member = 'relay'::regrole}), '0',
		'relay is a member of no role');
}

# --- stdout ----------------------------------------------------------------------------
{
	my $out = "$tmp/stdout.jsonl";
	my $r = start_relay('s1', $out, '--sink=stdout', '--batch-size=64');
	ok(wait_until(60, sub { undelivered() == 0 }), 'stdout: all delivered, with those three grants only');
	is(stop_process($r, 'TERM', 20), 0, 'stdout: SIGTERM exits 0');
	my (%seen, %last, %per);
	my ($dups, $disorder, $carried) = (0, 0, 0);
	for my $line (split /\n/, slurp_file($out)) {
		my $e = decode_json($line);
		$dups++ if $seen{ $e->{id} }++;
		$disorder++ if $e->{seq} != ($last{ $e->{aggregate} } // 0) + 1;
		$last{ $e->{aggregate} } = $e->{seq};
		$per{ $e->{aggregate} }++;
		$carried++ unless $e->{topic} eq 'stdout.t' && $e->{attempt} == 1
		  && $e->{headers}{h} eq 'v' && $e->{headers}{nested}{x} == $e->{payload}{n}
		  && $e->{aggregate} eq 'a' . ($e->{payload}{n} % 20) && $e->{emitted_at} =~ /^\d{4}-\d\d-\d\dT/;
	}
	is(scalar(keys %seen), 1000, 'stdout: 1000 events written');
	is($dups, 0, 'stdout: none twice');
	is(join(',', scalar(keys %per), (sort { $a <=> $b } values %per)[0], (sort { $a <=> $b } values %per)[-1]),
		'20,50,50', 'stdout: 20 aggregates of 50 events');
	is($disorder, 0, 'stdout: each aggregate in seq order (1, 2, 3, ...)');
	is($carried, 0, 'stdout: topic, attempt 1, headers, payload, aggregate and emission time carried');
	like(slurp_file($r->{log}), qr/idem_stats not readable by this role/,
		'stdout: the relay may not read idem_stats (no grant beyond the three)');
	is($node->safe_psql('shop', q{SELECT count(*) FROM idempotency.outbox WHERE state = 'd' AND relay = 's1'}),
		'1000', 'stdout: all 1000 acked by s1');
}

# --- the receiving service ---------------------------------------------------------------
my $b_port = free_port();
my $secret = 's3cret-' . int(rand(1e9));
my $consumer = spawn('consumer', {
		DATABASE_URL => 'host=' . $node->host . ' port=' . $node->port . ' dbname=service_b user=svc',
		PORT => $b_port, SECRET => $secret, DELAY_MS => 2 }, undef,
	$python, "$repo/test/relay/consumer.py");
wait_until(20, sub { IO::Socket::INET->new(PeerAddr => "127.0.0.1:$b_port") })
  or die 'the consumer did not listen';
my @http = ('--sink=http', "--http-url=http://127.0.0.1:$b_port/events/{topic}",
	'--http-timeout=2s', "--http-hmac-secret=$secret", '--lease=5s');

sub b { return $node->safe_psql('service_b', $_[0]); }

# --- http: two relays, one killed, PostgreSQL stopped ----------------------------------------
{
	emit('orders', $events, $aggregates);
	# Batches of 10 events (10 aggregates' heads): the other relay finds the other
	# aggregates free. (With batches spanning every aggregate, the second would find
	# each one's next event behind the first's lease, and stay idle.)
	my @main = (@http, '--batch-size=10');
	my %relays = map { $_ => start_relay($_, undef, @main) } qw(r1 r2);
	my $applied = sub { b("SELECT count(*) FROM applied WHERE topic = 'orders'") };
	my @steps = (
		sub {
			kill 'KILL', $relays{r1}{pid};
			waitpid($relays{r1}{pid}, 0);
			$relays{r1}{status} = $?;
			$relays{r1} = start_relay('r1', undef, @main);
		},
		sub { $node->stop('immediate'); sleep 1; $node->start });
	# Each disruption once another third of the events is applied.
	my ($step, @at) = (0);
	for my $s (@steps) {
		$step++;
		my $goal = int($events * $step / (@steps + 1));
		wait_until(60, sub { (eval { $applied->() } // 0) >= $goal })
		  or diag("step $step: only " . (eval { $applied->() } // '?') . " of $goal applied");
		push @at, $applied->();
		$s->();
	}
	ok((grep { $_ < $events } @at) == @steps, "http: the disruptions came mid-run (at @at of $events applied)");
	ok(wait_until(90, sub { (eval { undelivered() } // 1) == 0 }), 'http: the outbox empties')
	  or diag('undelivered: ' . undelivered());
	is($applied->(), $events,
		"http: $events events applied through 2 relays, one killed with SIGKILL, PostgreSQL stopped -m immediate");
	is(b(q{SELECT count(DISTINCT event_id) FROM applied WHERE topic = 'orders'}), $events, 'http: no event applied twice');
	is(b(q{SELECT count(*) FROM idempotency.keys WHERE scope = 'relay-test' AND role = 'svc'::regrole}), $events,
		'http: one idem_once key per event, svc\'s');
	is($node->safe_psql('shop', 'SELECT count(*) FROM idem_outbox_dead_letters()'), '0', 'http: nothing dead');
	is($node->safe_psql('shop', q{SELECT count(*) FROM idempotency.outbox WHERE topic = 'orders' AND state <> 'd'}), '0',
		'http: every event acked');
	# First application of each aggregate's events: seq 1, 2, 3, ... in that order.
	is(b(q{SELECT count(*) FROM (SELECT seq, row_number() OVER (PARTITION BY aggregate ORDER BY n) AS rn
	        FROM applied WHERE topic = 'orders') x WHERE seq <> rn}), '0',
		'http: each aggregate first applied strictly in seq order');
	is(b(q{SELECT count(*) FROM arrivals WHERE topic = 'orders' AND status IN (400, 401)}), '0',
		'http: every request carried Idempotency-Key: "<event id>" and a valid HMAC signature');
	my $arrivals = b(q{SELECT count(*) FROM arrivals WHERE topic = 'orders'});
	cmp_ok($arrivals, '>=', $events, 'http: (arrivals counted, repeats allowed)');
	note('http: ' . ($arrivals - $events) . ' repeated or refused arrivals, attempts up to '
		  . b(q{SELECT max(attempt) FROM arrivals WHERE topic = 'orders'}) . '; '
		  . $node->safe_psql('shop', q{SELECT string_agg(relay || ':' || n, ' ' ORDER BY relay)
		      FROM (SELECT relay, count(*) n FROM idempotency.outbox WHERE topic = 'orders' GROUP BY relay) x})
		  . ' acked');
	is($node->safe_psql('shop', q{SELECT count(DISTINCT relay) FROM idempotency.outbox WHERE topic = 'orders'}),
		'2', 'http: both relays delivered');
	for (qw(r1 r2)) { is(stop_process($relays{$_}, 'TERM', 20), 0, "http: $_ exits 0 on SIGTERM") }
}

# --- a dead letter ----------------------------------------------------------------------
{
	emit('poison', 1, 1, 'p');
	emit('after', 2, 1, 'q');
	my $r = start_relay('d1', undef, @http);
	ok(wait_until(30, sub { undelivered() == 0 }), 'dead letter: the outbox empties');
	is(IdemSqlOnly::safe_as($node, 'shop_owner', 'shop',
			q{SELECT topic || ' ' || aggregate || ' ' || seq || ' ' || attempt || ' ' || payload::text || ' | ' || reason
			  FROM idem_outbox_dead_letters()}),
		"poison p0 1 1 {\"n\": 1} | HTTP 422 Unprocessable Entity from http://127.0.0.1:$b_port/events/poison: refused",
		'a 422: the event is in idem_outbox_dead_letters() at its first attempt, the answer as reason');
	is(b(q{SELECT string_agg(status::text, ',') FROM arrivals WHERE topic = 'poison'}), '422',
		'dead letter: sent once, refused once, not retried');
	is(b(q{SELECT count(*) FROM applied WHERE topic IN ('poison', 'after')}), '2',
		'dead letter: not applied; the other topic\'s events applied');
	is($node->safe_psql('shop', 'SELECT outbox_dead || \' \' || outbox_undelivered FROM idem_stats()'), '1 0',
		'idem_stats: 1 dead, 0 undelivered');
	like(IdemSqlOnly::error_as($node, 'relay', 'shop', 'SELECT count(*) FROM idem_outbox_dead_letters()'),
		qr/^42501: permission denied for function idem_outbox_dead_letters/,
		'the relay\'s role may not read the dead letters (not granted)');
	is(stop_process($r, 'TERM', 20), 0, 'dead letter: the relay exits 0 on SIGTERM');
}

$node->stop;
done_testing();
