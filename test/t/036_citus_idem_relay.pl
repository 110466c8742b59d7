# idem-relay (relay/) on a Citus coordinator: a coordinator and two workers, the
# outbox distributed with `payments` (examples/create_payment_citus.sql, 4 shards);
# events of 40 aggregates (accounts, so over every shard) emitted in two waves; two
# relay copies (--sink=stdout) against the coordinator, one killed with SIGKILL in the
# middle of a batch (blocked writing into a full pipe, before its ack) and restarted:
# every event delivered, each aggregate's events in seq order in each relay's output,
# a repeat only of an event handed out again (attempt > 1), nothing left to hand out,
# nothing dead.
#
# Needs Citus installed in the PostgreSQL under test, like 017_citus.pl (IDEM_CITUS).
use strict;
use warnings;
use Cwd qw(abs_path);
use POSIX qw(WNOHANG);
use Time::HiRes qw(time sleep);
use JSON::PP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::RealBin/lib";
use IdemCitus;

IdemCitus::require_citus();

my $repo = abs_path("$FindBin::RealBin/../..");
my $accounts = 40;
my $per_wave = 20;    # events per account and wave

my ($coordinator, $worker1, $worker2) = IdemCitus::start_cluster();
my @nodes = ($coordinator, $worker1, $worker2);
$coordinator->safe_psql('postgres', 'CREATE ROLE relay LOGIN');
$_->safe_psql('postgres', q{
	GRANT EXECUTE ON FUNCTION idem_outbox_claim, idem_outbox_ack, idem_outbox_dead TO relay;}) for @nodes;
$coordinator->safe_psql('postgres', 'SET citus.shard_count = 4;'
	  . slurp_file("$repo/examples/create_payment_citus.sql"));
sub query { return $coordinator->safe_psql('postgres', $_[0]) }

my $tmp = PostgreSQL::Test::Utils::tempdir();
my $log_path = $PostgreSQL::Test::Utils::log_path;
my $relay_bin = "$tmp/idem-relay";
{
	my ($out, $err);
	my $ok = IPC::Run::run([ 'make', '-s', '-C', "$repo/relay", "OUT=$relay_bin" ],
		'>', \$out, '2>', \$err);
	ok($ok && -x $relay_bin, 'idem-relay builds') or BAIL_OUT("the relay did not build: $out$err");
}

my @processes;
sub start_relay {
	my ($name, $out) = @_;
	my $pid = fork() // die "fork: $!";
	if ($pid == 0) {
		POSIX::setsid();
		open(STDIN, '<', '/dev/null') && open(STDOUT, '>>', $out)
		  && open(STDERR, '>>', "$log_path/relay-$name.log") or POSIX::_exit(126);
		@ENV{qw(PGHOST PGPORT PGDATABASE PGUSER PGSSLMODE)} =
		  ($coordinator->host, $coordinator->port, 'postgres', 'relay', 'disable');
		exec($relay_bin, "--name=$name", '--sink=stdout', '--listen=', '--idle=100ms',
			'--max-backoff=1s', '--batch-size=25', '--concurrency=8', '--lease=4s')
		  or POSIX::_exit(127);
	}
	push @processes, $pid;
	return $pid;
}
END { local $?; for my $pid (@processes) { kill 'KILL', $pid; waitpid($pid, 0); } }

sub emit_wave {
	my ($wave) = @_;
	my $sql = '';
	for my $a (1 .. $accounts) {
		$sql .= qq{SELECT count(idem_emit('citus.relay', jsonb_build_object('wave', $wave, 'n', g), 'account-$a', route => $a))
		           FROM generate_series(1, $per_wave) g;\n};
	}
	query($sql);
}

sub lines_of {
	my ($file) = @_;
	return () unless -e $file;
	# A relay killed while writing may leave its last line cut short.
	return grep { defined } map { eval { decode_json($_) } } grep { /\S/ } split /\n/, slurp_file($file);
}

