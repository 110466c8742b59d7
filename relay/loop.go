package main

// The loop that joins the source and the sink: claim a batch, publish it (each
// aggregate's events one after another, in seq order; aggregates in parallel), ack
// what was delivered and move what was refused to the dead letters, in one
// transaction. Reconnects with growing, jittered pauses; stops on SIGTERM after acking
// what is in flight.
//
// Order: idem_outbox_claim hands out an aggregate's event only when every earlier one
// is delivered, dead or earlier in the same batch. So within a batch an aggregate's
// events are published strictly one after another, and when one cannot be delivered
// now the rest of its aggregate is left alone: they stay leased and are handed out
// again, in order, when the lease runs out. A publication is never started after the
// lease's safe end (the lease minus a margin), so another relay never gets an event
// while this one may still publish an earlier event of its aggregate.

import (
	"context"
	"math/rand"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

type relay struct {
	cfg      *Config
	src      *source
	sink     Sink
	m        *metrics
	stopping atomic.Bool
	stopCh   chan struct{}
	// hardCtx is cancelled by a second signal: publications in flight are abandoned.
	hardCtx  context.Context
	inflight atomic.Int64 // unix nanos of the oldest event in flight, 0 when none
	// sinkChecked: when the idle loop last asked the sink whether it can be reached.
	sinkChecked time.Time
}

type backoff struct {
	d, max time.Duration
}

func newBackoff(max time.Duration) *backoff { return &backoff{200 * time.Millisecond, max} }

// next returns the pause to take now (between half and all of the current step) and
// doubles the step up to the maximum.
func (b *backoff) next() time.Duration {
	d := b.d
	b.d *= 2
	if b.d > b.max {
		b.d = b.max
	}
	return d/2 + time.Duration(rand.Int63n(int64(d/2)+1))
}
func (b *backoff) reset() { b.d = 200 * time.Millisecond }

// sleep pauses for d; false when stopping cut it short.
func (r *relay) sleep(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-r.stopCh:
		return false
	}
}

func (r *relay) run() int {
	ctx := context.Background()
	dbBackoff, sinkBackoff := newBackoff(r.cfg.MaxBackoff), newBackoff(r.cfg.MaxBackoff)
	checked := false
	for !r.stopping.Load() {
		if !checked {
			if err := r.src.check(ctx); err != nil {
				if fatal, ok := err.(errFatal); ok {
					log.Error("cannot relay", "error", fatal.error)
					return 2
				}
				r.m.db.set(false, err)
				r.sleep(dbBackoff.next())
				continue
			}
			checked = true
			r.m.db.set(true, nil)
		}
		if up, _ := r.m.sink.get(); !up {
			if err := r.sink.Connect(ctx); err != nil {
				r.m.sink.set(false, err)
				r.sleep(sinkBackoff.next())
				continue
			}
			r.m.sink.set(true, nil)
			sinkBackoff.reset()
		}
		start := time.Now()
		events, err := r.src.claim(ctx, r.cfg.BatchSize, r.cfg.Lease, r.cfg.Topics)
		if err != nil {
			if fatal, ok := err.(errFatal); ok {
				log.Error("cannot relay", "error", fatal.error)
				return 2
			}
			r.m.db.set(false, err)
			checked = false
			r.sleep(dbBackoff.next())
			continue
		}
		r.m.db.set(true, nil)
		dbBackoff.reset()
		if len(events) == 0 {
			r.checkIdleSink(ctx)
			r.sleep(r.cfg.Idle)
			continue
		}
		if code := r.deliverBatch(ctx, events, start); code != 0 {
			return code
		}
	}
	log.Info("stopped", "reason", "signal")
	return 0
}

// sinkCheckEvery: how often an idle relay asks the sink whether it can still be reached.
const sinkCheckEvery = 5 * time.Second

// checkIdleSink lets /healthz and idem_relay_up follow a sink that goes away (or comes
// back) while there is nothing to publish: publishing is what notices it otherwise
// (a sink that keeps a connection also says when it loses it: lossNotifier).
func (r *relay) checkIdleSink(ctx context.Context) {
	if time.Since(r.sinkChecked) < sinkCheckEvery {
		return
	}
	r.sinkChecked = time.Now()
	if err := r.sink.Connect(ctx); err != nil {
		r.m.sink.set(false, err)
	}
}

