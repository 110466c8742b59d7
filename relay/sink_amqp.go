package main

// The RabbitMQ sink: publishes to one exchange (declared, or checked, at connection)
// with the topic as routing key, `mandatory`, persistent, message_id = the event id,
// the event's payload as body and its topic, aggregate, seq, attempt, emission time and
// headers as AMQP headers; waits for the publisher confirm.
//
// Confirm ack: delivered. Returned as unroutable (no queue bound for the routing key)
// then acked: refused for good, a dead letter. Nack: try again. Connection lost: the
// sink is down.
//
// With --amqp-pipeline N, up to N of an aggregate's events are published before the
// first is confirmed: AMQP keeps a channel's order, and the confirms settle them in
// order. A basic.nack then lets the later events, already routed, reach the queue ahead
// of the refused one's retry; so N > 1 suits brokers that do not nack (queues without
// an overflow of reject-publish).
//
// Returns and confirms are read by one goroutine: the broker sends a message's
// basic.return before its basic.ack, and the client hands the return over (unbuffered)
// before it reads the ack, so the return is recorded before the confirm is looked at.

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

type amqpPending struct {
	id   string
	done chan Result
}

type amqpSink struct {
	cfg     *Config
	lost    func(error) // set once, before the first Connect
	mu      sync.Mutex
	conn    *amqp.Connection
	ch      *amqp.Channel
	pending map[uint64]*amqpPending
}

func newAMQPSink(cfg *Config) *amqpSink { return &amqpSink{cfg: cfg} }

func (s *amqpSink) Name() string { return "amqp" }

func (s *amqpSink) notifyLoss(lost func(error)) { s.lost = lost }

func (s *amqpSink) Connect(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ch != nil && !s.conn.IsClosed() {
		return nil
	}
	if s.conn != nil {
		s.conn.Close()
	}
	conn, err := amqp.DialConfig(s.cfg.AMQPURL, amqp.Config{
		Heartbeat: 10 * time.Second, Properties: amqp.Table{"connection_name": log.relay},
		Dial: func(network, addr string) (net.Conn, error) {
			c, err := amqp.DefaultDial(30*time.Second)(network, addr)
			if err != nil {
				return nil, err
			}
			return newBatchingConn(c), nil
		},
	})
	if err != nil {
		return err
	}
	ch, err := conn.Channel()
	if err != nil {
		conn.Close()
		return err
	}
	if s.cfg.AMQPDeclare {
		err = ch.ExchangeDeclare(s.cfg.AMQPExchange, s.cfg.AMQPExType, true, false, false, false, nil)
	} else {
		err = ch.ExchangeDeclarePassive(s.cfg.AMQPExchange, s.cfg.AMQPExType, true, false, false, false, nil)
	}
	if err != nil {
		conn.Close()
		return fmt.Errorf("exchange %q (--amqp-exchange): %v", s.cfg.AMQPExchange, err)
	}
	if err := ch.Confirm(false); err != nil {
		conn.Close()
		return err
	}
	closed := conn.NotifyClose(make(chan *amqp.Error, 1))
	go func() {
		// Nothing comes when the relay closes it; an error when the broker or the network did.
		if e := <-closed; e != nil && s.lost != nil {
			s.lost(fmt.Errorf("the connection to RabbitMQ was lost: %v", e))
		}
	}()
	returns := ch.NotifyReturn(make(chan amqp.Return))
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, 4096))
	s.conn, s.ch, s.pending = conn, ch, map[uint64]*amqpPending{}
	go s.dispatch(ch, returns, confirms)
	return nil
}