my $total = 2 * $accounts * $per_wave;
my ($out1, $out2, $out3) = ("$tmp/relay-1.jsonl", "$tmp/relay-2.jsonl", "$tmp/relay-1b.jsonl");
# relay-1 first, alone, writing into a pipe nobody reads: it prints until the pipe is
# full and then blocks in the middle of a batch, before its ack. Killed there, it leaves
# events printed but not acked, which must be handed out again (attempt 2).
emit_wave(1);
my $fifo = "$tmp/relay-1.fifo";
POSIX::mkfifo($fifo, 0600) or die "mkfifo: $!";
sysopen(my $pipe, $fifo, POSIX::O_RDONLY | POSIX::O_NONBLOCK) or die "open $fifo: $!";
my $r1 = start_relay('relay-1', $fifo);
sleep 2;
my $r2 = start_relay('relay-2', $out2);
kill 'KILL', $r1;
waitpid($r1, 0);
{
	my ($data, $chunk) = ('', '');
	while (1) {
		my $n = sysread($pipe, $chunk, 65536);
		last unless $n;    # 0: EOF (the writer is gone), undef: nothing more
		$data .= $chunk;
	}
	append_to_file($out1, $data);
	cmp_ok(length($data), '>', 0, 'relay-1 printed events into the pipe before it was killed');
}
emit_wave(2);
$r1 = start_relay('relay-1', $out3);    # its own output, to check its order alone

my %seen;
my $deadline = time + 90;
while (time < $deadline) {
	%seen = map { $_->{id} => 1 } lines_of($out1), lines_of($out2), lines_of($out3);
	last if keys %seen >= $total;
	sleep 0.2;
}
is(scalar(keys %seen), $total, "every event delivered ($total over $accounts aggregates, 4 shards)");
for my $pid ($r1, $r2) { kill 'TERM', $pid; waitpid($pid, 0); }
is(query(q{SELECT count(*) FROM idem_outbox_claim('probe', 1000)}), 0, 'nothing left to hand out');
is(query(q{SELECT count(*) FROM idem_outbox_dead_letters()}), 0, 'nothing dead');

my ($disorder, $bad_repeat, $bad_payload, $both) = (0, 0, 0, 0);
my %count;
for my $file ($out1, $out2, $out3) {
	my %last;    # aggregate -> last seq printed by this relay
	for my $e (lines_of($file)) {
		my $agg = $e->{aggregate};
		$disorder++ if defined $last{$agg} && $e->{seq} < $last{$agg};
		$last{$agg} = $e->{seq};
		$bad_payload++ unless $agg =~ /^account-\d+$/ && $e->{topic} eq 'citus.relay';
		$count{ $e->{id} }++;
		$bad_repeat++ if $count{ $e->{id} } > 1 && $e->{attempt} < 2;
	}
}
cmp_ok(scalar(grep { $_ > 1 } values %count), '>', 0,
	'events relay-1 printed but never acked were printed again (handed out again after the kill)');
is($disorder, 0, 'each relay printed each aggregate\'s events in seq order');
is($bad_repeat, 0, 'an event printed twice only when handed out again (attempt > 1)');
is($bad_payload, 0, 'topic and aggregate travel with every event');
my %seqs;
for my $e (lines_of($out1), lines_of($out2), lines_of($out3)) { $seqs{ $e->{aggregate} }{ $e->{seq} } = 1; }
my $complete = grep { scalar(keys %{ $seqs{"account-$_"} // {} }) == 2 * $per_wave } 1 .. $accounts;
is($complete, $accounts, 'every aggregate\'s seq 1..' . 2 * $per_wave . ' delivered');
ok(scalar(lines_of($out2)) > 0 && scalar(lines_of($out1)) + scalar(lines_of($out3)) > 0,
	'both relays delivered events (the work was shared)');
done_testing();
