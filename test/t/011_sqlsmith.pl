# SQLsmith against the extension: random queries from a non-superuser role over tables
# of keys, scopes, fingerprints, responses and intervals, calling the extension's
# functions and operators with those values, NULLs and odd ones. Each query runs in a
# transaction that SQLsmith rolls back, and most of them fail; what must hold is
# that the server never crashes, the key store's indexes stay consistent, and every
# key stored before (completed, failed, a live lease, an abandoned lease, another
# role's) is exactly as it was and still replays for its role.
#
# Other seeds and lengths by hand: IDEM_SQLSMITH_SEED=7 IDEM_SQLSMITH_QUERIES=50000
# IDEM_SQLSMITH_TIMEOUT=1800
use strict;
use warnings;
use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::RealBin/lib";
use IdemCheck;

my $seed = $ENV{IDEM_SQLSMITH_SEED} // 1;
my $queries = $ENV{IDEM_SQLSMITH_QUERIES} // 8000;
my $time_limit = $ENV{IDEM_SQLSMITH_TIMEOUT} // 150;
my $sqlsmith = '/usr/bin/sqlsmith';
die "$sqlsmith is missing: install the Debian package sqlsmith (scripts/lib.sh lists it)"
  unless -x $sqlsmith;

my $node = PostgreSQL::Test::Cluster->new('sqlsmith');
$node->init;
# track_functions counts the calls of C functions that returned, so the test can tell
# that the extension was exercised. The log keeps each error's SQLSTATE but not the
# statements (SQLsmith's 17 MB of them are in its own output); a crashed backend's
# query is logged whole. After a crash the server restarts, so that SQLsmith and the
# checks below go on and report everything. No JIT: compiling SQLsmith's large queries
# took half the run and made some hit its 1 s statement timeout (the extension ships
# no bitcode, so JIT does nothing with its functions).
$node->append_conf('postgresql.conf', q{
shared_preload_libraries = 'idempotency'
idempotency.reaper_naptime = '1s'
track_functions = 'all'
log_statement = none
log_min_error_statement = panic
log_line_prefix = '%m [%p] %e %q%a '
track_activity_query_size = '64kB'
restart_after_crash = on
jit = off
});
$node->start;

# The fuzzing role, a bystander role with a key of the same name, and the keys SQLsmith
# will meet: one of each stored state.
$node->safe_psql('postgres', q{
  CREATE EXTENSION idempotency;
  CREATE ROLE smith LOGIN;
  CREATE ROLE bystander LOGIN;

  SET ROLE bystander;
  BEGIN;
  SELECT idem_claim('orders', 'done-1');
  SELECT idem_complete('orders', 'done-1', '{"owner": "bystander"}');
  COMMIT;

  SET ROLE smith;
  BEGIN;
  SELECT idem_claim('orders', 'done-1', idem_fingerprint('amount 1'::text));
  SELECT idem_complete('orders', 'done-1', '{"payment_id": 1}');
  SELECT idem_claim('orders', 'failed-1');
  SELECT idem_fail('orders', 'failed-1', '{"error": "declined"}');
  SELECT idem_once('inbox', 'm-1');
  COMMIT;
  SELECT idem_claim('jobs', 'lease-1', lease => '1 hour');
  SELECT idem_checkpoint('jobs', 'lease-1', 'started', '{"step": 1}', attempt => 1);
  SELECT idem_claim('jobs', 'abandoned-1', lease => '1 second');
  SELECT idem_checkpoint('jobs', 'abandoned-1', 'charged', '{"charge": "ch_1"}', attempt => 1);
  RESET ROLE;
});
# The reaper marks the lease that ran out.
$node->poll_query_until('postgres',
	q{SELECT state FROM idempotency.keys WHERE key = 'abandoned-1'}, 'a')
  or die 'the reaper did not abandon the stale lease';

