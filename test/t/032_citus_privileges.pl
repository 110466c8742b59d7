# Privileges on a distributed store (SPEC v1.4, "Security"; issue 41, item 2): a twin
# (<function>_routed) refuses whoever may not execute its public function, checked at
# every call on the node where it runs, and a GRANT or REVOKE on the public function
# made on the coordinator after idem_distribute reaches every node. A coordinator and
# two workers, `payments` distributed by `account` in 4 shards. An application's own
# public.idem_emit(text) and public.idem_claim(text) are there from the start.
#
#   (u) a store distributed with 1.4 (twins with a copy of their function's grants),
#       then ALTER EXTENSION idempotency UPDATE: the twins become executable by PUBLIC
#       on every node, the check being inside; the grants made before still hold
#       (a role refused idem_claim is refused idem_claim_routed, on every node), and a
#       later GRANT on the coordinator works everywhere;
#   (r) distributed again with 1.5, then the README's recipe applied on the coordinator
#       only (REVOKE EXECUTE ... FROM PUBLIC, GRANT to the application's role) for
#       idem_claim, idem_emit and idem_outbox_claim: a third role is refused (42501,
#       "permission denied for function <public function>") by each twin on the
#       coordinator and on both workers (connected directly), and by the transaction
#       block through the coordinator; nothing is stored;
#   (g) a later GRANT on the coordinator: the same calls work on every node; a REVOKE
#       again: refused again everywhere;
#   (a) the application's own functions: still theirs, and they lend nothing to a twin.
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

IdemCitus::require_citus();

my ($coordinator, $worker1, $worker2) = IdemCitus::start_cluster(extension_version => '1.4');
my @nodes = ($coordinator, $worker1, $worker2);
my %name = ($coordinator->port => 'coordinator', $worker1->port => 'worker1', $worker2->port => 'worker2');

sub query { return $coordinator->safe_psql('postgres', $_[0]) }

# The SQLSTATE and message of $sql run as $user on $node ("ok: <output>" without error).
sub outcome {
	my ($node, $user, $sql) = @_;
	my ($out, $err) = ('', '');
	$node->psql('postgres', "\\set VERBOSITY verbose\n\\set ON_ERROR_STOP 1\n$sql", stdout => \$out,
		stderr => \$err, extra_params => [ '-U', $user ]);
	return $err =~ /ERROR:\s+([0-9A-Z]{5}):\s+([^\n]*)/ ? "$1: $2" : "ok: $out";
}

# Roles (Citus creates them on the workers), the business table, and the application's
# own functions named like two of the extension's, executable by PUBLIC.
query(q{
	CREATE ROLE app LOGIN; CREATE ROLE other LOGIN; CREATE ROLE relay LOGIN;
	SET citus.shard_count = 4;
	CREATE TABLE payments (id bigserial, account bigint NOT NULL, amount numeric,
	                       PRIMARY KEY (account, id));
	SELECT create_distributed_table('payments', 'account');
	CREATE FUNCTION public.idem_emit(t text) RETURNS text LANGUAGE sql AS $$ SELECT 'app:' || t $$;
	CREATE FUNCTION public.idem_claim(t text) RETURNS text LANGUAGE sql AS $$ SELECT 'app:' || t $$;});

my $claim_sig = q{idem_claim(text, idem_key, bytea, interval, interval, interval, "any")};
my $emit_sig = q{idem_emit(text, jsonb, text, jsonb, idem_key, "any")};
my $relay_sig = q{idem_outbox_claim(text, integer, interval, text[])};

# An account whose shard is on each node (port => account), for calls made directly on
# a worker that run there.
my %account_on;
for my $account (1 .. 40) {
	my $port = query(qq{SELECT nodeport FROM citus_shards WHERE table_name = 'payments'::regclass
	                    AND shardid = get_shard_id_for_distribution_column('payments', ${account}::bigint)});
	$account_on{$port} //= $account;
}
is(scalar(grep { defined $account_on{ $_->port } } $worker1, $worker2), 2, 'an account on each worker');

