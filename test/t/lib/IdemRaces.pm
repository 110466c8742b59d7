# Races on one key, shared by both editions' tests (test/t/033_races.pl,
# test/sqlonly/t/006_races.pl): in each round eight sessions are released at the same
# instant (each waits for a table lock a controller session holds, then runs its
# statement), many rounds per scenario; every session's answer must be one the SPEC
# gives for that race, with exactly one winner where the SPEC says so, and no error
# but the SPEC's.
package IdemRaces;
use strict;
use warnings;
use Test::More;
use IPC::Run;

my $CONTENDERS = 8;
our $TODO;

# new(node => N, dbname => D, role => R, admin => A, todo => {SCENARIO => WHY}):
# sessions run as R (a role that is no superuser); A runs idem_reap; the scenarios
# named in todo are TODO tests (a known defect, listed by test/run_all.sh).
sub new {
	my ($class, %params) = @_;
	my $self = bless {%params}, $class;
	$self->{rounds} = $ENV{IDEM_RACE_ROUNDS} // 30;
	$self->{node}->safe_psql($self->{dbname}, q{
	  CREATE TABLE race_barrier ();
	  GRANT SELECT ON race_barrier TO PUBLIC;
	  -- An in-transaction claim that completes what it claimed: its outcome and attempt.
	  CREATE FUNCTION race_take(k idem_key) RETURNS text LANGUAGE plpgsql AS $$
	  DECLARE c idem_claim_result;
	  BEGIN
	    c := idem_claim('race', k, wait => '5 seconds');
	    IF c.outcome = 'claimed' THEN
	      PERFORM idem_complete('race', k, to_jsonb(c.attempt));
	    END IF;
	    RETURN c.outcome || ' ' || c.attempt;
	  END $$;});
	$self->{controller} = $self->{node}->background_psql($self->{dbname}, on_error_stop => 1);
	return $self;
}

# psql as ROLE with each statement as a -c of its own: (exit status, stdout, stderr).
sub _psql_command {
	my ($self, $role, @statements) = @_;
	return [ 'psql', '-X', '-A', '-t', '-q', '-v', 'ON_ERROR_STOP=1', '-v', 'VERBOSITY=verbose',
		'-h', $self->{node}->host, '-p', $self->{node}->port, '-U', $role, '-d', $self->{dbname},
		map { ('-c', $_) } @statements ];
}

sub _as {
	my ($self, $role, @statements) = @_;
	my ($out, $err) = ('', '');
	IPC::Run::run($self->_psql_command($role, @statements), '>', \$out, '2>', \$err)
	  or die "psql as $role failed: $err";
	chomp $out;
	return $out;
}

# One round: SETUP (statements run one by one as the role), then the contenders
# ([role, statement] each) released at once. Returns each one's answer: its output, or
# "ERROR <SQLSTATE> <message>".
sub round {
	my ($self, $setup, @contenders) = @_;
	$self->_as($self->{role}, @$setup) if @$setup;
	$self->{controller}->query_safe('BEGIN; LOCK TABLE race_barrier;');
	my @runs;
	for my $contender (@contenders) {
		my ($role, $sql) = @$contender;
		my ($out, $err) = ('', '');
		my $h = IPC::Run::start(
			$self->_psql_command($role, 'SELECT FROM race_barrier', $sql), '>', \$out, '2>', \$err);
		push @runs, { h => $h, out => \$out, err => \$err };
	}
	my $waiting = scalar @contenders;
	$self->{node}->poll_query_until($self->{dbname}, qq{
	  SELECT count(*) = $waiting FROM pg_locks
	  WHERE relation = 'race_barrier'::regclass AND NOT granted})
	  or die 'the contenders did not all wait at the barrier';
	$self->{controller}->query_safe('COMMIT;');
	my @answers;
	for my $run (@runs) {
		$run->{h}->finish;
		my ($out, $err) = (${ $run->{out} }, ${ $run->{err} });
		chomp $out;
		if ($err =~ /ERROR:\s+([0-9A-Z]{5}):\s+([^\n]*)/) {
			push @answers, "ERROR $1 $2";
		}
		elsif ($err =~ /\S/) {
			push @answers, "STDERR $err";
		}
		else {
			push @answers, $out;
		}
	}
	return @answers;
}

