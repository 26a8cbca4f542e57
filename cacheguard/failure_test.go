package cacheguard_test

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/cacheguard/cacheguard/cacheguard"
	"github.com/cacheguard/cacheguard/internal/faultproxy"
	"github.com/cacheguard/cacheguard/internal/redistest"
)

// corruptGen is the generation the corrupt-bytes test stores with its key.
const corruptGen = 12345

// header builds a version-3 envelope header of generation corruptGen by hand.
func header(version, flags byte, fresh, stale time.Time) []byte {
	b := make([]byte, 40)
	b[0], b[1], b[2], b[3] = 'c', 'g', version, flags
	binary.BigEndian.PutUint64(b[4:], uint64(fresh.UnixMilli()))
	binary.BigEndian.PutUint64(b[12:], uint64(stale.UnixMilli()))
	binary.BigEndian.PutUint64(b[24:], corruptGen)
	binary.BigEndian.PutUint64(b[32:], uint64(stale.UnixMilli()))
	return b
}

func TestCorruptBytesAreAMiss(t *testing.T) {
	ctx := context.Background()
	later := time.Now().Add(time.Hour)
	cases := map[string][]byte{
		"foreign":               []byte(`{"id":1}`),
		"empty":                 {},
		"short header":          []byte("cg\x02\x00abc"),
		"old version":           header(2, 0, later, later),
		"future version":        header(4, 0, later, later),
		"unknown flag":          header(3, 0x80, later, later),
		"bad times":             header(3, 0, later, later.Add(-time.Minute)),
		"fresh, bad payload":    append(header(3, 0, later, later), "{not json"...),
		"negative with payload": append(header(3, 1, later, later), "x"...),
	}
	for name, raw := range cases {
		t.Run(name, func(t *testing.T) {
			g, rdb := newGuard(t)
			key := testKey(t)
			if err := storeRaw(ctx, rdb, key, raw); err != nil {
				t.Fatal(err)
			}
			if err := rdb.Set(ctx, "cg:g:{"+key+"}", corruptGen, time.Hour).Err(); err != nil {
				t.Fatal(err)
			}
			c := &counter{name: "repaired"}
			var res cacheguard.Result
			v, err := cacheguard.Get(ctx, g, key, c.load, cacheguard.ReportTo(&res))
			if err != nil || v.Name != "repaired" || res != cacheguard.Miss {
				t.Fatalf("Get = %v, %v, %v; want a load", v, err, res)
			}
			if st := g.Stats(); st.DecodeErrors != 1 {
				t.Fatalf("decode errors = %d, want 1", st.DecodeErrors)
			}
			if _, err := cacheguard.Get(ctx, g, key, c.load, cacheguard.ReportTo(&res)); err != nil || res != cacheguard.Hit {
				t.Fatalf("after the repair: %v, %v; want a hit", err, res)
			}
		})
	}
}

func TestPanickingLoaderWith100Waiters(t *testing.T) {
	ctx := context.Background()
	g, rdb := newGuard(t)
	key := testKey(t)
	boom := errors.New("boom")
	release := make(chan struct{})
	loads := 0
	loader := func(context.Context) (item, error) {
		loads++
		<-release
		panic(boom)
	}
	const n = 100
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { _, errs[i] = cacheguard.Get(ctx, g, key, loader) })
	}
	// Release the loader once every call has missed and joined the flight.
	eventually(t, 10*time.Second, "all calls waiting", func() bool { return g.Stats().Misses == n })
	close(release)
	wg.Wait()
	for i, err := range errs {
		var pe *cacheguard.PanicError
		if !errors.As(err, &pe) || !errors.Is(err, boom) {
			t.Fatalf("call %d: %v, want a *PanicError wrapping the panic value", i, err)
		}
	}
	if loads != 1 {
		t.Fatalf("loads = %d, want 1", loads)
	}
	if rdb.Exists(ctx, leaseKey(key)).Val() != 0 {
		t.Fatal("the fill lease was not released")
	}
	// The process lives on and the key loads normally.
	if v, err := cacheguard.Get(ctx, g, key, (&counter{name: "ok"}).load); err != nil || v.Name != "ok" {
		t.Fatalf("after the panic: %v, %v", v, err)
	}
}