# The twins' calls, as clients would make them (key $key, account $a; a lease claim,
# which may commit pending).
sub claim_routed {
	my ($key, $a) = @_;
	return qq{SELECT outcome FROM idem_claim_routed('pay', '$key', NULL, NULL, '1 minute', NULL, ${a}::bigint, 5000)};
}
sub emit_routed {
	my ($a) = @_;
	return qq{SELECT idem_emit_routed('t', '{}', NULL, NULL, NULL, ${a}::bigint, 5000)};
}
sub relay_routed {
	my ($a) = @_;
	return qq{SELECT count(*) FROM idem_outbox_claim_routed('r', 10, '1 minute', '{nothing}', ${a}::bigint, 5000)};
}
sub block_routed {
	my ($key, $a) = @_;
	return qq{BEGIN;
SELECT outcome FROM idem_claim_routed('pay', '$key', NULL, NULL, NULL, NULL, ${a}::bigint, 5000);
SELECT idem_complete_routed('pay', '$key', '{}', NULL, ${a}::bigint, 5000);
COMMIT;};
}

# Every twin call of a role on every node: "node:outcome" lines, outcomes reduced to
# "ok" or the SQLSTATE and message.
sub on_every_node {
	my ($user, $make_sql, $tag) = @_;
	my @lines;
	for my $node (@nodes) {
		my $a = $account_on{ $node->port } // 1;
		my $result = outcome($node, $user, $make_sql->("$tag-" . $name{ $node->port }, $a));
		$result = 'ok' if $result =~ /^ok:/;
		push @lines, $name{ $node->port } . ": $result";
	}
	return join("\n", @lines);
}
sub refused_everywhere {
	my ($function) = @_;
	return join("\n", map { "$_: 42501: permission denied for function $function" } qw(coordinator worker1 worker2));
}
my $ok_everywhere = join("\n", map { "$_: ok" } qw(coordinator worker1 worker2));

sub keys_stored {
	my ($prefix) = @_;
	return query(qq{SELECT count(*) FROM idempotency.routed_keys WHERE key::text LIKE '$prefix%'});
}

# ---------------------------------------------------------------------------------
# (u) A store distributed with 1.4, then the update
# ---------------------------------------------------------------------------------

# The README's recipe on every node before idem_distribute, as 1.4 wanted it: 1.4
# copies it to the twins.
$_->safe_psql('postgres', qq{REVOKE EXECUTE ON FUNCTION $claim_sig FROM PUBLIC;
	GRANT EXECUTE ON FUNCTION $claim_sig TO app;}) for @nodes;
query(q{SELECT idem_distribute('payments')});
query(q{ALTER EXTENSION idempotency UPDATE});
is(join(',', map { $_->safe_psql('postgres', q{SELECT extversion FROM pg_extension WHERE extname = 'idempotency'}) } @nodes),
	'1.5,1.5,1.5', '(u) updated on every node');
for my $node (@nodes) {
	is($node->safe_psql('postgres', q{
		SELECT count(*) FILTER (WHERE has_function_privilege('other', p.oid, 'EXECUTE')
		                          AND NOT proacl::text LIKE '%app=%') || '|' || count(*)
		FROM pg_proc p WHERE p.proname LIKE 'idem\_%\_routed'}),
		'16|16', "(u) $name{ $node->port }: the 16 twins are executable by PUBLIC, no copied grant left");
}
is(on_every_node('other', \&claim_routed, 'u-other'), refused_everywhere('idem_claim'),
	'(u) a role refused idem_claim is refused idem_claim_routed on every node');
is(on_every_node('app', \&claim_routed, 'u-app'), $ok_everywhere, '(u) the role granted idem_claim claims on every node');
query(qq{GRANT EXECUTE ON FUNCTION $claim_sig TO other});
is(on_every_node('other', \&claim_routed, 'u-later'), $ok_everywhere,
	'(u) a GRANT on the coordinator after the update: idem_claim_routed works on every node');
is(keys_stored('u-'), '6', '(u) the 6 keys claimed stored, none of the refused');

# ---------------------------------------------------------------------------------
# (r) Distributed again with 1.5; the README's recipe on the coordinator only
# ---------------------------------------------------------------------------------

query(q{DELETE FROM idempotency.routed_keys; SELECT idem_undistribute(); SELECT idem_distribute('payments')});
query(qq{GRANT EXECUTE ON FUNCTION $claim_sig TO PUBLIC});
is(outcome($worker1, 'other', claim_routed('r-before', $account_on{ $worker1->port })), "ok: claimed",
	'(r) before the recipe, anyone claims');
query(qq{
	REVOKE EXECUTE ON FUNCTION $claim_sig FROM PUBLIC; GRANT EXECUTE ON FUNCTION $claim_sig TO app;
	REVOKE EXECUTE ON FUNCTION $emit_sig FROM PUBLIC, other; GRANT EXECUTE ON FUNCTION $emit_sig TO app;
	REVOKE EXECUTE ON FUNCTION $claim_sig FROM other;
	GRANT EXECUTE ON FUNCTION $relay_sig TO relay;});
