# The batch inbox under a crash: two consumers apply a stream of 100,000 messages in
# batches of 100 with idem_once_many (one forward, one backward, each batch
# overlapping the one before by 10 messages, as a redelivered poll would), the server
# is stopped with -m immediate in the middle, and after the restart both are handed
# the whole stream again. Every message's effect exists exactly once (counted), every
# committed batch's keys and effects survive together, and the store's indexes agree
# with the table (amcheck).
use strict;
use warnings;
use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::RealBin/lib";
use IdemCheck;

my $messages = 100_000;

my $node = PostgreSQL::Test::Cluster->new('batch_inbox');
$node->init;
# Waits for the other consumer's batch end at its commit: never near the limit.
$node->append_conf('postgresql.conf', q{
shared_preload_libraries = 'idempotency'
idempotency.wait_timeout = '60s'
});
$node->start;
# The consumer: one transaction per batch, its effects (one row per message applied,
# no unique constraint: a second application would be a second row) committed with
# its keys.
$node->safe_psql('postgres', q{
  CREATE EXTENSION idempotency;
  CREATE TABLE effects (msg_id text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now());
  CREATE PROCEDURE consume(p_ids idem_key[]) LANGUAGE plpgsql AS $$
  BEGIN
    INSERT INTO effects(msg_id)
      SELECT u.id::text FROM unnest(p_ids, idem_once_many('stream', p_ids)) AS u(id, applied)
      WHERE u.applied;
  END $$;
  -- A batch of the stream: messages p_from to p_to, in that order.
  CREATE PROCEDURE consume_range(p_from int, p_to int) LANGUAGE plpgsql AS $$
  DECLARE
    ids idem_key[] := ARRAY(SELECT ('msg-' || g)::idem_key
      FROM generate_series(p_from, p_to, CASE WHEN p_from <= p_to THEN 1 ELSE -1 END) g);
  BEGIN
    CALL consume(ids);
  END $$;});
# A batch's keys in order (the backward consumer's in reverse), as consume gets them.
is($node->safe_psql('postgres', q{
  BEGIN; CALL consume_range(3, 1); SELECT string_agg(msg_id, ' ') FROM effects; ROLLBACK;}),
	'msg-3 msg-2 msg-1', 'a batch, backward');

# The stream as psql scripts of CALLs, one per batch: forward, and backward with each
# batch's keys in reverse order too.
my (@forward, @backward);
for (my $start = 1; $start <= $messages; $start += 90)
{
	my $end = $start + 99 > $messages ? $messages : $start + 99;
	push @forward, "CALL consume_range($start, $end);\n";
	unshift @backward, "CALL consume_range($end, $start);\n";
}
my $forward = "$PostgreSQL::Test::Utils::tmp_check/forward.sql";
my $backward = "$PostgreSQL::Test::Utils::tmp_check/backward.sql";
PostgreSQL::Test::Utils::append_to_file($forward, join('', @forward));
PostgreSQL::Test::Utils::append_to_file($backward, join('', @backward));

# Both consumers at once, psql stopping at the first error.
sub consumers
{
	my @runs;
	for my $script ($forward, $backward)
	{
		my ($out, $err) = ('', '');
		push @runs, [
			IPC::Run::start(
				[ 'psql', '-X', '-q', '-v', 'ON_ERROR_STOP=1', '-f', $script,
				  '-h', $node->host, '-p', $node->port, 'postgres' ],
				'>', \$out, '2>', \$err),
			\$err ];
	}
	return @runs;
}

# Crash in the middle of the load.
my @runs = consumers();
$node->poll_query_until('postgres', q{SELECT count(*) > 30000 FROM effects})
  or die 'the consumers did not get going: ' . join(' ', map { ${ $_->[1] } } @runs);
$node->stop('immediate');
$_->[0]->finish for @runs;    # they fail with the server gone
$node->start;

my $after_crash = $node->safe_psql('postgres', q{
  SELECT (SELECT count(*) FROM effects) || ' ' ||
         (SELECT count(*) FROM idempotency.keys WHERE scope = 'stream')});
my ($effects, $keys) = split / /, $after_crash;
note("after the crash: $effects messages applied, $keys keys stored");
cmp_ok($effects, '>', 30000, 'the crash came in the middle of the stream');
cmp_ok($effects, '<', $messages, 'and before its end');
is($effects, $keys, 'after the crash: one key per effect, committed together');
is($node->safe_psql('postgres', q{SELECT count(*) FROM idempotency.keys WHERE state <> 'c'}),
	'0', 'every stored key completed');

# The whole stream again, to both.
@runs = consumers();
for my $run (@runs)
{
	ok($run->[0]->finish, 'the redelivery ran to its end without an error')
	  or diag(${ $run->[1] });
}

is($node->safe_psql('postgres', q{SELECT count(*), count(DISTINCT msg_id) FROM effects}),
	"$messages|$messages", 'every message applied exactly once');
is($node->safe_psql('postgres', qq{
  SELECT count(*) FROM generate_series(1, $messages) g
  WHERE NOT EXISTS (SELECT FROM effects WHERE msg_id = 'msg-' || g)}),
	'0', 'none missing');
is($node->safe_psql('postgres', q{
  SELECT count(*) FROM idempotency.keys WHERE scope = 'stream' AND state = 'c'}),
	$messages, 'one completed key per message');
# A third delivery applies nothing.
is($node->safe_psql('postgres', qq{
  SELECT count(*) FROM unnest(idem_once_many('stream',
    ARRAY(SELECT ('msg-' || g)::idem_key FROM generate_series(1, $messages) g))) a
  WHERE a}),
	'0', 'the stream delivered once more in one batch applies nothing');

IdemCheck::amcheck_keys($node, 'after the load, the crash and the redelivery');

$node->stop;
done_testing();