# What SQLsmith draws values from: 120 rows mixing the stored keys and scopes with
# fresh, invalid, boundary and odd values (its subselects pick rows at offsets up to
# 100), and a table with a unique B-tree and a hash index on an idem_key column, whose
# inserts, updates and merges go through the key type's operator classes.
#
# SQLsmith's own calls of the extension's functions seldom run to the end (most of
# its expressions meet NULLs, or rows its predicates filter out), so its inserts,
# updates, merges and deletes of fuzz.requests also go through the extension as an
# application's would: a trigger claims each row's key, finishes it one of five ways,
# applies a derived message once, looks the key up, and forgets a deleted row's key.
$node->safe_psql('postgres', q{
  CREATE SCHEMA fuzz;
  GRANT USAGE ON SCHEMA fuzz TO smith;
  CREATE TABLE fuzz.requests (scope text, key idem_key, key_text text, fingerprint bytea,
                              response jsonb, ttl interval, lease interval, wait interval,
                              attempt int, point text);
  INSERT INTO fuzz.requests
  SELECT (ARRAY['orders', 'jobs', 'inbox', 'Orders', '', repeat('s', 300)])[1 + i % 6],
         ((ARRAY['done-1', 'failed-1', 'lease-1', 'abandoned-1', 'm-1', 'fresh-' || i,
                 '550e8400-e29b-41d4-a716-' || lpad(i::text, 12, '0'), repeat('k', 255)])
          [1 + i % 8])::idem_key,
         (ARRAY['done-1', 'has space', '', repeat('k', 256), 'schlüssel', E'tab\there',
                'FRESH-' || i, '550E8400-E29B-41D4-A716-446655440000'])[1 + i % 8],
         CASE i % 4 WHEN 0 THEN NULL WHEN 1 THEN idem_fingerprint('amount 1'::text)
                    WHEN 2 THEN '\x'::bytea ELSE decode(repeat('ab', 65), 'hex') END,
         (ARRAY['{"payment_id": 1}', 'null', '[]', '"x"',
                '{"big": "' || repeat('y', 2000) || '"}'])[1 + i % 5]::jsonb,
         (ARRAY['1 day', '-1 day', '0', '1 ms', '100 years'])[1 + i % 5]::interval,
         (ARRAY['1 hour', '1 second', '0', '-1 s', NULL])[1 + i % 5]::interval,
         (ARRAY['0', '10 ms', '-1 s', NULL])[1 + i % 4]::interval,
         (ARRAY[NULL, 1, 2, 3, 4, -1, 2147483647])[1 + i % 7],
         (ARRAY['started', '', repeat('p', 1000), NULL])[1 + i % 4]
  FROM generate_series(1, 120) i;
  CREATE TABLE fuzz.keyed (key idem_key UNIQUE, note text);
  CREATE INDEX ON fuzz.keyed USING hash (key);
  INSERT INTO fuzz.keyed SELECT DISTINCT key, key_text FROM fuzz.requests;
  GRANT SELECT, INSERT, UPDATE, DELETE ON fuzz.requests, fuzz.keyed TO smith;
  -- Arrays of keys, for idem_once_many: repeats, NULL elements, two dimensions, empty,
  -- another lower bound.
  CREATE TABLE fuzz.batches (scope text, keys idem_key[]);
  INSERT INTO fuzz.batches VALUES
    ('inbox', '{m-1,m-2,m-1}'), ('inbox', '{m-3,NULL}'), ('inbox', '{{m-4,m-5},{m-6,m-7}}'),
    ('inbox', '{}'), ('inbox', '[0:1]={m-8,m-9}'), ('jobs', '{lease-1,abandoned-1,fresh-b}'),
    (NULL, '{m-10}'), ('inbox', NULL);
  GRANT SELECT, INSERT, UPDATE, DELETE ON fuzz.batches TO smith;

  CREATE FUNCTION fuzz.request_effect() RETURNS trigger LANGUAGE plpgsql AS $$
  DECLARE c idem_claim_result;
  BEGIN
    IF TG_OP = 'DELETE' THEN
      BEGIN
        PERFORM idem_forget(OLD.scope, OLD.key);
      EXCEPTION WHEN data_exception OR SQLSTATE 'IK000' THEN
        NULL;
      END;
      RETURN OLD;
    END IF;
    -- Refusals of invalid or conflicting requests are the documented outcomes: each
    -- row's calls run in a subtransaction of their own, which an error rolls back
    -- with the row's claims, and the statement goes on. Anything else fails it.
    BEGIN
      c := idem_claim(NEW.scope, NEW.key, NEW.fingerprint, NEW.ttl, NEW.lease, NEW.wait);
      IF c.outcome = 'claimed' THEN
        CASE abs(coalesce(NEW.attempt, 0)::bigint) % 5
          WHEN 0 THEN PERFORM idem_complete(NEW.scope, NEW.key, NEW.response);
          WHEN 1 THEN PERFORM idem_fail(NEW.scope, NEW.key, NEW.response);
          WHEN 2 THEN PERFORM idem_release(NEW.scope, NEW.key);
          WHEN 3 THEN PERFORM idem_checkpoint(NEW.scope, NEW.key, NEW.point, NEW.response,
                                              c.attempt);
          ELSE NULL;  -- left pending: IK002 at commit, but SQLsmith rolls back
        END CASE;
      END IF;
      PERFORM idem_once(NEW.scope, idem_derive(NEW.key, coalesce(NEW.point, '')), NEW.ttl,
                        NEW.wait);
      PERFORM FROM idem_lookup(NEW.scope, NEW.key);
    EXCEPTION WHEN data_exception OR program_limit_exceeded OR SQLSTATE 'IK000' THEN
      NULL;
    END;
    RETURN NEW;
  END $$;
  CREATE TRIGGER request_effect BEFORE INSERT OR UPDATE OR DELETE ON fuzz.requests
    FOR EACH ROW EXECUTE FUNCTION fuzz.request_effect();
});