func TestCallerCtxEndsLoadGoesOn(t *testing.T) {
	before := goleak.IgnoreCurrent()
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	g := cacheguard.New(rdb)
	key := testKey(t)
	l := newGated("late")
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := cacheguard.Get(ctx, g, key, l.load)
		errc <- err
	}()
	<-l.entered
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("Get = %v, want context.Canceled", err)
	}
	// The shared load was not cancelled: it completes and fills the cache.
	close(l.release)
	eventually(t, 5*time.Second, "value stored by the abandoned load", func() bool {
		return rdb.Exists(context.Background(), valueKey(key)).Val() == 1
	})

	// A waiter whose deadline passes leaves alone, the others still get the value.
	other := testKey(t, "other")
	l2 := newGated("shared")
	errs := make(chan error, 2)
	go func() {
		_, err := cacheguard.Get(context.Background(), g, other, l2.load)
		errs <- err
	}()
	<-l2.entered
	dctx, dcancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer dcancel()
	if _, err := cacheguard.Get(dctx, g, other, l2.load); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Get = %v, want context.DeadlineExceeded", err)
	}
	close(l2.release)
	if err := <-errs; err != nil {
		t.Fatal(err)
	}
	// Nothing the abandoned calls started outlives the Guard.
	g.Close()
	rdb.Close()
	goleak.VerifyNone(t, append(redistest.LeakOptions(), before)...)
}

func TestInvalidateDuringFillIsNotOverwritten(t *testing.T) {
	ctx := context.Background()
	a, rdb := newGuard(t)
	b, rb := newGuard(t)
	waiting := watchWaiting(rb)
	key := testKey(t)
	// a's call began before the Invalidate: it may be served the value
	// loaded before it or one loaded after (once its flight turned unfit, it
	// joined one begun after, which b's fill or its own reload serves).
	old := newStallsOnce("before")
	errc := make(chan error, 1)
	go func() {
		v, err := cacheguard.Get(ctx, a, key, old.load)
		if err == nil && v.Name != "before" && v.Name != "after" && v.Name != "reload" {
			err = fmt.Errorf("a got %v", v)
		}
		errc <- err
	}()
	<-old.entered
	// b waits for a's fill.
	fresh := &counter{name: "after"}
	got := make(chan item, 1)
	go func() {
		v, _ := cacheguard.Get(ctx, b, key, fresh.load)
		got <- v
	}()
	<-waiting

	if err := a.Invalidate(ctx, key); err != nil {
		t.Fatal(err)
	}
	// b is woken and is served data newer than the invalidation: its own
	// load under a new lease, or a's reload.
	if v := <-got; v.Name != "after" && v.Name != "reload" {
		t.Fatalf("b got %v, want a load made after the invalidation", v)
	}
	close(old.release) // the old fill completes now: its compare-and-set must fail
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	raw, err := rdb.HGet(ctx, valueKey(key), itemField).Bytes()
	if err != nil {
		t.Fatal(err)
	}
	var v item
	if err := (cacheguard.JSON{}).Unmarshal(raw[envHead:], &v); err != nil || v.Name == "before" {
		t.Fatalf("stored %v (%v), want the post-invalidation value", v, err)
	}

	// Alone: an invalidated fill stores nothing at all.
	solo := testKey(t, "solo")
	l := newGated("stale")
	go func() {
		_, err := cacheguard.Get(ctx, a, solo, l.load)
		errc <- err
	}()
	<-l.entered
	if err := b.Invalidate(ctx, solo); err != nil {
		t.Fatal(err)
	}
	close(l.release)
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if rdb.Exists(ctx, valueKey(solo), leaseKey(solo)).Val() != 0 {
		t.Fatal("an invalidated fill wrote its value")
	}
}

// TestRedisDownFailsOpenThenRecovers runs with both kinds of client: one
// whose socket calls follow the context's deadline (the read runs on the
// caller's goroutine) and one whose calls do not (the read is handed over).
func TestRedisDownFailsOpenThenRecovers(t *testing.T) {
	for _, ctxTimeouts := range []bool{false, true} {
		t.Run(fmt.Sprint("ContextTimeoutEnabled=", ctxTimeouts), func(t *testing.T) { redisDownFailsOpen(t, ctxTimeouts) })
	}
}

