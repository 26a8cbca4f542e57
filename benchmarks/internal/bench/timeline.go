package bench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/benchmarks/internal/stats"
	"github.com/cacheguard/cacheguard/benchmarks/internal/systems"
)

// Fill is one worker's timeline of a cold-key stampede (wall clock, unix ns):
// when its loads ran, when the first message on a channel naming the key
// reached it, when its flight had the value another process loaded, and when
// each request returned.
type Fill struct {
	Loads  [][2]int64 `json:"loads,omitempty"` // each load's start and end
	Pushed int64      `json:"pushed"`          // 0: no message
	Remote int64      `json:"remote"`          // 0: none (see systems.Marks)
	End    []int64    `json:"end,omitempty"`   // each request's return, in the order of Lat (LatAll on the real database)
}

// pushWatch hears the messages of every channel whose name contains key (but
// not the warm-up's keys, key+":warm:…"), on a connection of its own
// (PSUBSCRIBE), and keeps when the first arrived since it was last reset:
// for cacheguard, the push of the fill's value to the waiters (published on a
// channel named after the key), heard when the waiters' own connection hears
// it. It costs the system under test nothing but one more receiver of the
// message in Redis.
type pushWatch struct {
	rdb   *redis.Client
	ps    *redis.PubSub
	first atomic.Int64
	done  chan struct{}
}

func watchPushes(ctx context.Context, addr, key string) (*pushWatch, error) {
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	ps := rdb.PSubscribe(ctx, "*"+key+"*")
	if _, err := ps.Receive(ctx); err != nil { // the confirmation
		ps.Close()
		rdb.Close()
		return nil, fmt.Errorf("push watch: %w", err)
	}
	w := &pushWatch{rdb: rdb, ps: ps, done: make(chan struct{})}
	go func() {
		defer close(w.done)
		for {
			msg, err := ps.Receive(context.Background())
			if err != nil {
				return
			}
			if m, ok := msg.(*redis.Message); ok && !strings.Contains(m.Channel, key+":warm:") {
				w.first.CompareAndSwap(0, time.Now().UnixNano())
			}
		}
	}()
	return w, nil
}

func (w *pushWatch) Close() {
	if w == nil {
		return
	}
	w.ps.Close()
	<-w.done
	w.rdb.Close()
}

func (w *pushWatch) pushed() int64 {
	if w == nil {
		return 0
	}
	return w.first.Load()
}

// fillMarks are the instruments of a stampede worker (nil when the job
// asked for no timeline).
type fillMarks struct {
	push  *pushWatch
	marks *systems.Marks
}

func newFillMarks(ctx context.Context, j Job) (*fillMarks, error) {
	if !j.Timeline {
		return nil, nil
	}
	w, err := watchPushes(ctx, j.Addrs[0], j.Key)
	if err != nil {
		return nil, err
	}
	return &fillMarks{push: w, marks: &systems.Marks{}}, nil
}

// reset forgets what the warm-up marked: called at GO.
func (m *fillMarks) reset() {
	if m != nil {
		m.push.first.Store(0)
		m.marks.Remote.Store(0)
	}
}

func (m *fillMarks) cacheMarks() *systems.Marks {
	if m == nil {
		return nil
	}
	return m.marks
}

func (m *fillMarks) Close() {
	if m != nil {
		m.push.Close()
	}
}

// fill returns the worker's timeline, given its loads and each request's
// start (t0s) and latency.
func (m *fillMarks) fill(loads [][2]int64, t0s, lat []int64) *Fill {
	if m == nil {
		return nil
	}
	f := &Fill{Loads: loads, Pushed: m.push.pushed(), Remote: m.marks.Remote.Load(), End: make([]int64, len(lat))}
	for i := range lat {
		f.End[i] = t0s[i] + lat[i]
	}
	return f
}

// timeline is what one stampede adds to its load, and where that goes.
type timeline struct {
	load     time.Duration // the longest load
	p99      time.Duration // of every request
	overhead time.Duration // p99 − load
	// front: from GO to the first load's start (reads, the fill lease).
	front time.Duration
	// The waiting processes (those that did not load), the slowest of each:
	// from the load's end until the push reached the process (store,
	// publish, delivery), until its flight had the value (the Hub's
	// delivery to the flight, decode), and from then until the p99 of its
	// requests had returned (goroutine wake-ups).
	push, decode, wake time.Duration
	// filler: in the process that loaded, from the load's end to the p99 of
	// its requests' returns (store round trip, wake-ups).
	filler time.Duration
	// pushed, decoded: some process that did not load heard the push, had
	// the value from it (push, decode and wake are set).
	pushed, decoded bool
}

var errNoTimeline = errors.New("no timeline")

// fillTimeline reads the timeline of one stampede out of its workers'
// reports; lats are each report's latencies (Lat, or LatAll on the real
// database).
func fillTimeline(reps []Report, lats [][]int64) (timeline, error) {
	var tl timeline
	var all []time.Duration
	var start int64 = math.MaxInt64
	var firstLoad, lastEnd int64 = math.MaxInt64, 0
	for i, r := range reps {
		if r.Fill == nil {
			return tl, errNoTimeline
		}
		start = min(start, r.Start)
		for _, l := range r.Fill.Loads {
			tl.load = max(tl.load, time.Duration(l[1]-l[0]))
			firstLoad = min(firstLoad, l[0])
			lastEnd = max(lastEnd, l[1])
		}
		for _, v := range lats[i] {
			all = append(all, time.Duration(v))
		}
	}
	if lastEnd == 0 {
		return tl, errNoTimeline
	}
	tl.p99 = stats.Durations(all).P99
	tl.overhead = tl.p99 - tl.load
	tl.front = time.Duration(firstLoad - start)
	p99Since := func(ends []int64, from int64) time.Duration {
		ds := make([]time.Duration, len(ends))
		for i, e := range ends {
			ds[i] = time.Duration(e - from)
		}
		return stats.Durations(ds).P99
	}
	for _, r := range reps {
		f := r.Fill
		if len(f.Loads) > 0 {
			end := int64(0)
			for _, l := range f.Loads {
				end = max(end, l[1])
			}
			tl.filler = max(tl.filler, p99Since(f.End, end))
			continue
		}
		if f.Pushed > 0 {
			tl.pushed = true
			tl.push = max(tl.push, time.Duration(f.Pushed-lastEnd))
		}
		if f.Remote > 0 {
			tl.decoded = true
			if f.Pushed > 0 {
				tl.decode = max(tl.decode, time.Duration(f.Remote-f.Pushed))
			}
			tl.wake = max(tl.wake, p99Since(f.End, f.Remote))
		}
	}
	return tl, nil
}

