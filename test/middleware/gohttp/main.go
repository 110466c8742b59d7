// The payments app of test/t/029_middleware.pl: net/http with idemhttp and lib/pq.
//
//	POST /payments  {"account": 1, "amount": 10}  key required: 201, or 402 (declined,
//	                amount over 1000: final, stored with idem_fail)
//	POST /tips      the same, key optional
//	POST /orders    lease mode: a checkpoint, then the payment
//
// Test hooks: every handler first takes advisory lock 43 shared, so the test can hold a
// handler inside its transaction by holding that lock; X-Test-Fail: 1 makes a handler
// panic after its insert. The PG* variables (PGSSLMODE=disable) and PORT come from the
// environment.
package main

import (
	"database/sql"
	"encoding/json"
	"fmt"
	"log"
	"net/http"
	"os"
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

// checks serves the test's two checks of the fingerprint: "fingerprint METHOD PATH
// BODY" prints it in hex; "vectors FILE" prints the names of the vectors of
// test/fingerprint_vectors.json whose canonical text CanonicalJSON gets wrong.
func checks(args []string) {
	switch args[0] {
	case "fingerprint":
		fmt.Printf("%x\n", idemhttp.RequestFingerprint(args[1], args[2], []byte(args[3])))
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
	mux.Handle("/tips", idemhttp.Middleware(idemhttp.Options{DB: db, Optional: true})(http.HandlerFunc(pay)))
	mux.Handle("/orders", idemhttp.Middleware(idemhttp.Options{DB: db, Lease: 60 * time.Second})(http.HandlerFunc(order)))
	log.Fatal(http.ListenAndServe("127.0.0.1:"+os.Getenv("PORT"), mux))
}