func redisDownFailsOpen(t *testing.T, ctxTimeouts bool) {
	ctx := context.Background()
	s := redistest.Start(t)
	rdb := s.Client(func(o *redis.Options) {
		o.MaxRetries = -1
		o.DialTimeout = 200 * time.Millisecond
		o.ContextTimeoutEnabled = ctxTimeouts
	})
	g := cacheguard.New(rdb, cacheguard.EarlyRefresh(0))
	defer g.Close()
	key := testKey(t)
	if _, err := cacheguard.Get(ctx, g, key, (&counter{name: "cached"}).load); err != nil {
		t.Fatal(err)
	}
	s.Kill()

	// Down: every call still gets a value. A call shares only a load that
	// began after it (a load from before could predate an invalidation it
	// must see), so the burst costs two loads: the first caller's, and one
	// shared by every call that arrived while it ran.
	base := g.Stats()
	l := newGated("open")
	const n = 20
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			v, err := cacheguard.Get(ctx, g, key, l.load)
			if err == nil && v.Name != "open" {
				err = fmt.Errorf("got %v", v)
			}
			errs[i] = err
		})
	}
	eventually(t, 10*time.Second, "all calls missed", func() bool { return g.Stats().Misses == base.Misses+n })
	close(l.release)
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	if got := l.n.Load(); got != 2 {
		t.Fatalf("fail-open loads = %d, want 2 (coalesced)", got)
	}
	if st := g.Stats(); st.FailOpenLoads != base.FailOpenLoads+2 || st.RedisErrors == base.RedisErrors {
		t.Fatalf("stats %+v", st)
	}
	if _, err := cacheguard.Get(ctx, g, key, l.load, cacheguard.FailClosed()); !errors.Is(err, cacheguard.ErrUnavailable) {
		t.Fatalf("FailClosed = %v, want ErrUnavailable", err)
	}

	// Back: the cache fills again.
	if err := s.Restart(); err != nil {
		t.Fatal(err)
	}
	var res cacheguard.Result
	eventually(t, 10*time.Second, "cache back", func() bool {
		_, err := cacheguard.Get(ctx, g, key, (&counter{name: "back"}).load, cacheguard.ReportTo(&res))
		return err == nil && res == cacheguard.Hit
	})
}

func TestMaxConcurrentLoads(t *testing.T) {
	ctx := context.Background()
	s := redistest.Start(t)
	rdb := s.Client(func(o *redis.Options) { o.MaxRetries = -1 })
	g := cacheguard.New(rdb, cacheguard.MaxConcurrentLoads(1))
	defer g.Close()
	s.Kill()
	l := newGated("first")
	errc := make(chan error, 1)
	go func() {
		_, err := cacheguard.Get(ctx, g, testKey(t, "a"), l.load)
		errc <- err
	}()
	<-l.entered
	if _, err := cacheguard.Get(ctx, g, testKey(t, "b"), l.load, cacheguard.WaitBudget(50*time.Millisecond)); !errors.Is(err, cacheguard.ErrWaitTimeout) {
		t.Fatalf("second load = %v, want ErrWaitTimeout (no free slot)", err)
	}
	close(l.release)
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}

func TestCloseStopsBackgroundRefresh(t *testing.T) {
	ctx := context.Background()
	rdb := shared(t)
	g := cacheguard.New(rdb, cacheguard.FailFast())
	key := testKey(t)
	l := newGated("never")
	if _, err := cacheguard.Get(ctx, g, key, l.load); !errors.Is(err, cacheguard.ErrMiss) {
		t.Fatal(err)
	}
	<-l.entered
	g.Close() // cancels the background fill's context and waits for it
	if rdb.Exists(ctx, valueKey(key)).Val() != 0 {
		t.Fatal("a cancelled fill stored a value")
	}
}

