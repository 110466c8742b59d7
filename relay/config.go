package main

// Configuration: flags, each with an environment variable (IDEM_RELAY_<FLAG>, dashes as
// underscores), and an optional file of "flag = value" lines. Precedence: flag, then
// environment, then file, then default. Everything is validated before the relay
// connects anywhere, and an error names the setting and where it came from.

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"
)

type Config struct {
	Database     string
	Name         string
	Sink         string
	Topics       []string
	BatchSize    int
	Lease        time.Duration
	Concurrency  int
	MaxAttempts  int
	Idle         time.Duration
	MaxBackoff   time.Duration
	Listen       string
	LogLevel     string
	HTTPURL      string
	HTTPRoutes   []httpRoute
	HTTPTimeout  time.Duration
	HTTPSecret   string
	HTTPSigHdr   string
	HTTPCAFile   string
	HTTPHeaders  map[string]string
	AMQPURL      string
	AMQPExchange string
	AMQPExType   string
	AMQPDeclare  bool
	AMQPTimeout  time.Duration
	AMQPPipeline int
	NATSURL      string
	NATSPrefix   string
	NATSStream   string
	NATSTimeout  time.Duration
	StatsEvery   time.Duration
}

type httpRoute struct {
	pattern string // a topic, or a prefix ending in '*'
	url     string
}

// setting describes one flag: its name, default and help; values are strings until
// validation.
type setting struct {
	name, def, help string
	repeat          bool // may be given more than once (flags, or comma-separated)
}

var settings = []setting{
	{"database", "", "PostgreSQL connection string (key=value or postgres:// URL); empty: libpq's environment (PGHOST, PGPORT, PGDATABASE, PGUSER, PGPASSWORD, PGSSLMODE, ...). Also DATABASE_URL", false},
	{"name", "", "this relay's name in idem_outbox_claim (each running copy needs its own; default idem-relay-<host>-<pid>)", false},
	{"sink", "", "where events go: stdout, http, amqp or nats (required)", false},
	{"topics", "", "relay only these topics (comma-separated; default all)", true},
	{"batch-size", "100", "events claimed per idem_outbox_claim", false},
	{"lease", "30s", "lease taken on a batch: longer than publishing a batch takes", false},
	{"concurrency", "16", "aggregates published in parallel (each aggregate's events one after another)", false},
	{"max-attempts", "10", "an event refused this many times (counting hand-outs) becomes a dead letter; 0: never. A sink that cannot be reached counts no attempt", false},
	{"idle", "500ms", "pause when there is nothing to relay", false},
	{"max-backoff", "30s", "longest pause between reconnection attempts (pauses grow from 200ms, with jitter)", false},
	{"listen", ":9187", "address of /metrics and /healthz; empty: none", false},
	{"log-level", "info", "debug, info, warn or error", false},
	{"stats-interval", "10s", "how often the age of the oldest undelivered event is read (idem_stats; needs pg_monitor, else the oldest event in flight is shown)", false},
	{"http-url", "", "http sink: URL events are POSTed to; {topic} is replaced by the topic", false},
	{"http-route", "", "http sink: TOPIC=URL, the URL for a topic (TOPIC may end in * for a prefix); repeatable, first match wins, then --http-url", true},
	{"http-timeout", "10s", "http sink: time allowed for one request", false},
	{"http-hmac-secret", "", "http sink: shared secret; each request gets a header with HMAC-SHA256 of the body (prefer the environment or the config file to a flag)", false},
	{"http-signature-header", "Idem-Signature", "http sink: the header that carries \"sha256=<hex HMAC>\"", false},
	{"http-ca-file", "", "http sink: PEM file of CA certificates to trust for https (default: the system's)", false},
	{"http-header", "", "http sink: NAME: VALUE added to every request (e.g. Authorization); repeatable", true},
	{"amqp-url", "amqp://guest:guest@127.0.0.1:5672/", "amqp sink: the broker", false},
	{"amqp-exchange", "idem.events", "amqp sink: exchange published to (routing key: the topic)", false},
	{"amqp-exchange-type", "topic", "amqp sink: the exchange's type when declared", false},
	{"amqp-declare", "true", "amqp sink: declare the exchange (durable) at start; false: only check it exists", false},
	{"amqp-timeout", "10s", "amqp sink: time allowed for the broker's confirm", false},
	{"amqp-pipeline", "1", "amqp sink: an aggregate's events published before the first is confirmed (1: each after the previous confirm). Faster above 1, but a basic.nack (a queue's overflow=reject-publish, an internal error) then lets later events reach the queue before the refused one's retry", false},
	{"nats-url", "nats://127.0.0.1:4222", "nats sink: the server(s), comma-separated", false},
	{"nats-subject-prefix", "", "nats sink: prepended to the topic to make the subject", false},
	{"nats-stream", "", "nats sink: a stream checked to exist at start (optional)", false},
	{"nats-timeout", "10s", "nats sink: time allowed for the stream's ack", false},
}

