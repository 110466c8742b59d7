# What the SQL-only edition's TAP tests share: the files `make sql-only` wrote, the
# add-ons this PostgreSQL has (test/run_all.sh runs these tests in a copy of each
# PostgreSQL without the native edition, with pg_tle and pg_cron installed when their
# sources were there: scripts/sqlonly_deps.sh), and the two ways to install.
package IdemSqlOnly;
use strict;
use warnings;
use Test::More;
use PostgreSQL::Test::Utils;
use IPC::Run;

# dist_file('sql') or dist_file('pgtle'): the plain script or the pg_tle installer
# (IDEM_SQLONLY_DIST, else dist/ of the source tree the tests run from).
sub dist_file {
	my ($kind) = @_;
	my $dir = $ENV{IDEM_SQLONLY_DIST} || 'dist';
	my $file = "$dir/idempotency-$kind--1.5.sql";
	BAIL_OUT("no $file: run make sql-only first") unless -f $file;
	return $file;
}

sub sharedir {
	my $sharedir = `pg_config --sharedir`;
	chomp $sharedir;
	return $sharedir;
}

# Skips the whole file unless NAME (pg_tle, pg_cron) is installed in this PostgreSQL
# (test/run_all.sh then prints a "not run" line naming the file). Also refuses to run
# where the native edition is installed: pg_tle would refuse the name, and the plain
# script's objects would be mistaken for the native ones.
sub require_sqlonly_addon {
	my ($name) = @_;
	plan skip_all => "$name is not installed in this PostgreSQL (" . sharedir() . ')'
	  unless -f sharedir() . "/extension/$name.control";
}

sub require_no_native {
	BAIL_OUT('the native edition is installed in ' . sharedir()
		  . ': the SQL-only edition is tested in a PostgreSQL without it')
	  if -f sharedir() . '/extension/idempotency.control';
}

# psql_as($node, ROLE, DATABASE, SQL or undef, file => F): runs as ROLE, stopping at the
# first error; returns (exit status, stdout, stderr).
sub psql_as {
	my ($node, $role, $dbname, $sql, %params) = @_;
	my ($stdout, $stderr) = ('', '');
	my @cmd = ('psql', '-X', '-A', '-t', '-q', '-v', 'ON_ERROR_STOP=1',
		'-h', $node->host, '-p', $node->port, '-U', $role, '-d', $dbname);
	push @cmd, ('-f', $params{file}) if $params{file};
	push @cmd, ('-c', $sql) if defined $sql;
	my $ret = IPC::Run::run(\@cmd, '>', \$stdout, '2>', \$stderr) ? 0 : ($? >> 8);
	chomp $stdout;
	return ($ret, $stdout, $stderr);
}

# safe_as: psql_as's stdout; on an error, the error instead (so that the assertion
# comparing it fails and says why, and the file goes on).
sub safe_as {
	my ($node, $role, $dbname, $sql, %params) = @_;
	my ($ret, $stdout, $stderr) = psql_as($node, $role, $dbname, $sql, %params);
	return $stdout if $ret == 0;
	diag("psql as $role failed: $stderr");
	return "psql failed: $stderr";
}

# error_as: the SQLSTATE and message of a statement that must fail, "STATE: message"
# (VERBOSITY verbose gives the SQLSTATE), or "ok" when it did not fail.
sub error_as {
	my ($node, $role, $dbname, $sql) = @_;
	my ($stdout2, $stderr2) = ('', '');
	my @cmd = ('psql', '-X', '-A', '-t', '-q', '-v', 'ON_ERROR_STOP=1', '-v', 'VERBOSITY=verbose',
		'-h', $node->host, '-p', $node->port, '-U', $role, '-d', $dbname, '-c', $sql);
	IPC::Run::run(\@cmd, '>', \$stdout2, '2>', \$stderr2) and return 'ok';
	return "$1: $2" if $stderr2 =~ /ERROR:\s+([0-9A-Z]{5}):\s+([^\n]*)/;
	return "failed: $stderr2";
}

1;