func TestRedisPausedFailsOpen(t *testing.T) {
	ctx := context.Background()
	s := redistest.Start(t)
	rdb := s.Client(func(o *redis.Options) {
		o.MaxRetries = -1
		o.ReadTimeout, o.WriteTimeout = 100*time.Millisecond, 100*time.Millisecond
	})
	g := cacheguard.New(rdb)
	defer g.Close()
	key := testKey(t)
	if _, err := cacheguard.Get(ctx, g, key, (&counter{name: "cached"}).load); err != nil {
		t.Fatal(err)
	}
	s.Pause()
	v, err := cacheguard.Get(ctx, g, key, (&counter{name: "open"}).load)
	s.Resume()
	if err != nil || v.Name != "open" {
		t.Fatalf("Get while Redis is paused = %v, %v; want a fail-open load", v, err)
	}
	if st := g.Stats(); st.FailOpenLoads != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// slowGets delays every read of a value (HGET) by d before it is sent — as
// a process too busy to run it in time would; scripts go at once.
type slowGets struct{ d time.Duration }

func (h slowGets) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h slowGets) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() == "hget" {
			time.Sleep(h.d) // the delay (a fault, not synchronisation)
		}
		return next(ctx, cmd)
	}
}
func (h slowGets) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestReadTimeoutAsksTheFlight: a hit's read that the command timeout ends
// (Redis slow to answer it, or this process too busy to read the answer in
// time) is a miss whose state is unknown, not proof that Redis is away: the
// call asks through its flight's get-or-lease script, which returns the
// cached value, instead of failing open at once — no load. Only when that
// script fails too does the call fail open (TestRedisPausedFailsOpen).
func TestReadTimeoutAsksTheFlight(t *testing.T) {
	for _, cte := range []bool{false, true} {
		t.Run(fmt.Sprint("ContextTimeoutEnabled=", cte), func(t *testing.T) {
			ctx := context.Background()
			s := redistest.Start(t)
			rdb := s.Client(func(o *redis.Options) { o.ContextTimeoutEnabled = cte })
			g := cacheguard.New(rdb, cacheguard.CommandTimeout(200*time.Millisecond), cacheguard.EarlyRefresh(0))
			defer g.Close()
			key := testKey(t)
			if _, err := cacheguard.Get(ctx, g, key, (&counter{name: "cached"}).load); err != nil {
				t.Fatal(err)
			}
			rdb.AddHook(slowGets{d: time.Second})
			c := &counter{name: "loaded"}
			v, err := cacheguard.Get(ctx, g, key, c.load)
			if err != nil || v.Name != "cached" || c.n.Load() != 0 {
				t.Fatalf("Get with a read slower than the command timeout = %v, %v after %d loads; want the cached value, no load", v, err, c.n.Load())
			}
			if st := g.Stats(); st.FailOpenLoads != 0 || st.RedisErrors != 1 {
				t.Fatalf("fail-open loads %d, Redis errors %d; want 0 and 1 (the read)", st.FailOpenLoads, st.RedisErrors)
			}
		})
	}
}

