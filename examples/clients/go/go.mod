module example.com/payments

go 1.19

require github.com/lib/pq v1.10.7

// Debian's golang-github-lib-pq-dev; elsewhere drop this line (go mod tidy fetches it).
replace github.com/lib/pq => /usr/share/gocode/src/github.com/lib/pq
