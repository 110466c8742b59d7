module payments-app

go 1.19

require (
	github.com/lib/pq v1.10.7
	idemhttp v0.0.0
)

// The middleware from this repository; Debian's golang-github-lib-pq-dev.
replace (
	github.com/lib/pq => /usr/share/gocode/src/github.com/lib/pq
	idemhttp => ../../../middleware/go
)
