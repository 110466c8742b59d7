// idem-relay moves the events of the idempotency extension's outbox to a sink:
// RabbitMQ, NATS JetStream, HTTP or standard output. See relay/README.md and --help.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"
	"time"

	_ "github.com/lib/pq"
)

func main() {
	// The live heap is a batch or two of events, a few megabytes: collecting when it
	// has grown fourfold rather than twofold costs that much memory again and saves
	// about a sixth of the relay's CPU per event. GOGC set in the environment wins.
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(400)
	}
	os.Exit(realMain(os.Args[1:]))
}

func realMain(args []string) int {
	cfg, err := loadConfig(args, os.Stdout)
	if err == errHelp {
		return 0
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "idem-relay: %v\n", err)
		return 2
	}
	log.level = logLevels[cfg.LogLevel]
	log.relay = cfg.Name

	var sink Sink
	switch cfg.Sink {
	case "stdout":
		sink = newStdoutSink()
	case "http":
		sink, err = newHTTPSink(cfg)
	case "amqp":
		sink = newAMQPSink(cfg)
	case "nats":
		sink = newNATSSink(cfg)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "idem-relay: %v\n", err)
		return 2
	}
	defer sink.Close()
	src, err := openSource(cfg.Database, cfg.Name)
	if err != nil {
		fmt.Fprintf(os.Stderr, "idem-relay: --database: %v\n", err)
		return 2
	}
	m := newMetrics()
	if cfg.Listen != "" {
		if _, err := m.serve(cfg.Listen); err != nil {
			fmt.Fprintf(os.Stderr, "idem-relay: --listen %s: %v\n", cfg.Listen, err)
			return 2
		}
	}
	hardCtx, hardStop := context.WithCancel(context.Background())
	r := &relay{cfg: cfg, src: src, sink: sink, m: m, stopCh: make(chan struct{}), hardCtx: hardCtx}
	if n, ok := sink.(lossNotifier); ok {
		n.notifyLoss(func(err error) { m.sink.set(false, err) })
	}

	signals := make(chan os.Signal, 2)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		s := <-signals
		log.Info("stopping: no more claims; the batch in flight is published and acked", "signal", s.String())
		r.stopping.Store(true)
		close(r.stopCh)
		s = <-signals
		log.Warn("stopping now: publications in flight abandoned (their lease hands them out again)", "signal", s.String())
		hardStop()
	}()
	go r.watchOldest(hardCtx)

	log.Info("started", "sink", cfg.Sink, "batch_size", cfg.BatchSize, "lease", cfg.Lease.String(),
		"concurrency", cfg.Concurrency, "max_attempts", cfg.MaxAttempts, "listen", cfg.Listen)
	code := r.run()
	src.db.Close()
	return code
}

// watchOldest keeps the oldest-undelivered gauge: idem_stats when the role may read
// it, else the oldest event this relay has in flight.
func (r *relay) watchOldest(ctx context.Context) {
	stats := true
	for {
		if stats {
			c, cancel := context.WithTimeout(ctx, 5*time.Second)
			age, ok, err := r.src.oldestAge(c)
			cancel()
			if err == nil && ok {
				r.m.oldest.Set(age)
			} else if err == nil && !ok {
				stats = false
				log.Info("idem_stats not readable by this role (grant pg_monitor for the age of the oldest undelivered event); showing the oldest event in flight instead")
			}
		}
		if !stats {
			if n := r.inflight.Load(); n != 0 {
				r.m.oldest.Set(time.Since(time.Unix(0, n)).Seconds())
			} else {
				r.m.oldest.Set(0)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(r.cfg.StatsEvery):
		}
	}
}
