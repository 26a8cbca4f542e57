package reliability

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/cacheguard"
	"github.com/cacheguard/cacheguard/internal/redistest"
)

// newGuard returns a Guard on rdb closed at cleanup.
func newGuard(t *testing.T, s *redistest.Server, opts ...cacheguard.Option) *cacheguard.Guard {
	t.Helper()
	rdb := faultClient(s.Addr())
	g := cacheguard.New(rdb, opts...)
	t.Cleanup(func() {
		g.Close()
		rdb.Close()
	})
	return g
}

// stampede runs n concurrent Gets of key on the guards (round robin) and
// returns their values and errors.
func stampede(guards []*cacheguard.Guard, n int, key string, load func(context.Context) (string, error)) ([]string, []error) {
	vals, errs := make([]string, n), make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			vals[i], errs[i] = cacheguard.Get(context.Background(), guards[i%len(guards)], key, load)
		})
	}
	wg.Wait()
	return vals, errs
}

// TestReliabilityCacheHolderKilled: a process holding a key's fill lease is
// SIGKILLed in the middle of its load. The callers waiting in two other
// guards get the value loaded once by one of them after the lease runs out.
func TestReliabilityCacheHolderKilled(t *testing.T) {
	noLeaks(t)
	const lease = 300 * time.Millisecond
	srv := redistest.Start(t)
	client := srv.Client()
	t.Cleanup(func() { client.Close() })
	key := "killed-fill"
	p := startChild(t, "cg-fill", "REDIS_ADDR="+srv.Addr(), "KEY="+key, "LEASE="+lease.String())
	if l := p.next(t, 10*time.Second); l != "loading" {
		t.Fatalf("child: %s", l)
	}
	guards := []*cacheguard.Guard{newGuard(t, srv, cacheguard.Lease(lease)), newGuard(t, srv, cacheguard.Lease(lease))}
	var loads atomic.Int64
	start := time.Now()
	var vals []string
	var errs []error
	done := make(chan struct{})
	go func() {
		defer close(done)
		vals, errs = stampede(guards, 20, key, func(context.Context) (string, error) {
			loads.Add(1)
			return "fresh", nil
		})
	}()
	p.Kill()
	killed := time.Since(start)
	<-done
	fig := Figures{Scenario: "cache: fill-lease holder SIGKILLed mid-load, 20 waiters in 2 guards", Recovery: time.Since(start) - killed}
	for i := range vals {
		fig.Attempted++
		if errs[i] != nil || vals[i] != "fresh" {
			fig.Violations++
			t.Errorf("call %d: %q, %v", i, vals[i], errs[i])
			continue
		}
		fig.Succeeded++
	}
	if n := loads.Load(); n != 1 {
		fig.Violations++
		t.Errorf("%d loads after the holder died, want 1", n)
	}
	fig.Note = fmt.Sprintf("%d load(s) after the kill", loads.Load())
	fig.Report(t)
}

