package cacheguard_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/cacheguard"
	"github.com/cacheguard/cacheguard/internal/childproc"
)

func TestOneLoadManyGoroutines(t *testing.T) {
	ctx := context.Background()
	g, _ := newGuard(t)
	key := testKey(t)
	c := &counter{delay: 50 * time.Millisecond, name: "x"}
	const n = 200
	results := make([]cacheguard.Result, n)
	errs := make([]error, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			var v item
			v, errs[i] = cacheguard.Get(ctx, g, key, c.load, cacheguard.ReportTo(&results[i]))
			if errs[i] == nil && v != (item{1, "x"}) {
				errs[i] = fmt.Errorf("got %v", v)
			}
		})
	}
	close(start)
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	if n := c.n.Load(); n != 1 {
		t.Fatalf("loads = %d, want 1", n)
	}
	count := map[cacheguard.Result]int{}
	for _, r := range results {
		count[r]++
	}
	if count[cacheguard.Miss] != 1 || count[cacheguard.Miss]+count[cacheguard.Coalesced]+count[cacheguard.Hit] != n {
		t.Fatalf("results %v, want one MISS and the rest COALESCED or HIT", count)
	}
}

// Two Guards with their own clients stand for two processes.
func TestWaiterInOtherGuardGetsPushedValue(t *testing.T) {
	ctx := context.Background()
	a, _ := newGuard(t)
	b, rb := newGuard(t)
	waiting := watchWaiting(rb)
	key := testKey(t)
	entered, release := make(chan struct{}), make(chan struct{})
	var loads, bLoads int
	done := make(chan error, 1)
	go func() {
		_, err := cacheguard.Get(ctx, a, key, func(context.Context) (item, error) {
			loads++
			close(entered)
			<-release
			return item{ID: 7}, nil
		})
		done <- err
	}()
	<-entered
	var res cacheguard.Result
	got := make(chan item, 1)
	go func() {
		v, err := cacheguard.Get(ctx, b, key, func(context.Context) (item, error) {
			bLoads++
			return item{ID: -1}, nil
		}, cacheguard.ReportTo(&res))
		if err != nil {
			v = item{ID: -2, Name: err.Error()}
		}
		got <- v
	}()
	<-waiting // b waits for the lease (subscribed) before the holder finishes
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if v := <-got; v.ID != 7 || res != cacheguard.Coalesced {
		t.Fatalf("b got %v (%v), want the holder's value, COALESCED", v, res)
	}
	if loads != 1 || bLoads != 0 {
		t.Fatalf("loads a=%d b=%d, want 1 and 0", loads, bLoads)
	}
	if st := b.Stats(); st.CoalescedRemote != 1 {
		t.Fatalf("b stats %+v, want one remote coalescing", st)
	}
}

func TestSlowLoaderKeepsLease(t *testing.T) {
	ctx := context.Background()
	// Generous margins: renewal every third of the lease must survive a
	// CPU-starved -race run.
	lease := cacheguard.Lease(400 * time.Millisecond)
	a, _ := newGuard(t, lease)
	b, _ := newGuard(t, lease)
	key := testKey(t)
	slow := &counter{delay: 2 * time.Second, name: "slow"} // five leases long
	other := &counter{name: "other"}
	entered := make(chan struct{})
	errc := make(chan error, 2)
	go func() {
		_, err := cacheguard.Get(ctx, a, key, func(ctx context.Context) (item, error) {
			close(entered)
			return slow.load(ctx)
		})
		errc <- err
	}()
	<-entered
	go func() {
		v, err := cacheguard.Get(ctx, b, key, other.load)
		if err == nil && v.Name != "slow" {
			err = fmt.Errorf("b got %v", v)
		}
		errc <- err
	}()
	for range 2 {
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
	}
	if slow.n.Load() != 1 || other.n.Load() != 0 {
		t.Fatalf("loads slow=%d other=%d, want 1 and 0", slow.n.Load(), other.n.Load())
	}
}

