# The messaging example (examples/messaging) end to end, with a real broker and the relay
# program: payments with their events committed together (producer.sql) under
# concurrent load, some rolled back and many retried; three copies of idem-relay
# (relay/, built here from Debian's Go packages, --sink=amqp) moving the outbox to a
# private RabbitMQ node; a consumer (consumer.py, consumer.sql) applying the events to a
# second database. On the way a relay is killed (SIGKILL) mid-batch, after it published
# part of its batch and before its ack (it reaches the broker through a proxy that holds
# each of the broker's answers back, so that it publishes one event per 0.2 s), every
# broker connection is cut, the relays' and the consumer's sessions are terminated, the
# broker is restarted, and an event no queue is bound for ends in the dead letters until
# the consumer binds its topic and the event is retried. Then, exactly: every committed
# payment's event applied once, none of a rolled-back one, each account's events applied
# in seq order, the balances those payments add up to, and nothing left in the outbox.
# Which relay published what is read from the server log: the events each relay acked
# (idem-relay logs no line per event). Last, the illustration examples/messaging/relay.py
# runs once over the outbox: it prints the events of its topic, in seq order, acks them,
# and moves an event of another topic to the dead letters.
#
# The broker runs as the current OS user from /usr/lib/rabbitmq (Debian's
# rabbitmq-server), on 127.0.0.1, with its own node name, ports, Erlang port mapper
# and files, so a system RabbitMQ (if the package started one) is never touched.
use strict;
use warnings;
use Cwd qw(abs_path);
use IO::Socket::INET;
use IPC::Run;
use Time::HiRes qw(time sleep);
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::RealBin/lib";
use IdemCheck;
use IdemProcesses;

my $rabbit_bin = '/usr/lib/rabbitmq/bin';
die "$rabbit_bin/rabbitmq-server is missing: install the Debian package rabbitmq-server "
  . '(scripts/lib.sh lists it)'
  unless -x "$rabbit_bin/rabbitmq-server";
die '/usr/bin/python3 cannot import pika and psycopg: install python3-pika and python3-psycopg'
  unless system('/usr/bin/python3', '-c', 'import pika, psycopg') == 0;

my $repo = abs_path('.');
my $tmp = PostgreSQL::Test::Utils::tempdir();
my $load_seconds = 20;
my $keys = 2000;
my $accounts = 7;

my $node = PostgreSQL::Test::Cluster->new('messaging');
$node->init;
# The worker removes delivered events (outbox_retention 0) while the relays run.
$node->append_conf('postgresql.conf', q{
shared_preload_libraries = 'idempotency'
idempotency.reaper_naptime = '1s'
});
$node->start;
$node->safe_psql('postgres', 'CREATE DATABASE shop');
$node->safe_psql('postgres', 'CREATE DATABASE ledger');
$node->safe_psql('shop', 'CREATE EXTENSION idempotency');
$node->safe_psql('ledger', 'CREATE EXTENSION idempotency');
$node->safe_psql('shop', slurp_file('examples/messaging/producer.sql'));
$node->safe_psql('ledger', slurp_file('examples/messaging/consumer.sql'));
# The relays' role, with the grants producer.sql's header shows, and nothing else. Its
# statements are logged with their parameters: the acks name the events each relay
# published.
$node->safe_psql('shop', q{
  CREATE ROLE relay LOGIN;
  CREATE ROLE bystander LOGIN;
  GRANT EXECUTE ON FUNCTION idem_outbox_claim(text, integer, interval, text[]),
      idem_outbox_ack(text, idem_key[]), idem_outbox_dead(text, idem_key[], text) TO relay;
  ALTER ROLE relay SET log_statement = 'all';
  ALTER ROLE relay SET log_parameter_max_length = -1;});

my $connstr = 'host=' . $node->host . ' port=' . $node->port;
my $log_path = $PostgreSQL::Test::Utils::log_path;

