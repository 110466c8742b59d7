package main

// The sinks: one file each behind this interface. The loop gives a sink one event at
// a time per aggregate (an aggregate's next event only once the previous one is
// delivered), several aggregates at once; the sink says what became of the event.

import (
	"bufio"
	"context"
	"encoding/json"
	"net"
	"os"
	"sync"
	"time"
)

type Outcome int

const (
	Delivered Outcome = iota
	Retry             // try again later; counts an attempt unless Unreachable
	Dead              // refused for good: a dead letter with Reason
)

type Result struct {
	Outcome     Outcome
	Reason      string
	RetryAfter  time.Duration // the sink asked to wait this long (HTTP Retry-After)
	Unreachable bool          // the sink could not be reached: no attempt counted, sink down
}

type Sink interface {
	Name() string
	// Connect (re)establishes the connection, or checks the sink can be reached.
	Connect(ctx context.Context) error
	// Publish must be safe to call from several goroutines (different aggregates).
	Publish(ctx context.Context, e *Event) Result
	// Flush makes every delivered event durable at the sink before the ack.
	Flush(ctx context.Context) error
	Close()
}

// A sink that keeps a connection says when it loses it (the broker stopped, or closed
// the connection), so that the relay marks the sink down at once, logs it and
// reconnects, whether or not there is anything to publish.
type lossNotifier interface {
	notifyLoss(lost func(error))
}

func delivered() Result { return Result{Outcome: Delivered} }

// envelope is the event as every sink carries it: id, topic, aggregate, seq,
// attempt, emission time, headers and payload.
func envelope(e *Event) []byte {
	b, _ := json.Marshal(e)
	return b
}

// stdoutSink writes one JSON object per line to standard output, flushed before the ack.
type stdoutSink struct {
	mu sync.Mutex
	w  *bufio.Writer
}

func newStdoutSink() *stdoutSink { return &stdoutSink{w: bufio.NewWriterSize(os.Stdout, 1<<16)} }

func (s *stdoutSink) Name() string                      { return "stdout" }
func (s *stdoutSink) Connect(ctx context.Context) error { return nil }
func (s *stdoutSink) Publish(ctx context.Context, e *Event) Result {
	line := append(envelope(e), '\n')
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, err := s.w.Write(line); err != nil {
		return Result{Outcome: Retry, Reason: err.Error(), Unreachable: true}
	}
	return delivered()
}
func (s *stdoutSink) Flush(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Flush()
}
func (s *stdoutSink) Close() { s.Flush(context.Background()) }

// listen is net.Listen for the metrics endpoint (a function so tests could swap it).
var listen = func(addr string) (net.Listener, error) { return net.Listen("tcp", addr) }