// proxied returns a fault proxy in front of s and a client through it that
// bounds its socket calls by the context and does not retry, with idle
// connections kept ready (waited for).
func proxied(t *testing.T, s *redistest.Server, idle int) (*faultproxy.Proxy, *redis.Client) {
	t.Helper()
	p, err := faultproxy.New(s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	rdb := redis.NewClient(&redis.Options{Addr: p.Addr(), ContextTimeoutEnabled: true, MaxRetries: -1, MinIdleConns: idle})
	t.Cleanup(func() { rdb.Close() })
	if idle > 0 {
		redistest.Eventually(t, 10*time.Second, "idle connections", func() bool { return int(rdb.PoolStats().IdleConns) >= idle })
	}
	return p, rdb
}

// TestFollowerNoticesStall: a call waiting for another process's fill when
// Redis goes silent (black-holed) does not wait for the holder's lease (30s
// here, past the call's 10s budget): it asks again within a second, that
// ask times out, and it fails open with the loader's value.
func TestFollowerNoticesStall(t *testing.T) {
	ctx := context.Background()
	s := redistest.Start(t)
	p, rdb := proxied(t, s, 0)
	holder := cacheguard.New(s.Client(), cacheguard.Lease(30*time.Second))
	defer holder.Close()
	waiter := cacheguard.New(rdb, cacheguard.Lease(30*time.Second), cacheguard.CommandTimeout(200*time.Millisecond))
	defer waiter.Close()
	key := testKey(t)
	l := newGated("held")
	go cacheguard.Get(ctx, holder, key, l.load)
	<-l.entered
	waiting := watchWaiting(rdb)
	got := make(chan error, 1)
	go func() {
		v, err := cacheguard.Get(ctx, waiter, key, (&counter{name: "open"}).load)
		if err == nil && v.Name != "open" {
			err = fmt.Errorf("got %v", v)
		}
		got <- err
	}()
	<-waiting
	p.Set(faultproxy.BlackHole)
	if err := <-got; err != nil {
		t.Fatalf("a call waiting for another fill when Redis went silent: %v; want a fail-open load", err)
	}
	close(l.release)
}

// TestLeaseLostInStallIsGivenBack: a call whose get-or-lease script ran in
// Redis but whose reply never came (dropped by a proxy: Redis silent to this
// client) fails open; the script granted the call's token a fill lease (30s
// here) that nobody will fill. It is given back: another Guard's call then
// loads at once instead of waiting for that lease to expire (its context,
// 5s, would end first).
func TestLeaseLostInStallIsGivenBack(t *testing.T) {
	ctx := context.Background()
	s := redistest.Start(t)
	// Idle connections in the pool: a new one would not get past its
	// handshake, whose reply is dropped too, and the script would never leave.
	p, rdb := proxied(t, s, 4)
	a := cacheguard.New(rdb, cacheguard.Lease(30*time.Second), cacheguard.CommandTimeout(100*time.Millisecond))
	defer a.Close()
	b := cacheguard.New(s.Client(), cacheguard.Lease(30*time.Second))
	defer b.Close()
	key := testKey(t)
	// Redis knows the scripts (else the EVALSHA answers NOSCRIPT, unheard).
	if _, err := cacheguard.Get(ctx, a, testKey(t, "warm"), (&counter{}).load); err != nil {
		t.Fatal(err)
	}

	p.Set(faultproxy.DropReplies)
	v, err := cacheguard.Get(ctx, a, key, (&counter{name: "open"}).load)
	p.Set(faultproxy.Pass)
	if err != nil || v.Name != "open" {
		t.Fatalf("a Get whose replies were lost: %v, %v; want the fail-open load", v, err)
	}

	loadsAtOnce(t, b, key)
}

// loadsAtOnce checks that g's Get of key runs its own load (within 5s),
// rather than waiting for the expiry of a fill lease another Guard left
// behind (30s in the tests that call it).
func loadsAtOnce(t *testing.T, g *cacheguard.Guard, key string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var res cacheguard.Result
	start := time.Now()
	v, err := cacheguard.Get(ctx, g, key, (&counter{name: "b"}).load, cacheguard.ReportTo(&res))
	t.Logf("then another Guard's Get: %v, %v, %v in %v", v, err, res, time.Since(start))
	if err != nil || v.Name != "b" {
		t.Fatalf("another Guard's Get: %v, %v (%v); want its own load, not a wait for the lease left behind", v, err, res)
	}
}

// TestBrokenRoundTripGivesTheLeaseBack: a connection that breaks during a
// fill lease's round trip leaves the lease's fate unknown to its holder —
// the get-or-lease script ran but its reply was lost, or the store or the
// release that would end the lease never reached Redis — and the lease (30s
// here) is given back, whatever the error: another Guard's call then loads
// at once instead of waiting for the lease's expiry (its context, 5s, would
// end first). A lost lease reply used to be given back only when the
// command timed out; a store or release that failed, never. Nor one whose
// last attempt Redis refused: go-redis (MaxRetries, 3 on this client) sends
// a command again after a reply lost, and reports the last attempt's error
// alone — an error reply (READONLY, after a failover) though the first
// attempt ran.
func TestBrokenRoundTripGivesTheLeaseBack(t *testing.T) {
	broken := &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}
	isLease := func(a []any) bool { return len(a) > 1 && a[1] == cacheguard.LeaseScriptSHA() }
	for name, c := range map[string]struct {
		match func(a []any) bool
		sent  bool  // the command ran in Redis; its reply was lost
		err   error // what the Get's round trip reports: broken unless set
		load  func(context.Context) (item, error)
	}{
		"lease reply lost": {match: isLease, sent: true, load: (&counter{name: "open"}).load},
		"lease reply lost, a retry refused": {match: isLease, sent: true, err: replyError("READONLY You can't write against a read only replica."),
			load: (&counter{name: "open"}).load},
		"store never sent": {match: cacheguard.IsFillCall, load: (&counter{name: "a"}).load},
		"release never sent": {match: cacheguard.IsReleaseCall,
			load: func(context.Context) (item, error) { return item{}, errors.New("the database is down") }},
	} {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			var armed atomic.Bool
			rdb := shared(t)
			rdb.AddHook(redistest.Intercept(func(_ context.Context, cmds []redis.Cmder, send func() error) error {
				if !slices.ContainsFunc(cmds, func(cmd redis.Cmder) bool { return c.match(cmd.Args()) }) || !armed.CompareAndSwap(true, false) {
					return send()
				}
				if c.sent {
					_ = send()
				}
				err := cmp.Or(c.err, error(broken))
				for _, cmd := range cmds {
					cmd.SetErr(err)
				}
				return err
			}))
			a := cacheguard.New(rdb, cacheguard.Lease(30*time.Second))
			defer a.Close()
			b, _ := newGuard(t, cacheguard.Lease(30*time.Second))
			key := testKey(t)
			// Redis knows the scripts (else the EVALSHA answers NOSCRIPT).
			if _, err := cacheguard.Get(ctx, a, testKey(t, "warm"), (&counter{}).load); err != nil {
				t.Fatal(err)
			}
			armed.Store(true)
			v, err := cacheguard.Get(ctx, a, key, c.load)
			t.Logf("the Get whose round trip broke: %v, %v", v, err)
			if armed.Load() {
				t.Fatal("the round trip to break was not sent")
			}
			loadsAtOnce(t, b, key)
		})
	}
}

