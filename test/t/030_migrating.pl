# docs/migrating.md's move from a hand-written idempotency table, with its scripts
# (examples/migrating/, which the page shows as they are): keys the old table holds
# replay from it (and a reused one is refused), new keys go to the extension, and a
# retry racing the switch-over is applied once, in both directions and with 4
# concurrent duplicates. Every race is forced: a session holds its transaction open
# while the others are seen waiting (pg_stat_activity), then commits.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;

my $root = "$FindBin::RealBin/../..";
my %script = map { $_ => slurp_file("$root/examples/migrating/$_.sql") }
  qw(1_before 2_switch_over 3_after_window);
my $page = slurp_file("$root/docs/migrating.md");
for my $name (sort keys %script) {
	ok(index($page, "```sql\n$script{$name}```") >= 0,
		"docs/migrating.md shows examples/migrating/$name.sql as it is");
}

my $node = PostgreSQL::Test::Cluster->new('migrating');
$node->init;
# Waiting duplicates must outwait the test's own polling on a loaded machine.
$node->append_conf('postgresql.conf', "idempotency.wait_timeout = '120s'");
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION idempotency');
$node->safe_psql('postgres', $script{'1_before'});

sub transfers {
	my ($account) = @_;
	return $node->safe_psql('postgres', "SELECT count(*) FROM transfers WHERE account = $account");
}

# Sessions waiting for a lock whose query mentions $text, until there are $n.
sub wait_for_waiters {
	my ($text, $n) = @_;
	$text =~ s/'/''/g;
	ok($node->poll_query_until('postgres', qq{
		SELECT count(*) = $n FROM pg_stat_activity
		WHERE wait_event_type = 'Lock' AND query LIKE '%$text%'}),
		"$n sessions wait, their query $text");
}

# Before the switch: the old code applies and replays.
my $old1 = $node->safe_psql('postgres', q{CALL legacy_create_transfer('old-1', 1, 25)});
my $old2 = $node->safe_psql('postgres', q{CALL legacy_create_transfer('old-2', 2, 40)});
is($node->safe_psql('postgres', q{CALL legacy_create_transfer('old-1', 1, 25)}),
	$old1, 'before: the old code replays its own keys');

# An old-code transaction in flight as the procedure is switched, for each race below.
my %holder;
for my $case ([ 'race-a', 3 ], [ 'race-4', 4 ]) {
	my ($key, $account) = @$case;
	$holder{$key} = $node->background_psql('postgres');
	$holder{$key}->query_safe('BEGIN');
	$holder{$key}->query_safe("CALL legacy_create_transfer('$key', $account, 10)");
}

$node->safe_psql('postgres', $script{'2_switch_over'});

# Keys the old table holds replay from it, and are then the extension's.
is($node->safe_psql('postgres', q{CALL create_transfer('old-1', 1, 25)}),
	$old1, 'a key applied by the old code replays its response');
is(transfers(1), 1, 'and is not applied again');
is($node->safe_psql('postgres', q{SELECT state FROM idem_lookup('transfers', 'old-1')}),
	'completed', 'the extension now holds it completed');
$node->safe_psql('postgres', q{DELETE FROM legacy_idempotency_keys WHERE key = 'old-1'});
is($node->safe_psql('postgres', q{CALL create_transfer('old-1', 1, 25)}),
	$old1, 'its later retries replay from the extension alone');
my ($ret, $stdout, $stderr) = $node->psql('postgres', q{CALL create_transfer('old-2', 2, 41)});
like($stderr, qr/used for a different request/, 'an old key with another request is refused');
is(transfers(2), 1, 'and nothing is applied');

# New keys go to the extension.
my $new1 = $node->safe_psql('postgres', q{CALL create_transfer('new-1', 5, 10)});
like($new1, qr/"transfer_id"/, 'a new key is applied');
is($node->safe_psql('postgres', q{CALL create_transfer('new-1', 5, 10)}), $new1, 'and replays');
is(transfers(5), 1, 'once');
is($node->safe_psql('postgres', q{SELECT state FROM idem_lookup('transfers', 'new-1')}),
	'completed', 'the extension holds it');
is($node->safe_psql('postgres',
	q{SELECT status || ' ' || (response IS NULL) FROM legacy_idempotency_keys WHERE key = 'new-1'}),
	'moved true', 'the old table holds only a marker');

