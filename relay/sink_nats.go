package main

// The NATS JetStream sink: publishes to the subject <--nats-subject-prefix><topic> with
// Nats-Msg-Id = the event id (the stream drops a repeat within its duplicate window)
// and awaits the stream's ack. The body is the event's payload; the headers Idem-Topic,
// Idem-Aggregate, Idem-Seq, Idem-Attempt, Idem-Emitted-At and Idem-Headers (the event's
// headers as JSON) carry the rest.
//
// Stream ack: delivered. Not connected: the sink is down. No stream for the subject,
// a timeout, an error from the stream: try again (an attempt).

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
)

type natsSink struct {
	cfg *Config
	mu  sync.Mutex
	nc  *nats.Conn
	js  nats.JetStreamContext
}

func newNATSSink(cfg *Config) *natsSink { return &natsSink{cfg: cfg} }

func (s *natsSink) Name() string { return "nats" }

func (s *natsSink) Connect(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.nc != nil {
		if s.nc.IsConnected() {
			return s.checkStream()
		}
		if s.nc.IsReconnecting() {
			return errors.New("reconnecting to NATS")
		}
		s.nc.Close()
		s.nc = nil
	}
	nc, err := nats.Connect(s.cfg.NATSURL, nats.Name(log.relay), nats.MaxReconnects(-1),
		nats.ReconnectWait(500*time.Millisecond), nats.ReconnectJitter(500*time.Millisecond, time.Second),
		nats.Timeout(s.cfg.NATSTimeout))
	if err != nil {
		return err
	}
	js, err := nc.JetStream()
	if err != nil {
		nc.Close()
		return err
	}
	s.nc, s.js = nc, js
	return s.checkStream()
}

func (s *natsSink) checkStream() error {
	if s.cfg.NATSStream == "" {
		return nil
	}
	if _, err := s.js.StreamInfo(s.cfg.NATSStream, nats.MaxWait(s.cfg.NATSTimeout)); err != nil {
		return fmt.Errorf("stream %q (--nats-stream): %v", s.cfg.NATSStream, err)
	}
	return nil
}

func (s *natsSink) Publish(ctx context.Context, e *Event) Result {
	s.mu.Lock()
	nc, js := s.nc, s.js
	s.mu.Unlock()
	if nc == nil || !nc.IsConnected() {
		return Result{Outcome: Retry, Reason: "not connected to NATS", Unreachable: true}
	}
	msg := nats.NewMsg(s.cfg.NATSPrefix + e.Topic)
	msg.Data = e.Payload
	msg.Header.Set("Idem-Topic", e.Topic)
	if e.Aggregate != nil {
		msg.Header.Set("Idem-Aggregate", *e.Aggregate)
	}
	if e.Seq != nil {
		msg.Header.Set("Idem-Seq", strconv.FormatInt(*e.Seq, 10))
	}
	msg.Header.Set("Idem-Attempt", strconv.Itoa(e.Attempt))
	msg.Header.Set("Idem-Emitted-At", e.EmittedAt.UTC().Format(time.RFC3339Nano))
	if string(e.Headers) != "null" {
		msg.Header.Set("Idem-Headers", string(e.Headers))
	}
	c, cancel := context.WithTimeout(ctx, s.cfg.NATSTimeout)
	defer cancel()
	_, err := js.PublishMsg(msg, nats.MsgId(e.ID), nats.Context(c))
	if err == nil {
		return delivered()
	}
	if !nc.IsConnected() {
		return Result{Outcome: Retry, Reason: err.Error(), Unreachable: true}
	}
	return Result{Outcome: Retry, Reason: "JetStream: " + err.Error()}
}

func (s *natsSink) Flush(ctx context.Context) error { return nil }

func (s *natsSink) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.nc != nil {
		s.nc.Close()
	}
}