func envName(flagName string) string {
	return "IDEM_RELAY_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

type multiFlag struct{ values *[]string }

func (m multiFlag) String() string {
	if m.values == nil {
		return ""
	}
	return strings.Join(*m.values, ",")
}
func (m multiFlag) Set(v string) error { *m.values = append(*m.values, v); return nil }

type sourced struct {
	values []string
	where  string
}

func usage(w io.Writer, fs *flag.FlagSet) {
	fmt.Fprintf(w, `idem-relay: moves the events of the idempotency extension's outbox (idem_emit) to a sink,
at least once, each aggregate's events in seq order; a consumer applying with idem_once
(or, over HTTP, this project's middleware) applies each exactly once.

Usage: idem-relay --sink=stdout|http|amqp|nats [flags]

It loops idem_outbox_claim -> publish -> idem_outbox_ack / idem_outbox_dead. The role it
connects as needs EXECUTE on idem_outbox_claim, idem_outbox_ack and idem_outbox_dead only.
Every flag may also be set by the environment variable named beside it, or by a line
"flag = value" in the file of --config (or IDEM_RELAY_CONFIG); a flag beats the
environment, which beats the file.

Flags:
  --config FILE (IDEM_RELAY_CONFIG)
        optional file of "flag = value" lines ('#' starts a comment)
`)
	for _, s := range settings {
		def := ""
		if s.def != "" {
			def = fmt.Sprintf(" (default %q)", s.def)
		}
		fmt.Fprintf(w, "  --%s (%s)\n        %s%s\n", s.name, envName(s.name), s.help, def)
	}
	fmt.Fprint(w, `
Exit status: 0 after SIGTERM or SIGINT (the batch in flight published and acked first),
2 for a configuration error or a role that may not call the relay functions.
Endpoints (--listen): /metrics (Prometheus), /healthz (200, or 503 naming what is down).
Logs: JSON lines on standard error, one per change of state, never one per event.
See relay/README.md.
`)
}

func readConfigFile(path string) (map[string]sourced, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("config file: %v", err)
	}
	defer f.Close()
	known := map[string]setting{}
	for _, s := range settings {
		known[s.name] = s
	}
	out := map[string]sourced{}
	sc := bufio.NewScanner(f)
	line := 0
	for sc.Scan() {
		line++
		text := strings.TrimSpace(sc.Text())
		if text == "" || strings.HasPrefix(text, "#") {
			continue
		}
		eq := strings.IndexByte(text, '=')
		if eq < 0 {
			return nil, fmt.Errorf("%s:%d: expected \"flag = value\", got %q", path, line, text)
		}
		k := strings.TrimPrefix(strings.TrimSpace(text[:eq]), "--")
		v := strings.TrimSpace(text[eq+1:])
		if len(v) >= 2 && v[0] == '"' && v[len(v)-1] == '"' {
			if uq, err := strconv.Unquote(v); err == nil {
				v = uq
			}
		}
		s, ok := known[k]
		if !ok {
			return nil, fmt.Errorf("%s:%d: unknown setting %q (see --help)", path, line, k)
		}
		where := fmt.Sprintf("%s:%d", path, line)
		if prev, ok := out[k]; ok && s.repeat {
			out[k] = sourced{append(prev.values, v), where}
		} else {
			out[k] = sourced{[]string{v}, where}
		}
	}
	return out, sc.Err()
}

// errHelp: --help was asked for.
var errHelp = errors.New("help")

