package cacheguard

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/internal/counter"
	"github.com/cacheguard/cacheguard/internal/redistest"
)

// holdReplies counts reads (HGET, alone or in a pipeline) and, while armed,
// holds each one's reply (the command has run on the server) until release
// is closed.
type holdReplies struct {
	n       atomic.Int64
	armed   atomic.Bool
	release chan struct{}
}

// heldGets starts a server holding field k = v of the hash "h" and a Guard on
// it that sends one read of a representation at a time. The replies to reads
// (HGET) through the client it returns are held by the hook it returns until
// hook.open.
func heldGets(t *testing.T, v string) (*redistest.Server, *Guard, *holdReplies) {
	t.Helper()
	s := redistest.Start(t)
	rdb := s.Client()
	if err := rdb.HSet(context.Background(), "h", "k", v).Err(); err != nil {
		t.Fatal(err)
	}
	hook := &holdReplies{release: make(chan struct{})}
	hook.armed.Store(true)
	rdb.AddHook(hook)
	g := New(rdb, CommandTimeout(time.Hour)) // replies are held as long as a test needs
	g.reads.limit = 1                        // one read out at a time: see TestReadsOutAtOnce for more
	t.Cleanup(func() {
		hook.open()
		g.Close()
	})
	return s, g, hook
}

// open lets the held replies go and stops holding new ones.
func (h *holdReplies) open() {
	if h.armed.CompareAndSwap(true, false) {
		close(h.release)
	}
}

func (h *holdReplies) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *holdReplies) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if cmd.Name() == "hget" {
			h.n.Add(1)
			if h.armed.Load() {
				<-h.release
			}
		}
		return err
	}
}
func (h *holdReplies) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, cmd := range cmds {
			if cmd.Name() == "hget" {
				h.n.Add(1)
				if h.armed.Load() {
					<-h.release
				}
				break
			}
		}
		return err
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 5s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// queued is how many callers wait for the next read of key.
func (g *Guard) queued(key string) int {
	q := &g.reads
	q.mu.Lock()
	defer q.mu.Unlock()
	if l := q.m[entry{"h", key}]; l.next != nil {
		return l.next.waiting
	}
	return 0
}

// read is a read of field k of the hash "h" through g.
func read(ctx context.Context, g *Guard, k string) (string, error) {
	s, chained, err := g.readOne(ctx, entry{"h", k}, nil, time.Now().Add(time.Hour), nil, nil, false, false)
	chained.settle(nil) // no flight here: its callers go on as misses
	if err == nil {
		err = s.err
	}
	return string(s.b), err
}

// TestConcurrentReadsShareGets: a burst of reads costs two GETs — the one in
// flight when the burst arrives, and one more that all of the burst shares.
func TestConcurrentReadsShareGets(t *testing.T) {
	ctx := context.Background()
	_, g, hook := heldGets(t, "v")
	const n = 50
	var wg sync.WaitGroup
	got := make([]string, n+1)
	wg.Go(func() { got[n], _ = read(ctx, g, "k") })
	waitFor(t, "first GET out", func() bool { return hook.n.Load() == 1 })
	for i := range n {
		wg.Go(func() { got[i], _ = read(ctx, g, "k") })
	}
	waitFor(t, "burst queued", func() bool { return g.queued("k") == n })
	hook.open()
	wg.Wait()
	if g := hook.n.Load(); g != 2 {
		t.Fatalf("%d GETs for %d concurrent reads, want 2", g, n+1)
	}
	for i, v := range got {
		if v != "v" {
			t.Fatalf("reader %d got %q", i, v)
		}
	}
}

