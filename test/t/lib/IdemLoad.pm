# The concurrent load of test/t/001_concurrency.pl, shared with the pooler test
# (008_pooler.pl): many clients claim, insert and complete over a small key space,
# with random rollbacks; afterwards exact invariants must hold.
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
