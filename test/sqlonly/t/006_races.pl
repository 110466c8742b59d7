# Races on one key against the SQL-only edition (installed as plain SQL by the
# database owner, so that this runs with or without pg_tle): the scenarios of
# test/t/lib/IdemRaces.pm, which test/t/034_races.pl runs against the native edition.
# Eight sessions of a role that is not the owner released at the same instant, 30
# rounds of each (IDEM_RACE_ROUNDS): exactly one winner where the SPEC says so, and no
# SQLSTATE the SPEC does not name (before issue 50, a takeover could end in XX000
# "could not settle"). Then messaging (IdemRaces::run_messaging): emits for one
# aggregate (also past the 48-subtransaction cap, where the wait stays bounded), of one
# event id, applies of one entity's versions, acks of the same events.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::RealBin/lib", "$FindBin::RealBin/../../t/lib";
use IdemSqlOnly;
use IdemRaces;

IdemSqlOnly::require_no_native();
my $script = IdemSqlOnly::dist_file('sql');

my $node = PostgreSQL::Test::Cluster->new('races');
$node->init;
$node->append_conf('postgresql.conf', "max_connections = 40\n");
$node->start;
$node->safe_psql('postgres', q{
  CREATE ROLE app_owner LOGIN NOSUPERUSER;
  CREATE ROLE alice LOGIN NOSUPERUSER;
  CREATE DATABASE app OWNER app_owner;});
IdemSqlOnly::safe_as($node, 'app_owner', 'app', undef, file => $script);
# A known gap (sqlonly/README.md, "past the subtransaction cap"): after the bounded wait
# in a rolled-back subtransaction the write runs in the transaction itself, and a
# transaction that takes the aggregate's counter between the two is waited for without
# the bound. Under CI load that window was hit once in six runs (PostgreSQL 18: three of
# eight emits answered after 1.5 s). So here an emit past the cap may answer late; the
# rest of that scenario (true or IK005, no gap in the seqs) holds. To be closed in 1.6.
IdemRaces->new(node => $node, dbname => 'app', role => 'alice', admin => 'app_owner', late_past_cap => 1)
  ->run_all;

$node->stop;
done_testing();
