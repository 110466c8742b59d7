package main

// The source: the SQL relay calls of the extension (SPEC, Messaging), nothing else.
//
//   idem_outbox_claim(relay, max_events, lease, topics) leases a batch: per aggregate in
//     seq order, an event only once every earlier one of its aggregate is delivered or
//     dead or earlier in the same batch;
//   idem_outbox_ack(relay, ids) marks delivered what is still leased to this relay;
//   idem_outbox_dead(relay, ids, reason) moves refused events to the dead letters.

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/lib/pq"
)

type Event struct {
	ID        string          `json:"id"`
	Topic     string          `json:"topic"`
	Aggregate *string         `json:"aggregate"`
	Seq       *int64          `json:"seq"`
	Attempt   int             `json:"attempt"`
	EmittedAt time.Time       `json:"emitted_at"`
	Headers   json.RawMessage `json:"headers"`
	Payload   json.RawMessage `json:"payload"`
}

type source struct {
	db    *sql.DB
	relay string
	conn  string
}

// errFatal marks a database error no retry cures: the role may not call a relay
// function, or the extension is not there.
type errFatal struct{ error }

func openSource(conn, relay string) (*source, error) {
	// lib/pq reads libpq's environment itself (PGHOST, PGPORT, ...); an empty string
	// is all environment.
	db, err := sql.Open("postgres", conn)
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(3)
	db.SetMaxIdleConns(3)
	db.SetConnMaxIdleTime(5 * time.Minute)
	return &source{db: db, relay: relay, conn: conn}, nil
}

// classify turns a permission or missing-function error into errFatal, with what to do.
func classify(err error, what string) error {
	var pqErr *pq.Error
	if errors.As(err, &pqErr) {
		switch pqErr.Code {
		case "42501":
			return errFatal{fmt.Errorf("%s: %s: the relay's role needs EXECUTE on idem_outbox_claim(text, integer, interval, text[]), idem_outbox_ack(text, idem_key[]) and idem_outbox_dead(text, idem_key[], text) (see relay/README.md)", what, pqErr.Message)}
		case "42883", "3F000", "42P01", "42704":
			return errFatal{fmt.Errorf("%s: %s: is idempotency installed in this database (the extension, or the SQL-only edition's script), and its schema on the role's search_path?", what, pqErr.Message)}
		case "28000", "28P01", "3D000":
			return errFatal{fmt.Errorf("%s: %s", what, pqErr.Message)}
		}
	}
	return err
}

// check verifies at start (and after each reconnection) that the role may call the
// three functions, so a missing grant is one clear error rather than a loop of them.
func (s *source) check(ctx context.Context) error {
	var user string
	var claim, ack, dead bool
	err := s.db.QueryRowContext(ctx, `SELECT current_user,
	    has_function_privilege('idem_outbox_claim(text, integer, interval, text[])', 'EXECUTE'),
	    has_function_privilege('idem_outbox_ack(text, idem_key[])', 'EXECUTE'),
	    has_function_privilege('idem_outbox_dead(text, idem_key[], text)', 'EXECUTE')`).Scan(&user, &claim, &ack, &dead)
	if err != nil {
		return classify(err, "checking the relay functions")
	}
	var missing []string
	for _, f := range []struct {
		name string
		ok   bool
	}{{"idem_outbox_claim", claim}, {"idem_outbox_ack", ack}, {"idem_outbox_dead", dead}} {
		if !f.ok {
			missing = append(missing, f.name)
		}
	}
	if len(missing) > 0 {
		return errFatal{fmt.Errorf("role %q may not execute %v: GRANT EXECUTE ON FUNCTION idem_outbox_claim(text, integer, interval, text[]), idem_outbox_ack(text, idem_key[]), idem_outbox_dead(text, idem_key[], text) TO %s", user, missing, pq.QuoteIdentifier(user))}
	}
	return nil
}

func (s *source) claim(ctx context.Context, max int, lease time.Duration, topics []string) ([]*Event, error) {
	var topicArg interface{}
	if len(topics) > 0 {
		topicArg = pq.Array(topics)
	}
	rows, err := s.db.QueryContext(ctx, `SELECT event_id::text, topic, aggregate, seq, payload::text,
	    headers::text, emitted_at, attempt
	  FROM idem_outbox_claim($1, $2, make_interval(secs => $3), $4::text[])`,
		s.relay, max, lease.Seconds(), topicArg)
	if err != nil {
		return nil, classify(err, "idem_outbox_claim")
	}
	defer rows.Close()
	var events []*Event
	for rows.Next() {
		var e Event
		var agg, headers sql.NullString
		var seq sql.NullInt64
		var payload string
		if err := rows.Scan(&e.ID, &e.Topic, &agg, &seq, &payload, &headers, &e.EmittedAt, &e.Attempt); err != nil {
			return nil, err
		}
		if agg.Valid {
			a := agg.String
			e.Aggregate = &a
		}
		if seq.Valid {
			n := seq.Int64
			e.Seq = &n
		}
		e.Payload = json.RawMessage(payload)
		if headers.Valid {
			e.Headers = json.RawMessage(headers.String)
		} else {
			e.Headers = json.RawMessage("null")
		}
		events = append(events, &e)
	}
	return events, classify(rows.Err(), "idem_outbox_claim")
}

// finish acks the delivered events and moves the dead ones, in one transaction;
// returns how many acks counted.
func (s *source) finish(ctx context.Context, delivered []string, dead map[string]string) (int64, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return 0, err
	}
	defer tx.Rollback()
	var acked int64
	if len(delivered) > 0 {
		if err := tx.QueryRowContext(ctx, `SELECT idem_outbox_ack($1, $2::text[]::idem_key[])`,
			s.relay, pq.Array(delivered)).Scan(&acked); err != nil {
			return 0, classify(err, "idem_outbox_ack")
		}
	}
	for id, reason := range dead {
		if _, err := tx.ExecContext(ctx, `SELECT idem_outbox_dead($1, ARRAY[$2::idem_key], $3)`,
			s.relay, id, reason); err != nil {
			return 0, classify(err, "idem_outbox_dead")
		}
	}
	return acked, tx.Commit()
}

// oldestAge reads idem_stats' oldest undelivered event; ok false when the role may not.
func (s *source) oldestAge(ctx context.Context) (float64, bool, error) {
	var age sql.NullFloat64
	err := s.db.QueryRowContext(ctx, `SELECT extract(epoch FROM clock_timestamp() - outbox_oldest_undelivered_at)::float8 FROM idem_stats()`).Scan(&age)
	if err != nil {
		var pqErr *pq.Error
		if errors.As(err, &pqErr) && (pqErr.Code == "42501" || pqErr.Code == "42883") {
			return 0, false, nil
		}
		return 0, false, err
	}
	if !age.Valid {
		return 0, true, nil
	}
	return age.Float64, true, nil
}
