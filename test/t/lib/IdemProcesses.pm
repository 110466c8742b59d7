# Programs a TAP test starts beside its clusters (brokers, relays, services): each in a
# process group of its own, so that stopping one reaches what it started (the Erlang VM
# under rabbitmq-server, say), its output appended to a log of the test. At the end of
# the test those still running are stopped, and if the test failed the last lines of
# each log are shown.
package IdemProcesses;
use strict;
use warnings;
use Exporter 'import';
use POSIX qw(WNOHANG);
use Time::HiRes qw(time sleep);
use IO::Socket::INET;
use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

our @EXPORT = qw(spawn running stop_process wait_until processes);

my @processes;

# spawn(NAME, {ENV}, STDOUT or undef, COMMAND...): starts COMMAND with ENV added to
# the environment, its standard output to the file STDOUT (default: its log, as its
# standard error). Returns the process, a hash with name, pid and log.
sub spawn {
	my ($name, $env, $stdout, @command) = @_;
	my $process = { name => $name, log => "$PostgreSQL::Test::Utils::log_path/$name.log" };
	my $pid = fork() // die "fork: $!";
	if ($pid == 0) {
		POSIX::setsid();
		open(STDIN, '<', '/dev/null')
		  && open(STDOUT, '>>', $stdout // $process->{log})
		  && open(STDERR, '>>', $process->{log})
		  or POSIX::_exit(126);
		@ENV{ keys %$env } = values %$env;
		exec(@command) or POSIX::_exit(127);
	}
	$process->{pid} = $pid;
	push @processes, $process;
	return $process;
}

# Every process the test started, in order.
sub processes { return @processes; }

sub running {
	my ($process) = @_;
	return 0 if defined $process->{status};
	return 1 if waitpid($process->{pid}, WNOHANG) == 0;
	$process->{status} = $?;
	return 0;
}

# Sends $signal to the process (or, with $group, to its process group) and waits at
# most $seconds for it to exit; then kills the group. Returns its wait status, or
# undef if it had to be killed.
sub stop_process {
	my ($process, $signal, $seconds, $group) = @_;
	return $process->{status} unless running($process);
	kill $signal, ($group ? -$process->{pid} : $process->{pid});
	my $deadline = time + $seconds;
	while (running($process)) {
		if (time > $deadline) {
			kill 'KILL', -$process->{pid};
			waitpid($process->{pid}, 0);
			$process->{status} = $?;
			return undef;
		}
		sleep 0.05;
	}
	return $process->{status};
}

# Calls $check every 0.1 s until it returns true, for at most $seconds; returns
# whether it did.
sub wait_until {
	my ($seconds, $check) = @_;
	my $deadline = time + $seconds;
	until ($check->()) {
		return 0 if time > $deadline;
		sleep 0.1;
	}
	return 1;
}

# relay_once(BINARY, {ENV}, ARGS...): runs idem-relay to its end (a configuration or
# grant error), ENV added to the environment; returns (exit code, stdout, stderr).
sub relay_once {
	my ($bin, $env, @args) = @_;
	my ($out, $err) = ('', '');
	local @ENV{ keys %$env } = values %$env;
	IPC::Run::run([ $bin, @args ], '>', \$out, '2>', \$err, IPC::Run::timeout(30));
	return ($? >> 8, $out, $err);
}

# start_relay(BINARY, {ENV}, NAME, STDOUT or undef, ARGS...): idem-relay named NAME, its
# /metrics and /healthz on a free port (the process's {port}), pausing at most 1 s
# between reconnections and 100 ms when idle. Dies if it exits (a configuration error)
# or does not listen within 10 s.
my $relays_started = 0;
sub start_relay {
	my ($bin, $env, $name, $stdout, @args) = @_;
	my $port = PostgreSQL::Test::Cluster::get_free_port();
	$relays_started++;
	my $p = spawn("relay-$name-$relays_started", {%$env}, $stdout, $bin, "--name=$name",
		"--listen=127.0.0.1:$port", '--max-backoff=1s', '--idle=100ms', @args);
	$p->{port} = $port;
	wait_until(10, sub { !running($p) || IO::Socket::INET->new(PeerAddr => "127.0.0.1:$port") });
	die "relay $name exited with status " . ($p->{status} >> 8) . ' (its log follows)' unless running($p);
	IO::Socket::INET->new(PeerAddr => "127.0.0.1:$port") or die "relay $name did not listen";
	return $p;
}

END {
	my $failed = $? != 0 || !Test::More->builder->is_passing;
	local $?;
	stop_process($_, 'TERM', 15, 1) for reverse @processes;
	if ($failed) {
		for my $log (map { $_->{log} } @processes) {
			next unless -e $log;
			my @lines = split /\n/, slurp_file($log);
			splice(@lines, 0, @lines - 40) if @lines > 40;
			diag("the last lines of $log:\n" . join("\n", @lines));
		}
	}
}

1;