// failWhileWaiting runs a Get on one key in each of two Guards with their
// own clients (two processes): a's load starts first and fails with loadErr
// once b waits for it; b's own loader is load. It returns each Get's error.
func failWhileWaiting(t *testing.T, loadErr error, load func(context.Context) (item, error), opts ...cacheguard.Option) (errA, errB error) {
	t.Helper()
	ctx := context.Background()
	a, _ := newGuard(t, opts...)
	b, rb := newGuard(t, opts...)
	waiting := watchWaiting(rb)
	key := testKey(t)
	entered, release := make(chan struct{}), make(chan struct{})
	doneA := make(chan error, 1)
	go func() {
		_, err := cacheguard.Get(ctx, a, key, func(context.Context) (item, error) {
			close(entered)
			<-release
			return item{}, loadErr
		})
		doneA <- err
	}()
	<-entered
	doneB := make(chan error, 1)
	go func() {
		_, err := cacheguard.Get(ctx, b, key, load)
		doneB <- err
	}()
	<-waiting
	close(release)
	return <-doneA, <-doneB
}

func TestLoadErrorReachesRemoteWaiters(t *testing.T) {
	bLoads := 0
	errA, errB := failWhileWaiting(t, errors.New("db down"), func(context.Context) (item, error) { bLoads++; return item{}, nil })
	if errA == nil || errA.Error() != "db down" {
		t.Fatalf("holder: %v, want the loader's error", errA)
	}
	if !errors.Is(errB, cacheguard.ErrRemoteLoad) {
		t.Fatalf("waiter: %v, want ErrRemoteLoad", errB)
	}
	if bLoads != 0 {
		t.Fatal("the waiter loaded too")
	}
}

func TestOneLoadAcrossProcesses(t *testing.T) {
	const procs, perProc = 4, 48
	ctx := context.Background()
	rdb := shared(t)
	key := testKey(t)
	children := make([]*childproc.Proc, procs)
	for i := range children {
		children[i] = startChild(t, "stampede", childKey+"="+key, childN+"="+strconv.Itoa(perProc))
	}
	eventually(t, 30*time.Second, "children ready", func() bool {
		n, _ := rdb.Get(ctx, readyKey(key)).Int()
		return n == procs
	})
	tokens := make([]any, procs)
	for i := range tokens {
		tokens[i] = "go"
	}
	if err := rdb.RPush(ctx, barrierKey(key), tokens...).Err(); err != nil {
		t.Fatal(err)
	}
	for i, c := range children {
		out, err := c.Wait()
		if err != nil {
			t.Fatalf("child %d: %v\n%s", i, err, strings.Join(out, "\n"))
		}
		t.Logf("child %d: %s", i, strings.Join(out, "\n"))
	}
	if n, _ := rdb.Get(ctx, loadsKey(key)).Int(); n != 1 {
		t.Fatalf("loads across %d processes × %d requests = %d, want 1", procs, perProc, n)
	}
}

// TestHolderKilledWaiterTakesOver: a process that holds a key's fill lease is
// killed while it loads, or while it encodes the value it loaded (its lease
// renewed until the store, see TestLeaseKeptWhileEncoding); the waiters of
// another process take the fill over once the lease ran out, with one load.
func TestHolderKilledWaiterTakesOver(t *testing.T) {
	for _, stage := range []string{"load", "encode"} {
		t.Run(stage, func(t *testing.T) { holderKilled(t, stage) })
	}
}

func holderKilled(t *testing.T, stage string) {
	ctx := context.Background()
	rdb := shared(t)
	key := testKey(t)
	holder := startChild(t, "holder", childKey+"="+key, childN+"="+stage)
	eventually(t, 30*time.Second, "the child holds the lease and "+stage+"s", func() bool {
		return rdb.Exists(ctx, loadingKey(key)).Val() == 1
	})
	g, rg := newGuard(t, cacheguard.Lease(150*time.Millisecond))
	waiting := watchWaiting(rg)
	c := &counter{name: "taken over"}
	const n = 20
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			v, err := cacheguard.Get(ctx, g, key, c.load)
			if err == nil && v != (item{1, "taken over"}) {
				err = fmt.Errorf("got %v", v)
			}
			errs[i] = err
		})
	}
	// Kill the holder once this process waits for its fill.
	<-waiting
	out := holder.Kill()
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("%v\nchild: %s", err, strings.Join(out, "\n"))
	}
	if got := c.n.Load(); got != 1 {
		t.Fatalf("loads after the holder died = %d, want 1 (2 in all)", got)
	}
}

