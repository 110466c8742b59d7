package main

// Observability: structured logs (JSON lines on standard error, one per change of
// state), Prometheus metrics, and /healthz.

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

var logLevels = map[string]int{"debug": 0, "info": 1, "warn": 2, "error": 3}

type logger struct {
	mu    sync.Mutex
	level int
	relay string
}

var log = &logger{level: 1}

// log writes one line: {"time":..., "level":..., "relay":..., "msg":..., fields...}.
func (l *logger) log(level, msg string, kv ...interface{}) {
	if logLevels[level] < l.level {
		return
	}
	line := map[string]interface{}{
		"time": time.Now().UTC().Format(time.RFC3339Nano), "level": level, "relay": l.relay, "msg": msg,
	}
	for i := 0; i+1 < len(kv); i += 2 {
		v := kv[i+1]
		if err, ok := v.(error); ok {
			v = err.Error()
		}
		line[fmt.Sprint(kv[i])] = v
	}
	b, _ := json.Marshal(line)
	l.mu.Lock()
	os.Stderr.Write(append(b, '\n'))
	l.mu.Unlock()
}

func (l *logger) Debug(msg string, kv ...interface{}) { l.log("debug", msg, kv...) }
func (l *logger) Info(msg string, kv ...interface{})  { l.log("info", msg, kv...) }
func (l *logger) Warn(msg string, kv ...interface{})  { l.log("warn", msg, kv...) }
func (l *logger) Error(msg string, kv ...interface{}) { l.log("error", msg, kv...) }

// state is a component's up/down with a log line at each change only.
type state struct {
	mu    sync.Mutex
	name  string
	known bool
	up    bool
	why   string
	gauge prometheus.Gauge
}

func (s *state) set(up bool, why error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	reason := ""
	if why != nil {
		reason = why.Error()
	}
	if s.known && s.up == up {
		s.why = reason
		return
	}
	s.known, s.up, s.why = true, up, reason
	if up {
		s.gauge.Set(1)
		log.Info(s.name+" up", "component", s.name)
	} else {
		s.gauge.Set(0)
		log.Error(s.name+" down", "component", s.name, "error", reason)
	}
}

func (s *state) get() (bool, string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.known {
		return false, "not connected yet"
	}
	return s.up, s.why
}

type metrics struct {
	reg         *prometheus.Registry
	delivered   *prometheus.CounterVec
	retried     *prometheus.CounterVec
	dead        *prometheus.CounterVec
	publish     *prometheus.HistogramVec
	batch       prometheus.Histogram
	batchEvents prometheus.Histogram
	oldest      prometheus.Gauge
	headroom    prometheus.Gauge
	ackLost     prometheus.Counter
	up          *prometheus.GaugeVec
	db, sink    *state
}

func newMetrics() *metrics {
	m := &metrics{reg: prometheus.NewRegistry()}
	labels := []string{"topic", "sink"}
	m.delivered = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "idem_relay_events_delivered_total",
		Help: "Events the sink took and the relay acknowledged with idem_outbox_ack."}, labels)
	m.retried = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "idem_relay_events_retried_total",
		Help: "Publications that failed and will be tried again (in this lease or the next)."}, labels)
	m.dead = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "idem_relay_events_dead_total",
		Help: "Events moved to the dead letters with idem_outbox_dead."}, labels)
	m.publish = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "idem_relay_publish_seconds",
		Help: "Time to publish one event and have the sink's answer.", Buckets: prometheus.ExponentialBuckets(0.0001, 4, 10)}, []string{"sink"})
	m.batch = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "idem_relay_batch_seconds",
		Help: "Time from claiming a batch to acknowledging it.", Buckets: prometheus.ExponentialBuckets(0.001, 4, 10)})
	m.batchEvents = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "idem_relay_batch_events",
		Help: "Events per non-empty claimed batch.", Buckets: prometheus.ExponentialBuckets(1, 4, 7)})
	m.oldest = prometheus.NewGauge(prometheus.GaugeOpts{Name: "idem_relay_oldest_undelivered_age_seconds",
		Help: "Age of the oldest undelivered event (idem_stats when the role may read it, else the oldest event in flight here; 0 when none)."})
	m.headroom = prometheus.NewGauge(prometheus.GaugeOpts{Name: "idem_relay_lease_headroom_seconds",
		Help: "Time left on the lease when the last batch was acknowledged (near 0 or negative: raise --lease)."})
	m.ackLost = prometheus.NewCounter(prometheus.CounterOpts{Name: "idem_relay_acks_ignored_total",
		Help: "Published events whose ack the database ignored (the lease had passed to another relay): they are published again."})
	m.up = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "idem_relay_up",
		Help: "1 when the component (database, sink) is reachable."}, []string{"component"})
	m.reg.MustRegister(m.delivered, m.retried, m.dead, m.publish, m.batch, m.batchEvents, m.oldest,
		m.headroom, m.ackLost, m.up,
		prometheus.NewGoCollector(), prometheus.NewProcessCollector(prometheus.ProcessCollectorOpts{}))
	m.db = &state{name: "database", gauge: m.up.WithLabelValues("database")}
	m.sink = &state{name: "sink", gauge: m.up.WithLabelValues("sink")}
	m.up.WithLabelValues("database").Set(0)
	m.up.WithLabelValues("sink").Set(0)
	return m
}

func (m *metrics) serve(addr string) (*http.Server, error) {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		dbUp, dbWhy := m.db.get()
		sinkUp, sinkWhy := m.sink.get()
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if dbUp && sinkUp {
			fmt.Fprintln(w, "ok")
			return
		}
		w.WriteHeader(http.StatusServiceUnavailable)
		if !dbUp {
			fmt.Fprintf(w, "database down: %s\n", dbWhy)
		}
		if !sinkUp {
			fmt.Fprintf(w, "sink down: %s\n", sinkWhy)
		}
	})
	srv := &http.Server{Addr: addr, Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	ln, err := listen(addr)
	if err != nil {
		return nil, err
	}
	go srv.Serve(ln)
	return srv, nil
}