func loadConfig(args []string, stdout io.Writer) (*Config, error) {
	fs := flag.NewFlagSet("idem-relay", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	flagVals := map[string]*[]string{}
	for _, s := range settings {
		vals := &[]string{}
		flagVals[s.name] = vals
		if s.repeat {
			fs.Var(multiFlag{vals}, s.name, s.help)
		} else {
			fs.Func(s.name, s.help, func(v string) error { *vals = []string{v}; return nil })
		}
	}
	configPath := fs.String("config", "", "")
	help := fs.Bool("help", false, "")
	fs.BoolVar(help, "h", false, "")
	if err := fs.Parse(args); err != nil {
		return nil, fmt.Errorf("%v (see --help)", err)
	}
	if *help {
		usage(stdout, fs)
		return nil, errHelp
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q (settings are flags: see --help)", fs.Arg(0))
	}
	if *configPath == "" {
		*configPath = os.Getenv("IDEM_RELAY_CONFIG")
	}
	file := map[string]sourced{}
	if *configPath != "" {
		var err error
		if file, err = readConfigFile(*configPath); err != nil {
			return nil, err
		}
	}
	get := map[string]sourced{}
	for _, s := range settings {
		if v := *flagVals[s.name]; len(v) > 0 {
			get[s.name] = sourced{v, "flag --" + s.name}
		} else if e, ok := os.LookupEnv(envName(s.name)); ok {
			vals := []string{e}
			if s.repeat {
				vals = splitList(e, s.name == "http-route" || s.name == "http-header")
			}
			get[s.name] = sourced{vals, "environment " + envName(s.name)}
		} else if s.name == "database" && os.Getenv("DATABASE_URL") != "" {
			get[s.name] = sourced{[]string{os.Getenv("DATABASE_URL")}, "environment DATABASE_URL"}
		} else if f, ok := file[s.name]; ok {
			get[s.name] = f
		} else {
			get[s.name] = sourced{[]string{s.def}, "default"}
		}
	}
	return validate(get)
}

func splitList(v string, semicolon bool) []string {
	sep := ","
	if semicolon {
		sep = ";"
	}
	var out []string
	for _, p := range strings.Split(v, sep) {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

func validate(get map[string]sourced) (*Config, error) {
	var errs []string
	bad := func(name, format string, a ...interface{}) {
		errs = append(errs, fmt.Sprintf("--%s (%s): %s", name, get[name].where, fmt.Sprintf(format, a...)))
	}
	one := func(name string) string {
		v := get[name].values
		if len(v) == 0 {
			return ""
		}
		return v[len(v)-1]
	}
	positive := func(name string, min int) int {
		n, err := strconv.Atoi(one(name))
		if err != nil || n < min {
			bad(name, "want an integer >= %d, got %q", min, one(name))
		}
		return n
	}
	duration := func(name string, min time.Duration) time.Duration {
		d, err := time.ParseDuration(one(name))
		if err != nil || d < min {
			bad(name, "want a duration of at least %v such as 30s or 500ms, got %q", min, one(name))
		}
		return d
	}
	c := &Config{
		Database: one("database"), Name: one("name"), Sink: one("sink"),
		LogLevel: one("log-level"), Listen: one("listen"),
		HTTPURL: one("http-url"), HTTPSecret: one("http-hmac-secret"),
		HTTPSigHdr: one("http-signature-header"), HTTPCAFile: one("http-ca-file"),
		AMQPURL: one("amqp-url"), AMQPExchange: one("amqp-exchange"), AMQPExType: one("amqp-exchange-type"),
		NATSURL: one("nats-url"), NATSPrefix: one("nats-subject-prefix"), NATSStream: one("nats-stream"),
		HTTPHeaders: map[string]string{},
	}
	c.BatchSize = positive("batch-size", 1)
	c.Concurrency = positive("concurrency", 1)
	c.MaxAttempts = positive("max-attempts", 0)
	c.AMQPPipeline = positive("amqp-pipeline", 1)
	c.Lease = duration("lease", time.Second)
	c.Idle = duration("idle", time.Millisecond)
	c.MaxBackoff = duration("max-backoff", 200*time.Millisecond)
	c.HTTPTimeout = duration("http-timeout", time.Millisecond)
	c.AMQPTimeout = duration("amqp-timeout", time.Millisecond)
	c.NATSTimeout = duration("nats-timeout", time.Millisecond)
	c.StatsEvery = duration("stats-interval", 100*time.Millisecond)
	switch b := strings.ToLower(one("amqp-declare")); b {
	case "true", "yes", "on", "1":
		c.AMQPDeclare = true
	case "false", "no", "off", "0":
	default:
		bad("amqp-declare", "want true or false, got %q", b)
	}
	for _, t := range get["topics"].values {
		for _, p := range strings.Split(t, ",") {
			if p = strings.TrimSpace(p); p != "" {
				c.Topics = append(c.Topics, p)
			}
		}
	}
	switch c.LogLevel {
	case "debug", "info", "warn", "error":
	default:
		bad("log-level", "want debug, info, warn or error, got %q", c.LogLevel)
	}
	if c.Name == "" {
		host, _ := os.Hostname()
		c.Name = fmt.Sprintf("idem-relay-%s-%d", host, os.Getpid())
	} else if len(c.Name) > 255 {
		bad("name", "at most 255 bytes")
	}
	checkURL := func(name, u string, schemes ...string) {
		p, err := url.Parse(strings.ReplaceAll(u, "{topic}", "t"))
		if err != nil || p.Host == "" {
			bad(name, "not a URL: %q", u)
			return
		}
		for _, s := range schemes {
			if p.Scheme == s {
				return
			}
		}
		bad(name, "the scheme must be %s, got %q", strings.Join(schemes, " or "), u)
	}
	switch c.Sink {
	case "stdout":
	case "http":
		if c.HTTPURL != "" {
			checkURL("http-url", c.HTTPURL, "http", "https")
		}
		for _, r := range get["http-route"].values {
			if r == "" {
				continue
			}
			eq := strings.IndexByte(r, '=')
			if eq <= 0 {
				bad("http-route", "want TOPIC=URL, got %q", r)
				continue
			}
			route := httpRoute{strings.TrimSpace(r[:eq]), strings.TrimSpace(r[eq+1:])}
			checkURL("http-route", route.url, "http", "https")
			c.HTTPRoutes = append(c.HTTPRoutes, route)
		}
		if c.HTTPURL == "" && len(c.HTTPRoutes) == 0 {
			bad("http-url", "the http sink needs --http-url or --http-route")
		}
		for _, h := range get["http-header"].values {
			if h == "" {
				continue
			}
			colon := strings.IndexByte(h, ':')
			if colon <= 0 {
				bad("http-header", "want NAME: VALUE, got %q", h)
				continue
			}
			c.HTTPHeaders[strings.TrimSpace(h[:colon])] = strings.TrimSpace(h[colon+1:])
		}
		if c.HTTPCAFile != "" {
			if _, err := os.Stat(c.HTTPCAFile); err != nil {
				bad("http-ca-file", "%v", err)
			}
		}
		if c.HTTPSigHdr == "" {
			bad("http-signature-header", "must not be empty")
		}
	case "amqp":
		checkURL("amqp-url", c.AMQPURL, "amqp", "amqps")
		if c.AMQPExchange == "" {
			bad("amqp-exchange", "must not be empty (the default exchange cannot route by topic)")
		}
	case "nats":
		for _, u := range strings.Split(c.NATSURL, ",") {
			checkURL("nats-url", strings.TrimSpace(u), "nats", "tls")
		}
	case "":
		bad("sink", "required: stdout, http, amqp or nats")
	default:
		bad("sink", "want stdout, http, amqp or nats, got %q", c.Sink)
	}
	// A publication starts no later than the lease's end minus max(a quarter of it,
	// the sink's timeout), capped at half the lease: the timeout must fit in that half.
	timeouts := map[string]string{"http": "http-timeout", "amqp": "amqp-timeout", "nats": "nats-timeout"}
	if name, ok := timeouts[c.Sink]; ok {
		t := map[string]time.Duration{"http": c.HTTPTimeout, "amqp": c.AMQPTimeout, "nats": c.NATSTimeout}[c.Sink]
		if c.Lease > 0 && t > 0 && t*2 > c.Lease {
			bad("lease", "%v leaves no room for a publication of --%s %v: make the lease at least twice the timeout", c.Lease, name, t)
		}
	}
	if len(errs) > 0 {
		return nil, errors.New("invalid configuration:\n  " + strings.Join(errs, "\n  "))
	}
	return c, nil
}