// TestBurstSharesAMiss: a burst queued behind a read that finds the entry
// absent shares that miss — one GET, not two — and may join only flights
// created from then on (its mark), whose scripts are sent after it arrived.
func TestBurstSharesAMiss(t *testing.T) {
	ctx := context.Background()
	_, g, hook := heldGets(t, "v")
	const n = 50
	var wg sync.WaitGroup
	got := make([]stored, n+1)
	wg.Go(func() {
		var chained *task[entry, stored]
		got[n], chained, _ = g.readOne(ctx, entry{"h", "absent"}, nil, time.Now().Add(time.Hour), nil, nil, false, false)
		chained.settle(nil)
	})
	waitFor(t, "first GET out", func() bool { return hook.n.Load() == 1 })
	for i := range n {
		wg.Go(func() {
			got[i], _, _ = g.readOne(ctx, entry{"h", "absent"}, nil, time.Now().Add(time.Hour), nil, nil, false, false)
		})
	}
	waitFor(t, "burst queued", func() bool { return g.queued("absent") == n })
	serial := g.flights.serial.Load()
	hook.open()
	wg.Wait()
	if c := hook.n.Load(); c != 1 {
		t.Fatalf("%d GETs for %d concurrent reads of an absent entry, want 1", c, n+1)
	}
	for i, s := range got[:n] {
		if s.b != nil || s.err != nil || s.mark < serial || s.gen != counter.Unknown || !s.counted {
			t.Fatalf("reader %d got %+v; want absent, a mark of %d or later, an unknown generation, counted as a miss", i, s, serial)
		}
	}
	if m := g.Stats().Misses; m != n {
		t.Fatalf("%d misses counted for %d callers waiting on a missing entry, want %d", m, n, n)
	}
}

// TestColdBurstWakesCallersOnce: callers that shared a read which found the
// entry absent wait for the flight its leader joined, and wake once, when
// it ends — not also to join it (on a host of few cores, a cold burst's
// wake-ups delay the load). Until the load ends only the leader has taken
// the miss path (the observer heard one miss), yet every caller counts as a
// miss in Stats: a miss there is a call already waiting. With a flight
// already running — one that follows another process's fill: the calls
// that find their own process filling wait for its store without a read
// (TestLateCallsWaitForTheFillWithoutARead) — the callers of a read sent
// after it (which fetches the generation) are handed to it the same way.
// When the leader gives up (its
// context ends) while the load runs, its read's callers wake then, and
// share that load: still one.
func TestColdBurstWakesCallersOnce(t *testing.T) {
	for _, c := range []struct{ running, quits bool }{{false, false}, {true, false}, {false, true}} {
		t.Run(fmt.Sprintf("flight running %v, leader gives up %v", c.running, c.quits), func(t *testing.T) { burstWakesOnce(t, c.running, c.quits) })
	}
}

func burstWakesOnce(t *testing.T, running, quits bool) {
	ctx := context.Background()
	s, g, hook := heldGets(t, "v")
	var observed, coalesced atomic.Int64
	g.cfg.observer = func(_ context.Context, e Event) {
		switch e.Kind {
		case EventMiss:
			observed.Add(1)
		case EventCoalescedLocal:
			coalesced.Add(1)
		}
	}
	release, entered := make(chan struct{}), make(chan struct{}, 1)
	var releaseOnce sync.Once
	free := func() { releaseOnce.Do(func() { close(release) }) }
	t.Cleanup(free) // before the Guard closes (cleanups run last first)
	load := func(context.Context) (string, error) {
		entered <- struct{}{}
		<-release
		return "x", nil
	}
	const n = 32
	var wg sync.WaitGroup
	got := make([]string, n)
	errs := make([]error, n)
	get := func(i int) { got[i], errs[i] = Get(ctx, g, "cold", load) }
	first, leaders := 0, int64(1) // the calls that take the miss path: the reads' leaders
	lctx, quit := context.WithCancel(ctx)
	defer quit()
	wantLoads := int64(1)
	if running {
		// Another process fills; this one's flight follows it.
		g2 := New(s.Client(), CommandTimeout(time.Hour))
		defer g2.Close()
		defer free() // first
		wg.Go(func() { _, _ = Get(ctx, g2, "cold", load) })
		<-entered
		hook.armed.Store(false)
		wg.Go(func() { get(0) })
		waitFor(t, "this process's flight following the other's fill", func() bool { return following(g) })
		hook.armed.Store(true)
		first, leaders, wantLoads = 1, 2, 0
	}
	reads := hook.n.Load()
	wg.Go(func() { got[first], errs[first] = Get(lctx, g, "cold", load) })
	waitFor(t, "the first read out", func() bool { return hook.n.Load() == reads+1 })
	for i := first + 1; i < n; i++ {
		wg.Go(func() { get(i) })
	}
	waitFor(t, "the burst queued behind it", func() bool {
		g.reads.mu.Lock()
		defer g.reads.mu.Unlock()
		for _, l := range g.reads.m {
			if l.next != nil && l.next.waiting == n-first-1 {
				return true
			}
		}
		return false
	})
	hook.open()
	waitFor(t, "every call waiting", func() bool { return g.Stats().Misses == n })
	if o := observed.Load(); o != leaders {
		t.Fatalf("while the load ran, %d calls took the miss path; want %d (the reads' leaders)", o, leaders)
	}
	if quits {
		joined := g.flights.joined.Load()
		quit()
		// Counted as misses when they wake, they join the flight after:
		// one that joined after the load ended would find the value in
		// Redis through a flight of its own (a remote coalescing).
		waitFor(t, "the leader's callers woken as it left, in its flight", func() bool {
			return observed.Load() == n && g.flights.joined.Load()-joined == int64(n-first-1)
		})
	}
	free()
	wg.Wait()
	for i := range n {
		if quits && i == first {
			if !errors.Is(errs[i], context.Canceled) {
				t.Fatalf("the leader, its context cancelled: %q, %v", got[i], errs[i])
			}
			continue
		}
		if got[i] != "x" || errs[i] != nil {
			t.Fatalf("call %d: %q, %v", i, got[i], errs[i])
		}
	}
	if st := g.Stats(); st.Loads != uint64(wantLoads) || st.Misses != n || st.CoalescedLocal != n-1 || observed.Load() != n || coalesced.Load() != n-1 {
		t.Fatalf("%+v; observer: %d misses, %d coalesced; want %d load(s), %d misses, %d coalesced", st, observed.Load(), coalesced.Load(), wantLoads, n, n-1)
	}
}

