package cacheguard

import (
	"reflect"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// flightKey names what a flight fills: one representation (the value key,
// and the Go type, since two types may print alike).
type flightKey struct {
	value string
	typ   reflect.Type
}

// maxJoinAge bounds the age of a flight a call may join: half of the
// generation's shortest life, so that a generation that was lost and reads as
// absent (0) again cannot lead a call into a flight older than the
// invalidation that came between.
const maxJoinAge = genTTL / 2

// flight is one process's miss path for one representation, shared by the
// calls of the process that miss meanwhile and may take what it returns.
type flight struct {
	done    chan struct{} // closed when o is set
	o       *outcome
	started time.Time
	asked   chan struct{} // closed once its first get-or-lease script answered (or it ended)
	askOnce sync.Once
	// floor is a generation of the key that began before anything the flight
	// may return was loaded: the one its starter read, raised to each one its
	// get-or-lease script has seen. A call that read generation x joins the
	// flight only if floor ≥ x: what it returns was then loaded after every
	// invalidation that returned before the call began (those had moved the
	// generation to at most x), in whichever process they were made.
	floor  atomic.Int64
	closed atomic.Bool // takes no new callers: its fill lease was lost
}

// answered marks f's first get-or-lease answer (or its end).
func (f *flight) answered() { f.askOnce.Do(func() { close(f.asked) }) }

// saw raises f's floor to gen.
func (f *flight) saw(gen int64) {
	for {
		cur := f.floor.Load()
		if gen <= cur || f.floor.CompareAndSwap(cur, gen) {
			return
		}
	}
}

// flights is the set of running flights. The zero value is ready to use.
type flights struct {
	mu sync.Mutex // guards m
	m  map[flightKey][]*flight
}

// join returns a running flight of k that a call which read generation gen
// may take the outcome of, or a new one (leader) that the caller must start
// and end with finish. With pending, the flight returned has not heard from
// Redis yet and its floor is below gen: the caller waits for f.asked (the
// flight may then have seen gen, typically the one its own script created)
// and asks again — so that callers that miss together share one flight.
func (fs *flights) join(k flightKey, gen int64) (f *flight, leader, pending bool) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	var wait *flight
	for _, f := range fs.m[k] {
		if f.closed.Load() || time.Since(f.started) >= maxJoinAge {
			continue
		}
		if f.floor.Load() >= gen {
			return f, false, false
		}
		select {
		case <-f.asked:
		default:
			wait = f
		}
	}
	if wait != nil {
		return wait, false, true
	}
	if fs.m == nil {
		fs.m = map[flightKey][]*flight{}
	}
	f = &flight{done: make(chan struct{}), asked: make(chan struct{}), started: time.Now()}
	f.floor.Store(gen)
	fs.m[k] = append(fs.m[k], f)
	return f, true, false
}

// finish ends f with o.
func (fs *flights) finish(k flightKey, f *flight, o *outcome) {
	fs.mu.Lock()
	if l := slices.DeleteFunc(fs.m[k], func(x *flight) bool { return x == f }); len(l) > 0 {
		fs.m[k] = l
	} else {
		delete(fs.m, k)
	}
	fs.mu.Unlock()
	f.o = o
	close(f.done)
	f.answered()
}
