// loadgen: requests per second and the server's CPU per request, for
// test/bench/middleware/run.pl.
//
//	loadgen -url http://127.0.0.1:8080/payments -mode new|replay -c 8 -d 5s -pid 1234 -key run1
//
// new: every request a new key; replay: one key, answered once before the clock starts,
// then replayed. Prints "requests_per_second cpu_microseconds_per_request errors".
package main

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

func cpuTicks(pid int) int64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		log.Fatal(err)
	}
	// The fields after the command's closing parenthesis: utime is the 12th, stime the 13th.
	fields := strings.Fields(string(data[bytes.LastIndexByte(data, ')')+2:]))
	utime, _ := strconv.ParseInt(fields[11], 10, 64)
	stime, _ := strconv.ParseInt(fields[12], 10, 64)
	return utime + stime
}

func main() {
	url := flag.String("url", "", "the route")
	mode := flag.String("mode", "new", "new or replay")
	clients := flag.Int("c", 8, "concurrent clients")
	duration := flag.Duration("d", 5*time.Second, "how long")
	pid := flag.Int("pid", 0, "the server's process")
	prefix := flag.String("key", "bench", "key prefix")
	flag.Parse()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: *clients}}
	body := []byte(`{"account": 1, "amount": 10}`)
	post := func(key string) bool {
		req, _ := http.NewRequest("POST", *url, bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", key)
		res, err := client.Do(req)
		if err != nil {
			return false
		}
		io.Copy(io.Discard, res.Body)
		res.Body.Close()
		return res.StatusCode == 201
	}
	if *mode == "replay" && !post(*prefix+"-replayed") {
		log.Fatal("the first request failed")
	}
	var done, errors, next int64
	start := cpuTicks(*pid)
	began := time.Now()
	var wg sync.WaitGroup
	for i := 0; i < *clients; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Since(began) < *duration {
				key := *prefix + "-replayed"
				if *mode == "new" {
					key = fmt.Sprintf("%s-%d", *prefix, atomic.AddInt64(&next, 1))
				}
				if post(key) {
					atomic.AddInt64(&done, 1)
				} else {
					atomic.AddInt64(&errors, 1)
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(began).Seconds()
	ticks := cpuTicks(*pid) - start // 100 per second (USER_HZ)
	fmt.Printf("%.0f %.0f %d\n", float64(done)/elapsed, float64(ticks)*1e4/float64(done), errors)
}
