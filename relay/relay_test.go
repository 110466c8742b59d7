package main

// Unit tests of the parts that need no database: configuration, HTTP routing and
// Retry-After, the backoff, HTTPS against an in-process server, the man page, the
// RabbitMQ sink's write batching. The end-to-end behaviour is test/t/033_relay.pl's.

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestConfigSources(t *testing.T) {
	os.Setenv("IDEM_RELAY_BATCH_SIZE", "7")
	defer os.Unsetenv("IDEM_RELAY_BATCH_SIZE")
	file := filepath.Join(t.TempDir(), "relay.conf")
	os.WriteFile(file, []byte("sink = http\nhttp-url = \"http://b/{topic}\"\nbatch-size = 9\nlease = 40s\nhttp-route = pay.*=http://pay/\nhttp-route = x=http://x/\n"), 0o600)
	c, err := loadConfig([]string{"--config", file, "--lease=50s"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.BatchSize != 7 || c.Lease != 50*time.Second || c.Sink != "http" || len(c.HTTPRoutes) != 2 {
		t.Fatalf("flag > environment > file not kept: %+v", c)
	}
	s, _ := newHTTPSink(c)
	for topic, want := range map[string]string{"pay.created": "http://pay/", "x": "http://x/", "other": "http://b/other"} {
		if got := s.urlFor(topic); got != want {
			t.Errorf("urlFor(%q) = %q, want %q", topic, got, want)
		}
	}
}

func TestConfigErrorsNamed(t *testing.T) {
	_, err := loadConfig([]string{"--sink=nats", "--nats-url=http://x", "--concurrency=0", "--log-level=loud", "--lease=15s"}, io.Discard)
	if err == nil {
		t.Fatal("no error")
	}
	for _, want := range []string{`--nats-url (flag --nats-url): the scheme must be nats or tls`,
		`--concurrency (flag --concurrency): want an integer >= 1, got "0"`,
		`--log-level (flag --log-level): want debug, info, warn or error, got "loud"`,
		`--lease (flag --lease): 15s leaves no room for a publication of --nats-timeout 10s`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
}

func TestRetryAfter(t *testing.T) {
	if d := retryAfter("3"); d != 3*time.Second {
		t.Errorf("seconds: %v", d)
	}
	if d := retryAfter(time.Now().Add(10 * time.Second).UTC().Format(http.TimeFormat)); d < 8*time.Second || d > 10*time.Second {
		t.Errorf("date: %v", d)
	}
	if d := retryAfter("soon"); d != 0 {
		t.Errorf("garbage: %v", d)
	}
}

func TestBackoffGrowsWithJitterToTheMaximum(t *testing.T) {
	b := newBackoff(time.Second)
	steps := []time.Duration{200, 400, 800, 1000, 1000}
	for i, step := range steps {
		d := b.next()
		if d < step*time.Millisecond/2 || d > step*time.Millisecond {
			t.Errorf("pause %d: %v, want between %v and %v", i, d, step*time.Millisecond/2, step*time.Millisecond)
		}
	}
}

// Every delivery of an event over HTTP is the same body (the attempt goes in a header),
// so that a receiver fingerprinting the request replays a redelivery.
func TestHTTPBodyWithoutAttempt(t *testing.T) {
	agg, seq := "a1", int64(3)
	e := Event{ID: "e1", Topic: "t", Aggregate: &agg, Seq: &seq, Attempt: 1,
		EmittedAt: time.Unix(0, 0).UTC(), Headers: []byte(`{}`), Payload: []byte(`{"n":1}`)}
	first := string(httpBody(&e))
	e.Attempt = 2
	if again := string(httpBody(&e)); again != first {
		t.Fatalf("the body changed with the attempt: %s then %s", first, again)
	}
	if strings.Contains(first, "attempt") || !strings.Contains(first, `"seq":3`) || !strings.Contains(first, `"id":"e1"`) {
		t.Fatalf("unexpected body %s", first)
	}
}

// The man page is the reference beside --help: it must name every flag, its variable
// and its default.
func TestManPageNamesEverySetting(t *testing.T) {
	page, err := os.ReadFile("idem-relay.1")
	if err != nil {
		t.Fatal(err)
	}
	man := strings.ReplaceAll(string(page), `\-`, "-")
	for _, s := range settings {
		for _, want := range []string{"--" + s.name + "=", envName(s.name)} {
			if !strings.Contains(man, want) {
				t.Errorf("idem-relay.1 does not name %s", want)
			}
		}
		if s.def != "" && !strings.Contains(man, `(default "`+s.def+`")`) {
			t.Errorf("idem-relay.1 does not give --%s's default %q", s.name, s.def)
		}
	}
}

// HTTPS: the server's certificate trusted through --http-ca-file; without it the
// certificate is refused (the sink counts as unreachable, no attempt spent).
func TestHTTPSinkTLS(t *testing.T) {
	var got *http.Request
	var body []byte
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = r
		body, _ = io.ReadAll(r.Body)
		w.WriteHeader(http.StatusCreated)
	}))
	defer srv.Close()
	ca := filepath.Join(t.TempDir(), "ca.pem")
	os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600)
	agg, seq := "a1", int64(3)
	e := &Event{ID: "0d6c5a56-6f3e-4b0e-9a43-3c6f1b7f0001", Topic: "order.placed", Aggregate: &agg, Seq: &seq,
		Attempt: 2, EmittedAt: time.Now(), Headers: json.RawMessage(`{"h":"v"}`), Payload: json.RawMessage(`{"n":1}`)}
	cfg := &Config{HTTPURL: srv.URL + "/events/{topic}", HTTPTimeout: 5 * time.Second, Concurrency: 1,
		HTTPSecret: "k", HTTPSigHdr: "Idem-Signature", HTTPHeaders: map[string]string{}}

	untrusted, _ := newHTTPSink(cfg)
	if r := untrusted.Publish(context.Background(), e); r.Outcome != Retry || !r.Unreachable || !strings.Contains(r.Reason, "certificate") {
		t.Fatalf("an unknown certificate was not refused: %+v", r)
	}
	cfg.HTTPCAFile = ca
	s, err := newHTTPSink(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if r := s.Publish(context.Background(), e); r.Outcome != Delivered {
		t.Fatalf("not delivered over HTTPS with --http-ca-file: %+v", r)
	}
	mac := hmac.New(sha256.New, []byte("k"))
	mac.Write(body)
	if got.TLS == nil || got.URL.Path != "/events/order.placed" || got.Header.Get("Idempotency-Key") != `"`+e.ID+`"` ||
		got.Header.Get("Idem-Attempt") != "2" || got.Header.Get("Idem-Signature") != "sha256="+hex.EncodeToString(mac.Sum(nil)) {
		t.Fatalf("request not as documented: TLS %v, path %s, headers %v", got.TLS != nil, got.URL.Path, got.Header)
	}
}

