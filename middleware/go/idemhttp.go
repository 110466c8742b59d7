// Package idemhttp is net/http middleware that serves the Idempotency-Key header from
// the idempotency PostgreSQL extension, with database/sql (lib/pq, or any driver whose
// errors have SQLState()). docs/middleware.md in the repository has the whole story.
//
//	pay := idemhttp.Middleware(idemhttp.Options{DB: db})
//	mux.Handle("/payments", pay(http.HandlerFunc(createPayment)))
//	// in the handler: tx := idemhttp.FromContext(r.Context()).Tx   (commits with the key)
//
// For each request: parse the key, fingerprint the request, begin a transaction, claim
// the key and run the handler with that transaction; hold its response back, store it
// with idem_complete (or idem_fail for a final error), commit, then send it. A retry gets
// the stored response with Idempotent-Replayed: true.
package idemhttp

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// Options configure one route's use of keys.
type Options struct {
	DB            *sql.DB
	Optional      bool          // the key may be left out; the handler then runs without one
	Scope         string        // default: "METHOD /path" (the request's path)
	Lease         time.Duration // lease mode when > 0
	TTL, Wait     time.Duration // 0: the server's idempotency.default_ttl, wait_timeout
	StoredHeaders []string      // default: Content-Type, Location
	IsFinal       func(status int) bool
	// The largest response body held back, in bytes; 0: the server's
	// idempotency.max_response_size (and never more than that).
	MaxResponseSize int64
}

// Claim is what the handler gets from FromContext.
type Claim struct {
	Tx             *sql.Tx // the claim's transaction: the handler's writes commit with the key
	Scope, Key     string  // Key "" on an optional route called without one
	Attempt        int
	Checkpoint     sql.NullString // on a takeover in lease mode: the last recovery point
	CheckpointData []byte
	db             *sql.DB
	lease          bool
	checkpointed   bool
	limit          int64 // the largest body kept, in bytes
}

type contextKey struct{}

// FromContext gives the handler its claim.
func FromContext(ctx context.Context) *Claim {
	claim, _ := ctx.Value(contextKey{}).(*Claim)
	return claim
}

// SaveCheckpoint records a recovery point (idem_checkpoint) a takeover sees; in lease
// mode it commits at once, on another pooled connection, and renews the lease.
func (c *Claim) SaveCheckpoint(ctx context.Context, point string, data any) error {
	var payload []byte
	if data != nil {
		var err error
		if payload, err = json.Marshal(data); err != nil {
			return err
		}
	}
	const q = `SELECT idem_checkpoint($1, $2::idem_key, $3, $4::jsonb, $5)`
	if !c.lease {
		_, err := c.Tx.ExecContext(ctx, q, c.Scope, c.Key, point, nullable(payload), nil)
		return err
	}
	_, err := c.db.ExecContext(ctx, q, c.Scope, c.Key, point, nullable(payload), c.Attempt)
	if err == nil {
		c.checkpointed = true
	}
	return err
}

// FinalError is the default for which error responses are final, stored with idem_fail
// and replayed: a 4xx other than those that say "try again" (408, 409, 423, 425, 429).
func FinalError(status int) bool {
	switch status {
	case 408, 409, 423, 425, 429:
		return false
	}
	return status >= 400 && status < 500
}

// The server's idempotency.max_response_size in bytes (the SQL-only edition may leave
// it unset: its default then), read with the claim: no round trip of its own.
const limitSQL = `pg_size_bytes(coalesce(current_setting('idempotency.max_response_size', true), '1MB'))`

const claimSQL = `SELECT outcome, response, attempt, checkpoint, checkpoint_data,
    ceil(extract(epoch FROM retry_after))::int, ` + limitSQL + `
  FROM idem_claim($1, $2::idem_key, $3, $4::interval, $5::interval, $6::interval)`

// Errors that say "come back later", answered 409 with Retry-After, never retried inside
// the request (a retry would run the handler again): a wait that ran out, a
// serialization failure or deadlock, a lock timeout, a lease holder fenced out.
var busyStates = map[string]bool{"IK003": true, "IK005": true, "40001": true, "40P01": true, "55P03": true}
var statusOf = map[string]int{"IK001": 422, "22P02": 400, "57014": 503, "25006": 503, "IK006": 503}

// The Idempotency-Key field: the IETF draft's Structured Field String (RFC 8941),
// optionally with parameters, which are checked and ignored, or a bare key as most
// clients send it. The same rules, and the same messages, in every language's
// middleware (docs/middleware.md, "The key").
const sfChars = `(?:[\x20\x21\x23-\x5b\x5d-\x7e]|\\["\\])*`