// TestReliabilityCacheRedisKilledMidStampede: redis-server is SIGKILLed
// while a stampede waits on a load. Every call still gets a value (fail-open:
// the loader runs, coalesced per process, nothing is cached); calls made while
// Redis is down do too; once it is restarted the cache fills again and serves
// hits. Recovery is the time from the restart to the first hit.
func TestReliabilityCacheRedisKilledMidStampede(t *testing.T) {
	noLeaks(t)
	srv := redistest.Start(t)
	guards := []*cacheguard.Guard{newGuard(t, srv, cacheguard.EarlyRefresh(0)), newGuard(t, srv, cacheguard.EarlyRefresh(0))}
	key := "stampede"
	fig := Figures{Scenario: "cache: redis-server SIGKILLed mid-stampede (fail-open), then restarted", Recovery: -1}
	var loads atomic.Int64
	gate := make(chan struct{})
	loading := make(chan struct{}, 1)
	load := func(context.Context) (string, error) {
		loads.Add(1)
		select {
		case loading <- struct{}{}:
		default:
		}
		<-gate
		return "v", nil
	}
	count := func(vals []string, errs []error) {
		for i := range vals {
			fig.Attempted++
			if errs[i] != nil || vals[i] != "v" {
				fig.Violations++
				t.Errorf("call %d: %q, %v", i, vals[i], errs[i])
				continue
			}
			fig.Succeeded++
		}
	}
	var vals []string
	var errs []error
	done := make(chan struct{})
	go func() {
		defer close(done)
		vals, errs = stampede(guards, 40, key, load)
	}()
	<-loading
	srv.Kill()
	close(gate)
	<-done
	count(vals, errs)
	during := loads.Load()
	// While Redis is down: still values, loaded once per guard when the calls
	// overlap (the loader is held until all 20 have missed).
	gate2 := make(chan struct{})
	load2 := func(context.Context) (string, error) {
		loads.Add(1)
		<-gate2
		return "v", nil
	}
	misses := func() uint64 { return guards[0].Stats().Misses + guards[1].Stats().Misses }
	before := misses()
	done2 := make(chan struct{})
	go func() {
		defer close(done2)
		count(stampede(guards, 20, key, load2))
	}()
	for deadline := time.Now().Add(10 * time.Second); misses() < before+20 && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond) // polling an observable counter, bounded
	}
	close(gate2)
	<-done2
	down := loads.Load() - during
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	restarted := time.Now()
	for try := 0; ; try++ {
		var res cacheguard.Result
		v, err := cacheguard.Get(context.Background(), guards[0], key, load, cacheguard.ReportTo(&res))
		fig.Attempted++
		if err == nil && v == "v" {
			fig.Succeeded++
		}
		if res == cacheguard.Hit {
			fig.Recovery = time.Since(restarted)
			break
		}
		if try > 200 {
			t.Fatal("the cache never served a hit after the restart")
		}
	}
	fig.Note = fmt.Sprintf("loads: %d for the 40-call stampede hit by the kill, %d for 20 calls while down (per guard: the first caller's, and one shared by the calls that arrived meanwhile), %d until the first hit after the restart",
		during, down, loads.Load()-during-down)
	fig.Report(t)
}