func (s *amqpSink) dispatch(ch *amqp.Channel, returns chan amqp.Return, confirms chan amqp.Confirmation) {
	returned := map[string]string{}
	for {
		select {
		case r, ok := <-returns:
			if !ok {
				returns = nil
				continue
			}
			returned[r.MessageId] = fmt.Sprintf("unroutable: the broker returned it (%d %s): no queue is bound to exchange %q for routing key %q",
				r.ReplyCode, r.ReplyText, r.Exchange, r.RoutingKey)
		case c, ok := <-confirms:
			s.mu.Lock()
			if !ok {
				// The channel closed: whatever waits for a confirm will not get one.
				for tag, p := range s.pending {
					p.done <- Result{Outcome: Retry, Reason: "the connection to RabbitMQ was lost before the confirm", Unreachable: true}
					delete(s.pending, tag)
				}
				if s.ch == ch {
					s.ch = nil
				}
				s.mu.Unlock()
				return
			}
			p := s.pending[c.DeliveryTag]
			delete(s.pending, c.DeliveryTag)
			s.mu.Unlock()
			if p == nil {
				continue
			}
			if reason, ok := returned[p.id]; ok {
				delete(returned, p.id)
				p.done <- Result{Outcome: Dead, Reason: reason}
			} else if c.Ack {
				p.done <- delivered()
			} else {
				p.done <- Result{Outcome: Retry, Reason: "rejected by the broker (basic.nack)"}
			}
		}
	}
}

// amqpHeaders: the event's own headers (nested values as JSON text), then ours.
func amqpHeaders(e *Event) amqp.Table {
	t := amqp.Table{}
	var own map[string]interface{}
	if json.Unmarshal(e.Headers, &own) == nil {
		for k, v := range own {
			switch v.(type) {
			case string, float64, bool, nil:
				t[k] = v
			default:
				b, _ := json.Marshal(v)
				t[k] = string(b)
			}
		}
	}
	t["topic"] = e.Topic
	if e.Aggregate != nil {
		t["aggregate"] = *e.Aggregate
	}
	if e.Seq != nil {
		t["seq"] = *e.Seq
	}
	t["attempt"] = int64(e.Attempt)
	t["emitted_at"] = e.EmittedAt.UTC().Format(time.RFC3339Nano)
	return t
}

func (s *amqpSink) Publish(ctx context.Context, e *Event) Result { return s.send(ctx, e)() }

func (s *amqpSink) window() int { return s.cfg.AMQPPipeline }

// send publishes without waiting; the function returned waits for the confirm (the
// timeout counts from the publication).
func (s *amqpSink) send(ctx context.Context, e *Event) func() Result {
	msg := amqp.Publishing{
		MessageId: e.ID, Type: e.Topic, AppId: "idem-relay", ContentType: "application/json",
		DeliveryMode: amqp.Persistent, Timestamp: e.EmittedAt, Headers: amqpHeaders(e), Body: e.Payload,
	}
	p := &amqpPending{id: e.ID, done: make(chan Result, 1)}
	failed := func(r Result) func() Result { return func() Result { return r } }
	s.mu.Lock()
	if s.ch == nil {
		s.mu.Unlock()
		return failed(Result{Outcome: Retry, Reason: "not connected to RabbitMQ", Unreachable: true})
	}
	tag := s.ch.GetNextPublishSeqNo()
	s.pending[tag] = p
	err := s.ch.PublishWithContext(ctx, s.cfg.AMQPExchange, e.Topic, true, false, msg)
	if err != nil {
		delete(s.pending, tag)
		s.mu.Unlock()
		// The channel or connection is gone (a closed channel is the usual cause).
		return failed(Result{Outcome: Retry, Reason: err.Error(), Unreachable: true})
	}
	s.mu.Unlock()
	t := time.NewTimer(s.cfg.AMQPTimeout)
	return func() Result {
		defer t.Stop()
		select {
		case r := <-p.done:
			return r
		case <-t.C:
			return Result{Outcome: Retry, Reason: fmt.Sprintf("no confirm from RabbitMQ within %v", s.cfg.AMQPTimeout)}
		case <-ctx.Done():
			return Result{Outcome: Retry, Reason: ctx.Err().Error()}
		}
	}
}

func (s *amqpSink) Flush(ctx context.Context) error { return nil }

func (s *amqpSink) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.conn != nil {
		s.conn.Close()
	}
}
