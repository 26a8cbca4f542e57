package locks_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/internal/faultproxy"
	"github.com/cacheguard/cacheguard/internal/logtest"
	"github.com/cacheguard/cacheguard/internal/redistest"
	"github.com/cacheguard/cacheguard/locks"
)

// breakerEvents records a Breaker's state changes.
type breakerEvents struct {
	mu    sync.Mutex
	kinds []locks.EventKind
}

func (r *breakerEvents) observe(_ context.Context, e locks.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.kinds = append(r.kinds, e.Kind)
}

func (r *breakerEvents) count(k locks.EventKind) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, got := range r.kinds {
		if got == k {
			n++
		}
	}
	return n
}

// tryUntilOpen makes lock attempts until the breaker refuses one, and
// returns how many failed before it did.
func tryUntilOpen(t *testing.T, c *locks.Client, b *locks.Breaker) int {
	t.Helper()
	for n := 0; n < 50; n++ {
		_, err := c.TryLock(context.Background(), "breaker")
		if errors.Is(err, locks.ErrCircuitOpen) {
			if !b.Open() {
				t.Fatal("a call was refused by a closed breaker")
			}
			return n
		}
		if err == nil {
			t.Fatal("TryLock succeeded with Redis away")
		}
		if !errors.Is(err, locks.ErrUnavailable) {
			t.Fatalf("TryLock with Redis away: %v, want ErrUnavailable", err)
		}
	}
	t.Fatal("the breaker did not open after 50 failed attempts")
	return 0
}

// TestBreakerKilledRedis: with redis-server killed, the breaker opens after
// Threshold failures; then a lock attempt fails at once with ErrCircuitOpen
// (matching ErrUnavailable) without a dial; once the server is back, the
// first probe after Cooldown closes it.
func TestBreakerKilledRedis(t *testing.T) {
	s := redistest.Start(t)
	ev := &breakerEvents{}
	b := &locks.Breaker{Threshold: 3, Cooldown: 100 * time.Millisecond, Observer: ev.observe}
	dials := 0
	var mu sync.Mutex
	rdb := s.Client(func(o *redis.Options) { o.MaxRetries = -1 })
	rdb.AddHook(b)
	rdb.AddHook(dialCounter{&mu, &dials}) // inside the breaker: counts real dials
	c := locks.New(rdb)
	t.Cleanup(func() { c.Close() })
	lk, err := c.TryLock(context.Background(), "warm")
	if err != nil {
		t.Fatal(err)
	}
	_ = lk.Unlock(context.Background())

	s.Kill()
	tryUntilOpen(t, c, b) // one attempt may be enough: each failed dial counts
	if ev.count(locks.EventBreakerOpened) != 1 {
		t.Fatalf("BreakerOpened events: %d, want 1", ev.count(locks.EventBreakerOpened))
	}
	mu.Lock()
	before := dials
	mu.Unlock()
	for range 20 {
		if _, err := c.TryLock(context.Background(), "breaker"); !errors.Is(err, locks.ErrCircuitOpen) && b.Open() {
			t.Fatalf("attempt while open: %v, want ErrCircuitOpen", err)
		}
	}
	mu.Lock()
	after := dials
	mu.Unlock()
	if after-before > 2 { // at most the probes after Cooldown
		t.Fatalf("%d dials while the breaker was open", after-before)
	}

	if err := s.Restart(); err != nil {
		t.Fatal(err)
	}
	// The probe loop closes it without traffic.
	redistest.Eventually(t, 10*time.Second, "the breaker closed with no calls made", func() bool { return !b.Open() })
	redistest.Eventually(t, 10*time.Second, "a lock after Redis came back", func() bool {
		lk, err := c.TryLock(context.Background(), "breaker")
		if err != nil {
			return false
		}
		_ = lk.Unlock(context.Background())
		return true
	})
	if b.Open() || ev.count(locks.EventBreakerClosed) != 1 {
		t.Fatalf("after recovery: open %v, BreakerClosed events %d", b.Open(), ev.count(locks.EventBreakerClosed))
	}
}