# A retry through the new procedure while the old code's first attempt is in flight:
# it waits for it, then replays its response.
my $retry = $node->background_psql('postgres');
$retry->query_until(qr/started/, "\\echo started\nCALL create_transfer('race-a', 3, 10);\n");
wait_for_waiters("create_transfer('race-a'", 1);
$holder{'race-a'}->query_safe('COMMIT');
my $first = $node->safe_psql('postgres', q{SELECT response FROM legacy_idempotency_keys WHERE key = 'race-a'});
my $answer = $retry->query_until(qr/done/, "\\echo done\n");
like($answer, qr/^\Q$first\E$/m, 'a retry racing an old-code attempt in flight replays its response');
is(transfers(3), 1, 'and the transfer is applied once');
$retry->quit;

# 4 concurrent duplicates: the old-code attempt in flight and three through the new
# procedure (one waits for the old code, two for its claim).
my @dups;
for my $i (1 .. 3) {
	my $session = $node->background_psql('postgres');
	$session->query_until(qr/started/, "\\echo started\nCALL create_transfer('race-4', 4, 10);\n");
	push @dups, $session;
}
wait_for_waiters("create_transfer('race-4'", 3);
$holder{'race-4'}->query_safe('COMMIT');
$first = $node->safe_psql('postgres', q{SELECT response FROM legacy_idempotency_keys WHERE key = 'race-4'});
for my $i (0 .. 2) {
	like($dups[$i]->query_until(qr/done/, "\\echo done\n"), qr/^\Q$first\E$/m,
		"4 duplicates across the switch: duplicate " . ($i + 2) . " replays the first's response");
	$dups[$i]->quit;
}
is(transfers(4), 1, '4 duplicates across the switch: applied once');

# The other direction: the new procedure's first attempt in flight, an old-code retry
# (an instance not yet switched) waits for it and answers "in progress", not applying;
# the client's next retry replays.
my $new_first = $node->background_psql('postgres');
$new_first->query_safe('BEGIN');
my $new_answer = $new_first->query_safe(q{CALL create_transfer('race-b', 6, 10)});
my $old_retry = $node->background_psql('postgres', on_error_stop => 0);
$old_retry->query_until(qr/started/, "\\echo started\nCALL legacy_create_transfer('race-b', 6, 10);\n");
wait_for_waiters("legacy_create_transfer('race-b'", 1);
$new_first->query_safe('COMMIT');
$new_first->quit;
$old_retry->query_until(qr/done/, "\\echo done\n");
like($old_retry->{stderr}, qr/transfer race-b is in progress/,
	'an old-code retry racing the new procedure answers in progress');
$old_retry->quit;
is($node->safe_psql('postgres', q{CALL create_transfer('race-b', 6, 10)}), $new_answer,
	'the next retry replays');
is(transfers(6), 1, 'the transfer is applied once');

# 4 concurrent duplicates of a new key, all through the new procedure.
my $holder = $node->background_psql('postgres');
$holder->query_safe('BEGIN');
my $answer4 = $holder->query_safe(q{CALL create_transfer('new-4', 7, 10)});
@dups = ();
for my $i (1 .. 3) {
	my $session = $node->background_psql('postgres');
	$session->query_until(qr/started/, "\\echo started\nCALL create_transfer('new-4', 7, 10);\n");
	push @dups, $session;
}
wait_for_waiters("create_transfer('new-4'", 3);
$holder->query_safe('COMMIT');
$holder->quit;
for my $i (0 .. 2) {
	like($dups[$i]->query_until(qr/done/, "\\echo done\n"), qr/^\Q$answer4\E$/m,
		"4 duplicates of a new key: duplicate " . ($i + 2) . " replays the first's response");
	$dups[$i]->quit;
}
is(transfers(7), 1, '4 duplicates of a new key: applied once');

# After the window: the extension alone, the old table gone; what it stored during the
# window replays.
$node->safe_psql('postgres', $script{'3_after_window'});
is($node->safe_psql('postgres', q{SELECT to_regclass('legacy_idempotency_keys') IS NULL}),
	't', 'after the window: the old table is dropped');
is($node->safe_psql('postgres', q{CALL create_transfer('race-a', 3, 10)}),
	$node->safe_psql('postgres', q{SELECT response::text FROM idem_lookup('transfers', 'race-a')}),
	'a key the old code applied, retried during the window, still replays');
is($node->safe_psql('postgres', q{CALL create_transfer('new-1', 5, 10)}), $new1,
	'a key applied during the window still replays');
is($node->safe_psql('postgres', q{SELECT count(*) FROM transfers}), '7',
	'seven transfers in all, one per key');

$node->stop;
done_testing();
