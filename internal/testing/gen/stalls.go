package gen

import (
	"sync"
	"testing"
	"time"
)

// Stalls watches the test process for stalls — the moments a starved host
// (or the Go runtime) left it standing still — so that an oracle can excuse
// what a stall explains, as it excuses an injected fault: a Redis reply that
// a node timeout gave up on while the process could not read it. A goroutine
// sleeps a millisecond at a time and notes each wake-up that came late by
// more than a millisecond; it ends at the test's cleanup.
type Stalls struct {
	mu   sync.Mutex
	seen []stall // the latest, oldest first (at most keepStalls)
	stop chan struct{}
	done chan struct{}
}

type stall struct {
	end time.Time
	d   time.Duration
}

const keepStalls = 4096

// WatchStalls starts watching, until tb's cleanup.
func WatchStalls(tb testing.TB) *Stalls {
	s := &Stalls{stop: make(chan struct{}), done: make(chan struct{})}
	go s.watch()
	tb.Cleanup(func() { close(s.stop); <-s.done })
	return s
}

func (s *Stalls) watch() {
	defer close(s.done)
	const tick = time.Millisecond
	t := time.NewTimer(tick)
	defer t.Stop()
	for {
		before := time.Now()
		select {
		case <-s.stop:
			return
		case <-t.C:
			now := time.Now()
			if late := now.Sub(before) - tick; late > time.Millisecond {
				s.mu.Lock()
				if len(s.seen) == keepStalls {
					s.seen = append(s.seen[:0], s.seen[1:]...)
				}
				s.seen = append(s.seen, stall{end: now, d: late})
				s.mu.Unlock()
			}
			t.Reset(tick)
		}
	}
}

// Since reports whether the process stood still for at least d at some
// moment that ended after from.
func (s *Stalls) Since(from time.Time, d time.Duration) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := len(s.seen) - 1; i >= 0 && s.seen[i].end.After(from); i-- {
		if s.seen[i].d >= d {
			return true
		}
	}
	return false
}