// timelineMetrics are the columns of a wake-up overhead table.
var timelineMetrics = []Metric{
	{"load", "load ms", "%.1f"},
	{"p99", "p99 ms", "%.1f"},
	{"over", "**p99 − load ms**", "%.1f"},
	{"front", "GO → load start ms", "%.1f"},
	{"filler", "loading process: load end → p99 return ms", "%.1f"},
	{"push", "load end → push heard ms", "%.2f"},
	{"decode", "push heard → value decoded ms", "%.2f"},
	{"wake", "value decoded → p99 return ms", "%.2f"},
}

// addTimeline records tl in row r of a wake-up overhead table.
func addTimeline(r *Row, tl timeline) {
	r.add("load", stats.Ms(tl.load))
	r.add("p99", stats.Ms(tl.p99))
	r.add("over", stats.Ms(tl.overhead))
	r.add("front", stats.Ms(tl.front))
	r.add("filler", stats.Ms(tl.filler))
	if tl.pushed {
		r.add("push", stats.Ms(tl.push))
	}
	if tl.decoded {
		r.add("decode", stats.Ms(tl.decode))
		r.add("wake", stats.Ms(tl.wake))
	}
}

// timelineIntro explains a wake-up overhead table.
const timelineIntro = "What each system adds to the load on a cold key: *p99 − load* is the p99 latency of all " +
	"requests minus the load's own time (the longest load when there are several). Its floor is 0 for one load per " +
	"fleet (no request can be served before it ends); where every process loads, a request that arrives while its " +
	"process's load runs waits less than a load, so the figure can be negative (no ratio to it is given). " +
	"Where it goes, from the same runs (wall clock, every process on one host): " +
	"*GO → load start*, the reads and the fill lease before the load; in the process that loaded, from the load's end " +
	"until the p99 of its requests returned; in the slowest of the other processes, from the load's end until the " +
	"value's push reached the process (heard by a pattern subscription of the harness's own, beside the system's), " +
	"from then until the process's flight had decoded it (cacheguard's EventCoalescedRemote), and from then until " +
	"the p99 of its requests had returned (goroutine wake-ups). Systems that load in every process have no push."

// overRatio is a cold-key target's ratio of cacheguard's p99 − load (ov) to
// a baseline's (base), NaN (printed "–") when base is not positive: a
// baseline that loads in every process serves the requests that arrive
// during its process's load in less than a load, so its p99 can fall below
// its longest load, and a ratio to that means nothing; the row then compares
// the two figures.
func overRatio(ov, base float64) float64 {
	if base <= 0 {
		return math.NaN()
	}
	return ov / base
}

// ratioOrDash formats a ratio, "–" when it is NaN.
func ratioOrDash(r float64) string {
	if math.IsNaN(r) {
		return "–"
	}
	return fmt.Sprintf("%.2f×", r)
}

// wakeNote explains the form of the cold-key targets.
const wakeNote = "Cold-key targets: on a cold key no request can be served before the one load ends, so the floor " +
	"of its p99 is the load's own time; what a system adds to it (p99 − load, tables 4b and R1b) is its cost, " +
	"whatever the baseline's. (A ratio to per-process singleflight's p99 measured how much that baseline suffered: " +
	"its loads in every process do not slow a fixed-latency loader down.)"

// pushLog records every message published while it runs (PSUBSCRIBE *), on a
// connection of its own, for a trace.
type pushLog struct {
	rdb  *redis.Client
	ps   *redis.PubSub
	mu   sync.Mutex // guards log
	log  []systems.TraceEvent
	done chan struct{}
}

func logPushes(ctx context.Context, addr string) (*pushLog, error) {
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	ps := rdb.PSubscribe(ctx, "*")
	if _, err := ps.Receive(ctx); err != nil {
		ps.Close()
		rdb.Close()
		return nil, fmt.Errorf("push log: %w", err)
	}
	l := &pushLog{rdb: rdb, ps: ps, done: make(chan struct{})}
	go func() {
		defer close(l.done)
		for {
			msg, err := ps.Receive(context.Background())
			if err != nil {
				return
			}
			if m, ok := msg.(*redis.Message); ok {
				p := m.Payload
				if len(p) > 40 {
					p = p[:40]
				}
				l.mu.Lock()
				l.log = append(l.log, systems.TraceEvent{At: time.Now().UnixNano(), What: "push", Key: m.Channel, Err: p})
				l.mu.Unlock()
			}
		}
	}()
	return l, nil
}

func (l *pushLog) events() []systems.TraceEvent {
	if l == nil {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]systems.TraceEvent(nil), l.log...)
}

func (l *pushLog) Close() {
	if l == nil {
		return
	}
	l.ps.Close()
	<-l.done
	l.rdb.Close()
}
