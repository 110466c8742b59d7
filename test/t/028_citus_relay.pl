# The relay on a distributed store (SPEC v1.3, "Scale-out with Citus"; issue 34): the
# relay functions called on the coordinator serve every shard's events. A coordinator
# and two workers, `payments` distributed by `account` in 4 shards, the key store and
# the messaging tables distributed with it.
#
#   (f) a topic filter, over every shard;
#   (c) two relays taking turns (claim, claim, ack, ack): every event handed out once,
#       in per-aggregate seq order across both relays; every ack counted;
#   (l) a lease run out: the event goes to the other relay (attempt 2), the late ack
#       of the first is ignored;
#   (x) dead letters on two workers: listed oldest first, they stop blocking their
#       aggregate, and idem_outbox_retry puts them back with their seq;
#   (t) in a transaction block: a rolled-back claim or ack leaves nothing behind;
#   (m) a shard moved (block_writes, then back in logical mode) while a relay holds a
#       lease on one of its events, to a node whose own position sequence is far
#       behind: the ack after the move counts, and the aggregate's later events are
#       still handed out in seq order;
#   (r) relaying and emitting while a shard moves in logical mode: every event once, each
#       aggregate in seq order;
#   (s) one relay session claiming and acknowledging (acks go to the shards it was
#       handed the events from), the shard of an event split in between;
#   (i) one event id in two shards: an ack or dead letter from the claiming session, or
#       from a fresh one, settles both; so does the ack of one of two sessions each
#       handed one of them;
#   (v) a relay function inside a call Citus delegated: 0A000;
#   (k) at the end nothing is pending, each event delivered once; amcheck on every
#       shard of routed_outbox;
#   (d) a domain with a check (over bigint, over text) as the distribution column:
#       a route the domain refuses is refused on every node; emit, a shard moved,
#       claim, ack, dead letters and retry, every event handed out once.
#
# Needs Citus installed in the PostgreSQL under test, like 017_citus.pl (IDEM_CITUS).
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::RealBin/lib";
use IdemCitus;
use IdemCheck;

IdemCitus::require_citus();

my $accounts = 12;
my $per_account = 5;

my ($coordinator, $worker1, $worker2) = IdemCitus::start_cluster();
my @nodes = ($coordinator, $worker1, $worker2);
my @workers = ($worker1, $worker2);
# The producer's and the relay's grants on every node, before idem_distribute (which
# gives the twins the grants of the functions they stand for).
$coordinator->safe_psql('postgres', 'CREATE ROLE app LOGIN; CREATE ROLE relay LOGIN');
$_->safe_psql('postgres', q{
	GRANT EXECUTE ON FUNCTION idem_emit TO app;
	GRANT EXECUTE ON FUNCTION idem_outbox_claim, idem_outbox_ack, idem_outbox_dead,
	  idem_outbox_retry, idem_outbox_dead_letters TO relay;}) for @nodes;
$coordinator->safe_psql('postgres', 'SET citus.shard_count = 4;'
	  . PostgreSQL::Test::Utils::slurp_file("$FindBin::RealBin/../../examples/create_payment_citus.sql"));

sub query { return $coordinator->safe_psql('postgres', $_[0]) }
sub as_app { return $coordinator->safe_psql('postgres', $_[0], extra_params => [ '-U', 'app' ]) }
sub as_relay { return $coordinator->safe_psql('postgres', $_[0], extra_params => [ '-U', 'relay' ]) }

sub sqlstate_of {
	my ($sql, $user) = @_;
	my ($out, $err) = ('', '');
	$coordinator->psql('postgres', "\\set VERBOSITY verbose\n$sql", stdout => \$out,
		stderr => \$err, extra_params => [ '-U', $user ]);
	return $err =~ /ERROR:\s+([0-9A-Z]{5}):/ ? $1 : "no error ($out)";
}