// replyError is an error reply of Redis's.
type replyError string

func (e replyError) Error() string { return string(e) }
func (replyError) RedisError()     {}

// giveBackSpy counts the fill-lease give-backs (release.lua called with
// "*"+token) that Redis answered while armed (see, as a replyHook).
// giveBackOf returns the lease key of cmd when it is a give-back of a fill
// lease (release.lua with "*"+token), else "".
func giveBackOf(cmd redis.Cmder) string {
	a := cmd.Args() // evalsha|eval, sha|source, numkeys, lease key, [gone key,] "*"+token, ...
	if !cacheguard.IsReleaseCall(a) {
		return ""
	}
	for i := 4; i < len(a) && i < 6; i++ {
		if s, ok := a[i].(string); ok && strings.HasPrefix(s, "*") {
			k, _ := a[3].(string)
			return k
		}
	}
	return ""
}

type giveBackSpy struct {
	armed    atomic.Bool
	answered atomic.Int64
}

func (h *giveBackSpy) see(cmd redis.Cmder) {
	if h.armed.Load() && cmd.Err() == nil && giveBackOf(cmd) != "" {
		h.answered.Add(1)
	}
}

// TestGiveBackOutlastsStall: a fill lease's request that timed out in a
// stall may run when Redis resumes, however long the stall, and take a lease
// nobody fills (the entry's other callers would wait for its expiry). Its
// give-back is sent again until Redis answers it, not only for a lease: it
// used to stop then, before Redis came back. Whichever deadline cut the
// request — the command timeout, or the client's own socket timeout (which
// used to give nothing back) — it may have run.
func TestGiveBackOutlastsStall(t *testing.T) {
	for name, opt := range map[string]func(*redis.Options){
		"command timeout": func(o *redis.Options) { o.ContextTimeoutEnabled = true },
		"socket timeout": func(o *redis.Options) {
			o.MaxRetries = -1
			o.ReadTimeout, o.WriteTimeout = 100*time.Millisecond, 100*time.Millisecond
		},
	} {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			s := redistest.Start(t)
			spy := &giveBackSpy{}
			rdb := s.Client(opt)
			rdb.AddHook(replyHook(spy.see))
			lease := 300 * time.Millisecond
			g := cacheguard.New(rdb, cacheguard.Lease(lease), cacheguard.CommandTimeout(100*time.Millisecond))
			defer g.Close()
			key := testKey(t)
			s.Pause()
			defer s.Resume()
			if _, err := cacheguard.Get(ctx, g, key, (&counter{name: "open"}).load); err != nil {
				t.Fatalf("Get while Redis is paused: %v; want a fail-open load", err)
			}
			time.Sleep(lease + 300*time.Millisecond) // the fault: the stall outlasts the lease
			spy.armed.Store(true)
			s.Resume()
			redistest.Eventually(t, 10*time.Second, "the give-back answered after Redis resumed", func() bool { return spy.answered.Load() > 0 })
			admin := s.Client()
			defer admin.Close()
			if keys := admin.Keys(ctx, "*fl:*").Val(); len(keys) > 0 {
				t.Errorf("fill leases left once the give-back was answered: %v", keys)
			}
		})
	}
}