func TestRemoteWaitersGetNotFound(t *testing.T) {
	for _, neg := range []time.Duration{5 * time.Second, 0} {
		t.Run(fmt.Sprint("negative TTL ", neg), func(t *testing.T) {
			errA, errB := failWhileWaiting(t, cacheguard.ErrNotFound,
				func(context.Context) (item, error) { return item{ID: 1}, nil }, cacheguard.NegativeTTL(neg))
			if !errors.Is(errA, cacheguard.ErrNotFound) {
				t.Fatalf("holder: %v", errA)
			}
			if !errors.Is(errB, cacheguard.ErrNotFound) {
				t.Fatalf("waiter: %v, want ErrNotFound", errB)
			}
		})
	}
}

// TestWaiterIgnoresPushFromAnotherFill: a waiter trusts only the push of the
// fill whose lease it saw. A push from an earlier fill can reach a process's
// shared subscription after an invalidation that came later; taking it would
// serve the value the invalidation removed. Here a fresh envelope arrives on
// the channel from a fill that does not hold the lease: the waiter must wait
// for the holder's value instead.
func TestWaiterIgnoresPushFromAnotherFill(t *testing.T) {
	ctx := context.Background()
	a, rdb := newGuard(t)
	b, _ := newGuard(t)

	// A valid, fresh envelope holding a value nobody may serve for key.
	other := testKey(t, "other")
	if _, err := cacheguard.Get(ctx, a, other, (&counter{name: "stale"}).load); err != nil {
		t.Fatal(err)
	}
	stale, err := rdb.HGet(ctx, valueKey(other), itemField).Result()
	if err != nil {
		t.Fatal(err)
	}

	key := testKey(t)
	holder := newGated("holder")
	errc := make(chan error, 1)
	go func() {
		_, err := cacheguard.Get(ctx, a, key, holder.load)
		errc <- err
	}()
	<-holder.entered
	got := make(chan item, 1)
	go func() {
		v, err := cacheguard.Get(ctx, b, key, (&counter{name: "waiter loaded"}).load)
		if err != nil {
			t.Error(err)
		}
		got <- v
	}()
	channel := "cg:fw:{" + key + "}"
	eventually(t, 5*time.Second, "waiter subscribed", func() bool {
		return rdb.PubSubNumSub(ctx, channel).Val()[channel] == 1
	})
	if err := rdb.Publish(ctx, channel, "vsomeone-else "+stale).Err(); err != nil {
		t.Fatal(err)
	}
	close(holder.release)
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if v := <-got; v.Name != "holder" {
		t.Fatalf("waiter got %+v, want the lease holder's value", v)
	}
}

// hgets counts the reads of single entries a client sends (HGET; the fill's
// scripts and renewals are not counted).
type hgets struct{ n atomic.Int64 }

func (h *hgets) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *hgets) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() == "hget" {
			h.n.Add(1)
		}
		return next(ctx, cmd)
	}
}
func (h *hgets) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, c := range cmds {
			if c.Name() == "hget" {
				h.n.Add(1)
			}
		}
		return next(ctx, cmds)
	}
}

// Calls that arrive while their process fills the key for a miss, before
// the fill sends its store, wait for that store without a read of their
// own: its compare-and-set runs after they arrived, so a value it stored is
// what Redis held then. (Before, each wave of them read the entry first: 10
// reads in a burst of 128 calls on a 5 ms load, one process.)
func TestLateCallsWaitForTheFillWithoutARead(t *testing.T) {
	ctx := context.Background()
	rdb := shared(t)
	reads := &hgets{}
	rdb.AddHook(reads)
	g := cacheguard.New(rdb)
	t.Cleanup(func() { g.Close() })
	key := testKey(t)
	started, release := make(chan struct{}), make(chan struct{})
	load := func(context.Context) (item, error) {
		close(started) // a second load panics: the calls fail
		<-release
		return item{1, "x"}, nil
	}
	first := make(chan error, 1)
	go func() {
		_, err := cacheguard.Get(ctx, g, key, load)
		first <- err
	}()
	<-started
	before := reads.n.Load()
	const n = 8
	var wg sync.WaitGroup
	errs := make([]error, n)
	results := make([]cacheguard.Result, n)
	for i := range n {
		wg.Go(func() {
			var v item
			v, errs[i] = cacheguard.Get(ctx, g, key, load, cacheguard.ReportTo(&results[i]))
			if errs[i] == nil && v != (item{1, "x"}) {
				errs[i] = fmt.Errorf("got %v", v)
			}
		})
	}
	eventually(t, 10*time.Second, "the late calls waiting", func() bool { return g.Stats().Misses == n+1 })
	if d := reads.n.Load() - before; d != 0 {
		t.Errorf("the late calls sent %d reads, want none", d)
	}
	close(release)
	wg.Wait()
	if err := errors.Join(append(errs, <-first)...); err != nil {
		t.Fatal(err)
	}
	for i, r := range results {
		if r != cacheguard.Coalesced {
			t.Errorf("late call %d: %v, want COALESCED", i, r)
		}
	}
	if n := g.OpenStores(); n != 0 {
		t.Errorf("%d stores left open after the fill: every hit would take the flights' lock", n)
	}
}