var field = regexp.MustCompile(`^"(` + sfChars + `)"(?:;[ ]*[a-z*][a-z0-9_.*-]*(?:=(?:"` + sfChars +
	`"|[A-Za-z0-9*:?.+/=!#$%&'^_` + "`" + `|~-]+))?)*$`)
var unescape = regexp.MustCompile(`\\(.)`)

// ParseKey gives the key in the field's values, or an error that says what is wrong.
func ParseKey(values []string) (string, error) {
	if len(values) != 1 {
		return "", errors.New("more than one Idempotency-Key field: send one")
	}
	text := strings.Trim(values[0], " \t")
	if text == "" {
		return "", errors.New("the Idempotency-Key field is empty")
	}
	var key string
	if strings.HasPrefix(text, `"`) {
		m := field.FindStringSubmatch(text)
		if m == nil {
			return "", errors.New(`the key starts with a double quote but is not one Structured Field String: ` +
				`a closing quote, \" and \\ the only escapes, nothing after it but parameters (;name=value)`)
		}
		key = unescape.ReplaceAllString(m[1], "$1")
	} else {
		key = text
		if i := strings.IndexByte(key, '"'); i >= 0 {
			return "", fmt.Errorf(`a bare key cannot hold a double quote (at position %d): `+
				`send it as a Structured Field String, "...", with \" for the quote`, i+1)
		}
	}
	// An idem_key: 1 to 255 visible ASCII characters (positions count bytes, as the
	// other languages count the field's characters).
	if key == "" {
		return "", errors.New("the key is empty: 1 to 255 visible ASCII characters")
	}
	for i := 0; i < len(key); i++ {
		if key[i] < 0x21 || key[i] > 0x7e {
			return "", fmt.Errorf("the key has a character that is not visible ASCII (0x21 to 0x7E) at position %d", i+1)
		}
	}
	if len(key) > 255 {
		return "", fmt.Errorf("the key is %d characters long: at most 255", len(key))
	}
	return key, nil
}

// Middleware wraps one route's handler.
func Middleware(o Options) func(http.Handler) http.Handler {
	if o.IsFinal == nil {
		o.IsFinal = FinalError
	}
	if o.StoredHeaders == nil {
		o.StoredHeaders = []string{"Content-Type", "Location"}
	}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			o.serve(w, r, next)
		})
	}
}

type answer struct {
	status    int
	header    http.Header
	body      []byte
	notStored string // why the handler's response was not kept: "too-large", "stored-too-large", "streamed"
	limit     int64  // the limit it was held to
}

func (o Options) serve(w http.ResponseWriter, r *http.Request, next http.Handler) {
	scope := o.Scope
	if scope == "" {
		scope = r.Method + " " + r.URL.Path
	}
	key := ""
	if values := r.Header.Values("Idempotency-Key"); len(values) > 0 {
		var err error
		if key, err = ParseKey(values); err != nil {
			send(w, problem(400, "malformed-key", "Idempotency-Key is malformed", err.Error()))
			return
		}
	} else if !o.Optional {
		send(w, problem(400, "missing-key", "Idempotency-Key is missing", scope+" requires an Idempotency-Key header"))
		return
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		send(w, problem(400, "body", "The body could not be read", err.Error()))
		return
	}
	r.Body = io.NopCloser(bytes.NewReader(body)) // the handler reads it again
	claim := &Claim{Scope: scope, Key: key, db: o.DB, lease: o.Lease > 0 && key != ""}
	fingerprint := RequestFingerprint(r.Method, r.URL.RequestURI(), body)
	var a *answer
	if claim.lease {
		a, err = o.withLease(r, next, claim, fingerprint)
	} else {
		a, err = o.inTransaction(r, next, claim, fingerprint)
	}
	if err != nil {
		a = databaseError(err)
	} else if a.notStored != "" {
		a = notStoredAnswer(a.notStored, a.limit)
	}
	send(w, a)
}

func (o Options) claim(ctx context.Context, tx *sql.Tx, c *Claim, fingerprint []byte) (*answer, error) {
	var outcome string
	var response []byte
	var retryAfter sql.NullInt64
	var attempt sql.NullInt64
	err := tx.QueryRowContext(ctx, claimSQL, c.Scope, c.Key, fingerprint, interval(o.TTL),
		interval(o.Lease), interval(o.Wait)).Scan(&outcome, &response, &attempt, &c.Checkpoint,
		&c.CheckpointData, &retryAfter, &c.limit)
	if err != nil {
		return nil, err
	}
	c.Attempt = int(attempt.Int64)
	switch outcome {
	case "replay":
		return stored(response)
	case "in_progress":
		return busy(retryAfter.Int64), nil
	case "claimed":
		return nil, nil
	}
	return nil, fmt.Errorf("idem_claim answered %s to a fresh transaction", outcome)
}

