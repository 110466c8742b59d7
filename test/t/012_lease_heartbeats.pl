# Lease heartbeats against retrying claimers. A lease holder's idem_checkpoint renews
# the lease, which moves the key's row to a new version with new index entries (a
# non-HOT update). Claimers and idem_once calls that race those updates must only ever
# get the documented outcomes: in_progress from idem_claim (rule 5), IK005 from
# idem_once. Before the probe followed update chains and inserts were arbitrated by
# the unique index, a claim could miss the row between its two versions and come back
# claimed, or insert and fail with a raw 23505.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::RealBin/lib";

my $seconds = $ENV{IDEM_HEARTBEAT_SECONDS} // 8;
my $keys = 4;

my $node = PostgreSQL::Test::Cluster->new('heartbeats');
$node->init;
$node->append_conf('postgresql.conf', qq{
max_connections = 64
synchronous_commit = off
shared_preload_libraries = 'idempotency'
idempotency.reaper_enabled = off
});
$node->start;
$node->safe_psql('postgres', q{
  CREATE EXTENSION idempotency;
  -- Committed lease claims, each held by a heartbeat below.
  SELECT idem_claim('hb', ('k' || g)::idem_key, lease => '1 hour', ttl => '2 hours')
  FROM generate_series(1, 4) g;

  -- A claimer: only in_progress is a right answer while the lease lives.
  CREATE FUNCTION claim_probe(k idem_key) RETURNS void LANGUAGE plpgsql AS $$
  DECLARE c idem_claim_result;
  BEGIN
    c := idem_claim('hb', k, wait => '1s');
    IF c.outcome <> 'in_progress' THEN
      RAISE EXCEPTION 'claim of leased key % returned %', k, c.outcome;
    END IF;
  END $$;

  -- idem_once: only IK005 is a right answer while the lease lives.
  CREATE FUNCTION once_probe(k idem_key) RETURNS void LANGUAGE plpgsql AS $$
  BEGIN
    IF idem_once('hb', k, wait => '1s') THEN
      RAISE EXCEPTION 'idem_once applied leased key %', k;
    END IF;
    RAISE EXCEPTION 'idem_once skipped leased key %', k;
  EXCEPTION WHEN SQLSTATE 'IK005' THEN
    NULL;
  END $$;
});

my $heartbeat = qq{
\\set k random(1, $keys)
SELECT idem_checkpoint('hb', ('k' || :k)::idem_key, 'beat', attempt => 1);
};
my $claimer = qq{
\\set k random(1, $keys)
BEGIN;
SELECT claim_probe(('k' || :k)::idem_key);
COMMIT;
};
my $once = qq{
\\set k random(1, $keys)
SELECT once_probe(('k' || :k)::idem_key);
};

# Heartbeats weigh most: every renewal is a chance for a claim to meet the row
# between its versions.
$node->pgbench(
	"--no-vacuum --client=12 --jobs=2 --time=$seconds",
	0,
	[qr{number of failed transactions: 0}],
	[qr{^$}],
	"heartbeats, claimers and idem_once race for ${seconds}s: only documented outcomes",
	{ 'idem_heartbeat@6' => $heartbeat, 'idem_claimer@3' => $claimer, 'idem_once@3' => $once });

is($node->safe_psql('postgres', q{
		SELECT count(*) FROM idempotency.keys WHERE scope = 'hb' AND state = 'p' AND attempt = 1}),
	$keys, 'every leased key is still pending with its first attempt');
is($node->safe_psql('postgres', q{SELECT count(*) FROM idempotency.keys WHERE scope = 'hb'}),
	$keys, 'and no key has a second row');

$node->stop;
done_testing();
