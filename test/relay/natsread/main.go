// natsread, for test/t/033_relay.pl:
//
//	natsread URL create STREAM SUBJECT
//	    creates a JetStream stream (file storage, 2 minute duplicate window);
//	natsread URL dump STREAM
//	    prints each message of the stream as a JSON line {"id", "aggregate", "seq",
//	    "topic"} from its headers, in stream order;
//	natsread URL consume STREAM DURABLE SUBJECT
//	    a durable pull consumer of the stream's SUBJECT that applies each message in
//	    the database of DATABASE_URL (lib/pq syntax) until killed: in one transaction
//	    idem_once(SCOPE, Nats-Msg-Id) and, when true, a row of applied(event_id, topic,
//	    aggregate, seq); every message received is a row of arrivals, so a repeat
//	    (idem_once false) is an arrival without its applied row. The message is acked
//	    after the commit. One message in flight at a time (MaxAckPending 1): a message
//	    redelivered after a lost ack or a server restart comes before the next, so
//	    the stream's order is the order applied. It rides out a restart of the server
//	    (reconnecting for ever) and of PostgreSQL (the same message tried again until
//	    its transaction commits).
package main

import (
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"

	_ "github.com/lib/pq"
	"github.com/nats-io/nats.go"
)

func main() {
	if len(os.Args) < 4 {
		fmt.Fprintln(os.Stderr, "usage: natsread URL create STREAM SUBJECT | natsread URL dump STREAM | natsread URL consume STREAM DURABLE SUBJECT")
		os.Exit(2)
	}
	opts := []nats.Option{nats.Timeout(5 * time.Second)}
	if os.Args[2] == "consume" {
		opts = append(opts, nats.MaxReconnects(-1), nats.ReconnectWait(250*time.Millisecond), nats.RetryOnFailedConnect(true))
	}
	nc, err := nats.Connect(os.Args[1], opts...)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer nc.Close()
	js, err := nc.JetStream()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	switch os.Args[2] {
	case "create":
		_, err = js.AddStream(&nats.StreamConfig{Name: os.Args[3], Subjects: []string{os.Args[4]},
			Storage: nats.FileStorage, Duplicates: 2 * time.Minute})
	case "dump":
		var info *nats.StreamInfo
		if info, err = js.StreamInfo(os.Args[3]); err == nil {
			out := json.NewEncoder(os.Stdout)
			for seq := info.State.FirstSeq; seq <= info.State.LastSeq && seq > 0; seq++ {
				m, err := js.GetMsg(os.Args[3], seq)
				if err != nil {
					fmt.Fprintln(os.Stderr, err)
					os.Exit(1)
				}
				s, _ := strconv.ParseInt(m.Header.Get("Idem-Seq"), 10, 64)
				out.Encode(map[string]interface{}{"id": m.Header.Get("Nats-Msg-Id"), "topic": m.Header.Get("Idem-Topic"),
					"aggregate": m.Header.Get("Idem-Aggregate"), "seq": s, "subject": m.Subject})
			}
		}
	case "consume":
		if len(os.Args) < 6 {
			fmt.Fprintln(os.Stderr, "usage: natsread URL consume STREAM DURABLE SUBJECT")
			os.Exit(2)
		}
		err = consume(js, os.Args[3], os.Args[4], os.Args[5])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func logf(format string, args ...interface{}) {
	fmt.Fprintf(os.Stderr, "%s "+format+"\n", append([]interface{}{time.Now().Format("15:04:05.000")}, args...)...)
}

func consume(js nats.JetStreamContext, stream, durable, subject string) error {
	db, err := sql.Open("postgres", os.Getenv("DATABASE_URL"))
	if err != nil {
		return err
	}
	db.SetMaxOpenConns(1)
	scope := os.Getenv("SCOPE")
	var sub *nats.Subscription
	var lastErr string
	for {
		if sub == nil {
			sub, err = js.PullSubscribe(subject, durable, nats.BindStream(stream), nats.AckExplicit(),
				nats.MaxAckPending(1), nats.AckWait(2*time.Second), nats.DeliverAll())
			if err != nil {
				if err.Error() != lastErr {
					logf("subscribe: %v", err)
					lastErr = err.Error()
				}
				sub = nil
				time.Sleep(250 * time.Millisecond)
				continue
			}
			logf("consuming %s from stream %s as %s", subject, stream, durable)
			lastErr = ""
		}
		msgs, err := sub.Fetch(1, nats.MaxWait(time.Second))
		if err != nil && !errors.Is(err, nats.ErrTimeout) {
			if err.Error() != lastErr {
				logf("fetch: %v", err)
				lastErr = err.Error()
			}
			if errors.Is(err, nats.ErrBadSubscription) || errors.Is(err, nats.ErrConsumerDeleted) {
				sub = nil
			}
			time.Sleep(100 * time.Millisecond)
			continue
		}
		for _, m := range msgs {
			lastErr = ""
			apply(db, scope, m)
			if err := m.AckSync(nats.AckWait(2 * time.Second)); err != nil {
				logf("ack %s: %v (it comes again)", m.Header.Get("Nats-Msg-Id"), err)
			}
		}
	}
}

// apply records the message in one transaction, tried again until it commits.
func apply(db *sql.DB, scope string, m *nats.Msg) {
	id := m.Header.Get("Nats-Msg-Id")
	topic := m.Header.Get("Idem-Topic")
	aggregate := m.Header.Get("Idem-Aggregate")
	seq, _ := strconv.ParseInt(m.Header.Get("Idem-Seq"), 10, 64)
	attempt, _ := strconv.Atoi(m.Header.Get("Idem-Attempt"))
	said := ""
	for {
		err := func() error {
			tx, err := db.Begin()
			if err != nil {
				return err
			}
			defer tx.Rollback()
			var fresh bool
			if err := tx.QueryRow("SELECT idem_once($1, $2)", scope, id).Scan(&fresh); err != nil {
				return err
			}
			if fresh {
				if _, err := tx.Exec("INSERT INTO applied(event_id, topic, aggregate, seq) VALUES ($1, $2, $3, $4)",
					id, topic, aggregate, seq); err != nil {
					return err
				}
			}
			if _, err := tx.Exec("INSERT INTO arrivals(event_id, topic, aggregate, seq, attempt, status, path) VALUES ($1, $2, $3, $4, $5, 200, $6)",
				id, topic, aggregate, seq, attempt, m.Subject); err != nil {
				return err
			}
			return tx.Commit()
		}()
		if err == nil {
			return
		}
		if err.Error() != said {
			logf("database (%s, tried again): %v", id, err)
			said = err.Error()
		}
		time.Sleep(200 * time.Millisecond)
	}
}