# SQLsmith picks functions from every routine in pg_proc, over 3,000, so the
# extension's would rarely come up. It reads pg_proc unqualified, so a view of that
# name earlier on its search_path narrows the choice: the extension's functions
# that the role may execute (its set-returning ones shown as scalar, as SQLsmith skips
# those; PostgreSQL allows them in a select list), aggregates without polymorphic
# arguments, and a few catalog functions that make texts, keys, bytes, JSON and
# intervals to pass them. The view shows rows only to SQLsmith's schema reader (by its
# application_name): its test queries, which may select from the view too, find it
# empty.
$node->safe_psql('postgres', q{
  CREATE SCHEMA smith_catalog;
  CREATE VIEW smith_catalog.pg_proc AS
  SELECT p.oid, p.proname, p.pronamespace, p.prorettype, p.proargtypes, p.prokind,
         p.proretset AND NOT x.ext AS proretset
  FROM pg_catalog.pg_proc p,
       LATERAL (SELECT EXISTS (
                  SELECT FROM pg_catalog.pg_depend d
                  JOIN pg_catalog.pg_extension e ON e.oid = d.refobjid
                  WHERE d.classid = 'pg_catalog.pg_proc'::pg_catalog.regclass
                    AND d.objid = p.oid AND d.deptype = 'e'
                    AND e.extname = 'idempotency') AS ext) x
  WHERE pg_catalog.current_setting('application_name') = 'sqlsmith::schema'
    AND ((x.ext AND pg_catalog.has_function_privilege(p.oid, 'EXECUTE'))
         OR (p.prokind = 'a'
             AND NOT EXISTS (SELECT FROM pg_catalog.unnest(p.proargtypes) a
                             JOIN pg_catalog.pg_type t ON t.oid = a WHERE t.typtype = 'p'))
         OR (p.pronamespace = 'pg_catalog'::pg_catalog.regnamespace
             AND p.proname IN ('repeat', 'md5', 'upper', 'chr', 'lpad', 'substr', 'length',
                               'gen_random_uuid', 'decode', 'sha256', 'to_jsonb',
                               'jsonb_strip_nulls', 'make_interval', 'justify_interval',
                               'interval_mul', 'clock_timestamp')));
  GRANT USAGE ON SCHEMA smith_catalog TO smith;
  GRANT SELECT ON smith_catalog.pg_proc TO smith;
});

my $keys_query = q{
  SELECT role::text, scope, key::text, state, attempt, fingerprint, checkpoint,
         checkpoint_data::text, response::text, lease_expires_at, expires_at
  FROM idempotency.keys ORDER BY 1, 2, 3};
my $keys_before = $node->safe_psql('postgres', $keys_query);

my $log_offset = -s $node->logfile;
my $queries_file = $node->basedir . '/sqlsmith_queries.sql';
my $report_file = $node->basedir . '/sqlsmith.log';
my $target = sprintf(
	q{host=%s port=%d dbname=postgres user=smith options='-c search_path=smith_catalog,pg_catalog,public'},
	$node->host, $node->port);
note("sqlsmith --seed=$seed --max-queries=$queries; queries in $queries_file, report in $report_file");
my $smith = IPC::Run::start(
	[ $sqlsmith, "--target=$target", '--exclude-catalog', "--seed=$seed",
	  "--max-queries=$queries", '--dump-all-queries', '--verbose' ],
	'<', \undef, '>', $queries_file, '2>', $report_file,
	IPC::Run::timeout($time_limit));
my $smith_ok;
my $finished = eval { $smith_ok = $smith->finish; 1 };
if (!$finished) {
	$smith->kill_kill;
	diag("sqlsmith did not finish within ${time_limit}s: $@");
}
my $report = slurp_file($report_file);
ok($finished && $smith_ok, "sqlsmith ran $queries queries (seed $seed) within ${time_limit}s")
  or diag(substr($report, -3000));
