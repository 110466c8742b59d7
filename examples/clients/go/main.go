// A payment made once, from Go with database/sql and lib/pq (Debian:
// apt-get install golang-go golang-github-lib-pq-dev; build with
// GOFLAGS=-mod=mod GOPROXY=off go build).
//
// pay(db, key, account, amount) claims the key, inserts the payment and completes the
// key in one transaction, and answers as an HTTP service would (docs/clients.md): 201
// (a retry gets the same body with Idempotent-Replayed: true), 409 with Retry-After
// (in_progress), 422 (IK001), 400 (22P02), 503 (40001/40P01 still there after the
// retries, other transient errors), the rest as docs/reference.md's error table says,
// 500 for anything else (IK002 included).
//
// It needs the table and scope of examples/create_payment.sql. Connection settings come
// from the PG* environment variables (PGHOST, PGPORT, PGDATABASE, PGUSER, PGSSLMODE).
// Without PGSSLMODE it behaves as libpq's default, sslmode=prefer, which lib/pq lacks:
// TLS if the server offers it, else a plain connection (see openDB).
//
//	payments pay KEY ACCOUNT AMOUNT
//	payments race PREFIX WORKERS KEYS ACCOUNT_BASE   (WORKERS goroutines pay the same KEYS)
package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/lib/pq"
)

// The key is bound as text and cast to idem_key; the fingerprint covers the request.
const (
	claimSQL = `SELECT outcome, response, ceil(extract(epoch FROM retry_after))::int
	  FROM idem_claim('payments', $1::idem_key,
	                  idem_fingerprint(jsonb_build_object('account', $2::bigint, 'amount', $3::numeric)))`
	insertSQL = `INSERT INTO payments(account, amount) VALUES ($1, $2)
	  RETURNING jsonb_build_object('payment_id', id, 'amount', amount)`
	completeSQL = `SELECT idem_complete('payments', $1::idem_key, $2::jsonb)`
)

const attempts = 5

// retried: the whole transaction again, after a backoff.
var retried = map[string]bool{"IK005": true, "40001": true, "40P01": true}

// statusOf: the HTTP column of docs/reference.md's error table; anything else is 500.
var statusOf = map[string]int{"IK001": 422, "IK003": 409, "IK005": 409, "22P02": 400, "22004": 400,
	"22023": 400, "54000": 413, "40001": 503, "40P01": 503, "55P03": 503, "57014": 503, "IK006": 503,
	"25006": 503}

type Response struct {
	Status int
	Header map[string]string
	Body   json.RawMessage
}

func payOnce(ctx context.Context, db *sql.DB, key string, account int64, amount string) (Response, error) {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return Response{}, err
	}
	defer tx.Rollback() // does nothing after Commit
	var outcome string
	var response []byte
	var retryAfter sql.NullInt64
	if err := tx.QueryRowContext(ctx, claimSQL, key, account, amount).Scan(&outcome, &response, &retryAfter); err != nil {
		return Response{}, err
	}
	switch outcome {
	case "replay":
		return Response{201, map[string]string{"Idempotent-Replayed": "true"}, response}, tx.Commit()
	case "in_progress":
		return Response{409, map[string]string{"Retry-After": strconv.FormatInt(max1(retryAfter.Int64), 10)},
			json.RawMessage(`{"title": "in progress"}`)}, nil
	}
	// claimed ("duplicate" only comes to a transaction that claimed the key already)
	var payment []byte
	if err := tx.QueryRowContext(ctx, insertSQL, account, amount).Scan(&payment); err != nil {
		return Response{}, err
	}
	if _, err := tx.ExecContext(ctx, completeSQL, key, string(payment)); err != nil {
		return Response{}, err
	}
	return Response{201, map[string]string{}, payment}, tx.Commit() // IK002 would come from Commit
}

func pay(ctx context.Context, db *sql.DB, key string, account int64, amount string) Response {
	for attempt := 1; ; attempt++ {
		response, err := payOnce(ctx, db, key, account, amount)
		if err == nil {
			return response
		}
		code := ""
		var pqErr *pq.Error
		if errors.As(err, &pqErr) {
			code = string(pqErr.Code)
		}
		if retried[code] && attempt < attempts {
			fmt.Fprintf(os.Stderr, "%s: retrying after %s (attempt %d)\n", key, code, attempt)
			time.Sleep(time.Duration(float64(50*time.Millisecond) * float64(int(1)<<attempt) * (0.5 + rand.Float64())))
			continue
		}
		status, known := statusOf[code]
		if !known {
			status = 500
		}
		header := map[string]string{}
		if status == 409 || status == 503 {
			header["Retry-After"] = "1"
		}
		body, _ := json.Marshal(map[string]string{"sqlstate": code, "title": err.Error()})
		return Response{status, header, body}
	}
}

func max1(n int64) int64 {
	if n < 1 {
		return 1
	}
	return n
}

var output sync.Mutex

func report(key string, r Response) {
	replayed, retryAfter := "new", "-"
	if r.Header["Idempotent-Replayed"] != "" {
		replayed = "replayed"
	}
	if r.Header["Retry-After"] != "" {
		retryAfter = r.Header["Retry-After"]
	}
	body, _ := json.Marshal(r.Body) // one line
	output.Lock()
	defer output.Unlock()
	fmt.Println(key, r.Status, replayed, retryAfter, string(body))
}

// openDB connects as the PG* environment variables say. lib/pq's default sslmode is
// require, so a server without TLS (a local one, often) would refuse every connection
// with "SSL is not enabled on the server"; unless PGSSLMODE says otherwise, try TLS
// first and fall back to a plain connection, as libpq's default (prefer) does.
func openDB() (*sql.DB, error) {
	if os.Getenv("PGSSLMODE") != "" {
		return sql.Open("postgres", "")
	}
	db, err := sql.Open("postgres", "sslmode=require")
	if err != nil {
		return nil, err
	}
	if err := db.Ping(); errors.Is(err, pq.ErrSSLNotSupported) {
		db.Close()
		return sql.Open("postgres", "sslmode=disable")
	}
	return db, nil
}

func main() {
	db, err := openDB()
	if err != nil {
		panic(err)
	}
	defer db.Close()
	ctx := context.Background()
	args := os.Args[1:]
	switch args[0] {
	case "pay":
		account, _ := strconv.ParseInt(args[2], 10, 64)
		report(args[1], pay(ctx, db, args[1], account, args[3]))
	case "race":
		workers, _ := strconv.Atoi(args[2])
		keys, _ := strconv.Atoi(args[3])
		base, _ := strconv.ParseInt(args[4], 10, 64)
		db.SetMaxOpenConns(workers)
		var wg sync.WaitGroup
		for w := 0; w < workers; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 1; i <= keys; i++ {
					key := fmt.Sprintf("%s-%d", args[1], i)
					var r Response
					for {
						r = pay(ctx, db, key, base+int64(i), fmt.Sprintf("%d.5", i))
						if r.Status != 409 {
							break
						}
						seconds, _ := strconv.Atoi(r.Header["Retry-After"])
						time.Sleep(time.Duration(seconds) * time.Second) // as an HTTP client would
					}
					report(key, r)
				}
			}()
		}
		wg.Wait()
	}
}