# The lines of a process's log that match $re (in scalar context, how many).
sub log_lines {
	my ($process, $re) = @_;
	my @lines = -e $process->{log} ? grep { /$re/ } split /\n/, slurp_file($process->{log}) : ();
	return @lines;
}

# How often a relay or the consumer connected to the broker: idem-relay logs "sink up"
# (once per change of state), the consumer "connected to the broker".
sub broker_connections {
	my ($process) = @_;
	return scalar(log_lines($process, qr/"msg":"sink up"|connected to the broker/));
}

# The events a relay acked, by the relay's process name (each relay's sessions carry it
# as application_name), from the server log: an ack's statement, then its parameters
# ($2, the event ids). A relay acks only what the broker confirmed, so these are the
# events it published. The log is read on from where the last call stopped.
my (%acked, %statement_of_pid);
my $server_log_read = 0;
sub acked_by {
	my ($name) = @_;
	open(my $fh, '<', $node->logfile) or die "cannot open the server log: $!";
	seek($fh, $server_log_read, 0);
	while (my $line = <$fh>) {
		last unless $line =~ /\n\z/;    # a line still being written: read it next time
		$server_log_read += length $line;
		my ($pid, $app, $kind, $text) = $line =~ /\[(\d+)\] (\S*) ?(LOG|DETAIL):  (.*)$/ or next;
		if ($kind eq 'LOG') {
			$statement_of_pid{$pid} = $text;
		}
		elsif (($statement_of_pid{$pid} // '') =~ /^execute \S+: SELECT idem_outbox_ack\(/
			&& $text =~ /^[Pp]arameters: \$1 = '[^']*', \$2 = '\{([^}]*)\}'/) {    # "Parameters:" from PostgreSQL 16 on
			$acked{$app}{$_} = 1 for map { s/"//gr } split /,/, $1;
		}
	}
	close $fh;
	return keys %{ $acked{$name} // {} };
}

# --- The relay program ----------------------------------------------------------
my $relay_bin = "$tmp/idem-relay";
{
	my ($out, $err) = ('', '');
	my $ok = IPC::Run::run(
		[ 'make', '-s', '-C', "$repo/relay", "OUT=$relay_bin" ],
		'>', \$out, '2>', \$err);
	ok($ok && -x $relay_bin, 'idem-relay builds from relay/ with Debian\'s Go packages')
	  or BAIL_OUT("the relay did not build: $out$err");
}

# --- The broker ---------------------------------------------------------------
my $rabbit_dir = PostgreSQL::Test::Utils::tempdir();
my ($amqp_port, $dist_port, $epmd_port) =
  map { PostgreSQL::Test::Cluster::get_free_port() } 1 .. 3;
my $rabbit_node = 'idem@localhost';
mkdir "$rabbit_dir/home" or die "mkdir: $!";
mkdir "$rabbit_dir/mnesia" or die "mkdir: $!";
# The Erlang cookie the node and rabbitmqctl share.
PostgreSQL::Test::Utils::append_to_file("$rabbit_dir/home/.erlang.cookie",
	join('', map { ('A' .. 'Z')[ int(rand(26)) ] } 1 .. 20));
chmod 0400, "$rabbit_dir/home/.erlang.cookie";
# No disk or memory alarm: a nearly full disk must not block the publishers.
PostgreSQL::Test::Utils::append_to_file("$rabbit_dir/rabbitmq.conf",
	"disk_free_limit.absolute = 1MB\nvm_memory_high_watermark.relative = 0.9\n");
my %rabbit_env = (
	HOME => "$rabbit_dir/home",
	ERL_EPMD_PORT => $epmd_port,
	ERL_EPMD_ADDRESS => '127.0.0.1',
	RABBITMQ_NODENAME => $rabbit_node,
	RABBITMQ_NODE_IP_ADDRESS => '127.0.0.1',
	RABBITMQ_NODE_PORT => $amqp_port,
	RABBITMQ_DIST_PORT => $dist_port,
	RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS => '-kernel inet_dist_use_interface {127,0,0,1}',
	RABBITMQ_CTL_ERL_ARGS => '-kernel inet_dist_use_interface {127,0,0,1}',
	RABBITMQ_MNESIA_BASE => "$rabbit_dir/mnesia",
	RABBITMQ_LOG_BASE => "$log_path/rabbitmq",
	RABBITMQ_CONFIG_FILE => "$rabbit_dir/rabbitmq.conf",
	RABBITMQ_ADVANCED_CONFIG_FILE => "$rabbit_dir/advanced.config",
	RABBITMQ_CONF_ENV_FILE => "$rabbit_dir/rabbitmq-env.conf",
	RABBITMQ_ENABLED_PLUGINS_FILE => "$rabbit_dir/enabled_plugins",
	RABBITMQ_PLUGINS_EXPAND_DIR => "$rabbit_dir/plugins",
	RABBITMQ_PID_FILE => "$rabbit_dir/rabbitmq.pid");
# The port mapper in the foreground, so that it ends with the test.
my $epmd = spawn('epmd', \%rabbit_env, undef, '/usr/bin/epmd', '-port', $epmd_port);
my $rabbit;
my $rabbit_starts = 0;

sub start_rabbit {
	$rabbit_starts++;
	$rabbit = spawn("rabbitmq-$rabbit_starts", \%rabbit_env, undef, "$rabbit_bin/rabbitmq-server");
	wait_until(90,
		sub {
			die "rabbitmq-server exited with status $rabbit->{status}" unless running($rabbit);
			return IO::Socket::INET->new(PeerAddr => "127.0.0.1:$amqp_port");
		}) or die 'RabbitMQ did not accept connections within 90 s';
}

# rabbitmq-server's script stops the node cleanly on SIGTERM and exits with it.
sub stop_rabbit {
	return stop_process($rabbit, 'TERM', 60);
}

sub rabbitmqctl {
	my @args = @_;
	my ($out, $err) = ('', '');
	local @ENV{ keys %rabbit_env } = values %rabbit_env;
	IPC::Run::run([ "$rabbit_bin/rabbitmqctl", '-n', $rabbit_node, @args ],
		'<', \undef, '>', \$out, '2>', \$err, IPC::Run::timeout(60))
	  or die "rabbitmqctl @args failed:\n$out$err";
	return $out;
}

my $started = time;
start_rabbit();
note(sprintf('RabbitMQ accepted connections after %.1f s', time - $started));
like(rabbitmqctl('status'), qr/RabbitMQ version/, 'the private RabbitMQ node runs');

# --- The consumer, the load, the relays ---------------------------------------
my $amqp_url = "amqp://guest:guest\@127.0.0.1:$amqp_port/%2F";

# A slow link to the broker for the relay that is killed mid-batch: a proxy that passes
# what the client sends at once and holds each of the broker's answers back for 0.2 s.
# A relay publishing one event at a time, each after the previous one's confirm, then
# publishes one event per 0.2 s.
my $proxy_port = PostgreSQL::Test::Cluster::get_free_port();
my $proxy = spawn('slow-link', {}, undef, $^X, '-e', q{
	use IO::Socket::INET;
	use IO::Select;
	use Time::HiRes qw(sleep);
	my ($port, $broker_port, $delay) = @ARGV;
	my $listener = IO::Socket::INET->new(LocalAddr => "127.0.0.1:$port", Listen => 8, ReuseAddr => 1)
	  or die "listen: $!";
	$SIG{CHLD} = 'IGNORE';
	while (1) {
		my $client = $listener->accept or next;
		if (fork) { close $client; next; }
		my $broker = IO::Socket::INET->new(PeerAddr => "127.0.0.1:$broker_port") or exit 1;
		my $select = IO::Select->new($client, $broker);
		while (1) {
			for my $from ($select->can_read) {
				sysread($from, my $bytes, 65536) or exit 0;
				if ($from == $broker) { sleep $delay; syswrite($client, $bytes) or exit 0; }
				else { syswrite($broker, $bytes) or exit 0; }
			}
		}
	}
}, $proxy_port, $amqp_port, 0.2);
wait_until(10, sub { IO::Socket::INET->new(PeerAddr => "127.0.0.1:$proxy_port") })
  or die 'the proxy did not listen';
my $consumer_starts = 0;

sub start_consumer {
	my ($topics) = @_;
	$consumer_starts++;
	my $consumer = spawn(
		"consumer-$consumer_starts",
		{ DATABASE_URL => "$connstr dbname=ledger", AMQP_URL => $amqp_url, TOPICS => $topics },
		undef, '/usr/bin/python3', 'examples/messaging/consumer.py');
	wait_until(30,
		sub { running($consumer) && log_lines($consumer, qr/connected to the broker/) })
	  or die "the consumer did not start";
	return $consumer;
}

# A copy of idem-relay to the broker: its sessions carry its process name $name as
# application_name; --name (the relay's name in idem_outbox_claim) is $name unless
# told. A lease of 3 s, so that what a killed relay held comes back soon.
sub start_relay {
	my ($name, %settings) = @_;
	return spawn(
		$name,
		{ PGHOST => $node->host, PGPORT => $node->port, PGDATABASE => 'shop', PGUSER => 'relay',
		  PGSSLMODE => 'disable', PGAPPNAME => $name },
		undef, $relay_bin, '--sink=amqp', '--name=' . ($settings{relay_name} // $name),
		'--amqp-url=amqp://guest:guest@127.0.0.1:' . ($settings{amqp_port} // $amqp_port) . '/',
		'--amqp-timeout=1s', '--lease=' . ($settings{lease} // '3s'),
		'--batch-size=' . ($settings{batch} // 50), '--concurrency=' . ($settings{concurrency} // 16),
		'--idle=100ms', '--max-backoff=1s', '--listen=');
}

sub undelivered {
	return $node->safe_psql('shop', 'SELECT outbox_undelivered FROM idem_stats()');
}

# One more payment, under a key of its own, at most every 0.25 s: events for every relay
# to publish while the test waits for it to reconnect (an idle idem-relay finds that
# its broker connection broke when it next publishes).
my ($nudges, $last_nudge) = (0, 0);
sub nudge {
	return if time - $last_nudge < 0.25;
	$last_nudge = time;
	$nudges++;
	$node->safe_psql('shop',
		"BEGIN; CALL create_payment('nudge-$nudges', " . ($nudges % $accounts + 1) . ', 1.00); COMMIT;');
}

my $consumer = start_consumer('payment.created');

# Payments on $accounts accounts from six clients: keys repeat (a retry of a finished
# key replays it and emits nothing), and one in ten transactions rolls back after the
# payment and its event were written.
my $script = "$PostgreSQL::Test::Utils::tmp_check/messaging_load.sql";
PostgreSQL::Test::Utils::append_to_file($script, qq{
\\set k random(1, $keys)
\\set fail random(1, 10)
BEGIN;
CALL create_payment(('pay-' || :k)::idem_key, :k % $accounts + 1, :k / 100.0);
\\if :fail = 1
ROLLBACK;
\\else
COMMIT;
\\endif
});
my ($load_out, $load_err) = ('', '');
my $load = IPC::Run::start(
	[ 'pgbench', '--no-vacuum', '--client=6', '--jobs=2', '--rate=150',
	  "--time=$load_seconds", '-f', $script, '-h', $node->host, '-p', $node->port, 'shop' ],
	'>', \$load_out, '2>', \$load_err, IPC::Run::timeout($load_seconds + 60));

# A slow relay (through the slow link, one event at a time), started alone once events
# wait, so that it takes a full batch (leased for 6 s, which it would need 4 s to
# publish); killed once the consumer applied three of them, before it acked. No other
# relay runs yet: what the consumer applied, relay-1 published.
wait_until(30, sub { undelivered() >= 40 }) or die 'the load emitted no events';
my $slow = start_relay('relay-1', amqp_port => $proxy_port, batch => 20, concurrency => 1, lease => '6s');
wait_until(30, sub { $node->safe_psql('ledger', 'SELECT count(*) FROM applied_events') >= 3 })
  or die 'the slow relay published nothing';
kill 'KILL', $slow->{pid};
waitpid($slow->{pid}, 0);
$slow->{status} = $?;
stop_process($proxy, 'TERM', 10, 1);
# What relay-1 published before SIGKILL: the consumer's queue emptied, what it applied.
wait_until(30, sub { rabbitmqctl('list_queues', 'name', 'messages') =~ /^ledger\s+0\s*$/m })
  or die 'the consumer did not empty its queue';
my @published_unacked =
  split /\n/, $node->safe_psql('ledger', 'SELECT event_id FROM applied_events ORDER BY id');
my %leased_to_relay_1 = map { $_ => 1 } split /\n/, $node->safe_psql('shop',
	"SELECT event_id FROM idempotency.outbox WHERE relay = 'relay-1' AND state = 'p'");
ok( keys %leased_to_relay_1 == 20
	  && @published_unacked >= 3
	  && @published_unacked < 20
	  && !grep({ !$leased_to_relay_1{$_} } @published_unacked)
	  && !acked_by('relay-1'),
	'relay-1 was killed in the middle of a batch of 20, after publishing part of it, before its ack')
  or diag('leased to relay-1: ' . scalar(keys %leased_to_relay_1)
	  . ', published: ' . scalar(@published_unacked) . ', acked: ' . scalar(acked_by('relay-1')));
note('relay-1 published ' . scalar(@published_unacked) . ' events before SIGKILL');

my @relays = map { start_relay("relay-$_") } 2, 3;

# An event no queue is bound for: the broker returns it (it is published mandatory),
# so the relay moves it to the dead letters.
my $poison = $node->safe_psql('shop', q{
  SELECT idem_emit('payment.disputed',
                   jsonb_build_object('payment_id', id, 'account', account, 'reason', 'chargeback'),
                   aggregate => account::text, event_id => idem_derive(key::idem_key, 'payment.disputed'))
  FROM payments ORDER BY id LIMIT 1});
my $poison_account = $node->safe_psql('shop', 'SELECT account FROM payments ORDER BY id LIMIT 1');

# relay-1 again, under the same name, at full speed: three relays at once.
push @relays, start_relay('relay-1-restarted', relay_name => 'relay-1');

# Every connection to the broker cut at once; relays and consumer reconnect (each
# connects once more than it had).
wait_until(30, sub { !grep { !broker_connections($_) } @relays, $consumer })
  or die 'not every relay connected to the broker';
my %connections = map { $_->{name} => broker_connections($_) } @relays, $consumer;
rabbitmqctl('close_all_connections', 'cut by the test');
ok( wait_until(30,
		sub {
			nudge();
			!grep { broker_connections($_) <= $connections{ $_->{name} } } @relays, $consumer;
		}),
	'after close_all_connections every relay and the consumer reconnected');

# Their PostgreSQL sessions terminated; they reconnect too: the relays (each with a pool
# of sessions, which takes a new one in place of a broken one) open a session under
# their name again, the consumer logs its reconnection.
my %terminated_pid;
my %terminated_name;
for (split /\n/, $node->safe_psql('shop', q{
		SELECT pid || ' ' || CASE WHEN usename = 'relay' THEN application_name ELSE datname END
		       || ' ' || pg_terminate_backend(pid)
		FROM pg_stat_activity
		WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()
		  AND (usename = 'relay' OR datname = 'ledger')})) {
	my ($pid, $name, $done) = split / /;
	next unless $done eq 'true';
	$terminated_pid{$pid} = 1;
	$terminated_name{$name} = 1;
}
is( join(' ', grep { !$terminated_name{$_} } map { $_->{name} } @relays), '',
	'the sessions of every relay terminated');
ok($terminated_name{ledger}, "and the consumer's");
sub new_relay_sessions {
	my %named;
	for (split /\n/, $node->safe_psql('shop', q{
			SELECT pid || ' ' || application_name FROM pg_stat_activity WHERE usename = 'relay'})) {
		my ($pid, $name) = split / /;
		$named{$name} = 1 unless $terminated_pid{$pid};
	}
	return grep { $named{ $_->{name} } } @relays;
}
ok(wait_until(30, sub { new_relay_sessions() == @relays }),
	'every relay reconnected to PostgreSQL');
ok(wait_until(30, sub { log_lines($consumer, qr/connected to PostgreSQL/) >= 2 }),
	'the consumer reconnected to PostgreSQL');

# The broker restarted while the load goes on.
is(stop_rabbit(), 0, 'RabbitMQ stopped cleanly');
%connections = map { $_->{name} => broker_connections($_) } @relays, $consumer;
start_rabbit();
ok( wait_until(30,
		sub {
			nudge();
			!grep { broker_connections($_) <= $connections{ $_->{name} } } @relays, $consumer;
		}),
	'after a broker restart every relay and the consumer reconnected');

# The dead letter, and the fix: the consumer is restarted binding the topic too; then
# the event is put back.
ok( wait_until(30,
		sub {
			$node->safe_psql('shop',
				"SELECT count(*) FROM idem_outbox_dead_letters() WHERE event_id = '$poison'") == 1;
		}),
	'the event no queue is bound for is in the dead letters');
like(
	$node->safe_psql('shop',
		"SELECT topic || ' ' || aggregate || ' ' || seq || ' ' || reason
		 FROM idem_outbox_dead_letters('payment.disputed') WHERE event_id = '$poison'"),
	qr/^payment\.disputed $poison_account 1 unroutable: .*NO_ROUTE.* for routing key "payment\.disputed"$/,
	'with its topic, aggregate, seq and the reason the relay gave');
is(stop_process($consumer, 'TERM', 30), 0, 'the consumer stopped cleanly on SIGTERM');
$consumer = start_consumer('payment.created,payment.disputed');
ok(log_lines($consumer, qr/bound ledger to idem\.events for payment\.disputed/),
	'the restarted consumer binds payment.disputed');
is($node->safe_psql('shop', "SELECT idem_outbox_retry(ARRAY['$poison']::idem_key[])"),
	'1', 'idem_outbox_retry puts the dead letter back');
ok( wait_until(30,
		sub {
			$node->safe_psql('ledger',
				"SELECT count(*) FROM applied_events WHERE event_id = '$poison'") == 1;
		}),
	'and it is delivered and applied');

# The load's end, then the outbox drained.
$load->finish;
note($load_out);
ok($load_err eq '' && $load_out =~ /number of failed transactions: 0 /,
	"6 clients paid for ${load_seconds}s, no errors")
  or diag("stderr:\n$load_err");
# The broker's restart can take the relays long enough that the load ends before the
# relay started under relay-1's name gets an event: short bursts of payments, until it
# has published (at most five).
my ($transactions) = $load_out =~ /number of transactions actually processed: (\d+)/;
$transactions //= 0;
my $restarted = $relays[-1];
for (my $burst = 1; $burst <= 5 && !acked_by($restarted->{name}); $burst++) {
	my ($out, $err) = ('', '');
	IPC::Run::run(
		[ 'pgbench', '--no-vacuum', '--client=3', '--jobs=1', '--rate=100', '--time=3', '-f',
		  $script, '-h', $node->host, '-p', $node->port, 'shop' ],
		'>', \$out, '2>', \$err, IPC::Run::timeout(60));
	ok($err eq '' && $out =~ /number of failed transactions: 0 /,
		"a burst of payments after the load ($burst), no errors")
	  or diag("stderr:\n$err");
	$transactions += $out =~ /number of transactions actually processed: (\d+)/ ? $1 : 0;
	wait_until(10, sub { undelivered() == 0 || acked_by($restarted->{name}) });
}
my $payments = $node->safe_psql('shop', 'SELECT count(*) FROM payments');
ok( wait_until(60,
		sub {
			undelivered() == 0
			  && $node->safe_psql('ledger', 'SELECT count(*) FROM applied_events')
			  == $payments + 1;
		}),
	'the outbox drained and the ledger caught up')
  or diag('undelivered: ' . undelivered());
note(sprintf('drained %.0f s after the start of the load', time - $started));

# --- The checks ----------------------------------------------------------------
$transactions += $nudges;
cmp_ok($transactions, '>', $payments * 1.2,
	"keys were retried: $payments payments from $transactions transactions");
my $rolled_back = $node->safe_psql('shop', 'SELECT max(id) - count(*) FROM payments');
cmp_ok($rolled_back, '>', 0, "payments were rolled back ($rolled_back payment ids unused)");

# Every committed payment's event, under the id derived from its key, with its account
# and amount, applied exactly once; nothing else applied (a rolled-back payment's id
# is missing from payments).
is( $node->safe_psql('ledger', q{
		SELECT string_agg(concat_ws(' ', payload->>'payment_id', event_id, account, payload->>'amount'),
		                  E'\n' ORDER BY (payload->>'payment_id')::bigint, id)
		FROM applied_events WHERE topic = 'payment.created'}),
	$node->safe_psql('shop', q{
		SELECT string_agg(concat_ws(' ', id, idem_derive(key::idem_key, 'payment.created'), account, amount),
		                  E'\n' ORDER BY id)
		FROM payments}),
	'every committed payment applied exactly once, nothing else');
is( $node->safe_psql('ledger',
		'SELECT count(*) FROM (SELECT event_id FROM applied_events GROUP BY 1 HAVING count(*) > 1) d'),
	'0', 'no event applied twice');

# Order: each account's events were applied as seq 1, 2, 3, ... in that order, though
# several relays published them, and one account's events went through several relays.
# Relays take what is pending when they ask, so how the events split among the three
# running together is up to timing (one may get none); the relay restarted under
# relay-1's name is given payments until it has published.
my %account_of_event = map { split / / }
  split /\n/, $node->safe_psql('ledger', 'SELECT event_id || \' \' || account FROM applied_events');
my %relays_of_account;
for my $relay ($slow, @relays) {
	$relays_of_account{$_}{ $relay->{name} } = 1
	  for grep { defined } map { $account_of_event{$_} } acked_by($relay->{name});
}
ok(scalar(acked_by($restarted->{name})), "$restarted->{name} published events");
cmp_ok(scalar(grep { acked_by($_->{name}) } @relays),
	'>=', 2, 'at least two of the relays running together published events');
cmp_ok(scalar(grep { keys %{ $relays_of_account{$_} } > 1 } keys %relays_of_account),
	'>', 0, "an account's events were published by more than one relay");
is( $node->safe_psql('ledger', q{
		SELECT count(*) FROM (
		  SELECT seq, row_number() OVER (PARTITION BY topic, account ORDER BY id) AS n
		  FROM applied_events) a
		WHERE seq <> n}),
	'0', "each account's events applied in seq order, with no gap");
is( $node->safe_psql('ledger',
		"SELECT count(DISTINCT account) FROM applied_events WHERE topic = 'payment.created'"),
	$accounts, "over $accounts accounts");
is( $node->safe_psql('ledger',
		"SELECT string_agg(account || ' ' || balance || ' ' || payments, ',' ORDER BY account)
		 FROM accounts WHERE payments > 0"),
	$node->safe_psql('shop',
		"SELECT string_agg(account || ' ' || total || ' ' || n, ',' ORDER BY account::text)
		 FROM (SELECT account, sum(amount) AS total, count(*) AS n FROM payments GROUP BY account) p"),
	'the balances are the sums of the committed payments');
is( $node->safe_psql('ledger',
		"SELECT account || ' ' || disputes FROM accounts WHERE disputes > 0"),
	"$poison_account 1", 'the retried dead letter counted one dispute');

# The relay killed mid-batch: what it published was published again by another
# relay once its lease ran out, and the consumer skipped the second copies.
my %duplicates = map { / duplicate (\S+)/ ? ($1 => 1) : () }
  map { log_lines($_, qr/ duplicate /) } grep { $_->{name} =~ /^consumer/ } processes();
is(scalar(grep { !$duplicates{$_} } @published_unacked), 0,
	'each event relay-1 published before SIGKILL reached the consumer again and was skipped');
is(scalar(map { log_lines($_, qr/ stale /) } grep { $_->{name} =~ /^consumer/ } processes()),
	0, 'no event arrived after a later one of its account');

# Nothing left to relay.
is( $node->safe_psql('shop',
		'SELECT outbox_undelivered || \' \' || outbox_dead FROM idem_stats()'),
	'0 0', 'idem_stats: nothing undelivered, no dead letter');
is($node->safe_psql('shop', "SELECT count(*) FROM idem_outbox_claim('checker', 1000)"),
	'0', 'idem_outbox_claim finds nothing to relay');

# The relay functions are the relay's: not granted to PUBLIC.
my ($ret, $stdout, $stderr) = $node->psql('shop',
	"SET ROLE bystander; SELECT * FROM idem_outbox_claim('bystander')");
like($stderr, qr/permission denied for function idem_outbox_claim/,
	'a role without the grant cannot claim events');

# The processes end cleanly on SIGTERM (idem-relay: exit 0 once the batch in flight is
# acked); no relay panicked or gave up, no consumer logged a Python traceback.
for my $process (@relays, $consumer) {
	is(stop_process($process, 'TERM', 30), 0, "$process->{name} stopped cleanly on SIGTERM");
}
for my $process (grep { $_->{name} =~ /^relay/ } processes()) {
	is(scalar(log_lines($process, qr/^panic|^goroutine |"msg":"cannot relay"/)), 0,
		"$process->{name} did not panic or give up");
}
for my $process (grep { $_->{name} =~ /^consumer/ } processes()) {
	is(scalar(log_lines($process, qr/Traceback/)), 0, "$process->{name} logged no traceback");
}
is(stop_rabbit(), 0, 'RabbitMQ stopped cleanly');

# --- The illustration: examples/messaging/relay.py -----------------------------------
# Its few lines of SQL calls, once over the outbox as the relays' role: two events of
# the topic it "publishes" (prints), in seq order, acked; one of another topic, which it
# has no route for, moved to the dead letters.
my @shown = map {
	$node->safe_psql('shop', "SELECT idem_emit('example.shown', '{\"n\": $_}', 'example')")
} 1, 2;
my $unrouted = $node->safe_psql('shop', "SELECT idem_emit('example.unrouted', '{}', 'example')");
{
	my ($out, $err) = ('', '');
	local $ENV{DATABASE_URL} = "$connstr dbname=shop user=relay";
	local $ENV{TOPICS} = 'example.shown';
	ok( IPC::Run::run([ '/usr/bin/python3', 'examples/messaging/relay.py' ],
			'<', \undef, '>', \$out, '2>', \$err, IPC::Run::timeout(60))
		  && $err eq '',
		'examples/messaging/relay.py runs to its end') or diag("stderr:\n$err");
	is( $out,
		"$shown[0] example.shown example 1 {\"n\": 1}\n$shown[1] example.shown example 2 {\"n\": 2}\n",
		'it prints the events of its topic, in seq order');
}
is( $node->safe_psql('shop',
		'SELECT outbox_undelivered || \' \' || outbox_dead FROM idem_stats()'),
	'0 1', 'it acked them, and moved the other one to the dead letters');
is( $node->safe_psql('shop',
		"SELECT event_id || ' ' || reason FROM idem_outbox_dead_letters('example.unrouted')"),
	"$unrouted unroutable: no route for its topic", 'with its reason');

IdemCheck::amcheck_keys($node, 'shop', 'shop');
IdemCheck::amcheck_keys($node, 'ledger', 'ledger');
note(sprintf('the test took %.0f s', time - $started));

$node->stop;
done_testing();
