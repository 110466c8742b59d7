// The payments app of test/t/029_middleware.pl: net/http with idemhttp and lib/pq.
//
//	POST /payments  {"account": 1, "amount": 10}  key required: 201, or 402 (declined,
//	                amount over 1000: final, stored with idem_fail)
//	POST /tips      the same, key optional, responses held back up to 32768 bytes
//	POST /orders    lease mode: a checkpoint, then the payment
//
// Test hooks: every handler first takes advisory lock 43 shared, so the test can hold a
// handler inside its transaction by holding that lock; X-Test-Fail: 1 makes a handler
// panic after its insert; X-Test-Size: N pads the payment's answer to N bytes, and
// X-Test-Stream: 1 streams it (the response-size rule). POST /manual: the same payment
// with idem_claim and idem_complete by hand, without the middleware (the benchmark of
// test/bench/middleware). The PG* variables
// (PGSSLMODE=disable) and PORT come from the environment.
package main

import (
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"idemhttp"

	_ "github.com/lib/pq"
)

type payment struct {
	Account int64   `json:"account"`
	Amount  float64 `json:"amount"`
}

func pay(w http.ResponseWriter, r *http.Request) {
	claim := idemhttp.FromContext(r.Context())
	var p payment
	if err := json.NewDecoder(r.Body).Decode(&p); err != nil {
		http.Error(w, err.Error(), 400)
		return
	}
	must(claim.Tx.Exec(`SELECT pg_advisory_xact_lock_shared(43)`))
	if p.Amount > 1000 {
		must(claim.Tx.Exec(`INSERT INTO declines(account) VALUES ($1)`, p.Account))
		reply(w, 402, map[string]any{"error": "declined"})
		return
	}
	var id int64
	if err := claim.Tx.QueryRow(`INSERT INTO payments(account, amount) VALUES ($1, $2) RETURNING id`,
		p.Account, p.Amount).Scan(&id); err != nil {
		panic(err)
	}
	if r.Header.Get("X-Test-Fail") != "" {
		panic("the handler failed after its insert")
	}
	if r.Header.Get("X-Test-Stream") != "" {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(201)
		fmt.Fprintf(w, `{"payment_id": %d, `, id)
		w.(http.Flusher).Flush()
		fmt.Fprint(w, `"streamed": true}`)
		return
	}
	if size := r.Header.Get("X-Test-Size"); size != "" {
		n, _ := strconv.Atoi(size)
		head := fmt.Sprintf(`{"payment_id": %d, "pad": "`, id)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(201)
		fmt.Fprint(w, head+strings.Repeat("x", n-len(head)-2)+`"}`)
		return
	}
	w.Header().Set("Location", fmt.Sprintf("/payments/%d", id))
	reply(w, 201, map[string]any{"payment_id": id, "amount": p.Amount})
}

func order(w http.ResponseWriter, r *http.Request) {
	claim := idemhttp.FromContext(r.Context())
	var p payment
	if err := json.NewDecoder(r.Body).Decode(&p); err != nil {
		http.Error(w, err.Error(), 400)
		return
	}
	must(claim.Tx.Exec(`SELECT pg_advisory_xact_lock_shared(43)`))
	// Here a payment provider would be called with a key derived from ours.
	if err := claim.SaveCheckpoint(r.Context(), "charged", map[string]any{"attempt": claim.Attempt}); err != nil {
		panic(err)
	}
	var id int64
	if err := claim.Tx.QueryRow(`INSERT INTO payments(account, amount) VALUES ($1, $2) RETURNING id`,
		p.Account, p.Amount).Scan(&id); err != nil {
		panic(err)
	}
	reply(w, 201, map[string]any{"payment_id": id, "amount": p.Amount})
}