type outcome struct {
	delivered bool
	dead      string
}

func (r *relay) margin() time.Duration {
	var t time.Duration
	switch r.cfg.Sink {
	case "http":
		t = r.cfg.HTTPTimeout
	case "amqp":
		t = r.cfg.AMQPTimeout
	case "nats":
		t = r.cfg.NATSTimeout
	}
	m := r.cfg.Lease / 4
	if t > m {
		m = t
	}
	if m > r.cfg.Lease/2 {
		m = r.cfg.Lease / 2
	}
	return m
}

func (r *relay) deliverBatch(ctx context.Context, events []*Event, start time.Time) int {
	leaseEnd := start.Add(r.cfg.Lease)
	safeEnd := leaseEnd.Add(-r.margin())
	r.m.batchEvents.Observe(float64(len(events)))
	oldest := events[0].EmittedAt
	for _, e := range events {
		if e.EmittedAt.Before(oldest) {
			oldest = e.EmittedAt
		}
	}
	r.inflight.Store(oldest.UnixNano())
	defer r.inflight.Store(0)

	// Groups in the order of their first event; an event without aggregate is alone.
	var order [][]*Event
	index := map[string]int{}
	for _, e := range events {
		if e.Aggregate == nil {
			order = append(order, []*Event{e})
			continue
		}
		k := e.Topic + "\x00" + *e.Aggregate
		if i, ok := index[k]; ok {
			order[i] = append(order[i], e)
		} else {
			index[k] = len(order)
			order = append(order, []*Event{e})
		}
	}
	var mu sync.Mutex
	results := make(map[string]outcome, len(events))
	sem := make(chan struct{}, r.cfg.Concurrency)
	var wg sync.WaitGroup
	for _, group := range order {
		sem <- struct{}{}
		wg.Add(1)
		go func(group []*Event) {
			defer func() { <-sem; wg.Done() }()
			r.deliverGroup(group, safeEnd, func(id string, o outcome) {
				mu.Lock()
				results[id] = o
				mu.Unlock()
			})
		}(group)
	}
	wg.Wait()

	var ids []string
	dead := map[string]string{}
	for _, e := range events {
		o, ok := results[e.ID]
		switch {
		case !ok:
		case o.delivered:
			ids = append(ids, e.ID)
		default:
			dead[e.ID] = o.dead
		}
	}
	if len(ids) > 0 {
		if err := r.sink.Flush(r.hardCtx); err != nil {
			// Nothing counts as delivered: the lease hands the batch out again.
			r.m.sink.set(false, err)
			ids = nil
		}
	}
	if len(ids) == 0 && len(dead) == 0 {
		return 0
	}
	// The ack: retried while the database is away. A lease that ran out still counts
	// until another relay takes the events, so it is tried up to a second lease on.
	b := newBackoff(r.cfg.MaxBackoff)
	for {
		acked, err := r.src.finish(ctx, ids, dead)
		if err == nil {
			r.m.db.set(true, nil)
			r.m.headroom.Set(time.Until(leaseEnd).Seconds())
			r.m.batch.Observe(time.Since(start).Seconds())
			if ignored := int64(len(ids)) - acked; ignored > 0 {
				r.m.ackLost.Add(float64(ignored))
				log.Warn("acks ignored: the lease had passed to another relay; those events are published again",
					"events", ignored, "lease", r.cfg.Lease.String())
			}
			for _, e := range events {
				if o, ok := results[e.ID]; ok {
					if o.delivered && len(ids) > 0 {
						r.m.delivered.WithLabelValues(e.Topic, r.sink.Name()).Inc()
					} else if !o.delivered {
						r.m.dead.WithLabelValues(e.Topic, r.sink.Name()).Inc()
					}
				}
			}
			return 0
		}
		if fatal, ok := err.(errFatal); ok {
			log.Error("cannot relay", "error", fatal.error)
			return 2
		}
		r.m.db.set(false, err)
		if time.Now().After(leaseEnd.Add(r.cfg.Lease)) {
			log.Warn("gave up acking a batch: its events are published again", "events", len(ids)+len(dead))
			return 0
		}
		time.Sleep(b.next())
	}
}

