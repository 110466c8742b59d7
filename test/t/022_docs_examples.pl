# Every SQL example of README.md and docs/ runs as pasted: each document's ```sql
# blocks, in the order they appear, as a superuser with psql (as a reader would paste
# them), on a fresh cluster with the library preloaded. README.md runs first, in a new
# database (its Install section creates the extension); every page of docs/ then runs
# in a copy of what README.md left (the extension, Getting started's table and
# procedure), as a reader who followed the README would.
#
#   - A statement may fail only where its line says so: the line psql names in the
#     error must contain "ERROR" (as in `CALL ...;  -- ERROR IK001: ...`), with the
#     SQLSTATE it names if it names one, and an expected error must happen (a line
#     saying ERROR that runs cleanly fails too).
#   - A block is left out when the line before its fence is `<!-- fragment -->` (a
#     part of a statement, or a shape with placeholders); documents that need what one
#     node cannot have (Citus) are left out whole, below, each with its reason.
#   - Roles are the cluster's, not a database's: the roles a page of docs/ creates are
#     dropped after it, so that each page starts with the roles README.md left.
#
# One assertion per block, named by its document and line. First, every link of
# README.md, CONTRIBUTING.md and docs/ resolves: a relative link names a file or
# directory of the repository, and its #anchor a heading (GitHub's slug) of that file.
use strict;
use warnings;
use utf8;
use Encode qw(decode);
use File::Basename qw(dirname);
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