// TestReliabilityCacheCorruptEntries: while callers in two guards read a set
// of keys, a nemesis overwrites the stored entries with corrupt bytes (random
// bytes, foreign JSON, truncated and future-version envelopes). Every call
// returns the loader's value: corrupt bytes are a miss, counted, never a
// panic and never returned.
func TestReliabilityCacheCorruptEntries(t *testing.T) {
	noLeaks(t)
	srv := redistest.Start(t)
	raw := srv.Client()
	guards := []*cacheguard.Guard{newGuard(t, srv), newGuard(t, srv)}
	corrupt := [][]byte{
		[]byte(`{"id":1}`), {}, []byte("cg"), []byte("cg\x01\x00short"),
		append([]byte("cg\x03\x00"), make([]byte, 40)...), // a future version
		append([]byte("cg\x02\x80"), make([]byte, 40)...), // an unknown flag
	}
	ctx, cancel := context.WithCancel(context.Background())
	var nemesis sync.WaitGroup
	var written atomic.Int64
	nemesis.Go(func() {
		for i := 0; ctx.Err() == nil; i++ {
			b := corrupt[i%len(corrupt)]
			if i%3 == 0 {
				b = make([]byte, rand.IntN(64))
				for j := range b {
					b[j] = byte(rand.IntN(256))
				}
				if len(b) > 3 {
					b[0], b[1], b[2] = 'c', 'g', 2 // a plausible header with garbage behind it
				}
			}
			// The value of a string under key corrupt:N: field "string" of
			// the key's values hash (see cacheguard's "Keys").
			if raw.HSet(ctx, fmt.Sprintf("cg:v:{corrupt:%d}", i%4), "string", b).Err() == nil {
				written.Add(1)
			}
		}
	})
	fig := Figures{Scenario: "cache: entries overwritten with corrupt bytes during reads", Recovery: -1}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := range scale(200, 60) {
				key := fmt.Sprintf("corrupt:%d", i%4)
				v, err := cacheguard.Get(context.Background(), guards[w%2], key, func(context.Context) (string, error) {
					return "good:" + key, nil
				})
				mu.Lock()
				fig.Attempted++
				if err != nil || v != "good:"+key {
					fig.Violations++
					if fig.Violations < 5 {
						t.Errorf("Get(%s) = %q, %v", key, v, err)
					}
				} else {
					fig.Succeeded++
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	cancel()
	nemesis.Wait()
	decode := guards[0].Stats().DecodeErrors + guards[1].Stats().DecodeErrors
	fig.Note = fmt.Sprintf("%d corrupt entries written, %d decode errors counted", written.Load(), decode)
	fig.Report(t)
	if decode == 0 {
		t.Error("no decode error counted: the nemesis never hit a read")
	}
}

// TestReliabilityCachePanickingLoader: a loader panics under a stampede of 40
// callers in two guards. No process dies; every caller sharing the load gets
// an error (a *cacheguard.PanicError in the loading guard, a remote-load
// error in the other), and the next call loads again at once: the panic
// released the fill lease.
func TestReliabilityCachePanickingLoader(t *testing.T) {
	noLeaks(t)
	srv := redistest.Start(t)
	guards := []*cacheguard.Guard{newGuard(t, srv), newGuard(t, srv)}
	key := "panics"
	vals, errs := stampede(guards, 40, key, func(context.Context) (string, error) { panic("loader bug") })
	fig := Figures{Scenario: "cache: panicking loader under a 40-caller stampede in 2 guards", Recovery: -1}
	panics, remote := 0, 0
	for i := range vals {
		fig.Attempted++
		var pe *cacheguard.PanicError
		switch {
		case errors.As(errs[i], &pe):
			panics++
			fig.Refused++
		case errors.Is(errs[i], cacheguard.ErrRemoteLoad):
			remote++
			fig.Refused++
		default:
			fig.Violations++
			t.Errorf("call %d: %q, %v; want the panic as an error", i, vals[i], errs[i])
		}
	}
	start := time.Now()
	v, err := cacheguard.Get(context.Background(), guards[1], key, func(context.Context) (string, error) { return "ok", nil })
	fig.Recovery = time.Since(start)
	fig.Attempted++
	if err != nil || v != "ok" {
		fig.Violations++
		t.Errorf("after the panic: %q, %v", v, err)
	} else {
		fig.Succeeded++
	}
	fig.Note = fmt.Sprintf("%d PanicError, %d remote-load errors; recovery = the next call's latency", panics, remote)
	fig.Report(t)
}

// TestReliabilityCacheInvalidationRace: a writer bumps a database version
// and invalidates the key, over and over, alternating between two guards (two
// processes), while readers in both call Get with a loader that reads the
// version (slowly, so that fills and invalidations overlap). A call that
// starts after an invalidation returned — made through either guard — never
// sees an older version: a fill that began before it never lands afterwards,
// and the call does not join that fill (it joins only flights of the
// generation it read). (This caught a regression of per-process read
// coalescing, e92ba2c, in which a call could join a GET sent before the
// invalidation; fixed in 002e3c8. Until issue 14 a call in the other guard
// could still join a flight of its own from before the invalidation.)
func TestReliabilityCacheInvalidationRace(t *testing.T) {
	noLeaks(t)
	srv := redistest.Start(t)
	guards := []*cacheguard.Guard{newGuard(t, srv, cacheguard.EarlyRefresh(0)), newGuard(t, srv, cacheguard.EarlyRefresh(0))}
	key := "inval"
	var db atomic.Int64         // the database's version
	var visible [2]atomic.Int64 // per guard: the latest version whose invalidation through it returned
	load := func(context.Context) (string, error) {
		v := db.Load()
		// A load takes a moment: the window for a racing invalidation (the
		// fault being modelled, not synchronisation).
		time.Sleep(time.Duration(rand.IntN(3000)) * time.Microsecond)
		return fmt.Sprint(v), nil
	}
	fig := Figures{Scenario: "cache: invalidation racing fills (2 guards, 4 readers)", Recovery: -1}
	ctx, cancel := context.WithCancel(context.Background())
	var writer sync.WaitGroup
	invalidations := 0
	writer.Go(func() {
		for ctx.Err() == nil {
			v := db.Add(1)
			g := invalidations % 2
			if err := guards[g].Invalidate(context.Background(), key); err != nil {
				t.Errorf("Invalidate: %v", err)
				return
			}
			visible[g].Store(v)
			invalidations++
			select { // let some reads hit between invalidations
			case <-ctx.Done():
			case <-time.After(2 * time.Millisecond):
			}
		}
	})
	var mu sync.Mutex
	var wg sync.WaitGroup
	for r := range 4 {
		wg.Go(func() {
			g := r % 2
			for range scale(300, 100) {
				acked := max(visible[0].Load(), visible[1].Load())
				s, err := cacheguard.Get(context.Background(), guards[g], key, load)
				var got int64
				fmt.Sscan(s, &got)
				mu.Lock()
				fig.Attempted++
				switch {
				case err != nil:
					fig.Unknown++
				case got < acked:
					fig.Violations++
					if fig.Violations < 5 {
						t.Errorf("guard %d read version %d after the invalidation of version %d returned", g, got, acked)
					}
				default:
					fig.Succeeded++
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	cancel()
	writer.Wait()
	fig.Note = fmt.Sprintf("%d invalidations; a read may return no version older than the latest whose invalidation (through either guard) returned before it began", invalidations)
	fig.Report(t)
}

// TestReliabilityCacheInvalidateInFlightRead is the deterministic form of
// the regression above: a Get's GET has run in Redis but its reply is held in
// the proxy; Invalidate (same guard) deletes the value and returns; a Get
// that starts after that must return the new value — not join the GET still
// in flight and return the old one.
func TestReliabilityCacheInvalidateInFlightRead(t *testing.T) {
	noLeaks(t)
	srv := redistest.Start(t)
	px := startProxy(t, srv)
	// go-redis's default timeouts: the held reply must not time out (a
	// retried GET would read the invalidated key afresh).
	rdb := redis.NewClient(&redis.Options{Addr: px.Addr()})
	t.Cleanup(func() { rdb.Close() })
	g := cacheguard.New(rdb, cacheguard.EarlyRefresh(0))
	t.Cleanup(func() { g.Close() })
	bg := context.Background()
	var version atomic.Int64
	version.Store(1)
	load := func(context.Context) (string, error) { return fmt.Sprint(version.Load()), nil }
	if _, err := cacheguard.Get(bg, g, "inflight", load); err != nil {
		t.Fatal(err)
	}
	fig := Figures{Scenario: "cache: Invalidate while a GET of the key is in flight (same guard)", Recovery: -1, Attempted: 1}

	held := px.HoldNext()
	first := make(chan string, 1)
	go func() {
		v, _ := cacheguard.Get(bg, g, "inflight", load)
		first <- v
	}()
	<-held // the first Get's GET ran (it read version 1); its reply waits
	select {
	case v := <-first:
		t.Fatalf("the first Get answered %q: the held reply was not its GET's", v)
	default:
	}
	version.Store(2)
	if err := g.Invalidate(bg, "inflight"); err != nil {
		t.Fatal(err)
	}
	second := make(chan string, 1)
	sent := px.Forwarded()
	go func() {
		v, _ := cacheguard.Get(bg, g, "inflight", load)
		second <- v
	}()
	// The second Get either sends its own GET (seen at the proxy) or joins
	// the first's; joining cannot be observed, so give it a bounded moment.
	for deadline := time.Now().Add(300 * time.Millisecond); px.Forwarded() == sent && time.Now().Before(deadline); {
		select {
		case v := <-second: // answered without waiting for the held reply
			second <- v
			deadline = time.Now()
		case <-time.After(5 * time.Millisecond):
		}
	}
	px.Release()
	<-first
	got := <-second
	if got != "2" {
		fig.Violations++
	} else {
		fig.Succeeded++
	}
	fig.Note = fmt.Sprintf("the call after Invalidate returned version %s (want 2)", got)
	fig.Report(t)
	if got != "2" {
		t.Errorf("a Get that started after Invalidate returned joined the GET sent before it and returned version %s", got)
	}
}