// following reports whether a flight of g follows another process's fill.
func following(g *Guard) bool {
	g.flights.mu.Lock()
	defer g.flights.mu.Unlock()
	for _, l := range g.flights.m {
		for _, t := range l.running {
			if t.elsewhere.Load() {
				return true
			}
		}
	}
	return false
}

// TestReadAfterInvalidationNotServedOldValue: a read that begins after the
// value was deleted never shares a GET that was answered before the delete.
func TestReadAfterInvalidationNotServedOldValue(t *testing.T) {
	ctx := context.Background()
	s, g, hook := heldGets(t, "old")
	first := make(chan string, 1)
	go func() { v, _ := read(ctx, g, "k"); first <- v }()
	waitFor(t, "first GET answered by the server", func() bool { return hook.n.Load() == 1 })
	// The invalidation completes while that GET's reply is still on its way.
	if err := s.Client().HDel(ctx, "h", "k").Err(); err != nil {
		t.Fatal(err)
	}
	later := make(chan error, 1)
	go func() {
		v, err := read(ctx, g, "k")
		if err == nil && v != "" {
			err = errors.New("got " + v)
		}
		later <- err
	}()
	waitFor(t, "later read queued", func() bool { return g.queued("k") == 1 })
	hook.open()
	if v := <-first; v != "old" {
		t.Fatalf("first read got %q", v)
	}
	if err := <-later; err != nil {
		t.Fatalf("a read that began after the delete: %v, want nothing found", err)
	}
}

