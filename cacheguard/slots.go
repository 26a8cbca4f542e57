package cacheguard

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
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
	queue [2][]*slotWait // the waiting loads: [0] waited for, [1] background
	// promotions counts the waiting loads promote let run (tests).
	promotions atomic.Int64
}

// slotWait is a load waiting for a slot.
type slotWait struct {
	granted chan struct{}
	flights []*flight // the flights it loads for
	// free: granted without a slot, for a loader's Get that joined one of
	// its flights (see promote). Set before granted closes.
	free bool
}

func newLoadSlots(n int) *loadSlots {
	if n <= 0 {
		return nil
	}
	return &loadSlots{free: n}
}

// take waits for a slot until ctx ends, for a load of flights (none for a
// load without the lease), and reports whether it may run (ok), whether it
// then holds a slot (held) that give must free — a load that a loader's Get
// joined holds none (see promote) — and whether it queued for it (waited).
func (s *loadSlots) take(ctx context.Context, background bool, flights []*flight) (held, ok, waited bool) {
	s.mu.Lock()
	switch {
	case slices.ContainsFunc(flights, promoted):
		s.mu.Unlock()
		return false, true, false
	case s.free > 0:
		s.free--
		s.mu.Unlock()
		return true, true, false
	}
	q := 0
	if background {
		q = 1
	}
	w := &slotWait{granted: make(chan struct{}), flights: flights}
	s.queue[q] = append(s.queue[q], w)
	s.mu.Unlock()
	select {
	case <-w.granted:
		return !w.free, true, true
	case <-ctx.Done():
	}
	s.mu.Lock()
	if i := slices.Index(s.queue[q], w); i >= 0 {
		s.queue[q] = slices.Delete(s.queue[q], i, i+1)
		s.mu.Unlock()
		return false, false, true
	}
	s.mu.Unlock()
	if !w.free {
		s.give() // granted as ctx ended: pass it on
	}
	return false, false, true
}

func promoted(f *flight) bool { return f.t.nested.Load() }

// promote lets flight t load without a slot, now or when it comes to wait
// for one: a Get that a loader makes under its load's context (which takes
// no slot: it would wait for the one its caller holds) has joined t, and
// would otherwise wait for t while t waits for that very slot. It stays so
// should that Get stop waiting first (served an older value, its budget
// ended): one load more than the bound, never a stall. It runs
// under s.mu after t is marked, so that a load that checks the mark under
// s.mu before it queues either sees it or is found queued here.
func (s *loadSlots) promote(t *task[entry, *outcome]) {
	if s == nil || t.nested.Swap(true) {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for q := range s.queue {
		for i, w := range s.queue[q] {
			if slices.ContainsFunc(w.flights, func(f *flight) bool { return f.t == t }) {
				w.free = true
				close(w.granted)
				s.promotions.Add(1)
				s.queue[q] = slices.Delete(s.queue[q], i, i+1)
				return
			}
		}
	}
}

// give frees a slot: to the first waiting load, in the order take describes.
func (s *loadSlots) give() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for q := range s.queue {
		if len(s.queue[q]) > 0 {
			close(s.queue[q][0].granted)
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
// of flights (none: a load without the lease) under ctx (a background one:
// see loadSlots), and returns the func that frees it. Every load a Guard runs
// takes one — unless ctx is a load's of the same Guard (nested): a loader
// that calls Get would otherwise wait for the slot it holds; and for the same
// reason a flight such a Get joins takes none (see promote). It fails with
// ctx's cause when ctx ends first, and with an error matching
// context.DeadlineExceeded at deadline. It reports whether the load queued
// for its slot (waited): its fill leases may have been voided meanwhile (see
// call.fill).
func (g *Guard) slot(ctx context.Context, background bool, deadline time.Time, flights []*flight) (free func(), waited bool, err error) {
	if g.slots == nil || g.nested(ctx) {
		return func() {}, false, nil
	}
	wctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	held, ok, waited := g.slots.take(wctx, background, flights)
	if !ok {
		if ctx.Err() != nil {
			return nil, waited, context.Cause(ctx)
		}
		return nil, waited, fmt.Errorf("cacheguard: every load slot (MaxConcurrentLoads %d) stayed taken until the load's deadline: %w",
			g.cfg.maxLoads, context.DeadlineExceeded)
	}
	if !held {
		return func() {}, waited, nil
	}
	return g.slots.give, waited, nil
}

// nested reports whether ctx is a load's of g: a Get its loader makes.
func (g *Guard) nested(ctx context.Context) bool { return ctx.Value(loadingKey{}) == g }