// TestBreakerBlackHole: a black-holed Redis (connections kept, bytes
// dropped) opens the breaker through read timeouts, and a paused one too;
// traffic flowing again closes it.
func TestBreakerBlackHole(t *testing.T) {
	b := &locks.Breaker{Threshold: 2, Cooldown: 100 * time.Millisecond}
	s, px, rdb := behindProxy(t, b)
	c := locks.New(rdb)
	t.Cleanup(func() { c.Close() })
	if _, err := c.TryLock(context.Background(), "warm"); err != nil {
		t.Fatal(err)
	}

	px.Set(faultproxy.BlackHole)
	tryUntilOpen(t, c, b)
	start := time.Now()
	_, err := c.TryLock(context.Background(), "breaker")
	if !errors.Is(err, locks.ErrCircuitOpen) || !errors.Is(err, locks.ErrUnavailable) {
		t.Fatalf("attempt while open: %v, want ErrCircuitOpen matching ErrUnavailable", err)
	}
	t.Logf("a refused attempt took %v", time.Since(start))

	px.Set(faultproxy.Pass)
	redistest.Eventually(t, 10*time.Second, "the breaker closed after the black hole", func() bool {
		_ = rdb.Ping(context.Background()).Err()
		return !b.Open()
	})

	s.Pause()
	tryUntilOpen(t, c, b)
	s.Resume()
	redistest.Eventually(t, 10*time.Second, "the breaker closed after the pause", func() bool {
		_ = rdb.Ping(context.Background()).Err()
		return !b.Open()
	})
}

// behindProxy starts a server and a fault proxy in front of it, and returns
// them with a client of the proxy (100ms read and write timeouts, no
// retries) that has b installed.
func behindProxy(t *testing.T, b *locks.Breaker) (*redistest.Server, *faultproxy.Proxy, *redis.Client) {
	t.Helper()
	return proxied(t, b, redis.Options{MaxRetries: -1, ReadTimeout: 100 * time.Millisecond, WriteTimeout: 100 * time.Millisecond, PoolSize: 4})
}

// proxied is behindProxy with the client's options o (its Addr the proxy's).
func proxied(t *testing.T, b *locks.Breaker, o redis.Options) (*redistest.Server, *faultproxy.Proxy, *redis.Client) {
	t.Helper()
	s := redistest.Start(t)
	px, err := faultproxy.New(s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = px.Close() })
	o.Addr = px.Addr()
	rdb := redis.NewClient(&o)
	t.Cleanup(func() { _ = rdb.Close() })
	rdb.AddHook(b)
	return s, px, rdb
}

// TestBreakerIgnoresAnswers: nil replies, error replies and the caller's own
// cancellations are not failures of Redis.
func TestBreakerIgnoresAnswers(t *testing.T) {
	s := redistest.Start(t)
	b := &locks.Breaker{Threshold: 2}
	rdb := s.Client()
	rdb.AddHook(b)
	ctx := context.Background()
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	for range 10 {
		if err := rdb.Get(ctx, "missing").Err(); !errors.Is(err, redis.Nil) {
			t.Fatal(err)
		}
		if err := rdb.Eval(ctx, "return redis.error_reply('BOOM no')", nil).Err(); err == nil {
			t.Fatal("the error reply did not come back")
		}
		_ = rdb.Get(cancelled, "k").Err()
	}
	if b.Open() {
		t.Fatal("the breaker opened on answers and cancellations")
	}
}

// dialCounter counts the client's dials.
type dialCounter struct {
	mu *sync.Mutex
	n  *int
}