// TestCancelledLeaderDoesNotFailFollowers: the read runs detached from the
// caller that started it, so the others still get its answer when that
// caller gives up.
func TestCancelledLeaderDoesNotFailFollowers(t *testing.T) {
	ctx := context.Background()
	_, g, hook := heldGets(t, "v")
	lctx, cancel := context.WithCancel(ctx)
	leader := make(chan error, 1)
	go func() { _, err := read(lctx, g, "k"); leader <- err }()
	waitFor(t, "first GET out", func() bool { return hook.n.Load() == 1 })
	// Queue a burst behind it, and a second caller of the first read that gives up.
	follower := make(chan string, 1)
	go func() { v, _ := read(ctx, g, "k"); follower <- v }()
	waitFor(t, "follower queued", func() bool { return g.queued("k") == 1 })
	cancel()
	hook.open()
	<-leader
	select {
	case v := <-follower:
		if v != "v" {
			t.Fatalf("follower got %q", v)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("follower stuck")
	}
}

// TestGivenUpReadsLeaveNothing: a caller that queues behind a GET in flight
// and gives up leaves no entry behind once that GET is answered (50 keys, 50
// callers that gave up: an empty map).
func TestGivenUpReadsLeaveNothing(t *testing.T) {
	ctx := context.Background()
	_, g, hook := heldGets(t, "v")
	const n = 50
	var wg sync.WaitGroup
	for i := range n {
		key := "k" + string(rune('A'+i))
		wg.Go(func() { read(ctx, g, key) })
		waitFor(t, "GET out", func() bool { return hook.n.Load() == int64(i+1) })
		gctx, cancel := context.WithCancel(ctx)
		gave := make(chan struct{})
		go func() { read(gctx, g, key); close(gave) }()
		waitFor(t, "queued", func() bool { return g.queued(key) == 1 })
		cancel()
		<-gave
	}
	hook.open()
	wg.Wait()
	q := &g.reads
	q.mu.Lock()
	left := len(q.m)
	q.mu.Unlock()
	if left != 0 {
		t.Fatalf("%d keys left in the coalescing map after every read ended", left)
	}
}

// TestReadsOutAtOnce: callers on different cores do not wait for each
// other's reads: up to max reads of a representation go out at once, and
// only the callers that arrive while max are out queue for the next, which
// they share (a burst of 50 costs max+1 reads).
func TestReadsOutAtOnce(t *testing.T) {
	ctx := context.Background()
	_, g, hook := heldGets(t, "v")
	g.reads.limit = 3
	const n = 50
	var wg sync.WaitGroup
	got := make([]string, n+3)
	for i := range 3 {
		wg.Go(func() { got[n+i], _ = read(ctx, g, "k") })
	}
	waitFor(t, "three reads out", func() bool { return hook.n.Load() == 3 })
	for i := range n {
		wg.Go(func() { got[i], _ = read(ctx, g, "k") })
	}
	waitFor(t, "burst queued", func() bool { return g.queued("k") == n })
	hook.open()
	wg.Wait()
	if g := hook.n.Load(); g != 4 {
		t.Fatalf("%d reads for %d concurrent callers, want 4", g, n+3)
	}
	for i, v := range got {
		if v != "v" {
			t.Fatalf("reader %d got %q", i, v)
		}
	}
}

// slowReplies delays the reply to every read (HGET) by d, after the server
// has answered it: a Redis slow to answer, never a stalled one.
type slowReplies struct {
	d    time.Duration
	sent atomic.Int64 // HGETs answered by the server
}

func (h *slowReplies) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *slowReplies) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if cmd.Name() == "hget" {
			h.sent.Add(1)
			time.Sleep(h.d) // the reply's delay (a fault, not synchronisation)
		}
		return err
	}
}
func (h *slowReplies) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestQueuedReadTimedFromItsSend: the command timeout of a caller queued
// behind a read in flight runs from when its own read is sent, not from when
// it queued: every read here answers within the command timeout (1s of 1.5s),
// so every caller gets the value — none fails for the time it spent waiting
// for the read ahead of it. With and without ContextTimeoutEnabled (the
// caller reads on its own goroutine, or hands the read to a worker).
func TestQueuedReadTimedFromItsSend(t *testing.T) {
	for _, cte := range []bool{false, true} {
		t.Run(map[bool]string{false: "plain client", true: "ContextTimeoutEnabled"}[cte], func(t *testing.T) {
			ctx := context.Background()
			s := redistest.Start(t)
			rdb := s.Client(func(o *redis.Options) { o.ContextTimeoutEnabled = cte })
			if err := rdb.HSet(ctx, "h", "k", "v").Err(); err != nil {
				t.Fatal(err)
			}
			hook := &slowReplies{d: time.Second}
			rdb.AddHook(hook)
			g := New(rdb, CommandTimeout(1500*time.Millisecond))
			g.reads.limit = 1
			t.Cleanup(func() { g.Close() })
			type answer struct {
				v   string
				err error
			}
			first, queued := make(chan answer, 1), make(chan answer, 1)
			go func() { v, err := read(ctx, g, "k"); first <- answer{v, err} }()
			waitFor(t, "first read answered by the server", func() bool { return hook.sent.Load() == 1 })
			go func() { v, err := read(ctx, g, "k"); queued <- answer{v, err} }()
			waitFor(t, "second read queued", func() bool { return g.queued("k") == 1 })
			for name, c := range map[string]chan answer{"first": first, "queued": queued} {
				if a := <-c; a.err != nil || a.v != "v" {
					t.Errorf("%s read: %q, %v; want the value (each read answers within the command timeout)", name, a.v, a.err)
				}
			}
		})
	}
}

