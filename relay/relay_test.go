package main

// Unit tests of the parts without a server: configuration, HTTP routing and
// Retry-After, the backoff. The end-to-end behaviour is test/t/033_relay.pl's.

import (
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
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