func (d dialCounter) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		d.mu.Lock()
		*d.n++
		d.mu.Unlock()
		return next(ctx, network, addr)
	}
}
func (dialCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (dialCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// inFlight counts the commands a Breaker let through that have not returned
// yet; installed after the Breaker, it sees only those.
type inFlight struct{ n atomic.Int64 }

func (f *inFlight) DialHook(next redis.DialHook) redis.DialHook { return next }
func (f *inFlight) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		f.n.Add(1)
		defer f.n.Add(-1)
		return next(ctx, cmd)
	}
}
func (f *inFlight) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestBreakerIgnoresStragglers: commands sent into a black hole before the
// breaker opened that fail only after a probe closed it again must not
// count: the breaker once reopened on a healthy Redis 200ms later, because
// five such stragglers timed out.
func TestBreakerIgnoresStragglers(t *testing.T) {
	s := redistest.Start(t)
	px, err := faultproxy.New(s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = px.Close() })
	ev := &breakerEvents{}
	b := &locks.Breaker{Threshold: 5, Cooldown: 100 * time.Millisecond, Observer: ev.observe}
	rdb := redis.NewClient(&redis.Options{Addr: px.Addr(), MaxRetries: -1, ReadTimeout: 100 * time.Millisecond, PoolSize: 20})
	t.Cleanup(func() { _ = rdb.Close() })
	rdb.AddHook(b)
	var fl inFlight
	rdb.AddHook(&fl)
	ctx := context.Background()
	// Connections for the stragglers, made before the black hole (a new one
	// could not even greet the server): six blocking reads at once.
	var warm sync.WaitGroup
	for i := range 6 {
		warm.Go(func() { _ = rdb.BLPop(ctx, time.Second, fmt.Sprint("warm:", i)).Err() })
	}
	warm.Wait()

	px.Set(faultproxy.BlackHole)
	// Stragglers: blocking reads, whose read timeout (go-redis gives them
	// their block plus 10s) ends long after the breaker opened and closed.
	var wg sync.WaitGroup
	for i := range 5 {
		wg.Go(func() { _ = rdb.BLPop(ctx, time.Second, fmt.Sprint("straggler:", i)).Err() })
	}
	stragglers := make(chan struct{})
	go func() { wg.Wait(); close(stragglers) }()
	redistest.Eventually(t, 5*time.Second, "the stragglers sent", func() bool { return fl.n.Load() == 5 })
	for !b.Open() {
		if err := rdb.Get(ctx, "k").Err(); err == nil {
			t.Fatal("a GET was answered through the black hole")
		}
	}
	px.Set(faultproxy.Pass)
	redistest.Eventually(t, 5*time.Second, "the probe closed the breaker", func() bool { return !b.Open() })
	select {
	case <-stragglers:
		t.Fatal("the stragglers failed before the breaker closed again: the test proves nothing")
	default:
	}
	select {
	case <-stragglers:
	case <-time.After(20 * time.Second):
		t.Fatal("the stragglers did not return")
	}
	if b.Open() || ev.count(locks.EventBreakerOpened) != 1 {
		t.Fatalf("after the stragglers failed on a healthy Redis: open %v, opened %d times; want closed, opened once",
			b.Open(), ev.count(locks.EventBreakerOpened))
	}
	if err := rdb.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
}

// TestStallFailsFast: with the README's client (ContextTimeoutEnabled) and a
// Breaker on it, a paused (SIGSTOP) or black-holed Redis turns every lock
// call into an error within twice the command timeout (500ms by default;
// the first call, sent while Redis had just answered) or within the timeout
// itself (the later ones, Redis quiet) — not a call that lasts the stall —
// the breaker opens after Threshold such failures, then calls fail at once;
// once Redis answers again the probe closes the breaker. Latencies are
// logged; the bound asserted (2s, while Redis stays paused) only separates a
// call bounded on its own from one that waits for the client's 3s read
// timeout or for the stall to end.
func TestStallFailsFast(t *testing.T) {
	for _, fault := range []string{"paused", "black-holed"} {
		t.Run(fault, func(t *testing.T) { testStallFailsFast(t, fault) })
	}
}

