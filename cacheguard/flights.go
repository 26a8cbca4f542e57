package cacheguard

import (
	"reflect"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// flightKey names what a flight fills: one representation (keySet.rep, and
// the Go type, since two types may print alike).
type flightKey struct {
	rep  string
	typ  reflect.Type
	tags string // the call's tag set (tagSet.key): tagged and untagged loads store different envelopes
}

// maxJoinAge bounds the age of a flight a call may join by its generation:
// half of the generation's shortest life, so that a generation that was lost
// and reads as absent (0) cannot lead a call into a flight older than the
// invalidation that came between.
const maxJoinAge = genTTL / 2

// flight is one process's miss path for one representation, shared by the
// calls of the process that miss meanwhile and may take what it returns.
type flight struct {
	done    chan struct{} // closed when o is set
	o       *outcome
	started time.Time
	serial  uint64 // flights.serial when it was created
	rep     string
	asked   chan struct{} // closed once its first get-or-lease script answered (or it ended)
	askOnce sync.Once
	// floor is a generation of the key that began before anything the flight
	// may return was loaded: the one its starter read (0 when it read none),
	// raised to each one its get-or-lease script has seen. A call that read
	// generation x joins the flight if floor ≥ x: what it returns was then
	// loaded after every invalidation that returned before the call began
	// (those had moved the generation to at most x), in whichever process
	// they were made.
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
	mu     sync.Mutex // guards m and active
	m      map[flightKey][]*flight
	active map[string]int // running flights per representation

	// serial counts the flights created; running those not finished. Both
	// change under mu (running first), and are read without it by mark.
	serial  atomic.Uint64
	running atomic.Int64
}

// mark returns what a read of rep must carry for the calls sharing it to
// choose a flight (see join): the serial of the last flight created, and
// whether a flight of rep runs (then the read fetches the generation too).
func (fs *flights) mark(rep string) (serial uint64, busy bool) {
	serial = fs.serial.Load()
	if fs.running.Load() == 0 {
		return serial, false
	}
	fs.mu.Lock()
	busy = fs.active[rep] > 0
	fs.mu.Unlock()
	return serial, busy
}

// join returns a running flight of k that a call may take the outcome of, or
// a new one (leader) that the caller must start and end with finish. s is
// what the call's read found, sent after the call began: a flight created
// after that read (serial above s.mark) sends its scripts after it, so all it
// can return was loaded under the generation the call would have read, or a
// later one; a flight created before the read was sent was running then, so
// the read fetched the generation (s.gen, 0 when absent), and the call
// joins such a flight only if its floor is at least that. With pending, the flight returned has
// not heard from Redis yet and its floor is below s.gen: the caller waits for
// f.asked (the flight may then have seen s.gen, typically the one its own
// script created) and asks again — so that callers that miss together share
// one flight.
func (fs *flights) join(k flightKey, s stored) (f *flight, leader, pending bool) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	var wait *flight
	for _, f := range fs.m[k] {
		if f.closed.Load() {
			continue
		}
		if f.serial > s.mark {
			return f, false, false
		}
		if time.Since(f.started) >= maxJoinAge {
			continue
		}
		if f.floor.Load() >= s.gen {
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
		fs.m, fs.active = map[flightKey][]*flight{}, map[string]int{}
	}
	fs.running.Add(1)
	f = &flight{done: make(chan struct{}), asked: make(chan struct{}), started: time.Now(), serial: fs.serial.Add(1), rep: k.rep}
	f.floor.Store(s.gen)
	fs.m[k] = append(fs.m[k], f)
	fs.active[k.rep]++
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
	if fs.active[k.rep]--; fs.active[k.rep] <= 0 {
		delete(fs.active, k.rep)
	}
	fs.running.Add(-1)
	fs.mu.Unlock()
	f.o = o
	close(f.done)
	f.answered()
}