func manual(db *sql.DB) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("Idempotency-Key")
		raw, _ := io.ReadAll(r.Body)
		var p payment
		if err := json.Unmarshal(raw, &p); err != nil {
			http.Error(w, err.Error(), 400)
			return
		}
		tx, err := db.BeginTx(r.Context(), nil)
		if err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		defer tx.Rollback()
		var outcome string
		var response []byte
		if err := tx.QueryRow(`SELECT outcome, response FROM idem_claim('POST /manual', $1::idem_key, $2)`,
			key, idemhttp.RequestFingerprint("POST", "/manual", raw)).Scan(&outcome, &response); err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		if outcome == "replay" {
			tx.Commit()
			var stored struct {
				Status  int               `json:"status"`
				Headers map[string]string `json:"headers"`
				Body    string            `json:"body"`
			}
			json.Unmarshal(response, &stored)
			for k, v := range stored.Headers {
				w.Header().Set(k, v)
			}
			w.Header().Set("Idempotent-Replayed", "true")
			w.WriteHeader(stored.Status)
			io.WriteString(w, stored.Body)
			return
		}
		if outcome != "claimed" {
			w.Header().Set("Retry-After", "1")
			http.Error(w, "in progress", 409)
			return
		}
		must(tx.Exec(`SELECT pg_advisory_xact_lock_shared(43)`))
		var id int64
		if err := tx.QueryRow(`INSERT INTO payments(account, amount) VALUES ($1, $2) RETURNING id`,
			p.Account, p.Amount).Scan(&id); err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		text, _ := json.Marshal(map[string]any{"payment_id": id, "amount": p.Amount})
		headers := map[string]string{"content-type": "application/json", "location": fmt.Sprintf("/payments/%d", id)}
		stored, _ := json.Marshal(map[string]any{"status": 201, "headers": headers, "body": string(text)})
		must(tx.Exec(`SELECT idem_complete('POST /manual', $1::idem_key, $2::jsonb)`, key, string(stored)))
		if err := tx.Commit(); err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		for k, v := range headers {
			w.Header().Set(k, v)
		}
		w.WriteHeader(201)
		w.Write(text)
	}
}

func reply(w http.ResponseWriter, status int, body any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(body)
}

func must(_ sql.Result, err error) {
	if err != nil {
		panic(err)
	}
}

// checks serves the test's checks of the fingerprint and the key: "fingerprint METHOD
// PATH BODY" prints it in hex; "vectors FILE" prints the names of the vectors of
// test/fingerprint_vectors.json whose canonical text CanonicalJSON gets wrong; "keys
// FILE" those of test/middleware/key_vectors.json that ParseKey gets wrong.
func checks(args []string) {
	switch args[0] {
	case "fingerprint":
		fmt.Printf("%x\n", idemhttp.RequestFingerprint(args[1], args[2], []byte(args[3])))
	case "keys":
		data, err := os.ReadFile(args[1])
		if err != nil {
			log.Fatal(err)
		}
		var vectors []struct {
			Name, Key, Error string
			Fields           []string
		}
		if err := json.Unmarshal(data, &vectors); err != nil {
			log.Fatal(err)
		}
		for _, v := range vectors {
			key, err := idemhttp.ParseKey(v.Fields)
			if got := fmt.Sprint(err); (err == nil && key != v.Key) || (err != nil && got != v.Error) {
				fmt.Printf("%s: got %q, %q\n", v.Name, key, got)
			}
		}
	case "vectors":
		data, err := os.ReadFile(args[1])
		if err != nil {
			log.Fatal(err)
		}
		var vectors []struct{ Name, Input, Canonical string }
		if err := json.Unmarshal(data, &vectors); err != nil {
			log.Fatal(err)
		}
		for _, v := range vectors {
			if got, err := idemhttp.CanonicalJSON([]byte(v.Input)); err != nil || got != v.Canonical {
				fmt.Println(v.Name)
			}
		}
	}
}

func main() {
	if len(os.Args) > 1 {
		checks(os.Args[1:])
		return
	}
	db, err := sql.Open("postgres", "")
	if err != nil {
		log.Fatal(err)
	}
	db.SetMaxOpenConns(8)
	mux := http.NewServeMux()
	mux.Handle("/payments", idemhttp.Middleware(idemhttp.Options{DB: db})(http.HandlerFunc(pay)))
	mux.Handle("/tips", idemhttp.Middleware(idemhttp.Options{DB: db, Optional: true, MaxResponseSize: 32768})(http.HandlerFunc(pay)))
	mux.Handle("/orders", idemhttp.Middleware(idemhttp.Options{DB: db, Lease: 60 * time.Second})(http.HandlerFunc(order)))
	mux.Handle("/manual", manual(db))
	log.Fatal(http.ListenAndServe("127.0.0.1:"+os.Getenv("PORT"), mux))
}
