package main

// batchingConn carries the RabbitMQ sink's connection. The AMQP client flushes every
// frame it writes, three per message (method, properties, body), each its own system
// call and TCP segment, and so many wake-ups of the broker's reader. Here one goroutine
// writes out whatever has piled up since its last write: a lone frame leaves at once,
// and under load the frames of many publications leave together.
//
// A write handed over is not yet sent: a failed write closes the connection, the
// client reports it lost, and the publications it carried get no confirm, so none
// counts as delivered. What piles up is bounded by the publications in flight
// (--concurrency times --amqp-pipeline messages), each of which awaits its confirm.

import (
	"net"
	"sync"
)

type batchingConn struct {
	net.Conn
	mu      sync.Mutex
	ready   *sync.Cond
	pending []byte
	err     error // the first failed write, or net.ErrClosed once closed
}

func newBatchingConn(c net.Conn) *batchingConn {
	b := &batchingConn{Conn: c}
	b.ready = sync.NewCond(&b.mu)
	go b.writeLoop()
	return b
}

func (b *batchingConn) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.err != nil {
		return 0, b.err
	}
	b.pending = append(b.pending, p...)
	b.ready.Signal()
	return len(p), nil
}

func (b *batchingConn) writeLoop() {
	var out []byte
	for {
		b.mu.Lock()
		for len(b.pending) == 0 && b.err == nil {
			b.ready.Wait()
		}
		if b.err != nil {
			b.mu.Unlock()
			return
		}
		out, b.pending = b.pending, out[:0]
		b.mu.Unlock()
		if _, err := b.Conn.Write(out); err != nil {
			b.fail(err)
			return
		}
	}
}

// fail records the first error and closes the connection, which ends its reader too.
func (b *batchingConn) fail(err error) error {
	b.mu.Lock()
	first := b.err == nil
	if first {
		b.err = err
	}
	b.ready.Signal()
	b.mu.Unlock()
	if first {
		return b.Conn.Close()
	}
	return nil
}

func (b *batchingConn) Close() error { return b.fail(net.ErrClosed) }