# GitHub's anchor of a heading: lower case, punctuation dropped (but - and _), spaces
# to -; a repeated heading gets -1, -2, ...
sub anchors {
	my ($path) = @_;
	my (%anchors, %seen, $fence);
	for my $line (split /\n/, decode('UTF-8', slurp_file($path))) {
		$fence = !$fence if $line =~ /^\s*```/;
		next if $fence;
		$anchors{$1} = 1 while $line =~ /<a\s+(?:name|id)="([^"]+)"/g;
		next unless $line =~ /^#{1,6}\s+(.*?)\s*#*\s*$/;
		my $slug = lc $1;
		$slug =~ s/\[([^\]]*)\]\([^)]*\)/$1/g;    # a link's text
		$slug =~ s/[^\w\- ]//g;
		$slug =~ s/ /-/g;
		my $n = $seen{$slug}++;
		$anchors{ $n ? "$slug-$n" : $slug } = 1;
	}
	return \%anchors;
}

my %anchors_of;
for my $document ('README.md', 'CONTRIBUTING.md', sort glob('docs/*.md')) {
	my (@broken, $fence);
	my $n = 0;
	for my $line (split /\n/, decode('UTF-8', slurp_file($document))) {
		$n++;
		$fence = !$fence if $line =~ /^\s*```/;
		next if $fence;
		(my $text = $line) =~ s/`[^`]*`//g;    # code spans are not links
		while ($text =~ /\]\(([^)\s]+)\)/g) {
			my $target = $1;
			next if $target =~ m{^[a-z]+:}i;     # https:, mailto:
			my ($file, $anchor) = split /#/, $target, 2;
			my $path =
			  $file eq '' ? $document : dirname($document) . "/$file";
			$path =~ s{^\./}{};
			1 while $path =~ s{[^/]+/\.\./}{};
			if (!-e $path) {
				push @broken, "line $n: $target: no file $path";
				next;
			}
			next unless defined $anchor && $path =~ /\.md$/;
			$anchors_of{$path} //= anchors($path);
			push @broken, "line $n: $target: no heading #$anchor in $path"
			  unless $anchors_of{$path}{$anchor};
		}
	}
	ok(!@broken, "$document: every link resolves") or diag(join("\n", @broken));
}

# Documents whose examples need what this native cluster cannot have: more than one
# PostgreSQL node (test/t/017_citus.pl runs the same calls on a real Citus cluster), or
# the SQL-only edition with pg_cron (test/sqlonly/t/003_pg_cron.pl runs its calls).
my %not_here = (
	'docs/citus.md' => 'needs a Citus cluster (017_citus.pl)',
	'docs/design-citus.md' => 'a design note: needs a Citus cluster',
	'docs/sql-only.md' => 'needs the SQL-only edition and pg_cron (test/sqlonly/t/003_pg_cron.pl)',
);

my @documents = ('README.md', sort glob('docs/*.md'));

my $node = PostgreSQL::Test::Cluster->new('docs');
$node->init;
$node->append_conf('postgresql.conf', "shared_preload_libraries = 'idempotency'\n");
$node->start;

# The ```sql blocks of a document (also indented, in a list item): [line of the fence,
# text], fragments left out.
sub sql_blocks {
	my ($path) = @_;
	my @lines = split /\n/, slurp_file($path), -1;
	my (@blocks, $start, $indent, @body);
	for my $i (0 .. $#lines) {
		if (!defined $start) {
			next unless $lines[$i] =~ /^(\s*)```sql\s*$/;
			$indent = $1;
			my $previous = $i > 0 ? $lines[ $i - 1 ] : '';
			$start = $i + 1;
			$start = -$start if $previous =~ /^\s*<!--\s*fragment\b/;
			@body = ();
		}
		elsif ($lines[$i] =~ /^\s*```\s*$/) {
			push @blocks, [ $start, join("\n", @body) . "\n" ] if $start > 0;
			undef $start;
		}
		else {
			(my $line = $lines[$i]) =~ s/^\Q$indent\E//;
			push @body, $line;
		}
	}
	return @blocks;
}

my $database = 0;
for my $document (@documents) {
	if ($not_here{$document}) {
		note("$document: not run here: $not_here{$document}");
		next;
	}
	my @blocks = sql_blocks($document);
	next unless @blocks;
	my $dbname = 'docs_' . ++$database;
	my $template = $database == 1 ? '' : ' TEMPLATE docs_1';
	$node->safe_psql('postgres', "CREATE DATABASE $dbname$template");
	my $roles_before = $node->safe_psql('postgres',
		"SELECT string_agg(quote_literal(rolname), ',') FROM pg_roles");
	for my $block (@blocks) {
		my ($line, $sql) = @$block;
		my $file = "$PostgreSQL::Test::Utils::tmp_check/block_${database}_$line.sql";
		open my $fh, '>', $file or die "$file: $!";
		print $fh $sql;
		close $fh;
		my ($stdout, $stderr);
		$node->psql($dbname, undef,
			extra_params => [ '-v', 'VERBOSITY=verbose', '-f', $file ],
			stdout => \$stdout, stderr => \$stderr, on_error_stop => 0);
		my @sql_lines = split /\n/, $sql;
		# psql names the line of the statement's end: "psql:FILE:LINE: ERROR:  ..."
		my %failed;
		while ($stderr =~ /^psql:[^:]+:(\d+): ERROR:\s+(.*)$/mg) {
			$failed{$1} = $2;
		}
		my @wrong;
		for my $n (sort { $a <=> $b } keys %failed) {
			my $says = $sql_lines[ $n - 1 ] // '';
			push @wrong, "line " . ($line + $n) . ": unexpected ERROR: $failed{$n}"
			  unless $says =~ /ERROR/;
			# "-- ERROR IK001: ..." names the SQLSTATE (psql's verbose errors begin with it)
			push @wrong, "line " . ($line + $n) . ": expected $1, got ERROR: $failed{$n}"
			  if $says =~ /--.*\bERROR:?\s+([0-9A-Z]{5})\b/ && $failed{$n} !~ /^$1:/;
		}
		for my $n (1 .. @sql_lines) {
			next unless $sql_lines[ $n - 1 ] =~ /--.*\bERROR\b/;
			push @wrong, "line " . ($line + $n) . ": says ERROR but ran cleanly"
			  unless $failed{$n};
		}
		ok(!@wrong, "$document, the block at line $line runs as pasted")
		  or diag(join("\n", @wrong) . "\nstderr:\n$stderr");
	}
	next if $database == 1;    # README.md's database and roles stay for the rest
	$node->safe_psql('postgres', "DROP DATABASE $dbname WITH (FORCE)");
	my $new_roles = $node->safe_psql('postgres',
		"SELECT string_agg(quote_ident(rolname), ', ') FROM pg_roles WHERE rolname NOT IN ($roles_before)");
	$node->safe_psql('postgres', "DROP ROLE $new_roles") if $new_roles ne '';
}

done_testing();
