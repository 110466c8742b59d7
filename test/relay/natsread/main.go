// natsread, for test/t/033_relay.pl: `natsread URL create STREAM SUBJECT` creates a
// JetStream stream (file storage, 2 minute duplicate window); `natsread URL dump STREAM`
// prints each message of the stream as a JSON line {"id", "aggregate", "seq", "topic"}
// from its headers, in stream order.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
)

func main() {
	if len(os.Args) < 4 {
		fmt.Fprintln(os.Stderr, "usage: natsread URL create STREAM SUBJECT | natsread URL dump STREAM")
		os.Exit(2)
	}
	nc, err := nats.Connect(os.Args[1], nats.Timeout(5*time.Second))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer nc.Close()
	js, err := nc.JetStream()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	switch os.Args[2] {
	case "create":
		_, err = js.AddStream(&nats.StreamConfig{Name: os.Args[3], Subjects: []string{os.Args[4]},
			Storage: nats.FileStorage, Duplicates: 2 * time.Minute})
	case "dump":
		var info *nats.StreamInfo
		if info, err = js.StreamInfo(os.Args[3]); err == nil {
			out := json.NewEncoder(os.Stdout)
			for seq := info.State.FirstSeq; seq <= info.State.LastSeq && seq > 0; seq++ {
				m, err := js.GetMsg(os.Args[3], seq)
				if err != nil {
					fmt.Fprintln(os.Stderr, err)
					os.Exit(1)
				}
				s, _ := strconv.ParseInt(m.Header.Get("Idem-Seq"), 10, 64)
				out.Encode(map[string]interface{}{"id": m.Header.Get("Nats-Msg-Id"), "topic": m.Header.Get("Idem-Topic"),
					"aggregate": m.Header.Get("Idem-Aggregate"), "seq": s, "subject": m.Subject})
			}
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