// TestLateLeaseRequestAfterGiveBack: a fill lease's request that reaches
// Redis only after its caller gave up on it and its give-back was answered
// takes nothing. It used to take the lease, which nobody would fill: the
// entry's callers then waited for its expiry.
func TestLateLeaseRequestAfterGiveBack(t *testing.T) {
	ctx := context.Background()
	s := redistest.Start(t)
	key := testKey(t)
	h := &faultHook{lateKey: "cg:v:{" + key + "}", deliver: make(chan struct{}), wiped: &atomic.Int64{},
		bad: func(format string, args ...any) { t.Errorf(format, args...) }}
	var gaveBack atomic.Int64
	rdb := s.Client(func(o *redis.Options) { o.ContextTimeoutEnabled = true })
	rdb.AddHook(h)
	rdb.AddHook(replyHook(func(cmd redis.Cmder) { // sees what h lets through
		if cmd.Err() == nil && giveBackOf(cmd) == leaseKey(key) {
			gaveBack.Add(1)
		}
	}))
	g := cacheguard.New(rdb, cacheguard.Lease(10*time.Second), cacheguard.CommandTimeout(100*time.Millisecond))
	defer g.Close()
	if _, err := cacheguard.Get(ctx, g, key+"-warm", (&counter{name: "warm"}).load); err != nil {
		t.Fatal(err) // loads the scripts: the held EVALSHA runs when it arrives
	}
	h.lateUntil.Store(time.Now().Add(time.Minute).UnixNano())
	if _, err := cacheguard.Get(ctx, g, key, (&counter{name: "open"}).load); err != nil {
		t.Fatalf("Get with its lease request held: %v; want a fail-open load", err)
	}
	redistest.Eventually(t, 10*time.Second, "the give-back answered", func() bool { return gaveBack.Load() > 0 })
	close(h.deliver)
	h.late.wait() // the held request has reached Redis (h's oracle has seen its reply)
	admin := s.Client()
	defer admin.Close()
	if pttl := admin.PTTL(ctx, leaseKey(key)).Val(); pttl > 0 {
		t.Errorf("the late request took a fill lease that nobody fills, for %v", pttl)
	}
}

// With Redis down, a Get a loader makes under its load's context does not
// wait for a load without the lease of the same key that another caller
// started, which waits for the slot the loader holds: it runs its own, as a
// loader's Get takes no slot.
func TestMaxConcurrentLoadsNestedFailOpen(t *testing.T) {
	ctx := context.Background()
	s := redistest.Start(t)
	rdb := s.Client(func(o *redis.Options) { o.MaxRetries = -1 })
	g := cacheguard.New(rdb, cacheguard.MaxConcurrentLoads(1), cacheguard.WaitBudget(time.Minute), cacheguard.LoadTimeout(time.Minute))
	defer g.Close()
	s.Kill()
	kA, kB := testKey(t, "a"), testKey(t, "b")
	outside := newGated("outside")
	release := make(chan struct{})
	nested := make(chan error, 1)
	loadA := func(ctx context.Context) (item, error) {
		<-release
		v, err := cacheguard.Get(ctx, g, kB, (&counter{name: "nested"}).load)
		if err == nil && v.Name != "nested" {
			err = fmt.Errorf("nested Get of B served %v", v)
		}
		nested <- err
		return item{Name: "A"}, err
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() {
		if _, err := cacheguard.Get(ctx, g, kA, loadA); err != nil {
			t.Errorf("Get of A: %v", err)
		}
	})
	eventually(t, 10*time.Second, "A's load holds the slot", func() bool { return g.Stats().FailOpenLoads == 1 })
	wg.Go(func() {
		if _, err := cacheguard.Get(ctx, g, kB, outside.load); err != nil {
			t.Errorf("Get of B: %v", err)
		}
	})
	eventually(t, 10*time.Second, "B's load waits for the slot", func() bool { return cacheguard.LoadsWaiting(g) == 1 })
	close(release)
	select {
	case err := <-nested:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Error("the nested Get of B still waits for B's load, which waits for the slot its own caller holds")
	}
	close(outside.release)
}

// TestLateLeaseGrantLoadsOnce: a fill lease that Redis granted but whose
// reply reached the Guard only after the lease had run out there (held on the
// wire) is not loaded under — another process may have taken the fill over
// meanwhile — so a key is loaded once per expiry across processes
// (guarantee A), with a lease shorter than the command timeout too. The late
// grant is given back and its flight waits for the fill as any other.
func TestLateLeaseGrantLoadsOnce(t *testing.T) {
	ctx := context.Background()
	s := redistest.Start(t)
	key := testKey(t)
	var hold atomic.Bool
	granted := make(chan struct{})
	slow := s.Client(func(o *redis.Options) { o.ContextTimeoutEnabled = true })
	slow.AddHook(replyHook(func(cmd redis.Cmder) {
		if isLeaseCall(cmd) && cmd.Err() == nil && hold.CompareAndSwap(true, false) {
			close(granted)
			time.Sleep(250 * time.Millisecond) // the fault: the grant's reply comes 250ms late
		}
	}))
	opts := []cacheguard.Option{cacheguard.Lease(100 * time.Millisecond), cacheguard.CommandTimeout(time.Second), cacheguard.WaitBudget(5 * time.Second)}
	a := cacheguard.New(slow, opts...)
	defer a.Close()
	b := cacheguard.New(s.Client(func(o *redis.Options) { o.ContextTimeoutEnabled = true }), opts...)
	defer b.Close()
	if _, err := cacheguard.Get(ctx, a, key+"-warm", (&counter{name: "warm"}).load); err != nil {
		t.Fatal(err) // loads the scripts
	}
	loads := &counter{name: "v", delay: 200 * time.Millisecond}
	hold.Store(true)
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() {
		if v, err := cacheguard.Get(ctx, a, key, loads.load); err != nil || v.Name != "v" {
			t.Errorf("Get on the slow process: %v %v", v, err)
		}
	})
	<-granted // A holds the lease in Redis; its reply is on the way
	if v, err := cacheguard.Get(ctx, b, key, loads.load); err != nil || v.Name != "v" {
		t.Errorf("Get on the other process: %v %v", v, err)
	}
	wg.Wait()
	if n := loads.n.Load(); n != 1 {
		t.Fatalf("%d loads of one cold key across two processes; want 1 (a lease read after it ran out was loaded under)", n)
	}
}