func testStallFailsFast(t *testing.T, fault string) {
	s := redistest.Start(t)
	px, err := faultproxy.New(s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = px.Close() })
	ev := &breakerEvents{}
	b := &locks.Breaker{Observer: ev.observe}
	rdb := redis.NewClient(&redis.Options{Addr: px.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = rdb.Close() })
	rdb.AddHook(b)
	c := locks.New(rdb)
	t.Cleanup(func() { c.Close() })
	bg := context.Background()
	held, err := c.TryLock(bg, "stall:held")
	if err != nil {
		t.Fatal(err)
	}

	stall, heal := s.Pause, s.Resume
	if fault == "black-holed" {
		stall, heal = func() { px.Set(faultproxy.BlackHole) }, func() { px.Set(faultproxy.Pass) }
	}
	stall()
	resumed := false
	defer func() {
		if !resumed {
			heal()
		}
	}()
	paused := time.Now()
	call := func(what string, f func() error) (time.Duration, error) {
		t.Helper()
		done := make(chan error, 1)
		start := time.Now()
		go func() { done <- f() }()
		select {
		case err := <-done:
			return time.Since(start), err
		case <-time.After(2 * time.Second):
			t.Fatalf("%s: no answer within 2s of a %s Redis", what, fault)
		}
		return 0, nil
	}
	var slowest time.Duration
	tries := 0
	for !b.Open() {
		if tries++; tries > 20 {
			t.Fatal("the breaker did not open after 20 failed attempts")
		}
		d, err := call("TryLock", func() error { _, err := c.TryLock(bg, "stall:try"); return err })
		if !errors.Is(err, locks.ErrUnavailable) {
			t.Fatalf("TryLock on a %s Redis: %v, want ErrUnavailable", fault, err)
		}
		slowest = max(slowest, d)
	}
	opened := time.Since(paused)
	d, err := call("TryLock while open", func() error { _, err := c.TryLock(bg, "stall:try"); return err })
	if !errors.Is(err, locks.ErrCircuitOpen) {
		t.Fatalf("TryLock with the breaker open: %v, want ErrCircuitOpen", err)
	}
	dl, err := call("Lock while open", func() error { _, err := c.Lock(bg, "stall:lock", locks.WaitBudget(10*time.Second)); return err })
	if !errors.Is(err, locks.ErrUnavailable) {
		t.Fatalf("Lock with the breaker open: %v, want ErrUnavailable", err)
	}
	du, err := call("Unlock while open", func() error { return held.Unlock(bg) })
	if err == nil {
		t.Fatalf("Unlock on a %s Redis succeeded", fault)
	}
	t.Logf("%s Redis: %d attempts failed within %v each (slowest) until the breaker opened %v after the stall began; then TryLock %v, Lock %v, Unlock %v",
		fault, tries, slowest.Round(time.Millisecond), opened.Round(time.Millisecond), d, dl, du)

	heal()
	resumed = true
	back := time.Now()
	redistest.Eventually(t, 5*time.Second, "the breaker closed after Redis answered again", func() bool { return !b.Open() })
	closed := time.Since(back)
	// What the failed calls may have taken (their commands sat in Redis's
	// socket buffers and ran when it resumed) is given back, and the release
	// of the Unlock that failed is sent again, once Redis answers: no name
	// stays locked for a lease.
	for _, name := range []string{"stall:try", "stall:lock", "stall:held"} {
		redistest.Eventually(t, 5*time.Second, name+" free again", func() bool {
			lk, err := c.TryLock(bg, name)
			if err == nil {
				_ = lk.Unlock(bg)
			}
			return err == nil
		})
	}
	t.Logf("after Redis answered again: the breaker closed after %v, every name was free after %v",
		closed.Round(time.Millisecond), time.Since(back).Round(time.Millisecond))
}

// TestBreakerIgnoresPoolTimeout: a client whose connection pool is
// exhausted (every connection busy, on a Redis that answers) fails commands
// with redis.ErrPoolTimeout; that is the client's load, not Redis failing,
// and must not open the breaker.
func TestBreakerIgnoresPoolTimeout(t *testing.T) {
	s := redistest.Start(t)
	b := &locks.Breaker{Threshold: 3}
	rdb := s.Client(func(o *redis.Options) { o.PoolSize, o.PoolTimeout, o.MaxRetries = 1, 20*time.Millisecond, -1 })
	rdb.AddHook(b)
	ctx := context.Background()
	busy := make(chan error, 1)
	go func() { busy <- rdb.BLPop(ctx, time.Second, "pool:busy").Err() }() // holds the only connection
	redistest.Eventually(t, 5*time.Second, "the only connection busy", func() bool {
		st := rdb.PoolStats()
		return st.TotalConns == 1 && st.IdleConns == 0
	})
	for range 5 {
		if err := rdb.Get(ctx, "k").Err(); !errors.Is(err, redis.ErrPoolTimeout) {
			t.Logf("GET with the pool exhausted: %v (the blocking read may have ended)", err)
		}
	}
	if b.Open() {
		t.Fatal("the breaker opened on the client's own pool timeouts, Redis answering")
	}
	<-busy
}

