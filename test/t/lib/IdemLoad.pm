# The concurrent load of test/t/001_concurrency.pl, shared with the pooler test
# (008_pooler.pl) and the background activity test (010): many clients claim, insert
# and complete over a small key space, with random rollbacks; afterwards exact
# invariants must hold. mixed_scripts adds messages applied with idem_once and
# read-only look-ups to the same key space.
package IdemLoad;
use strict;
use warnings;
use Test::More;

# The business table the load writes; `pid` records the server backend of each
# operation, so a pooler test can see transactions move between backends.
sub setup {
	my ($node) = @_;
	$node->safe_psql('postgres', q{
	  CREATE EXTENSION IF NOT EXISTS idempotency;
	  CREATE TABLE business (id bigserial PRIMARY KEY, key text NOT NULL, amount int NOT NULL,
	                         pid int NOT NULL DEFAULT pg_backend_pid());
	  CREATE TABLE inbox (id bigserial PRIMARY KEY, key text NOT NULL);
	});
}

# One pgbench transaction: claim, business insert, complete; one in ten claimed
# operations is rolled back instead (a client failing mid-way), so a later duplicate
# of its key must claim it afresh.
sub script {
	my ($keys) = @_;
	my $script = q{
\set k random(1, KEYS)
\set fail random(1, 10)
BEGIN;
SELECT (outcome = 'claimed')::int AS claimed FROM idem_claim('load', ('key-' || :k)::idem_key, idem_fingerprint(('amount ' || :k)::text), wait => '2s') \gset
\if :claimed
INSERT INTO business (key, amount) VALUES ('key-' || :k, :k);
\if :fail = 1
ROLLBACK;
\else
SELECT idem_complete('load', ('key-' || :k)::idem_key, jsonb_build_object('amount', :k));
COMMIT;
\endif
\else
COMMIT;
\endif
};
	$script =~ s/KEYS/$keys/;
	return $script;
}

# A message consumer: idem_once and the message's effect in one transaction, one in
# ten rolled back (the consumer failing after the insert), so redeliveries either
# skip the message or apply it afresh.
sub once_script {
	my ($keys) = @_;
	my $script = q{
\set k random(1, KEYS)
\set fail random(1, 10)
BEGIN;
SELECT idem_once('once', ('msg-' || :k)::idem_key, wait => '2s')::int AS fresh \gset
\if :fresh
INSERT INTO inbox (key) VALUES ('msg-' || :k);
\endif
\if :fail = 1
ROLLBACK;
\else
COMMIT;
\endif
};
	$script =~ s/KEYS/$keys/;
	return $script;
}

# A read-only look-up of a key of script(): a completed key must hold its own
# response. A wrong one fails the client with an error that names the key (pgbench
# cannot assert, but a failed cast aborts the client and shows its message).
sub lookup_script {
	my ($keys) = @_;
	my $script = q{
\set k random(1, KEYS)
SELECT count(*) AS wrong FROM idem_lookup('load', ('key-' || :k)::idem_key) l
 WHERE l.state <> 'completed' OR l.response <> jsonb_build_object('amount', :k) \gset
\if :wrong
SELECT ('idem_lookup: wrong state or response for key-' || :k)::int;
\endif
};
	$script =~ s/KEYS/$keys/;
	return $script;
}

# The three scripts by name with their weights (NAME@WEIGHT, as pgbench's -f takes
# them): mostly claims, which repeat keys and so also replay.
sub mixed_scripts {
	my ($keys) = @_;
	return {
		'idem_claim@6' => script($keys),
		'idem_once@3' => once_script($keys),
		'idem_lookup@1' => lookup_script($keys),
	};
}

# The invariants of once_script's messages, each a test named with $label.
sub check_once_invariants {
	my ($node, $label) = @_;
	is($node->safe_psql('postgres', q{SELECT count(*) FROM inbox}),
		$node->safe_psql('postgres',
			q{SELECT count(*) FROM idempotency.keys WHERE scope = 'once' AND state = 'c'}),
		"$label: inbox rows == messages applied once");
	is($node->safe_psql('postgres',
			q{SELECT count(*) FROM (SELECT key FROM inbox GROUP BY key HAVING count(*) > 1) d}),
		'0', "$label: no message applied twice");
	is($node->safe_psql('postgres', q{
			SELECT count(*) FROM inbox i
			WHERE NOT EXISTS (SELECT FROM idempotency.keys k
			                  WHERE k.scope = 'once' AND k.key::text = i.key)}),
		'0', "$label: every applied message is stored");
}

# The invariants after a load over $keys keys, each a test named with $label.
sub check_invariants {
	my ($node, $keys, $label) = @_;
	is($node->safe_psql('postgres', q{SELECT count(*) FROM business}),
		$node->safe_psql('postgres',
			q{SELECT count(*) FROM idempotency.keys WHERE scope = 'load' AND state = 'c'}),
		"$label: business rows == completed keys");
	is($node->safe_psql('postgres',
			q{SELECT count(*) FROM (SELECT key FROM business GROUP BY key HAVING count(*) > 1) d}),
		'0', "$label: no key has two business rows");
	is($node->safe_psql('postgres',
			q{SELECT count(*) FROM idempotency.keys WHERE scope = 'load' AND state <> 'c'}),
		'0', "$label: no key is left pending");
	is($node->safe_psql('postgres', q{
			SELECT count(*) FROM idempotency.keys k JOIN business b ON b.key = k.key::text
			WHERE k.scope = 'load' AND k.response <> jsonb_build_object('amount', b.amount)}),
		'0', "$label: every stored response belongs to its business row");
	cmp_ok($node->safe_psql('postgres', q{SELECT count(*) FROM business}), '>', $keys / 4,
		"$label: the load covered a good share of the key space");
}

1;
