package cacheguard

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"
)

// loadSlots bounds how many loads a Guard runs at once (MaxConcurrentLoads).
// A load waits for a slot; a slot that frees goes to the loads callers wait
// for (a miss, a load without the lease) before the background ones (the
// refresh after a stale value was served, an early refresh), first come first
// served within each: when the database is the bottleneck, a reader who has
// nothing to be served waits behind no refresh of a value others are served
// meanwhile. A nil *loadSlots bounds nothing.
type loadSlots struct {
	mu    sync.Mutex
	free  int
	queue [2][]chan struct{} // the waiting loads: [0] waited for, [1] background
}

func newLoadSlots(n int) *loadSlots {
	if n <= 0 {
		return nil
	}
	return &loadSlots{free: n}
}

// take waits for a slot until ctx ends, and reports whether it got one.
func (s *loadSlots) take(ctx context.Context, background bool) bool {
	s.mu.Lock()
	if s.free > 0 {
		s.free--
		s.mu.Unlock()
		return true
	}
	q := 0
	if background {
		q = 1
	}
	granted := make(chan struct{})
	s.queue[q] = append(s.queue[q], granted)
	s.mu.Unlock()
	select {
	case <-granted:
		return true
	case <-ctx.Done():
	}
	s.mu.Lock()
	if i := slices.Index(s.queue[q], granted); i >= 0 {
		s.queue[q] = slices.Delete(s.queue[q], i, i+1)
		s.mu.Unlock()
		return false
	}
	s.mu.Unlock()
	s.give() // granted as ctx ended: pass it on
	return false
}

// give frees a slot: to the first waiting load, in the order take describes.
func (s *loadSlots) give() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for q := range s.queue {
		if len(s.queue[q]) > 0 {
			close(s.queue[q][0])
			s.queue[q] = slices.Delete(s.queue[q], 0, 1)
			return
		}
	}
	s.free++
}

// waiting is how many loads wait for a slot.
func (s *loadSlots) waiting() int {
	if s == nil {
		return 0
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.queue[0]) + len(s.queue[1])
}

// loadingKey marks the context of a load of a Guard (the Guard is the value):
// a Get its loader makes is no new load to bound.
type loadingKey struct{}

// slot waits until deadline for one of MaxConcurrentLoads' slots for a load
// under ctx (a background one: see loadSlots), and returns the func that frees
// it. Every load a Guard runs takes one — unless ctx is a load's of the same
// Guard: a loader that calls Get would otherwise wait for the slot it holds.
// It fails with ctx's cause when ctx ends first, and with an error matching
// context.DeadlineExceeded at deadline.
func (g *Guard) slot(ctx context.Context, background bool, deadline time.Time) (free func(), err error) {
	if g.slots == nil || ctx.Value(loadingKey{}) == g {
		return func() {}, nil
	}
	wctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	if !g.slots.take(wctx, background) {
		if ctx.Err() != nil {
			return nil, context.Cause(ctx)
		}
		return nil, fmt.Errorf("cacheguard: every load slot (MaxConcurrentLoads %d) stayed taken until the load's deadline: %w",
			g.cfg.maxLoads, context.DeadlineExceeded)
	}
	return g.slots.give, nil
}