# A batch as rows [event_id, aggregate, seq, attempt], in the order handed out.
sub rows_of {
	my ($out) = @_;
	return [ map { [ split /\|/, $_, -1 ] } grep { $_ ne '' } split /\n/, $out ];
}
my $claim_columns = q{event_id, coalesce(aggregate, ''), coalesce(seq::text, ''), attempt};
sub claim {
	my ($relay, $max, $extra) = @_;
	$extra //= '';
	return rows_of(as_relay(qq{SELECT $claim_columns FROM idem_outbox_claim('$relay', $max$extra)}));
}
sub ids { return q{ARRAY[} . join(',', map { "'$_->[0]'" } @{ $_[0] }) . q{]::idem_key[]} }
sub ack { my ($relay, $batch) = @_; return as_relay(qq{SELECT idem_outbox_ack('$relay', } . ids($batch) . ')') }

# The node (port) holding the shard of an account's routed_outbox rows.
sub node_of {
	return query(qq{SELECT nodeport FROM citus_shards WHERE table_name = 'idempotency.routed_outbox'::regclass
	                AND shardid = get_shard_id_for_distribution_column('idempotency.routed_outbox', $_[0]::bigint)});
}

# Events: per account, $per_account of aggregate account-N (seq 1..5), from blocks on
# the coordinator, and one without aggregate (topic account.touched).
as_app(join("\n", map {
	my $a = $_;
	(map { "BEGIN; SELECT idem_emit('payment.created', '{\"n\": $_}', 'account-$a', route => $a); COMMIT;" } 1 .. $per_account),
	  "SELECT idem_emit('account.touched', '{}', route => $a);"
} 1 .. $accounts));
is(query(q{SELECT count(DISTINCT nodeport) FROM citus_shards WHERE table_name = 'idempotency.routed_outbox'::regclass
           AND shardid IN (SELECT get_shard_id_for_distribution_column('idempotency.routed_outbox', a::bigint)
                           FROM generate_series(1, 12) a)}),
	'2', 'the accounts\' events are in shards on both workers');

# ---------------------------------------------------------------------------------
# (f) A topic filter, over every shard
# ---------------------------------------------------------------------------------

my $touched = claim('relay-1', 100, q{, topics => '{account.touched}'});
is(scalar(@$touched), $accounts, "(f) the topic filter hands out the $accounts events of account.touched");
is(scalar(grep { $_->[1] eq '' && $_->[2] eq '' && $_->[3] == 1 } @$touched), $accounts,
	'(f) without aggregate or seq, attempt 1');
is(ack('relay-1', $touched), $accounts, '(f) all acknowledged');

# ---------------------------------------------------------------------------------
# (c) Two relays taking turns
# ---------------------------------------------------------------------------------

my %first_seen;    # event id => handing-out number
my %order;         # aggregate => [seq, in the order handed out]
my ($handed, $acked, $rounds) = (0, 0, 0);
while ($rounds++ < 100) {
	my $b1 = claim('relay-1', 7);
	my $b2 = claim('relay-2', 7);
	last if !@$b1 && !@$b2;
	for my $row (@$b1, @$b2) {
		$first_seen{ $row->[0] } //= ++$handed;
		push @{ $order{ $row->[1] } }, $row->[2];
	}
	$acked += ack('relay-1', $b1) if @$b1;
	$acked += ack('relay-2', $b2) if @$b2;
}
my $events = $accounts * $per_account;
is(scalar(keys %first_seen) . "|$handed|$acked", "$events|$events|$events",
	"(c) two relays: each of the $events events handed out once and acknowledged once");
is(scalar(grep { join(',', @{ $order{$_} }) eq join(',', 1 .. $per_account) } keys %order), $accounts,
	"(c) each aggregate's events handed out in seq order 1..$per_account across both relays");
is(query(q{SELECT count(*) FILTER (WHERE state = 'd') || '|' || count(*) FROM idempotency.routed_outbox}),
	$events + $accounts . '|' . ($events + $accounts), '(c) every event delivered');

# ---------------------------------------------------------------------------------
# (l) A lease run out
# ---------------------------------------------------------------------------------

as_app(q{SELECT idem_emit('late', '{}', 'late-1', event_id => 'late-1', route => 1)});
my $late = claim('relay-1', 10, q{, lease => '1 millisecond'});
is(join(',', map { "$_->[0]:$_->[3]" } @$late), 'late-1:1', '(l) relay-1 takes the event for 1 ms');
my $again = [];
for (1 .. 100) {
	$again = claim('relay-2', 10);
	last if @$again;
}
is(join(',', map { "$_->[0]:$_->[3]" } @$again), 'late-1:2', '(l) its lease ran out: relay-2 has it, attempt 2');
is(ack('relay-1', $late), '0', '(l) the late ack of relay-1 is ignored');
is(ack('relay-2', $again), '1', '(l) relay-2\'s ack counts');

# ---------------------------------------------------------------------------------
# (x) Dead letters on two workers
# ---------------------------------------------------------------------------------

my ($acc_a, $acc_b) = (1, undef);
for my $a (2 .. 12) { if (node_of($a) != node_of($acc_a)) { $acc_b = $a; last } }
as_app(qq{SELECT idem_emit('dl', '{"n": 1}', 'dl-$acc_a', event_id => 'dl-a-1', route => $acc_a);
          SELECT idem_emit('dl', '{"n": 2}', 'dl-$acc_a', event_id => 'dl-a-2', route => $acc_a);});
my $poison = claim('relay-1', 1, q{, topics => '{dl}'});
is(join(',', map { $_->[0] } @$poison), 'dl-a-1', '(x) the first event of dl-a, alone');
as_app(qq{SELECT idem_emit('dl', '{"n": 1}', 'dl-$acc_b', event_id => 'dl-b-1', route => $acc_b)});
is(as_relay(q{SELECT idem_outbox_dead('relay-1', '{dl-a-1}', 'poison')}), '1', '(x) dead: 1');
my $next = claim('relay-1', 10, q{, topics => '{dl}'});
is(join(',', sort map { "$_->[0]:$_->[2]" } @$next), 'dl-a-2:2,dl-b-1:1',
	'(x) the dead letter blocks its aggregate no more: dl-a seq 2 and dl-b handed out');
is(as_relay(q{SELECT idem_outbox_dead('relay-1', '{dl-b-1}', 'poison too')}), '1', '(x) another dead letter, on the other worker');
is(ack('relay-1', [ grep { $_->[0] eq 'dl-a-2' } @$next ]), '1', '(x) dl-a-2 acknowledged');
is(as_relay(q{SELECT string_agg(event_id || ':' || reason || ':' || seq, ',') FROM idem_outbox_dead_letters()}),
	'dl-a-1:poison:1,dl-b-1:poison too:1', '(x) the dead letters of both workers, oldest first, with their reasons');
is(as_relay(q{SELECT string_agg(event_id::text, ',') FROM idem_outbox_dead_letters(max_rows => 1)}),
	'dl-a-1', '(x) max_rows over every shard: the oldest');
is(as_relay(q{SELECT count(*) FROM idem_outbox_dead_letters('other')}), '0', '(x) a topic without dead letters: none');
is(as_relay(q{SELECT idem_outbox_retry()}), '2', '(x) idem_outbox_retry() puts both back');
my $retried = claim('relay-1', 10, q{, topics => '{dl}'});
is(join(',', sort map { "$_->[0]:$_->[2]:$_->[3]" } @$retried), 'dl-a-1:1:2,dl-b-1:1:2',
	'(x) handed out again with their seq, attempt 2');
is(ack('relay-1', $retried), '2', '(x) and acknowledged');
is(as_relay(q{SELECT count(*) FROM idem_outbox_dead_letters()}), '0', '(x) no dead letter left');

# ---------------------------------------------------------------------------------
# (t) In a transaction block
# ---------------------------------------------------------------------------------

as_app(join("\n", map { "SELECT idem_emit('tx', '{}', 'tx-$_', event_id => 'tx-$_', route => $_);" } 1 .. 4));
is(as_relay(qq{BEGIN; SELECT count(*) FROM idem_outbox_claim('relay-1', 10, topics => '{tx}'); ROLLBACK;}),
	'4', '(t) a claim in a block rolled back ...');
is(join(',', sort map { "$_->[0]:$_->[3]" } @{ rows_of(as_relay(qq{BEGIN;
	SELECT $claim_columns FROM idem_outbox_claim('relay-2', 10, topics => '{tx}');
	SELECT idem_outbox_ack('relay-2', '{tx-1,tx-2,tx-3,tx-4}') \\g /dev/null
	ROLLBACK;})) }), 'tx-1:1,tx-2:1,tx-3:1,tx-4:1', '(t) ... leased nothing: another relay has them at attempt 1');
my $tx = rows_of(as_relay(qq{BEGIN; SELECT $claim_columns FROM idem_outbox_claim('relay-1', 10, topics => '{tx}'); COMMIT;}));
is(join(',', sort map { "$_->[0]:$_->[3]" } @$tx), 'tx-1:1,tx-2:1,tx-3:1,tx-4:1',
	'(t) the ack rolled back too: still pending, attempt 1');
is(as_relay(q{BEGIN; SELECT idem_outbox_ack('relay-1', '{tx-1,tx-2,tx-3,tx-4}'); COMMIT;}), '4',
	'(t) claimed and acknowledged in committed blocks');

# ---------------------------------------------------------------------------------
# (m) A shard moved during relaying
# ---------------------------------------------------------------------------------

my $from = node_of(1);
my ($source) = grep { $_->port == $from } @workers;
my ($target) = grep { $_->port != $from } @workers;
# The source numbers far ahead of the target: the aggregate's events emitted after the
# move take lower numbers from the target's own sequence.
$source->safe_psql('postgres', q{SELECT setval('idempotency.outbox_position', 1000000)});
as_app(join("\n", map { "SELECT idem_emit('moved', '{}', 'mv-1', event_id => 'mv-$_', route => 1);" } 1 .. 3));
my $held = claim('relay-1', 1, q{, topics => '{moved}'});
is(join(',', map { "$_->[0]:$_->[2]" } @$held), 'mv-1:1', '(m) relay-1 holds the lease of mv-1 (seq 1)');
my $shard = query(q{SELECT get_shard_id_for_distribution_column('idempotency.routed_outbox', 1::bigint)});
IdemCitus::move_shard($coordinator, $shard, $from, $target->port, 'block_writes');
is(node_of(1), $target->port, '(m) the shard of account 1 moved to the other worker');
as_app(join("\n", map { "SELECT idem_emit('moved', '{}', 'mv-1', event_id => 'mv-$_', route => 1);" } 4 .. 6));
is(query(q{SELECT count(*) FROM idempotency.routed_outbox WHERE aggregate = 'mv-1' AND seq > 3
           AND position > (SELECT max(position) FROM idempotency.routed_outbox WHERE aggregate = 'mv-1' AND seq <= 3)}),
	'3', '(m) the events emitted after the move come after the earlier ones in their shard\'s order');
is($target->safe_psql('postgres', q{SELECT last_value < 1000000 FROM idempotency.outbox_position}), 't',
	'(m) although the target\'s own sequence is far behind');
is(ack('relay-1', $held), '1', '(m) the ack after the move reaches the event on its new node');
my $rest = claim('relay-2', 100, q{, topics => '{moved}'});
is(join(',', map { $_->[2] } @$rest), '2,3,4,5,6', '(m) the rest in seq order, none lost');
# Back, in logical mode, with a lease held again.
as_app(q{SELECT idem_emit('moved', '{}', 'mv-1', event_id => 'mv-7', route => 1)});
is(ack('relay-2', $rest), '5', '(m) acknowledged');
$held = claim('relay-1', 10, q{, topics => '{moved}'});
# (IdemCitus cleans up the placement the first move left behind before moving back.)
IdemCitus::move_shard($coordinator, $shard, $target->port, $from, 'force_logical');
is(node_of(1), $from, '(m) moved back in logical mode');
as_app(q{SELECT idem_emit('moved', '{}', 'mv-1', event_id => 'mv-8', route => 1)});
is(ack('relay-1', $held), '1', '(m) the ack after the move back counts');
is(join(',', map { $_->[2] } @{ claim('relay-2', 100, q{, topics => '{moved}'}) }), '8',
	'(m) and the next event follows: nothing lost, nothing reordered');
as_relay(q{SELECT idem_outbox_ack('relay-2', '{mv-8}')});

# ---------------------------------------------------------------------------------
# (r) Relaying and emitting while a shard moves (logical mode)
# ---------------------------------------------------------------------------------

# 5 events of aggregate cr-N per account, then a move of account 1's shard started in
# a session of its own; meanwhile a relay claims and acknowledges 4 at a time and a
# producer emits for account 1, until the move is done and nothing is left. A call
# that fails (the shard's cut-over) is retried, as a relay or a producer does.
as_app(join("\n", map { my $a = $_; map { "SELECT idem_emit('concurrent', '{}', 'cr-$a', route => $a);" } 1 .. 5 } 1 .. $accounts));
my $moving_from = node_of(1);
my ($moving_to) = grep { $_ != $moving_from } map { $_->port } @workers;
my $mover = IdemCitus::start_move($coordinator, query(q{SELECT get_shard_id_for_distribution_column('payments', 1::bigint)}),
	$moving_from, $moving_to, 'force_logical');
my (%seen_r, %order_r);
my ($emitted_r, $retried_r) = (5 * $accounts, 0);
my ($moved, $idle) = (0, 0);
for my $round (1 .. 2000) {
	$moved ||= node_of(1) == $moving_to;
	if (!$moved || $round % 5 == 0) {
		my ($ok) = $coordinator->psql('postgres', q{SELECT idem_emit('concurrent', '{}', 'cr-1', route => 1)},
			extra_params => [ '-U', 'app' ]);
		$ok == 0 ? $emitted_r++ : $retried_r++;
	}
	my ($out, $err) = ('', '');
	my $rc = $coordinator->psql('postgres',
		qq{SELECT $claim_columns FROM idem_outbox_claim('relay-r', 4, topics => '{concurrent}')},
		stdout => \$out, stderr => \$err, extra_params => [ '-U', 'relay' ]);
	if ($rc != 0) { $retried_r++; next }
	my $batch = rows_of($out);
	for my $row (@$batch) {
		push @{ $order_r{ $row->[1] } }, $row->[2] unless $seen_r{ $row->[0] }++;
	}
	while (@$batch) {
		my $rc_ack = $coordinator->psql('postgres', q{SELECT idem_outbox_ack('relay-r', } . ids($batch) . ')',
			extra_params => [ '-U', 'relay' ]);
		last if $rc_ack == 0;
		$retried_r++;
	}
	$idle = @$batch ? 0 : $idle + 1;
	last if $moved && $idle >= 2;
}
IdemCitus::finish_move($mover);
note("(r) calls retried during the move: $retried_r");
is(node_of(1), $moving_to, '(r) the shard of account 1 moved while relaying');
is(scalar(keys %seen_r), $emitted_r, "(r) each of the $emitted_r events emitted before and during the move handed out");
is(scalar(grep { my @s = @{ $order_r{$_} }; join(',', @s) eq join(',', 1 .. scalar @s) } keys %order_r),
	$accounts, '(r) each aggregate in seq order 1, 2, 3, ... with no gap, across the move');
is(query(q{SELECT count(*) FROM idempotency.routed_outbox WHERE topic = 'concurrent' AND state <> 'd'}), '0',
	'(r) all acknowledged');

# ---------------------------------------------------------------------------------
# (s) One relay session claiming and acknowledging (it remembers each event's shard),
#     with the shard of one of its events split in between
# ---------------------------------------------------------------------------------

my $session = $coordinator->background_psql('postgres', extra_params => [ '-U', 'relay' ]);
# Ids made by idem_emit (random UUIDs), whose shards the session remembers.
as_app(join("\n", map { "SELECT idem_emit('session', '{}', 'ss-$_', route => $_);" } 1 .. $accounts));
my %ss = map { split /\|/ } split /\n/, query(q{
	SELECT substr(aggregate, 4) || '|' || event_id FROM idempotency.routed_outbox WHERE topic = 'session'});
my $ss_ids = sub { 'ARRAY[' . join(', ', map { "'$ss{$_}'" } @_) . ']::idem_key[]' };
is($session->query_safe(q{SELECT count(*) FROM idem_outbox_claim('relay-s', 100, topics => '{session}')}),
	$accounts, "(s) the session's relay takes $accounts events of every shard");
is($session->query_safe('SELECT idem_outbox_ack(\'relay-s\', ' . $ss_ids->(1, 2) . ')'), '2',
	'(s) its ack of two of them counts both');
my ($split, $min, $max, $port) = split /\|/, query(q{
	SELECT s.shardid || '|' || s.shardminvalue || '|' || s.shardmaxvalue || '|' || c.nodeport
	FROM pg_dist_shard s JOIN citus_shards c USING (shardid)
	WHERE s.shardid = get_shard_id_for_distribution_column('idempotency.routed_outbox', 3::bigint)});
my %node_id = map { split /\|/ } split /\n/, query(q{SELECT nodeport, nodeid FROM pg_dist_node WHERE groupid > 0});
my ($other) = grep { $_ != $port } keys %node_id;
query(sprintf(q{SELECT citus_split_shard_by_split_points(%d, ARRAY['%d'], ARRAY[%d, %d], shard_transfer_mode => 'block_writes')},
	$split, int(($min + $max) / 2), $node_id{$port}, $node_id{$other}));
isnt(query(q{SELECT get_shard_id_for_distribution_column('idempotency.routed_outbox', 3::bigint)}), $split,
	'(s) the shard of account 3 split in two');
is($session->query_safe('SELECT idem_outbox_ack(\'relay-s\', ' . $ss_ids->(3 .. $accounts) . ')'),
	$accounts - 2, '(s) the ack of the rest after the split counts every one, the split shard\'s too');
is($session->query_safe('SELECT idem_outbox_ack(\'relay-s\', ' . $ss_ids->(1, 3) . ')'), '0',
	'(s) acknowledged twice: nothing more');
$session->quit;
is(query(q{SELECT count(*) FROM idempotency.routed_outbox WHERE topic = 'session' AND state = 'd'}), $accounts,
	'(s) all delivered');

# ---------------------------------------------------------------------------------
# (i) One event id in two shards (the outbox's key is the id and the route): an ack or
#     dead letter settles both, from the claiming session as from a fresh one
# ---------------------------------------------------------------------------------

my $shard_of = sub { query(qq{SELECT get_shard_id_for_distribution_column('idempotency.routed_outbox', $_[0]::bigint)}) };
my $d1 = 1;
my ($d2) = grep { $shard_of->($_) ne $shard_of->($d1) } 2 .. $accounts;
my $claimer = $coordinator->background_psql('postgres', extra_params => [ '-U', 'relay' ]);
# Emits event $id with the routing values $d1 and $d2; the claiming session takes both.
my $twice = sub {
	my ($id) = @_;
	as_app(qq{SELECT idem_emit('twice', '{}', event_id => '$id', route => $d1);
	          SELECT idem_emit('twice', '{}', event_id => '$id', route => $d2);});
	return $claimer->query_safe(q{SELECT count(*) FROM idem_outbox_claim('relay-d', 10, topics => '{twice}')});
};
is($twice->('dup-ack'), '2', "(i) event dup-ack of accounts $d1 and $d2 (two shards): the session claims both");
is($claimer->query_safe(q{SELECT idem_outbox_ack('relay-d', ARRAY['dup-ack']::idem_key[])}), '2',
	'(i) its ack from the claiming session settles both');
is($twice->('dup-fresh'), '2', '(i) dup-fresh: both claimed');
is(as_relay(q{SELECT idem_outbox_ack('relay-d', ARRAY['dup-fresh']::idem_key[])}), '2',
	'(i) the ack from a fresh session settles both');
is($twice->('dup-dead'), '2', '(i) dup-dead: both claimed');
is($claimer->query_safe(q{SELECT idem_outbox_dead('relay-d', ARRAY['dup-dead']::idem_key[], 'bad')}), '2',
	'(i) its dead letter from the claiming session settles both');
is($twice->('dup-dead-fresh'), '2', '(i) dup-dead-fresh: both claimed');
is(as_relay(q{SELECT idem_outbox_dead('relay-d', ARRAY['dup-dead-fresh']::idem_key[], 'bad')}), '2',
	'(i) the dead letter from a fresh session settles both');
# Two sessions of the relay, each handed one of the two (one event a claim): the ack
# from the first settles both, as on one node an ack settles every event of that id
# leased to the relay; the second's late ack then finds nothing.
my $other_claimer = $coordinator->background_psql('postgres', extra_params => [ '-U', 'relay' ]);
as_app(qq{SELECT idem_emit('twice', '{}', event_id => 'dup-two', route => $d1);
          SELECT idem_emit('twice', '{}', event_id => 'dup-two', route => $d2);});
is($claimer->query_safe(q{SELECT count(*) FROM idem_outbox_claim('relay-d', 1, topics => '{twice}')})
	 . ' ' . $other_claimer->query_safe(q{SELECT count(*) FROM idem_outbox_claim('relay-d', 1, topics => '{twice}')}),
	'1 1', '(i) dup-two: each of two sessions of the relay is handed one');
is($claimer->query_safe(q{SELECT idem_outbox_ack('relay-d', ARRAY['dup-two']::idem_key[])}), '2',
	'(i) the first session\'s ack settles both');
is($other_claimer->query_safe(q{SELECT idem_outbox_ack('relay-d', ARRAY['dup-two']::idem_key[])}), '0',
	'(i) the second session\'s ack finds nothing left');
$other_claimer->quit;
is(query(q{SELECT string_agg(event_id::text || ':' || state::text, ',' ORDER BY event_id::text, state::text) FROM idempotency.routed_outbox
           WHERE topic = 'twice'}),
	'dup-ack:d,dup-ack:d,dup-dead:x,dup-dead:x,dup-dead-fresh:x,dup-dead-fresh:x,dup-fresh:d,dup-fresh:d,dup-two:d,dup-two:d',
	'(i) each of the ten events settled as asked');
# Relayed again and delivered, for (k).
is(as_relay(q{SELECT idem_outbox_retry(ARRAY['dup-dead', 'dup-dead-fresh']::idem_key[])}), '4', '(i) retried');
is($claimer->query_safe(q{SELECT count(*) FROM idem_outbox_claim('relay-d', 10, topics => '{twice}')}), '4',
	'(i) claimed again');
is($claimer->query_safe(q{SELECT idem_outbox_ack('relay-d', ARRAY['dup-dead', 'dup-dead-fresh']::idem_key[])}), '4',
	'(i) and acknowledged');
$claimer->quit;

# ---------------------------------------------------------------------------------
# (v) Inside a call Citus delegated
# ---------------------------------------------------------------------------------

query(q{
	CREATE FUNCTION relay_inside(p_account bigint) RETURNS bigint LANGUAGE sql
	  AS $$ SELECT count(*) FROM idem_outbox_claim('inside') $$;
	SELECT create_distributed_function('relay_inside(bigint)', 'p_account', colocate_with => 'payments');
	GRANT EXECUTE ON FUNCTION relay_inside TO relay;});
is(sqlstate_of(q{SELECT relay_inside(1)}, 'relay'), '0A000', '(v) a relay function in a delegated call: 0A000');
is(sqlstate_of(q{SELECT * FROM idem_outbox_claim('r')}, 'app'), '42501', '(v) a role without the grant: 42501');

# ---------------------------------------------------------------------------------
# (k) Nothing pending; amcheck on every shard
# ---------------------------------------------------------------------------------

is(query(q{SELECT count(*) FILTER (WHERE state <> 'd') || '|' || count(*) FILTER (WHERE attempt = 0)
           FROM idempotency.routed_outbox}), '0|0', '(k) every event delivered, none never handed out');
is(scalar(@{ claim('relay-1', 100) }), 0, '(k) a claim finds nothing more');
# 4 indexes of routed_outbox, 1 of the aggregates.
IdemCheck::amcheck_routed($coordinator, \@workers, '^routed_outbox.*_[0-9]+$', 'idempotency.routed_outbox', 5);

# ---------------------------------------------------------------------------------
# (d) A domain with a check as the distribution column (issue 41): over bigint, a check
#     that refuses 0 and every negative number; over text, one that refuses every
#     number, so that the relay finds no value to try for any shard and reads the
#     routes of the shards' waiting events instead. The store taken back and
#     distributed again with each. (Citus 14.0.1 misroutes some queries of its own on
#     a domain column, WHERE account = 1 among them: the checks here go through the
#     extension's functions, and read the shards whole.)
# ---------------------------------------------------------------------------------

# The events of each shard of routed_outbox that are not delivered yet, and on how many
# nodes those shards are: "shards|nodes".
sub waiting_shards {
	return query(q{SELECT count(*) || '|' || count(DISTINCT s.nodeport)
	               FROM run_command_on_shards('idempotency.routed_outbox',
	                                          $$SELECT count(*) FROM %s WHERE state <> 'd'$$) r
	               JOIN citus_shards s USING (shardid) WHERE r.result::bigint > 0});
}

# The SQLSTATE of a statement run as app on $node.
sub sqlstate_on {
	my ($node, $sql) = @_;
	my ($out, $err) = ('', '');
	$node->psql('postgres', "\\set VERBOSITY verbose\n$sql", stdout => \$out, stderr => \$err,
		extra_params => [ '-U', 'app' ]);
	return $err =~ /ERROR:\s+([0-9A-Z]{5}):/ ? $1 : "no error ($out)";
}

for my $domain (
	[ 'account_id', 'bigint', 'CHECK (VALUE > 0)', [ 1 .. 12 ], '-1' ],
	[ 'tenant_code', 'text', q{CHECK (VALUE ~ '^t-[a-z]+$')}, [ map { "t-$_" } 'a' .. 'l' ], q{'T-1'::text} ])
{
	my ($type, $base, $check, $routes, $refused) = @$domain;
	my $table = "ledger_$base";
	# Delivered events are all there is: the store may be taken back.
	query(q{DELETE FROM idempotency.routed_outbox});
	query(q{DELETE FROM idempotency.routed_outbox_aggregates});
	query(q{SELECT idem_undistribute()});
	query(qq{CREATE DOMAIN $type AS $base $check;
	         CREATE TABLE $table (account $type NOT NULL, id bigserial, PRIMARY KEY (account, id));
	         SET citus.shard_count = 4;
	         SELECT create_distributed_table('$table', 'account');});
	query(qq{SELECT idem_distribute('$table')});
	is(query(q{SELECT format_type(atttypid, atttypmod) FROM pg_attribute
	           WHERE attrelid = 'idempotency.routed_outbox'::regclass AND attname = 'route'}),
		$type, "(d) $type: the store routed by the domain");
	# 3 events of aggregate dom-<route> per route, from blocks on the coordinator.
	as_app(join("\n", map { my $r = $_;
		map { "BEGIN; SELECT idem_emit('dom', '{\"n\": $_}', 'dom-$r', route => '$r'::$type); COMMIT;" } 1 .. 3 } @$routes));
	my $events = 3 * @$routes;
	like(waiting_shards(), qr/^[2-4]\|2$/, "(d) $type: the $events events in shards on both workers");
	# A route of the base type (or one cast implicitly to it) that the domain refuses:
	# refused as an implicit cast to the domain would be, wherever the call runs (on
	# a worker, for the shard there, too), and nothing stored.
	is(join(',', map { sqlstate_on($_, qq{SELECT idem_emit('refused', '{}', route => $refused)}) } @nodes),
		'23514,23514,23514', "(d) $type: a route $refused the domain refuses: 23514 on every node");
	is(query(q{SELECT sum(result::bigint) FROM run_command_on_shards('idempotency.routed_outbox',
	             $$SELECT count(*) FROM %s WHERE topic = 'refused'$$)}), '0', "(d) $type: and nothing stored");

	# A shard holding some of them moved to the other worker first (its copy checks
	# the domain's constraints on every route).
	my ($moving, $port_d) = split /\|/, query(q{
		SELECT r.shardid || '|' || s.nodeport
		FROM run_command_on_shards('idempotency.routed_outbox', $$SELECT count(*) FROM %s$$) r
		JOIN citus_shards s USING (shardid) WHERE r.result::bigint > 0 ORDER BY r.shardid LIMIT 1});
	my ($to_d) = grep { $_ != $port_d } map { $_->port } @workers;
	IdemCitus::move_shard($coordinator, $moving, $port_d, $to_d, 'block_writes');
	is(query(qq{SELECT nodeport FROM citus_shards WHERE shardid = $moving}), $to_d,
		"(d) $type: a shard of the events moved");

	# Claimed 5 at a time by one relay, acknowledged each time from a fresh session.
	my (%handed_out, %order_d);
	my ($handed, $acked) = (0, 0);
	for (1 .. 50) {
		my $batch = claim('relay-d', 5, q{, topics => '{dom}'});
		last if !@$batch;
		for my $row (@$batch) {
			$handed++;
			$handed_out{ $row->[0] }++;
			push @{ $order_d{ $row->[1] } }, $row->[2];
		}
		$acked += ack('relay-d', $batch);
	}
	is(scalar(keys %handed_out) . "|$handed|$acked", "$events|$events|$events",
		"(d) $type: each of the $events events handed out once and acknowledged");
	is(scalar(grep { join(',', @{ $order_d{$_} }) eq '1,2,3' } keys %order_d), scalar(@$routes),
		"(d) $type: each aggregate in seq order");

	# A dead letter, listed, retried, delivered.
	as_app(qq{SELECT idem_emit('dom-dl', '{}', 'dl', event_id => 'dl-$type', route => '$routes->[0]'::$type)});
	is(join(',', map { "$_->[0]:$_->[3]" } @{ claim('relay-d', 10, q{, topics => '{dom-dl}'}) }), "dl-$type:1",
		"(d) $type: the next event handed out");
	is(as_relay(qq{SELECT idem_outbox_dead('relay-d', '{dl-$type}', 'poison')}), '1', "(d) $type: dead");
	is(as_relay(q{SELECT string_agg(event_id || ':' || reason, ',') FROM idem_outbox_dead_letters()}),
		"dl-$type:poison", "(d) $type: listed by idem_outbox_dead_letters");
	is(as_relay(q{SELECT idem_outbox_retry()}), '1', "(d) $type: idem_outbox_retry puts it back");
	# Claimed again and acknowledged in one transaction block of a fresh session.
	is(as_relay(qq{BEGIN; SELECT $claim_columns FROM idem_outbox_claim('relay-d', 10, topics => '{dom-dl}');
	               SELECT idem_outbox_ack('relay-d', '{dl-$type}'); COMMIT;}),
		"dl-$type|dl|1|2\n1", "(d) $type: handed out again (attempt 2) and acknowledged, in a block");
	is(as_relay(q{SELECT count(*) FROM idem_outbox_dead_letters()}) . '|' . waiting_shards(), '0|0|0',
		"(d) $type: no dead letter left, nothing waiting in any shard");
	is(scalar(@{ claim('relay-d', 100) }), 0, "(d) $type: a claim finds nothing more");
}

$_->stop for @nodes;
done_testing();