// TestResentLeaseRequestTakesNothingLate: a get-or-lease round trip whose
// command timeout the process noticed late (rcmd.Busy: the process, not
// Redis, was slow) is asked again; the request it sent first may still reach
// Redis after the flight stored — after an invalidation, too, when it would
// take the lease under the new generation for nobody, and every process's
// callers of the entry would wait for that lease's expiry. The round trip is
// asked again under a new token, after the first token's give-back in the
// same pipeline, so the first request takes nothing.
func TestResentLeaseRequestTakesNothingLate(t *testing.T) {
	ctx := context.Background()
	s := redistest.Start(t)
	key := testKey(t)
	rdb := s.Client()
	stuck := &stuckRequest{release: make(chan struct{}), ran: make(chan error, 1)}
	defer stuck.wg.Wait()
	defer stuck.free() // first: a failure leaves no copy waiting
	rdb.AddHook(stuck)
	g := cacheguard.New(rdb, cacheguard.CommandTimeout(200*time.Millisecond))
	defer g.Close()
	if _, err := cacheguard.Get(ctx, g, key+"-warm", (&counter{name: "warm"}).load); err != nil {
		t.Fatal(err) // loads the scripts
	}
	stuck.armed.Store(true)
	v, err := cacheguard.Get(ctx, g, key, (&counter{name: "v"}).load, cacheguard.WaitBudget(5*time.Second))
	if err != nil || v.Name != "v" {
		t.Fatalf("Get: %v, %v", v, err)
	}
	if !stuck.struck.Load() {
		t.Fatal("no get-or-lease request was held")
	}
	if err := g.Invalidate(ctx, key); err != nil {
		t.Fatal(err)
	}
	gone := "cg:fg:{" + key + "}|" + itemField
	eventually(t, 5*time.Second, "the first request given back", func() bool { return rdb.Exists(ctx, gone).Val() == 1 })
	stuck.free() // the first request reaches Redis
	if err := <-stuck.ran; err != nil {
		t.Fatal(err)
	}
	if holder, err := rdb.Get(ctx, leaseKey(key)).Result(); !errors.Is(err, redis.Nil) {
		t.Fatalf("the first request, run after the fill stored and the key was invalidated, took the lease (%q, %v): nobody fills it", holder, err)
	}
}

// stuckRequest holds the first get-or-lease round trip a client sends once
// armed: the process stands still past the command's deadline (it notices
// the timeout late), while a copy of the request waits on the wire until
// release, then reaches Redis (its reply, to ran, nobody else hears).
type stuckRequest struct {
	armed, struck atomic.Bool
	release       chan struct{}
	freed         sync.Once
	ran           chan error
	wg            sync.WaitGroup
}

// free lets the held request's copy go on to Redis.
func (h *stuckRequest) free() { h.freed.Do(func() { close(h.release) }) }

func (h *stuckRequest) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h *stuckRequest) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h *stuckRequest) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if !slices.ContainsFunc(cmds, isLeaseCall) || !h.armed.CompareAndSwap(true, false) {
			return next(ctx, cmds)
		}
		h.struck.Store(true)
		copies := make([]redis.Cmder, len(cmds))
		for i, c := range cmds {
			copies[i] = redis.NewCmd(context.Background(), c.Args()...)
		}
		h.wg.Go(func() {
			<-h.release
			h.ran <- next(context.Background(), copies)
		})
		<-ctx.Done()
		time.Sleep(150 * time.Millisecond) // the fault: the process notices its deadline late (over half a timeout)
		for _, c := range cmds {
			c.SetErr(ctx.Err())
		}
		return ctx.Err()
	}
}