// deliverGroup publishes one aggregate's events of the batch in order. It stops at
// the first event it cannot deliver now: the rest stay leased, for the next hand-out.
func (r *relay) deliverGroup(group []*Event, safeEnd time.Time, record func(string, outcome)) {
	p, ahead := r.sink.(pipeliner)
	for i := 0; i < len(group); {
		if ahead && p.window() > 1 && len(group)-i > 1 {
			if i += r.deliverAhead(p, group[i:], safeEnd, record); i == len(group) {
				return
			}
		}
		if !r.deliverOne(group[i], safeEnd, record) {
			return
		}
		i++
	}
}

// A pipeliner (RabbitMQ with --amqp-pipeline above 1) takes several of an aggregate's
// events before the first is confirmed: send publishes, the function it returns waits
// for that event's result.
type pipeliner interface {
	window() int
	send(ctx context.Context, e *Event) func() Result
}

// deliverAhead publishes up to the sink's window of events at once and returns how many
// from the first on were delivered; the first that was not is left to deliverOne, which
// retries it alone (and republishes those after it).
func (r *relay) deliverAhead(p pipeliner, events []*Event, safeEnd time.Time, record func(string, outcome)) int {
	if len(events) > p.window() {
		events = events[:p.window()]
	}
	t0 := time.Now()
	var waits []func() Result
	for _, e := range events {
		if time.Now().After(safeEnd) || r.hardCtx.Err() != nil {
			break
		}
		waits = append(waits, p.send(r.hardCtx, e))
	}
	delivered, refused := 0, false
	for i, wait := range waits {
		res := wait()
		r.m.publish.WithLabelValues(r.sink.Name()).Observe(time.Since(t0).Seconds())
		switch {
		case res.Outcome == Delivered && delivered == i:
			record(events[i].ID, outcome{delivered: true})
			delivered++
		case res.Outcome == Delivered && refused:
			log.Warn("an event was confirmed after an earlier one of its aggregate was refused: it may reach consumers first",
				"aggregate", *events[i].Aggregate, "seq", *events[i].Seq, "sink", r.sink.Name())
			refused = false
		case res.Outcome == Retry && !res.Unreachable && delivered == i:
			refused = true
		}
	}
	return delivered
}

// deliverOne publishes one event until the sink takes it or refuses it for good; false
// when it must wait for another hand-out (the lease's safe end, a stop).
func (r *relay) deliverOne(e *Event, safeEnd time.Time, record func(string, outcome)) bool {
	name := r.sink.Name()
	b := newBackoff(r.cfg.MaxBackoff)
	tries := 0
	for {
		if time.Now().After(safeEnd) || r.hardCtx.Err() != nil {
			return false
		}
		t0 := time.Now()
		res := r.sink.Publish(r.hardCtx, e)
		r.m.publish.WithLabelValues(name).Observe(time.Since(t0).Seconds())
		if res.Outcome == Delivered {
			record(e.ID, outcome{delivered: true})
			return true
		}
		if res.Outcome == Dead {
			log.Debug("dead letter", "event", e.ID, "reason", res.Reason)
			record(e.ID, outcome{dead: res.Reason})
			return true
		}
		r.m.retried.WithLabelValues(e.Topic, name).Inc()
		wait := res.RetryAfter
		if res.Unreachable {
			r.m.sink.set(false, errString(res.Reason))
		} else if wait == 0 {
			// A refusal the sink answered: an attempt.
			tries++
			if r.cfg.MaxAttempts > 0 && e.Attempt+tries-1 >= r.cfg.MaxAttempts {
				record(e.ID, outcome{dead: "max_attempts (" + strconv.Itoa(r.cfg.MaxAttempts) + ") reached: " + res.Reason})
				return true
			}
		}
		if wait == 0 {
			wait = b.next()
		}
		if r.stopping.Load() || time.Now().Add(wait).After(safeEnd) {
			return false
		}
		if !r.sleep(wait) {
			return false
		}
		if res.Unreachable {
			// Wait for the sink to come back rather than hammer it per aggregate.
			if err := r.sink.Connect(r.hardCtx); err != nil {
				continue
			}
			r.m.sink.set(true, nil)
		}
	}
}

type errString string

func (e errString) Error() string { return string(e) }
