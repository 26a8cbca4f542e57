package main

import (
	"fmt"
	"sync"
	"time"

	"github.com/alicebob/miniredis/v2"
)

// tick is how often the embedded server's clock is moved on: keys expire at
// most this late.
const tick = 5 * time.Millisecond

// embedded is an in-process Redis-compatible server (miniredis), so the demo
// needs nothing installed. miniredis does not expire keys by itself: a ticker
// moves its key clock on by the time that really passed, so leases and TTLs run
// out in real time. Its TIME command already answers the wall clock.
type embedded struct {
	srv  *miniredis.Miniredis
	stop chan struct{}
	done chan struct{}
	once sync.Once
}

// startEmbedded starts the server on a free loopback port and its clock.
func startEmbedded() (*embedded, error) {
	srv := miniredis.NewMiniRedis()
	if err := srv.Start(); err != nil {
		return nil, fmt.Errorf("start embedded redis: %w", err)
	}
	e := &embedded{srv: srv, stop: make(chan struct{}), done: make(chan struct{})}
	go e.clock()
	return e, nil
}

// Addr is the server's host:port.
func (e *embedded) Addr() string { return e.srv.Addr() }

// clock advances the key clock by the monotonic time elapsed since the last tick.
func (e *embedded) clock() {
	defer close(e.done)
	t := time.NewTicker(tick)
	defer t.Stop()
	last := time.Now()
	for {
		select {
		case <-e.stop:
			return
		case now := <-t.C:
			e.srv.FastForward(now.Sub(last))
			last = now
		}
	}
}

// Close stops the clock and the server; it is safe to call more than once.
func (e *embedded) Close() {
	e.once.Do(func() {
		close(e.stop)
		<-e.done
		e.srv.Close()
	})
}