# scenario(NAME, SETUP, CONTENDERS, CHECK, AFTER): `rounds` rounds; CHECK gets the
# answers (in the contenders' order) and AFTER's output (a statement run as the role
# after the round, or undef) and returns '' when the round is right, else why not.
# One assertion per scenario; the first wrong rounds are shown.
sub scenario {
	my ($self, $name, $setup, $contenders, $check, $after) = @_;
	# IDEM_RACE_ONLY=pattern runs only the scenarios whose names match (by hand).
	return if $ENV{IDEM_RACE_ONLY} && $name !~ /$ENV{IDEM_RACE_ONLY}/;
	my @wrong;
	for my $round (1 .. $self->{rounds}) {
		my @answers = $self->round($setup, @$contenders);
		my $state = defined $after ? $self->_as($self->{role}, $after) : undef;
		my $why = $check->(\@answers, $state);
		push @wrong, "round $round: $why [" . join(' | ', @answers) . ']'
		  . (defined $state ? " then [$state]" : '')
		  if $why ne '';
	}
	local $TODO = ($self->{todo} // {})->{$name};
	is(scalar @wrong, 0, "$name: $self->{rounds} rounds of $CONTENDERS sessions at once")
	  or diag(join("\n", @wrong[ 0 .. ($#wrong < 9 ? $#wrong : 9) ]));
}

# The answers as "answer x count" in sorted order, for comparing a round's multiset.
sub tally {
	my (@answers) = @_;
	my %count;
	$count{$_}++ for @answers;
	return join(', ', map { "$_ x $count{$_}" } sort keys %count);
}

# Errors other than those listed (SQLSTATEs), or ''.
sub other_errors {
	my ($answers, @allowed) = @_;
	my %ok = map { $_ => 1 } @allowed;
	my @bad = grep { /^(ERROR|STDERR)/ && !(/^ERROR (\S+)/ && $ok{$1}) } @$answers;
	return @bad ? 'errors the SPEC does not give here: ' . join('; ', @bad) : '';
}

my @STALE = (q{SELECT idem_forget('race', 'k')},
	q{SELECT idem_claim('race', 'k', lease => '1 millisecond')}, q{SELECT pg_sleep(0.005)});

# Every scenario.
sub run_all {
	my ($self) = @_;
	my $role = $self->{role};
	my $lease_take = [ $role, q{SELECT outcome || ' ' || attempt
	  FROM idem_claim('race', 'k', lease => '30 seconds', wait => '5 seconds')} ];
	my $take = [ $role, q{SELECT race_take('k')} ];
	my $state = q{SELECT coalesce((SELECT state || ' ' || attempt FROM idem_lookup('race', 'k')), 'none')};
	my $one_winner = sub {
		my ($win, $lose) = @_;
		my $want = tally($win, ($lose) x ($CONTENDERS - 1));
		return sub {
			my ($answers) = @_;
			my $got = tally(@$answers);
			return $got eq $want ? '' : "want $want";
		};
	};

	# Rule 6: of concurrent takeovers of a stale lease, exactly one wins attempt 2.
	$self->scenario('lease takeovers of a stale lease', \@STALE, [ ($lease_take) x $CONTENDERS ],
		$one_winner->('claimed 2', 'in_progress 2'));
	# In-transaction takeovers that complete: one claims, the others wait and replay.
	$self->scenario('in-transaction takeovers of a stale lease', \@STALE, [ ($take) x $CONTENDERS ],
		sub {
			my ($answers, $after) = @_;
			my $why = $one_winner->('claimed 2', 'replay 2')->($answers);
			return $why ne '' ? $why : $after eq 'completed 2' ? '' : 'the key is not completed by attempt 2';
		}, $state);
	# idem_once on a stale lease: applied once.
	$self->scenario('idem_once on a stale lease', \@STALE,
		[ ([ $role, q{SELECT idem_once('race', 'k', wait => '5 seconds')} ]) x $CONTENDERS ],
		$one_winner->('t', 'f'));
	# An expired key is replaced as if absent: attempt 1, once.
	$self->scenario('claims of an expired key',
		[ q{SELECT idem_forget('race', 'k')},
		  q{BEGIN; SELECT idem_claim('race', 'k', ttl => '1 millisecond'); SELECT idem_complete('race', 'k'); COMMIT;},
		  q{SELECT pg_sleep(0.005)} ],
		[ ($take) x $CONTENDERS ], $one_winner->('claimed 1', 'replay 1'));
	# idem_once_many over stale, expired and absent keys, each batch in its own order:
	# each key applied by exactly one batch.
	my @keys = qw(m1 m2 m3 m4);
	my @batches;
	for my $i (0 .. $CONTENDERS - 1) {
		my @order = map { $keys[ ($_ + $i) % 4 ] } 0 .. 3;
		@order = reverse @order if $i % 2;
		push @batches, \@order;
	}
	$self->scenario('idem_once_many batches sharing stale, expired and absent keys',
		[ map({ qq{SELECT idem_forget('race', '$_')} } @keys),
		  q{SELECT idem_claim('race', 'm1', lease => '1 millisecond'), idem_claim('race', 'm2', lease => '1 millisecond')},
		  q{BEGIN; SELECT idem_claim('race', 'm3', ttl => '1 millisecond'); SELECT idem_complete('race', 'm3'); COMMIT;},
		  q{SELECT pg_sleep(0.005)} ],
		[ map { my $b = $_; [ $role, "SELECT idem_once_many('race', ARRAY['" . join("', '", @$b)
			  . q{']::idem_key[], wait => '5 seconds')} ] } @batches ],
		sub {
			my ($answers) = @_;
			my $why = other_errors($answers);
			return $why if $why ne '';
			my %applied;
			for my $i (0 .. $#batches) {
				my @flags = split /,/, ($answers->[$i] =~ s/[{}]//gr);
				return "batch $i answered $answers->[$i]" unless @flags == 4;
				for my $j (0 .. 3) { $applied{ $batches[$i][$j] }++ if $flags[$j] eq 't' }
			}
			my @wrong = grep { ($applied{$_} // 0) != 1 } @keys;
			return @wrong ? 'applied other than once: ' . join(', ', map { "$_ " . ($applied{$_} // 0) } @wrong) : '';
		});
	# Forgets among in-transaction takeovers: only the SPEC's answers, and never a key
	# left pending.
	$self->scenario('forgets among takeovers', \@STALE,
		[ ([ $role, q{SELECT idem_forget('race', 'k')} ]) x 3, ($take) x ($CONTENDERS - 3) ],
		sub {
			my ($answers, $after) = @_;
			my $why = other_errors($answers, 'IK005');
			return $why if $why ne '';
			my @bad = grep { !/^(t|f|ERROR IK005.*|(claimed|replay|in_progress) [12])$/ } @$answers;
			return "unexpected answers: @bad" if @bad;
			return $after =~ /^(none|completed [12])$/ ? '' : "the key is left $after";
		}, $state);
	# idem_reap marking the stale lease abandoned among lease takeovers: one wins.
	$self->scenario('idem_reap among lease takeovers', \@STALE,
		[ [ $self->{admin}, q{SELECT idem_reap() >= 0} ], ($lease_take) x ($CONTENDERS - 1) ],
		sub {
			my ($answers) = @_;
			my @answers = @$answers;
			my $reap = shift @answers;
			return "idem_reap answered $reap" unless $reap eq 't';
			my $want = tally('claimed 2', ('in_progress 2') x ($CONTENDERS - 2));
			my $got = tally(@answers);
			return $got eq $want ? '' : "want $want";
		});
	# The first holder, back late, finishes while others take over: either its
	# completion wins (the others replay it) or one takeover does (the holder is fenced
	# out with IK003).
	$self->scenario('a late holder finishing among lease takeovers', \@STALE,
		[ [ $role, q{SELECT 'completed' FROM idem_complete('race', 'k', '"holder"', attempt => 1)} ],
		  ($lease_take) x ($CONTENDERS - 1) ],
		sub {
			my ($answers) = @_;
			my @answers = @$answers;
			my $holder = shift @answers;
			my $got = tally(@answers);
			if ($holder eq 'completed') {
				my $want = tally(('replay 1') x ($CONTENDERS - 1));
				return $got eq $want ? '' : "the holder completed: want $want";
			}
			return "the holder answered $holder" unless $holder =~ /^ERROR IK003 /;
			my $want = tally('claimed 2', ('in_progress 2') x ($CONTENDERS - 2));
			return $got eq $want ? '' : "the holder was fenced out: want $want";
		});
	# The same completion delivered eight times: one completes, the others are refused.
	$self->scenario('duplicate completions of a lease claim',
		[ q{SELECT idem_forget('race', 'k')}, q{SELECT idem_claim('race', 'k', lease => '1 hour')} ],
		[ ([ $role, q{SELECT 'completed' FROM idem_complete('race', 'k', to_jsonb(pg_backend_pid()), attempt => 1)} ])
			  x $CONTENDERS ],
		sub {
			my ($answers) = @_;
			my $why = other_errors($answers, 'IK003');
			return $why if $why ne '';
			my $done = grep { $_ eq 'completed' } @$answers;
			return $done == 1 ? '' : "$done completions";
		});
	$self->run_messaging;
	$self->{controller}->quit;
}

# Messaging (SPEC "Messaging"): emits for one aggregate, of one event id, applies of
# one entity's versions and acks of the same events, at once, some of them rolled back.
# Before issue 50's messaging fix the SQL-only idem_emit could end in XX000 "could not
# settle" here.
sub run_messaging {
	my ($self) = @_;
	my $role = $self->{role};
	# The role emits and relays; the outbox is read and emptied through these.
	$self->{node}->safe_psql($self->{dbname}, qq{
	  -- (By name: the native idem_emit has one argument more, route.)
	  DO \$\$
	  DECLARE f regprocedure;
	  BEGIN
	    FOR f IN SELECT p.oid FROM pg_proc p
	             WHERE p.proname IN ('idem_emit', 'idem_outbox_claim', 'idem_outbox_ack') LOOP
	      EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO $role', f);
	    END LOOP;
	  END \$\$;
	  CREATE FUNCTION race_outbox_reset() RETURNS void LANGUAGE sql SECURITY DEFINER AS \$\$
	    DELETE FROM idempotency.outbox WHERE topic = 'race';
	    DELETE FROM idempotency.outbox_aggregates WHERE topic = 'race';
	    DELETE FROM idempotency.applied_versions WHERE scope = 'race';
	    DELETE FROM idempotency.keys WHERE scope = 'race-cap';
	  \$\$;
	  -- A statement's answer (its SQLSTATE if it fails), 'late ' before it if it took
	  -- 1.5 s or more.
	  CREATE FUNCTION race_timed(statement text) RETURNS text LANGUAGE plpgsql AS \$\$
	  DECLARE
	    started timestamptz := clock_timestamp();
	    answer text;
	  BEGIN
	    BEGIN
	      EXECUTE statement INTO answer;
	    EXCEPTION WHEN OTHERS THEN
	      answer := 'ERROR ' || SQLSTATE;
	    END;
	    RETURN CASE WHEN clock_timestamp() - started >= '1.5 s' THEN 'late ' ELSE '' END || answer;
	  END \$\$;
	  -- The race topic's events: "event_id aggregate:seq:state" in seq order.
	  CREATE FUNCTION race_outbox() RETURNS text LANGUAGE sql SECURITY DEFINER AS \$\$
	    SELECT coalesce(string_agg(CASE WHEN o.aggregate IS NULL THEN '' ELSE o.aggregate || ':' || o.seq || ':' END
	                               || o.state::text, ',' ORDER BY o.seq, o.event_id::text), 'none')
	    FROM idempotency.outbox o WHERE o.topic = 'race';
	  \$\$;
	  CREATE FUNCTION race_outbox_ids() RETURNS idem_key[] LANGUAGE sql SECURITY DEFINER AS \$\$
	    SELECT array_agg(o.event_id ORDER BY o.position) FROM idempotency.outbox o WHERE o.topic = 'race';
	  \$\$;
	  CREATE FUNCTION race_applied() RETURNS text LANGUAGE sql SECURITY DEFINER AS \$\$
	    SELECT coalesce((SELECT a.version::text FROM idempotency.applied_versions a
	                     WHERE a.scope = 'race' AND a.entity = 'e'), 'none');
	  \$\$;
	  GRANT EXECUTE ON FUNCTION race_outbox_reset(), race_outbox(), race_outbox_ids(), race_applied(),
	    race_timed(text) TO PUBLIC;});
	my $reset = [q{SELECT race_outbox_reset()}];
	# Five commit, three roll back (their seq is given back).
	my @ends = ((q{COMMIT}) x 5, (q{ROLLBACK}) x 3);
	$self->scenario('emits for one aggregate', $reset,
		[ map { [ $role, qq{BEGIN; SELECT idem_emit('race', '{}', 'agg') IS NOT NULL; $_;} ] } @ends ],
		sub {
			my ($answers, $after) = @_;
			my $why = other_errors($answers);
			return $why if $why ne '';
			my $want = join(',', map { "agg:$_:p" } 1 .. 5);
			return $after eq $want ? '' : "the outbox holds $after, want $want";
		}, q{SELECT race_outbox()});
	# The same past the SQL-only edition's 48-subtransaction cap (60 keys first), each
	# holding the aggregate 0.3 s: every wait still ends within idempotency.wait_timeout
	# (0.2 s), in the event or IK005, and the seqs have no gap.
	$self->scenario('emits for one aggregate past the subtransaction cap', $reset,
		[ ([ $role, q{BEGIN; SET LOCAL idempotency.wait_timeout = '200ms';
		  SELECT count(*) FILTER (WHERE idem_once('race-cap', (pg_backend_pid() || '-' || i)::idem_key)) FROM generate_series(1, 60) i;
		  SELECT race_timed($$SELECT idem_emit('race', '{}', 'agg') IS NOT NULL$$);
		  SELECT 'slept' FROM pg_sleep(0.3); COMMIT;} ]) x $CONTENDERS ],
		sub {
			my ($answers, $after) = @_;
			my $why = other_errors($answers);
			return $why if $why ne '';
			my @emits = map { [ split /\n/ ]->[1] // '' } @$answers;
			# late_past_cap: the edition's documented gap (see test/sqlonly/t/006_races.pl).
			my $answer = $self->{late_past_cap} ? qr/^(late )?(true|ERROR IK005)$/ : qr/^(true|ERROR IK005)$/;
			my @bad = grep { !/$answer/ } @emits;
			return "answered @bad" if @bad;
			my $n = grep { /^(late )?true$/ } @emits;
			my $want = join(',', map { "agg:$_:p" } 1 .. $n);
			return $after eq $want ? '' : "the outbox holds $after, want $want";
		}, q{SELECT race_outbox()});
	# One given event id, with and without the aggregate: one event, the id answered.
	my $i = 0;
	$self->scenario('emits of one event id', $reset,
		[ map { my $aggregate = $i++ % 2 ? q{NULL} : q{'agg'};
			[ $role, qq{BEGIN; SELECT idem_emit('race', '{}', $aggregate, event_id => 'ev'); $_;} ] }
		  @ends ],
		sub {
			my ($answers, $after) = @_;
			my $why = other_errors($answers);
			return $why if $why ne '';
			my @bad = grep { $_ ne 'ev' } @$answers;
			return "answered @bad" if @bad;
			return $after =~ /^(agg:1:)?p$/ ? '' : "the outbox holds $after, want one event";
		}, q{SELECT race_outbox()});
	# Versions 1 to 8 of one entity: the last recorded is 8, and 8 answered true.
	$self->scenario('applies of one entity\'s versions', $reset,
		[ map { [ $role, qq{SELECT idem_apply_version('race', 'e', $_)} ] } 1 .. 8 ],
		sub {
			my ($answers, $after) = @_;
			my $why = other_errors($answers);
			return $why if $why ne '';
			my @bad = grep { !/^[tf]$/ } @$answers;
			return "answered @bad" if @bad;
			return 'version 8 was not applied' unless $answers->[7] eq 't';
			return $after eq '8' ? '' : "recorded $after";
		}, q{SELECT race_applied()});
	# Acks of the same ten events: each counted once in all (a cycle of waits may end one
	# with 40P01, its acks then another's), every event delivered.
	$self->scenario('acks of the same events', [ @$reset,
		q{SELECT count(idem_emit('race', '{}')) FROM generate_series(1, 10)},
		q{SELECT count(*) FROM idem_outbox_claim('race-relay', 100, topics => ARRAY['race'])} ],
		[ ([ $role, q{SELECT idem_outbox_ack('race-relay', race_outbox_ids())} ]) x 8 ],
		sub {
			my ($answers, $after) = @_;
			my $why = other_errors($answers, '40P01');
			return $why if $why ne '';
			my $sum = 0;
			$sum += $_ for grep { /^\d+$/ } @$answers;
			return "acked $sum" unless $sum == 10;
			return $after eq join(',', ('d') x 10) ? '' : "the outbox holds $after";
		}, q{SELECT race_outbox()});
}

1;