// TestReadManyReply: a read of several keys in one round trip (a pipeline
// of HGETs) gives each key's bytes, nil for an absent one and an empty slice for an
// empty value, whatever the value's bytes.
func TestReadManyReply(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Start(t).Client()
	g := New(rdb)
	defer g.Close()
	p := "readmany"
	big := strings.Repeat("\xff\x00-", 30_000)
	vals := map[string]string{p + ":a": "one", p + ":c": "", p + ":d": big}
	for k, v := range vals {
		if err := rdb.HSet(ctx, k, "f", v).Err(); err != nil {
			t.Fatal(err)
		}
	}
	keys := []string{p + ":a", p + ":b", p + ":c", p + ":d"}
	out := make([]stored, len(keys))
	g.read(ctx, keys, "f", nil, out, nil, false)
	for i, k := range keys {
		if out[i].err != nil {
			t.Fatalf("%s: %v", k, out[i].err)
		}
		b := out[i].b
		if want, found := vals[k]; found != (b != nil) || string(b) != want {
			t.Fatalf("%s: %d bytes (nil %v), want %d (present %v)", k, len(b), b == nil, len(want), found)
		}
	}
}

// TestHandedOverCallsKeepTagInvalidation: the callers of a read sent after
// InvalidateTags returned, which found the entry absent and were handed to
// a flight that began loading before it, are not served that flight's value
// (loaded under the tag's older version): they load again. (TestGenCache
// found it: the hand-over admitted the flight by the key's generation alone,
// which a tag's invalidation does not move.)
func TestHandedOverCallsKeepTagInvalidation(t *testing.T) {
	ctx := context.Background()
	_, g, hook := heldGets(t, "v")
	release, entered := make(chan struct{}), make(chan struct{}, 1)
	var releaseOnce sync.Once
	free := func() { releaseOnce.Do(func() { close(release) }) }
	t.Cleanup(free)
	var loads atomic.Int64
	load := func(context.Context) (string, error) {
		if loads.Add(1) == 1 {
			entered <- struct{}{}
			<-release
			return "old", nil
		}
		return "new", nil
	}
	const n = 8
	var wg sync.WaitGroup
	got := make([]string, n)
	errs := make([]error, n)
	get := func(i int) { got[i], errs[i] = Get(ctx, g, "cold", load, Tags("t")) }
	hook.armed.Store(false)
	wg.Go(func() { get(0) })
	<-entered
	if err := g.InvalidateTags(ctx, "t"); err != nil {
		t.Fatal(err)
	}
	hook.armed.Store(true)
	reads := hook.n.Load()
	wg.Go(func() { get(1) })
	waitFor(t, "the read out", func() bool { return hook.n.Load() == reads+1 })
	for i := 2; i < n; i++ {
		wg.Go(func() { get(i) })
	}
	waitFor(t, "callers queued behind it", func() bool {
		g.reads.mu.Lock()
		defer g.reads.mu.Unlock()
		for _, l := range g.reads.m {
			if l.next != nil && l.next.waiting == n-2 {
				return true
			}
		}
		return false
	})
	hook.open()
	waitFor(t, "every call waiting", func() bool { return g.Stats().Misses == n })
	free()
	wg.Wait()
	if errs[0] != nil || got[0] != "old" {
		t.Fatalf("the call that began before the invalidation: %q, %v", got[0], errs[0])
	}
	for i := 1; i < n; i++ {
		if errs[i] != nil || got[i] != "new" {
			t.Fatalf("call %d, begun after InvalidateTags returned: %q, %v; want the value loaded after it", i, got[i], errs[i])
		}
	}
}