for my $node ($worker1, $worker2) {
	is($node->safe_psql('postgres', qq{
		SELECT has_function_privilege('other', '$claim_sig', 'EXECUTE') || '|'
		    || has_function_privilege('app', '$claim_sig', 'EXECUTE') || '|'
		    || has_function_privilege('other', '$emit_sig', 'EXECUTE') || '|'
		    || has_function_privilege('relay', '$relay_sig', 'EXECUTE')}),
		'false|true|false|true', "(r) $name{ $node->port }: the grants made on the coordinator are there");
}
is(outcome($coordinator, 'other', q{SELECT idem_claim('pay', 'r-x', route => 1)}),
	'42501: permission denied for function idem_claim', '(r) idem_claim itself: 42501');
is(on_every_node('other', \&claim_routed, 'r-other'), refused_everywhere('idem_claim'),
	'(r) idem_claim_routed refuses the third role on the coordinator and on both workers');
is(outcome($coordinator, 'other', block_routed('r-block', 1)),
	'42501: permission denied for function idem_claim',
	'(r) the transaction block through the coordinator (idem_claim_routed, idem_complete_routed): 42501');
is(on_every_node('other', sub { emit_routed($_[1]) }, 'r'), refused_everywhere('idem_emit'),
	'(r) idem_emit_routed refuses a role refused idem_emit, on every node');
is(on_every_node('other', sub { relay_routed($_[1]) }, 'r'), refused_everywhere('idem_outbox_claim'),
	'(r) idem_outbox_claim_routed refuses a role refused idem_outbox_claim, on every node');
is(keys_stored('r-') . '|' . query(q{SELECT count(*) FROM idempotency.routed_outbox}), '1|0',
	'(r) nothing stored by the refused calls (only the claim before the recipe)');
is(on_every_node('app', \&claim_routed, 'r-app'), $ok_everywhere, '(r) the application\'s role claims on every node');
is(on_every_node('app', sub { emit_routed($_[1]) }, 'r'), join("\n", map { "$_: ok" } qw(coordinator worker1 worker2)),
	'(r) and emits on every node');
is(outcome($coordinator, 'app', block_routed('r-app-block', 1)) =~ /^ok:/ ? 'ok' : 'refused', 'ok',
	'(r) and runs the transaction block through the coordinator');
is(on_every_node('relay', sub { relay_routed($_[1]) }, 'r'), $ok_everywhere, '(r) the relay claims on every node');

# ---------------------------------------------------------------------------------
# (g) A later GRANT, then a REVOKE, on the coordinator
# ---------------------------------------------------------------------------------

query(qq{GRANT EXECUTE ON FUNCTION $claim_sig, $emit_sig, $relay_sig TO other});
is(on_every_node('other', \&claim_routed, 'g-other'), $ok_everywhere, '(g) after the GRANT: idem_claim_routed on every node');
is(outcome($coordinator, 'other', block_routed('g-block', 1)) =~ /^ok:/ ? 'ok' : 'refused', 'ok',
	'(g) and the transaction block through the coordinator');
is(on_every_node('other', sub { emit_routed($_[1]) }, 'g'), $ok_everywhere, '(g) idem_emit_routed on every node');
is(on_every_node('other', sub { relay_routed($_[1]) }, 'g'), $ok_everywhere, '(g) idem_outbox_claim_routed on every node');
query(qq{REVOKE EXECUTE ON FUNCTION $claim_sig, $emit_sig, $relay_sig FROM other});
is(on_every_node('other', \&claim_routed, 'g-again'), refused_everywhere('idem_claim'), '(g) after the REVOKE: refused again on every node');
is(on_every_node('other', sub { relay_routed($_[1]) }, 'g'), refused_everywhere('idem_outbox_claim'),
	'(g) idem_outbox_claim_routed too');

# ---------------------------------------------------------------------------------
# (a) The application's own functions
# ---------------------------------------------------------------------------------

is(outcome($coordinator, 'other', q{SELECT public.idem_emit('x') || public.idem_claim('y')}), 'ok: app:xapp:y',
	'(a) the application\'s idem_emit(text) and idem_claim(text) are still its own, for anyone');
is(query(q{SELECT count(*) FROM pg_proc WHERE proname IN ('idem_emit', 'idem_claim')}), '4',
	'(a) beside the extension\'s');

$_->stop for @nodes;
done_testing();