// inTransaction: claim, handler and completion in one transaction.
func (o Options) inTransaction(r *http.Request, next http.Handler, c *Claim, fingerprint []byte) (*answer, error) {
	ctx := r.Context()
	tx, err := o.DB.BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	defer tx.Rollback() // after a Commit it does nothing
	c.Tx = tx
	if c.Key != "" {
		if a, err := o.claim(ctx, tx, c, fingerprint); a != nil || err != nil {
			if err == nil {
				err = tx.Commit()
			}
			return a, err
		}
	} else if err := tx.QueryRowContext(ctx, `SELECT `+limitSQL).Scan(&c.limit); err != nil {
		return nil, err
	}
	a := run(r, next, c, o.limit(c))
	keep, err := o.finish(ctx, c, a, nil)
	if err != nil || !keep {
		return a, err // rolled back: the claim and the handler's writes are gone
	}
	return a, tx.Commit()
}

// withLease: the claim commits first (a lease); the handler then runs in a transaction
// of its own, which completes the key with the attempt.
func (o Options) withLease(r *http.Request, next http.Handler, c *Claim, fingerprint []byte) (a *answer, err error) {
	ctx := r.Context()
	tx, err := o.DB.BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	a, err = o.claim(ctx, tx, c, fingerprint)
	if err != nil {
		tx.Rollback()
		return nil, err
	}
	if err = tx.Commit(); err != nil || a != nil {
		return a, err
	}
	finished := false
	defer func() {
		// Not finished (an error, or a response that is not kept): give the key up so a
		// retry runs afresh, unless the handler recorded a checkpoint: then the claim
		// stays until its lease runs out, and a retry takes it over from there.
		if !finished && !c.checkpointed {
			if _, e := o.DB.ExecContext(context.Background(), `SELECT idem_release($1, $2::idem_key, $3)`,
				c.Scope, c.Key, c.Attempt); e != nil {
				log.Printf("idemhttp: idem_release failed: %v", e)
			}
		}
	}()
	if c.Tx, err = o.DB.BeginTx(ctx, nil); err != nil {
		return nil, err
	}
	defer c.Tx.Rollback()
	a = run(r, next, c, o.limit(c))
	keep, err := o.finish(ctx, c, a, c.Attempt)
	if err != nil || !keep {
		return a, err
	}
	if err = c.Tx.Commit(); err == nil {
		finished = true
	}
	return a, err
}

// finish stores the response; false if it is not to be kept (roll back).
func (o Options) finish(ctx context.Context, c *Claim, a *answer, attempt any) (bool, error) {
	if a.notStored != "" {
		return false, nil
	}
	if c.Key == "" {
		return a.status < 500, nil
	}
	fn := "idem_complete"
	if a.status >= 400 {
		if !o.IsFinal(a.status) {
			return false, nil
		}
		fn = "idem_fail"
	}
	headers := map[string]string{}
	for _, name := range o.StoredHeaders {
		if v := a.header.Get(name); v != "" {
			headers[strings.ToLower(name)] = v
		}
	}
	response := map[string]any{"status": a.status, "headers": headers}
	// jsonb holds valid UTF-8 without U+0000; anything else is stored as base64.
	if utf8.Valid(a.body) && !bytes.ContainsRune(a.body, 0) {
		response["body"] = string(a.body)
	} else {
		response["body_base64"] = base64.StdEncoding.EncodeToString(a.body)
	}
	payload, err := json.Marshal(response)
	if err != nil {
		return false, err
	}
	_, err = c.Tx.ExecContext(ctx, `SELECT `+fn+`($1, $2::idem_key, $3::jsonb, $4)`, c.Scope, c.Key, string(payload), attempt)
	var withState interface{ SQLState() string }
	if errors.As(err, &withState) && withState.SQLState() == "54000" {
		// The stored document (the body escaped or in base64, the headers) over the
		// server's limit: the same rule as a body over it. The caller rolls back.
		a.notStored = "stored-too-large"
		return false, nil
	}
	return err == nil, err
}

// limit is the largest body held back for this claim.
func (o Options) limit(c *Claim) int64 {
	if o.MaxResponseSize > 0 && o.MaxResponseSize < c.limit {
		return o.MaxResponseSize
	}
	return c.limit
}

// recorder holds the handler's response back until the transaction commits. A body
// over the limit, or a flushed one (streamed), is not kept: its bytes are dropped as
// they come, and notStored says why.
type recorder struct {
	header    http.Header
	status    int
	body      bytes.Buffer
	limit     int64
	notStored string
}