// A Breaker without Logger warns through slog.Default() when it opens.
func TestBreakerWarnsToSlogDefault(t *testing.T) {
	s := redistest.Start(t)
	def := logtest.New(8)
	def.Default(t)
	b := &locks.Breaker{Threshold: 2, Cooldown: 50 * time.Millisecond}
	rdb := s.Client(func(o *redis.Options) { o.MaxRetries = -1 })
	rdb.AddHook(b)
	c := locks.New(rdb, locks.Logger(slog.New(slog.DiscardHandler)))
	t.Cleanup(func() { c.Close() })
	s.Kill()
	tryUntilOpen(t, c, b)
	if m := def.Wait(t, 5*time.Second); !strings.Contains(m, "circuit breaker opened") {
		t.Fatalf("warning %q, want the breaker's", m)
	}
}

// TestBreakerOpensOnSilence: when Redis has answered nothing for Silence, the
// next failure opens the breaker, however far below Threshold the failures
// are (a process whose callers wait in line for a lock sends few commands
// into a stall: the fleet's stall test saw breakers open 4s into it).
func TestBreakerOpensOnSilence(t *testing.T) {
	b := &locks.Breaker{Threshold: 1000, Silence: 300 * time.Millisecond}
	_, px, rdb := behindProxy(t, b)
	c := locks.New(rdb)
	t.Cleanup(func() { c.Close() })
	if _, err := c.TryLock(context.Background(), "warm"); err != nil {
		t.Fatal(err)
	}
	px.Set(faultproxy.BlackHole)
	start := time.Now()
	n := tryUntilOpen(t, c, b)
	t.Logf("opened %v into the black hole, after %d failed attempts", time.Since(start), n)
	px.Set(faultproxy.Pass)
	redistest.Eventually(t, 10*time.Second, "the breaker closed after the black hole", func() bool {
		_ = rdb.Ping(context.Background()).Err()
		return !b.Open()
	})
}

