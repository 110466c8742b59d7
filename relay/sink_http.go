package main

// The HTTP sink: a POST of the event's envelope as JSON to the URL chosen by its
// topic, with Idempotency-Key: "<event id>" so that a service using this project's
// middleware applies it once, and optionally an HMAC-SHA256 of the body.
//
// 2xx: delivered. 429 and 503 with Retry-After: wait as told, then again. 408, 409,
// 425, 429, 5xx, a timeout: try again (an attempt). Any other 4xx (and a 3xx, not
// followed): refused for good, a dead letter with the status and the start of the body.
// No connection: the sink is down (no attempt counted).

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"
)

type httpSink struct {
	cfg    *Config
	client *http.Client
}

func newHTTPSink(cfg *Config) (*httpSink, error) {
	transport := http.DefaultTransport.(*http.Transport).Clone()
	transport.MaxIdleConnsPerHost = cfg.Concurrency
	transport.ResponseHeaderTimeout = cfg.HTTPTimeout
	if cfg.HTTPCAFile != "" {
		pem, err := os.ReadFile(cfg.HTTPCAFile)
		if err != nil {
			return nil, fmt.Errorf("--http-ca-file: %v", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--http-ca-file %s: no PEM certificate in it", cfg.HTTPCAFile)
		}
		transport.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	return &httpSink{cfg: cfg, client: &http.Client{
		Transport: transport,
		Timeout:   cfg.HTTPTimeout,
		CheckRedirect: func(req *http.Request, via []*http.Request) error {
			return http.ErrUseLastResponse
		},
	}}, nil
}

func (s *httpSink) Name() string { return "http" }

func (s *httpSink) urlFor(topic string) string {
	for _, r := range s.cfg.HTTPRoutes {
		if r.pattern == topic || (strings.HasSuffix(r.pattern, "*") && strings.HasPrefix(topic, strings.TrimSuffix(r.pattern, "*"))) {
			return strings.ReplaceAll(r.url, "{topic}", url.PathEscape(topic))
		}
	}
	if s.cfg.HTTPURL == "" {
		return ""
	}
	return strings.ReplaceAll(s.cfg.HTTPURL, "{topic}", url.PathEscape(topic))
}

// Connect checks that every configured host accepts a TCP connection.
func (s *httpSink) Connect(ctx context.Context) error {
	urls := []string{s.cfg.HTTPURL}
	for _, r := range s.cfg.HTTPRoutes {
		urls = append(urls, r.url)
	}
	for _, u := range urls {
		if u == "" {
			continue
		}
		p, err := url.Parse(strings.ReplaceAll(u, "{topic}", "t"))
		if err != nil {
			return err
		}
		host := p.Host
		if p.Port() == "" {
			if p.Scheme == "https" {
				host = net.JoinHostPort(p.Hostname(), "443")
			} else {
				host = net.JoinHostPort(p.Hostname(), "80")
			}
		}
		d := net.Dialer{Timeout: s.cfg.HTTPTimeout}
		c, err := d.DialContext(ctx, "tcp", host)
		if err != nil {
			return err
		}
		c.Close()
	}
	return nil
}

func (s *httpSink) Publish(ctx context.Context, e *Event) Result {
	target := s.urlFor(e.Topic)
	if target == "" {
		return Result{Outcome: Dead, Reason: fmt.Sprintf("no --http-route matches topic %q and --http-url is not set", e.Topic)}
	}
	body := httpBody(e)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, target, bytes.NewReader(body))
	if err != nil {
		return Result{Outcome: Dead, Reason: fmt.Sprintf("bad URL %q for topic %q: %v", target, e.Topic, err)}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", `"`+e.ID+`"`)
	req.Header.Set("Idem-Attempt", strconv.Itoa(e.Attempt))
	req.Header.Set("User-Agent", "idem-relay")
	for k, v := range s.cfg.HTTPHeaders {
		req.Header.Set(k, v)
	}
	if s.cfg.HTTPSecret != "" {
		mac := hmac.New(sha256.New, []byte(s.cfg.HTTPSecret))
		mac.Write(body)
		req.Header.Set(s.cfg.HTTPSigHdr, "sha256="+hex.EncodeToString(mac.Sum(nil)))
	}
	resp, err := s.client.Do(req)
	if err != nil {
		var netErr net.Error
		if errors.As(err, &netErr) && netErr.Timeout() {
			return Result{Outcome: Retry, Reason: "timeout: " + err.Error()}
		}
		if ctx.Err() != nil {
			return Result{Outcome: Retry, Reason: err.Error()}
		}
		return Result{Outcome: Retry, Reason: err.Error(), Unreachable: true}
	}
	snippet, _ := io.ReadAll(io.LimitReader(resp.Body, 300))
	io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	resp.Body.Close()
	status := fmt.Sprintf("HTTP %s from %s", resp.Status, target)
	if len(snippet) > 0 {
		status += ": " + strings.TrimSpace(string(snippet))
	}
	switch code := resp.StatusCode; {
	case code >= 200 && code < 300:
		return delivered()
	case code == 429 || code == 503:
		return Result{Outcome: Retry, Reason: status, RetryAfter: retryAfter(resp.Header.Get("Retry-After"))}
	case code == 408 || code == 409 || code == 425 || code >= 500:
		return Result{Outcome: Retry, Reason: status}
	default:
		return Result{Outcome: Dead, Reason: status}
	}
}

// retryAfter reads Retry-After: seconds or an HTTP date; 0 when absent or unreadable.
func retryAfter(v string) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	if n, err := strconv.Atoi(v); err == nil && n >= 0 {
		return time.Duration(n) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil {
		if d := time.Until(t); d > 0 {
			return d
		}
	}
	return 0
}

func (s *httpSink) Flush(ctx context.Context) error { return nil }
func (s *httpSink) Close()                          { s.client.CloseIdleConnections() }

// httpBody is the event as JSON without its attempt, which goes in the Idem-Attempt
// header instead: every delivery of an event is then the same request (same key, same
// body), so a receiver that fingerprints the request, as this project's middleware does,
// replays a redelivery after a relay restart instead of refusing it as a different
// request for the same key (IK001, a 422 that would make the event a dead letter).
func httpBody(e *Event) []byte {
	b, _ := json.Marshal(struct {
		ID        string          `json:"id"`
		Topic     string          `json:"topic"`
		Aggregate *string         `json:"aggregate"`
		Seq       *int64          `json:"seq"`
		EmittedAt time.Time       `json:"emitted_at"`
		Headers   json.RawMessage `json:"headers"`
		Payload   json.RawMessage `json:"payload"`
	}{e.ID, e.Topic, e.Aggregate, e.Seq, e.EmittedAt, e.Headers, e.Payload})
	return b
}
