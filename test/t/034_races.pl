# Races on one key (test/t/lib/IdemRaces.pm): eight sessions released at the same
# instant, 30 rounds of each scenario (IDEM_RACE_ROUNDS): takeovers of a stale lease,
# in-transaction takeovers, idem_once, claims of an expired key, idem_once_many,
# forgets, idem_reap and a late holder's completion among takeovers, duplicate
# completions. test/sqlonly/t/006_races.pl runs the same against the SQL-only edition.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::RealBin/lib";
use IdemRaces;

my $node = PostgreSQL::Test::Cluster->new('races');
$node->init;
$node->append_conf('postgresql.conf', qq{
max_connections = 40
shared_preload_libraries = 'idempotency'
idempotency.reaper_enabled = off
});
$node->start;
$node->safe_psql('postgres', q{
  CREATE EXTENSION idempotency;
  CREATE ROLE alice LOGIN NOSUPERUSER;});
my $superuser = $node->safe_psql('postgres', 'SELECT current_user');
IdemRaces->new(node => $node, dbname => 'postgres', role => 'alice', admin => $superuser)->run_all;

$node->stop;
done_testing();