// recordingConn records each write it is given; the first waits for gate, so that
// what is written meanwhile piles up. failWith makes every write fail.
type recordingConn struct {
	net.Conn // only Write and Close are used
	gate     chan struct{}
	failWith error
	mu       sync.Mutex
	writes   []string
	closed   bool
}

func (c *recordingConn) Write(p []byte) (int, error) {
	if c.gate != nil {
		<-c.gate
		c.gate = nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.failWith != nil {
		return 0, c.failWith
	}
	c.writes = append(c.writes, string(p))
	return len(p), nil
}

func (c *recordingConn) Close() error {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	return nil
}

func (c *recordingConn) written() (string, int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return strings.Join(c.writes, ""), len(c.writes)
}

func TestBatchingConnWritesWhatPiledUpTogether(t *testing.T) {
	rec := &recordingConn{gate: make(chan struct{})}
	b := newBatchingConn(rec)
	// The first frame leaves at once (its write now waits at the gate); the frames
	// handed over meanwhile leave in one write, in order.
	b.Write([]byte("m1"))
	time.Sleep(20 * time.Millisecond)
	for _, f := range []string{"h1", "b1", "m2", "h2", "b2"} {
		if _, err := b.Write([]byte(f)); err != nil {
			t.Fatal(err)
		}
	}
	close(rec.gate)
	deadline := time.Now().Add(5 * time.Second)
	for {
		got, n := rec.written()
		if got == "m1h1b1m2h2b2" {
			if n != 2 {
				t.Fatalf("%d writes for 6 frames, want 2 (the first, then the rest together)", n)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("written %q, want m1h1b1m2h2b2", got)
		}
		time.Sleep(time.Millisecond)
	}
	b.Close()
	if _, err := b.Write([]byte("late")); err == nil {
		t.Fatal("a write after Close was accepted")
	}
}

func TestBatchingConnFailedWriteClosesTheConnection(t *testing.T) {
	rec := &recordingConn{failWith: errors.New("connection reset by peer")}
	b := newBatchingConn(rec)
	b.Write([]byte("m1"))
	deadline := time.Now().Add(5 * time.Second)
	for {
		rec.mu.Lock()
		closed := rec.closed
		rec.mu.Unlock()
		if closed {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the connection was not closed after a failed write")
		}
		time.Sleep(time.Millisecond)
	}
	if _, err := b.Write([]byte("m2")); err == nil || !strings.Contains(err.Error(), "reset") {
		t.Fatalf("a write after the failure: %v, want the failure", err)
	}
}