// blackHoled returns a client behind a proxy set to black-hole (after one
// PING through it) whose own timeouts (10 s) outlast every context of these
// tests: only the callers' contexts end its commands.
func blackHoled(t *testing.T, b *locks.Breaker) *redis.Client {
	t.Helper()
	_, px, rdb := proxied(t, b, redis.Options{MaxRetries: -1, ContextTimeoutEnabled: true,
		ReadTimeout: 10 * time.Second, WriteTimeout: 10 * time.Second, PoolSize: 4})
	if err := rdb.Ping(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	px.Set(faultproxy.BlackHole)
	return rdb
}

// getGivenUp sends a GET into the black hole under a context that ends
// after d: its deadline, or, with cancelFirst, its cancellation 50 ms
// before (a caller that went away; go-redis reads on to the deadline).
func getGivenUp(t *testing.T, rdb *redis.Client, d time.Duration, cancelFirst bool) {
	t.Helper()
	pctx, pcancel := context.WithCancel(context.Background())
	defer pcancel()
	ctx, cancel := context.WithTimeout(pctx, d)
	defer cancel()
	if cancelFirst {
		defer time.AfterFunc(d-50*time.Millisecond, pcancel).Stop()
	}
	if err := rdb.Get(ctx, "k").Err(); err == nil || errors.Is(err, redis.Nil) {
		t.Fatalf("GET into a black hole: %v, want its context's end", err)
	}
}

// TestBreakerIgnoresCallerDeadlines: a command that its caller's deadline
// ends is not a failure of Redis, also when the socket's deadline (the
// context's) fires a moment before the context counts as ended.
func TestBreakerIgnoresCallerDeadlines(t *testing.T) {
	b := &locks.Breaker{Threshold: 1000, Silence: -1}
	rdb := blackHoled(t, b)
	for range 6 {
		getGivenUp(t, rdb, 50*time.Millisecond, false)
		if n := b.Failures(); n != 0 {
			t.Fatalf("%d failures counted for GETs that their callers' deadlines ended", n)
		}
	}
}

// TestBreakerOpensOnSilenceWhenCallersGiveUp: a command whose caller gave up
// on it is not counted, but once Redis has been silent for Silence such a
// command opens the breaker (after the check's PING goes unanswered too), as
// a failure would. Before, a process whose commands all ran under request
// contexts that ended first never opened it.
func TestBreakerOpensOnSilenceWhenCallersGiveUp(t *testing.T) {
	opened := make(chan struct{})
	var once sync.Once
	b := &locks.Breaker{Threshold: 1000, Silence: 300 * time.Millisecond, Observer: func(_ context.Context, e locks.Event) {
		if e.Kind == locks.EventBreakerOpened {
			once.Do(func() { close(opened) })
		}
	}}
	rdb := blackHoled(t, b)
	getGivenUp(t, rdb, 100*time.Millisecond, false) // given up before Silence: not silence enough
	if b.Open() || b.Failures() != 0 {
		t.Fatalf("a caller giving up after 100 ms of silence counted: open %v, %d failures", b.Open(), b.Failures())
	}
	getGivenUp(t, rdb, 400*time.Millisecond, true) // given up 450 ms into the silence
	select {
	case <-opened:
	case <-time.After(10 * time.Second):
		t.Fatal("the breaker did not open: a caller gave up after Redis was silent for Silence")
	}
}

// TestBreakerBlockingIsNoSilence: a blocking command (BLPOP) waiting on a
// healthy Redis starts no silence: a later command that fails alone, on its
// own short wait, does not open the breaker.
func TestBreakerBlockingIsNoSilence(t *testing.T) {
	b := &locks.Breaker{Threshold: 1000, Silence: 700 * time.Millisecond}
	s, px, rdb := behindProxy(t, b)
	ctx := context.Background()
	if err := rdb.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	popped := make(chan error, 1)
	go func() { popped <- rdb.BLPop(ctx, 3*time.Second, "nothing").Err() }()
	admin := s.Client()
	redistest.Eventually(t, 5*time.Second, "BLPOP waiting", func() bool {
		return strings.Contains(admin.ClientList(ctx).Val(), "cmd=blpop")
	})
	time.Sleep(800 * time.Millisecond) // the subject: BLPOP has waited longer than Silence
	px.Set(faultproxy.BlackHole)
	if err := rdb.Get(ctx, "k").Err(); err == nil || errors.Is(err, redis.Nil) {
		t.Fatalf("GET into a black hole: %v, want a timeout", err)
	}
	if b.Open() {
		t.Error("one failure opened the breaker: BLPOP's wait was taken for silence")
	}
	px.Set(faultproxy.Pass)
	<-popped
}

// BenchmarkBreakerHook is what a Breaker adds to each command that Redis
// answers, the command itself left out (its hook calls a next that answers at
// once), alone and from parallel goroutines.
func BenchmarkBreakerHook(b *testing.B) {
	answer := func(ctx context.Context, cmd redis.Cmder) error { return nil }
	for _, silence := range []time.Duration{-1, 0} {
		name := map[time.Duration]string{-1: "no-silence", 0: "silence"}[silence]
		br := &locks.Breaker{Silence: silence}
		hook := br.ProcessHook(answer)
		ctx := context.Background()
		cmd := redis.NewStringCmd(ctx, "get", "k")
		b.Run(name, func(b *testing.B) {
			for b.Loop() {
				_ = hook(ctx, cmd)
			}
		})
		b.Run(name+"/parallel", func(b *testing.B) {
			b.RunParallel(func(pb *testing.PB) {
				cmd := redis.NewStringCmd(ctx, "get", "k")
				for pb.Next() {
					_ = hook(ctx, cmd)
				}
			})
		})
	}
}