// A call that arrives after another process's Invalidate that came while
// the fill loaded waits for that fill, whose store or release then finds
// the generation moved, and gets what was loaded after the invalidation,
// never what was loaded before it — a value, an absence or an uncached
// answer (release.lua reports the generation: a release that did not would
// hand the call an ErrNotFound from before the row existed). (After an Invalidate of its own
// process the call reads at once: TestLostGenerationNoOldFlight.)
func TestLateCallAfterInvalidateDuringFill(t *testing.T) {
	for _, first := range []string{"value", "not found", "uncached"} {
		t.Run(first, func(t *testing.T) {
			ctx := context.Background()
			g, _ := newGuard(t, cacheguard.NegativeTTL(0)) // an absence is released, not stored
			other, _ := newGuard(t)
			key := testKey(t)
			var loads atomic.Int64
			started, release := make(chan struct{}), make(chan struct{})
			load := func(context.Context) (item, error) {
				n := loads.Add(1)
				if n == 1 {
					close(started)
					<-release
					switch first {
					case "not found":
						return item{}, cacheguard.ErrNotFound
					case "uncached":
						return item{1, "x"}, fmt.Errorf("a cookie: %w", cacheguard.ErrUncached)
					}
				}
				return item{int(n), "x"}, nil
			}
			firstDone := make(chan error, 1)
			go func() {
				_, err := cacheguard.Get(ctx, g, key, load)
				firstDone <- err
			}()
			<-started
			if err := other.Invalidate(ctx, key); err != nil {
				t.Fatal(err)
			}
			late := make(chan error, 1)
			go func() {
				v, err := cacheguard.Get(ctx, g, key, load)
				if err != nil || v.ID != 2 {
					err = fmt.Errorf("the call after the Invalidate got %v, %v; want the value loaded after it", v, err)
				}
				late <- err
			}()
			eventually(t, 10*time.Second, "the late call waiting", func() bool { return g.Stats().Misses == 2 })
			close(release)
			if err := <-late; err != nil {
				t.Fatal(err)
			}
			<-firstDone
			if n := loads.Load(); n != 2 {
				t.Fatalf("loads = %d, want 2", n)
			}
			if n := g.OpenStores(); n != 0 {
				t.Fatalf("%d stores left open", n)
			}
		})
	}
}