my ($last_count) = $report =~ /.*^queries: (\d+)$/ms;
is($last_count, $queries, 'sqlsmith reported every query');

# No backend crashed, no assertion or PANIC, nothing leaked (PostgreSQL warns of
# buffer, relcache, snapshot and other leaks at the end of a transaction), and no
# internal error (SQLSTATE class XX: "cache lookup failed", "could not open relation
# with OID 0", corrupted data), whatever the queries were.
my @log = split /\n/, slurp_file($node->logfile, $log_offset);
my @trouble;
for my $i (0 .. $#log) {
	next unless $log[$i] =~
	  /terminated by signal|was terminated by exception|server process .* was terminated|PANIC|TRAP:|leak|not closed|still referenced| XX\d\d\d /;
	my $entry = $log[$i];
	# With the query that crashed: the DETAIL after, up to the next log line.
	if (($log[ $i + 1 ] // '') =~ /Failed process was running/) {
		my $j = $i + 1;
		$entry .= "\n" . $log[ $j++ ];
		$entry .= "\n" . $log[ $j++ ] while $j <= $#log && $log[$j] !~ /^\d{4}-\d\d-\d\d /;
	}
	push @trouble, $entry;
}
is(scalar @trouble, 0, 'no crash, PANIC, leak or internal error in the server log')
  or diag(join "\n", @trouble);
is($node->psql('postgres', 'SELECT 1'), 0, 'the postmaster still answers');

# The extension was exercised: SQLsmith generated calls of its functions, and its
# functions ran to the end (counted once SQLsmith's backend has exited and flushed its
# statistics; calls that raised an error are not counted).
my $generated = slurp_file($queries_file);
for my $function (qw(idem_claim idem_complete idem_fail idem_release idem_checkpoint
	idem_once idem_forget idem_lookup idem_abandoned idem_derive idem_fingerprint idem_key))
{
	my $count = () = $generated =~ /\bpublic\.$function\(/g;
	note("$function: $count calls in the generated queries");
}
$node->poll_query_until('postgres',
	q{SELECT count(*) = 0 FROM pg_stat_activity WHERE application_name LIKE 'sqlsmith%'})
  or die 'the sqlsmith sessions did not end';
my %calls = map { split /\|/ } split /\n/, $node->safe_psql('postgres', q{
  SELECT f.funcid::regprocedure, f.calls
  FROM pg_stat_user_functions f
  JOIN pg_depend d ON d.classid = 'pg_proc'::regclass AND d.objid = f.funcid AND d.deptype = 'e'
  JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'idempotency'});
note("calls of the extension's functions that returned:\n"
	  . join("\n", map { "$_: $calls{$_}" } sort { $calls{$b} <=> $calls{$a} } keys %calls));
for my $function (qw(idem_claim idem_complete idem_fail idem_release idem_checkpoint
	idem_once idem_forget idem_lookup idem_derive idem_fingerprint idem_key_eq))
{
	my $returned = 0;
	$returned += $calls{$_} for grep { /^\Q$function\E\(/ } keys %calls;
	cmp_ok($returned, '>', 0, "$function ran to the end under sqlsmith ($returned calls)");
}

IdemCheck::amcheck_keys($node, 'after sqlsmith');

# Every stored key is as it was, and replays for its role.
is($node->safe_psql('postgres', $keys_query), $keys_before,
	'every stored key is exactly as before');
is($node->safe_psql('postgres', q{
  SET ROLE smith;
  BEGIN;
  SELECT outcome, response FROM idem_claim('orders', 'done-1', idem_fingerprint('amount 1'::text));
  SELECT outcome, response FROM idem_claim('orders', 'failed-1');
  SELECT outcome FROM idem_claim('jobs', 'lease-1');
  SELECT state, checkpoint FROM idem_lookup('jobs', 'lease-1');
  SELECT state, checkpoint FROM idem_lookup('jobs', 'abandoned-1');
  SELECT idem_once('inbox', 'm-1');
  ROLLBACK;}),
	qq{replay|{"payment_id": 1}\nreplay|{"error": "declined"}\nin_progress\npending|started\n}
	  . qq{abandoned|charged\nf},
	"smith's keys replay: completed, failed, the live lease, the abandoned lease, a message");
is($node->safe_psql('postgres', q{
  SET ROLE bystander;
  BEGIN;
  SELECT outcome, response FROM idem_claim('orders', 'done-1');
  ROLLBACK;}),
	q{replay|{"owner": "bystander"}}, "the bystander's key of the same name replays its own response");

$node->stop;
done_testing();