func (r *recorder) Header() http.Header { return r.header }
func (r *recorder) WriteHeader(status int) {
	if r.status == 0 {
		r.status = status
	}
}
func (r *recorder) Write(b []byte) (int, error) {
	r.WriteHeader(http.StatusOK)
	if r.notStored != "" {
		return len(b), nil
	}
	if int64(r.body.Len())+int64(len(b)) > r.limit {
		r.notStored = "too-large"
		r.body = bytes.Buffer{}
		return len(b), nil
	}
	return r.body.Write(b)
}

// Flush is a handler's way to stream (http.Flusher).
func (r *recorder) Flush() {
	if r.notStored == "" {
		r.notStored = "streamed"
		r.body = bytes.Buffer{}
	}
}

// run calls the handler; a panic is its failure: 500, and the transaction rolls back.
func run(r *http.Request, next http.Handler, c *Claim, limit int64) (a *answer) {
	rec := &recorder{header: http.Header{}, limit: limit}
	defer func() {
		if p := recover(); p != nil {
			log.Printf("idemhttp: the handler panicked: %v", p)
			a = problem(500, "internal", "Internal Server Error", "the handler failed")
		}
	}()
	next.ServeHTTP(rec, r.WithContext(context.WithValue(r.Context(), contextKey{}, c)))
	rec.WriteHeader(http.StatusOK)
	return &answer{rec.status, rec.header, rec.body.Bytes(), rec.notStored, limit}
}

func stored(response []byte) (*answer, error) {
	var s struct {
		Status     int               `json:"status"`
		Headers    map[string]string `json:"headers"`
		Body       *string           `json:"body"`
		BodyBase64 string            `json:"body_base64"`
	}
	if err := json.Unmarshal(response, &s); err != nil {
		return nil, err
	}
	a := &answer{status: s.Status, header: http.Header{}}
	for k, v := range s.Headers {
		a.header.Set(k, v)
	}
	a.header.Set("Idempotent-Replayed", "true")
	if s.Body != nil {
		a.body = []byte(*s.Body)
	} else {
		a.body, _ = base64.StdEncoding.DecodeString(s.BodyBase64)
	}
	return a, nil
}

func busy(seconds int64) *answer {
	if seconds < 1 {
		seconds = 1
	}
	a := problem(409, "in-progress", "A request is outstanding for this Idempotency-Key",
		"a request with this key is being processed; retry after Retry-After seconds")
	a.header.Set("Retry-After", strconv.FormatInt(seconds, 10))
	return a
}

func databaseError(err error) *answer {
	var withState interface{ SQLState() string }
	state := ""
	if errors.As(err, &withState) {
		state = withState.SQLState()
	}
	if busyStates[state] {
		return busy(1)
	}
	if state == "IK001" {
		return problem(422, "key-reused", "Idempotency-Key is already used",
			"this key was used for another request; use a new key for a new request")
	}
	status, known := statusOf[state]
	if !known {
		log.Printf("idemhttp: %s %v", state, err)
		return problem(500, "database", "The request could not be served", "internal error")
	}
	return problem(status, "database", "The request could not be served", err.Error())
}

// problem is a JSON error (RFC 9457 shape).
func problem(status int, kind, title, detail string) *answer {
	body, _ := json.Marshal(map[string]any{"type": "about:blank#" + kind, "title": title, "status": status, "detail": detail})
	return &answer{status: status, header: http.Header{"Content-Type": {"application/problem+json"}}, body: body}
}

// notStoredAnswer is the rule for a response too large to store, or streamed: not
// stored, its work rolled back, 500 with Idempotent-Not-Stored saying why.
func notStoredAnswer(reason string, limit int64) *answer {
	detail := "the response was streamed, and a response is held back until its transaction commits"
	switch reason {
	case "too-large":
		detail = fmt.Sprintf("the response is larger than idempotency.max_response_size (%d bytes)", limit)
	case "stored-too-large":
		detail = "the response as stored (its body escaped or in base64, and its headers) " +
			"is larger than idempotency.max_response_size"
	}
	a := problem(500, "response-not-stored", "The response could not be stored",
		detail+": it was not stored, and the request's work was rolled back")
	a.header.Set("Idempotent-Not-Stored", strings.TrimPrefix(reason, "stored-"))
	return a
}

func send(w http.ResponseWriter, a *answer) {
	for k, v := range a.header {
		w.Header()[k] = v
	}
	w.Header().Set("Content-Length", strconv.Itoa(len(a.body)))
	w.WriteHeader(a.status)
	w.Write(a.body)
}

func interval(d time.Duration) any {
	if d <= 0 {
		return nil
	}
	return fmt.Sprintf("%d milliseconds", d.Milliseconds())
}

func nullable(b []byte) any {
	if b == nil {
		return nil
	}
	return string(b)
}