// Calls that joined their process's fill after a read — a GetMany, which
// reads first; a Get whose read queued behind the starter's and was handed
// to its flight (chained); and the fill's own starter — stop waiting for it
// once it turns unfit (an Invalidate in this process returned: its store
// would fail) and share a flight begun after, as calls that arrive later do.
// Before, they waited for the stalled load to end (up to their wait budget).
func TestJoinedCallsLeaveAnUnfitFill(t *testing.T) {
	type got struct {
		v   item
		err error
	}
	for _, joiner := range []string{"GetMany", "chained Get"} {
		t.Run(joiner, func(t *testing.T) {
			ctx := context.Background()
			g, rdb := newGuard(t)
			cacheguard.SetReadLimit(g, 1) // a second call's read queues behind the first
			hold := &holdHGET{release: make(chan struct{})}
			rdb.AddHook(hold)
			var once sync.Once
			unhold := func() { once.Do(func() { hold.armed.Store(false); close(hold.release) }) }
			t.Cleanup(unhold) // before the Guard closes
			key := testKey(t)
			var loads atomic.Int64
			started, release := make(chan struct{}), make(chan struct{})
			t.Cleanup(func() { close(release) })
			load := func(context.Context) (item, error) {
				n := loads.Add(1)
				if n == 1 {
					close(started)
					<-release
				}
				return item{int(n), "x"}, nil
			}
			first, joined := make(chan got, 1), make(chan got, 1)
			hold.armed.Store(joiner == "chained Get")
			go func() {
				v, err := cacheguard.Get(ctx, g, key, load)
				first <- got{v, err}
			}()
			if joiner == "chained Get" {
				eventually(t, 10*time.Second, "the starter's read held", func() bool { return hold.held.Load() == 1 })
				go func() {
					v, err := cacheguard.Get(ctx, g, key, load)
					joined <- got{v, err}
				}()
				eventually(t, 10*time.Second, "a read queued behind it", func() bool { return cacheguard.ReadsQueued(g) == 1 })
				unhold()
				<-started
			} else {
				<-started
				go func() {
					m, err := cacheguard.GetMany(ctx, g, []string{key}, func(ctx context.Context, keys []string) (map[string]item, error) {
						v, err := load(ctx)
						return map[string]item{keys[0]: v}, err
					})
					joined <- got{m[key], err}
				}()
			}
			eventually(t, 10*time.Second, "both calls waiting for the fill", func() bool { return g.Stats().Misses == 2 })
			if err := g.Invalidate(ctx, key); err != nil {
				t.Fatal(err)
			}
			within := time.Now().Add(5 * time.Second)
			for name, c := range map[string]chan got{"the fill's starter": first, "the " + joiner: joined} {
				select {
				case r := <-c:
					if r.err != nil || r.v.ID < 2 {
						t.Errorf("%s got %v, %v; want a value loaded after the Invalidate", name, r.v, r.err)
					}
				case <-time.After(time.Until(within)):
					t.Errorf("%s still waits for the stalled fill 5s after the Invalidate returned", name)
				}
			}
			if n := loads.Load(); n != 2 {
				t.Errorf("loads = %d, want 2 (the stalled one and one after the Invalidate)", n)
			}
		})
	}
}

// holdHGET holds HGET commands sent alone (with pipelines, in a pipeline
// too) while armed, until release is closed, counting them.
type holdHGET struct {
	armed     atomic.Bool
	held      atomic.Int64
	release   chan struct{}
	pipelines bool
}

func (h *holdHGET) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *holdHGET) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if h.pipelines && h.armed.Load() && slices.ContainsFunc(cmds, func(c redis.Cmder) bool { return c.Name() == "hget" }) {
			h.held.Add(1)
			<-h.release
		}
		return next(ctx, cmds)
	}
}
func (h *holdHGET) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() == "hget" && h.armed.Load() {
			h.held.Add(1)
			<-h.release
		}
		return next(ctx, cmd)
	}
}

// TestCallCountedOnce: a call that began waiting for its process's fill
// counts as a miss then (Stats: a miss is a call already waiting); when that
// fill cannot store (an Invalidate came) the call reads, and may find a
// value stored meanwhile. It is served that value, and still counted once:
// Hits + Misses is the number of calls.
func TestCallCountedOnce(t *testing.T) {
	ctx := context.Background()
	g, rdb := newGuard(t)
	hold := &holdHGET{release: make(chan struct{}), pipelines: true}
	rdb.AddHook(hold)
	var once sync.Once
	unhold := func() { once.Do(func() { hold.armed.Store(false); close(hold.release) }) }
	t.Cleanup(unhold) // before the Guard closes
	key := testKey(t)
	l := newStallsOnce("stalled")
	t.Cleanup(func() { close(l.release) })
	first, late := make(chan error, 1), make(chan cacheguard.Result, 1)
	go func() {
		_, err := cacheguard.Get(ctx, g, key, l.load)
		first <- err
	}()
	<-l.entered
	go func() {
		var res cacheguard.Result
		_, err := cacheguard.Get(ctx, g, key, l.load, cacheguard.ReportTo(&res))
		if err != nil {
			t.Error(err)
		}
		late <- res
	}()
	eventually(t, 10*time.Second, "the late call waiting for the fill", func() bool { return g.Stats().Misses == 2 })
	hold.armed.Store(true) // the late call's read, once the fill turns unfit
	if err := g.Invalidate(ctx, key); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the late call's read held", func() bool { return hold.held.Load() == 1 })
	// The starter loads again meanwhile (its flight turned unfit too) and
	// stores: the late call's read finds that value.
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	unhold()
	if res := <-late; res != cacheguard.Hit {
		t.Fatalf("the late call's result %v, want a hit on the value the starter stored again", res)
	}
	if st := g.Stats(); st.Hits+st.Misses != 2 {
		t.Errorf("Stats counts %d hits and %d misses for 2 calls: %+v", st.Hits, st.Misses, st)
	}
}
