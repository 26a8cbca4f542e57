package reliability

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/cacheguard"
	"github.com/cacheguard/cacheguard/internal/redistest"
	"github.com/cacheguard/cacheguard/locks"
)

// watched is a server reached through a proxy that counts what is sent to it.
type watched struct {
	px  *Proxy
	rdb *redis.Client
}

func newWatched(t *testing.T) watched {
	t.Helper()
	s := redistest.Start(t)
	px := startProxy(t, s)
	rdb := redis.NewClient(&redis.Options{Addr: px.Addr()})
	t.Cleanup(func() { rdb.Close() })
	return watched{px: px, rdb: rdb}
}

// silent fails t when call sends anything to Redis.
func (w watched) silent(t *testing.T, what string, call func()) {
	t.Helper()
	before := w.px.Forwarded()
	call()
	if n := w.px.Forwarded() - before; n != 0 {
		t.Errorf("%s sent %d requests to Redis before failing", what, n)
	}
}

// panicsWith fails t unless f panics with a message starting with prefix.
func panicsWith(t *testing.T, what, prefix string, f func()) {
	t.Helper()
	defer func() {
		t.Helper()
		p := recover()
		msg, _ := p.(string)
		if e, ok := p.(error); ok {
			msg = e.Error()
		}
		if !strings.HasPrefix(msg, prefix) {
			t.Errorf("%s: panic %v, want a %q message", what, p, prefix)
		}
	}()
	f()
}

// TestReliabilityBadInput: every public constructor and call of locks and
// cacheguard, given invalid arguments, returns its documented error (or, for
// a constructor's programmer error, panics with the package prefix) and sends
// nothing to Redis.
func TestReliabilityBadInput(t *testing.T) {
	noLeaks(t)
	w := newWatched(t)
	bg := context.Background()
	fig := Figures{Scenario: "bad input: invalid arguments to every public constructor and call", Recovery: -1}
	check := func(what string, err, want error) {
		t.Helper()
		fig.Attempted++
		if !errors.Is(err, want) {
			fig.Violations++
			t.Errorf("%s: %v, want %v", what, err, want)
			return
		}
		fig.Refused++
	}

	panicsWith(t, "locks.New(nil)", "locks:", func() { locks.New(nil) })
	panicsWith(t, "locks.New(rdb, Lease(0))", "locks:", func() { locks.New(w.rdb, locks.Lease(0)) })
	var nilClient *locks.Client
	w.silent(t, "nil Client", func() {
		_, err := nilClient.TryLock(bg, "x")
		check("(*Client)(nil).TryLock", err, locks.ErrInvalid)
	})
	c := locks.New(w.rdb)
	rl := locks.NewRedlock([]redis.UniversalClient{w.rdb})
	long := strings.Repeat("n", locks.MaxNameLen+1)
	lockCases := []struct {
		what string
		name string
		opts []locks.CallOption
	}{
		{"empty name", "", nil},
		{"name over MaxNameLen", long, nil},
		{"lease below MinLease", "x", []locks.CallOption{locks.Lease(locks.MinLease - 1)}},
		{"zero lease", "x", []locks.CallOption{locks.Lease(0)}},
		{"negative wait", "x", []locks.CallOption{locks.WaitBudget(-1)}},
		{"negative replicas", "x", []locks.CallOption{locks.Replicas(-1, time.Second)}},
		{"replicas without timeout", "x", []locks.CallOption{locks.Replicas(1, 0)}},
	}
	for _, l := range []locks.Locker{c, rl} {
		for _, tc := range lockCases {
			w.silent(t, tc.what, func() {
				_, err := l.TryLock(bg, tc.name, tc.opts...)
				check("TryLock: "+tc.what, err, locks.ErrInvalid)
				_, err = l.Lock(bg, tc.name, tc.opts...)
				check("Lock: "+tc.what, err, locks.ErrInvalid)
			})
		}
	}
	w.silent(t, "Redlock-only refusals", func() {
		_, err := rl.TryLock(bg, "x", locks.Fair())
		check("Redlock Fair", err, locks.ErrInvalid)
		_, err = rl.TryLock(bg, "x", locks.Replicas(1, time.Second))
		check("Redlock Replicas", err, locks.ErrInvalid)
	})
	w.silent(t, "NewRedlock", func() {
		panicsWith(t, "NewRedlock(nil)", "locks:", func() { locks.NewRedlock(nil) })
		panicsWith(t, "NewRedlock with a nil client", "locks:", func() { locks.NewRedlock([]redis.UniversalClient{w.rdb, nil}) })
		panicsWith(t, "NewRedlock with one node twice", "locks:", func() { locks.NewRedlock([]redis.UniversalClient{w.rdb, w.rdb}) })
		panicsWith(t, "NewRedlock with a zero lease", "locks:", func() { locks.NewRedlock([]redis.UniversalClient{w.rdb}, locks.Lease(0)) })
		panicsWith(t, "NewRedlock with a negative drift", "locks:", func() { locks.NewRedlock([]redis.UniversalClient{w.rdb}, locks.Drift(-1)) })
		panicsWith(t, "NewRedlock with a negative node timeout", "locks:", func() { locks.NewRedlock([]redis.UniversalClient{w.rdb}, locks.NodeTimeout(-1)) })
	})
	w.silent(t, "Optimistic", func() {
		fn := func(*redis.Tx) error { return nil }
		check("Optimistic nil client", locks.Optimistic(bg, nil, fn, []string{"k"}), locks.ErrInvalid)
		check("Optimistic nil fn", locks.Optimistic(bg, w.rdb, nil, []string{"k"}), locks.ErrInvalid)
		check("Optimistic no keys", locks.Optimistic(bg, w.rdb, fn, nil), locks.ErrInvalid)
		check("Optimistic empty key", locks.Optimistic(bg, w.rdb, fn, []string{""}), locks.ErrInvalid)
		check("Optimistic negative budget", locks.Optimistic(bg, w.rdb, fn, []string{"k"}, locks.WaitBudget(-1)), locks.ErrInvalid)
		check("Optimistic with a lock option", locks.Optimistic(bg, w.rdb, fn, []string{"k"}, locks.Lease(time.Second)), locks.ErrInvalid)
	})
	// Extend with a too-short lease, on a held lock.
	lk, err := c.TryLock(bg, "held")
	if err != nil {
		t.Fatal(err)
	}
	w.silent(t, "Extend", func() {
		check("Extend below MinLease", lk.Extend(bg, locks.MinLease-1), locks.ErrInvalid)
	})
	if err := lk.Unlock(bg); err != nil {
		t.Fatal(err)
	}
	c.Close()
	rl.Close()
	w.silent(t, "closed", func() {
		_, err := c.TryLock(bg, "x")
		check("TryLock after Close", err, locks.ErrClosed)
		_, err = rl.TryLock(bg, "x")
		check("Redlock TryLock after Close", err, locks.ErrClosed)
	})

	// cacheguard
	panicsWith(t, "cacheguard.New(nil)", "cacheguard:", func() { cacheguard.New(nil) })
	panicsWith(t, "cacheguard.New(rdb, TTL(0))", "cacheguard:", func() { cacheguard.New(w.rdb, cacheguard.TTL(0)) })
	// ReportTo, Variant (call only) and Prefix, Observer (Guard only) in the
	// wrong place do not compile.
	panicsWith(t, "cacheguard.New(rdb, MaxConcurrentLoads(-1))", "cacheguard:", func() { cacheguard.New(w.rdb, cacheguard.MaxConcurrentLoads(-1)) })
	g := cacheguard.New(w.rdb)
	load := func(context.Context) (string, error) { return "v", nil }
	longKey := strings.Repeat("k", cacheguard.MaxKeyLen+1)
	getCases := []struct {
		what string
		g    *cacheguard.Guard
		key  string
		load func(context.Context) (string, error)
		opts []cacheguard.CallOption
	}{
		{"nil guard", nil, "k", load, nil},
		{"empty key", g, "", load, nil},
		{"key over MaxKeyLen", g, longKey, load, nil},
		{"nil loader", g, "k", nil, nil},
		{"zero TTL", g, "k", load, []cacheguard.CallOption{cacheguard.TTL(0)}},
		{"negative TTL", g, "k", load, []cacheguard.CallOption{cacheguard.TTL(-time.Second)}},
		{"negative stale window", g, "k", load, []cacheguard.CallOption{cacheguard.ServeStale(-1)}},
		{"negative wait budget", g, "k", load, []cacheguard.CallOption{cacheguard.WaitBudget(-1)}},
		{"negative NegativeTTL", g, "k", load, []cacheguard.CallOption{cacheguard.NegativeTTL(-1)}},
		{"zero load timeout", g, "k", load, []cacheguard.CallOption{cacheguard.LoadTimeout(0)}},
		{"fill lease below minimum", g, "k", load, []cacheguard.CallOption{cacheguard.Lease(cacheguard.MinLease - 1)}},
		{"negative beta", g, "k", load, []cacheguard.CallOption{cacheguard.EarlyRefresh(-1)}},
		{"NaN beta", g, "k", load, []cacheguard.CallOption{cacheguard.EarlyRefresh(math.NaN())}},
		{"infinite beta", g, "k", load, []cacheguard.CallOption{cacheguard.EarlyRefresh(math.Inf(1))}},
		{"jitter 1", g, "k", load, []cacheguard.CallOption{cacheguard.Jitter(1)}},
		{"NaN jitter", g, "k", load, []cacheguard.CallOption{cacheguard.Jitter(math.NaN())}},
		{"unknown timeout action", g, "k", load, []cacheguard.CallOption{cacheguard.OnWaitTimeout(99)}},
		{"nil codec", g, "k", load, []cacheguard.CallOption{cacheguard.Encoding(nil)}},
	}
	for _, tc := range getCases {
		w.silent(t, tc.what, func() {
			_, err := cacheguard.Get(bg, tc.g, tc.key, tc.load, tc.opts...)
			check("Get: "+tc.what, err, cacheguard.ErrInvalid)
		})
	}
	w.silent(t, "Invalidate", func() {
		var nilGuard *cacheguard.Guard
		check("Invalidate nil guard", nilGuard.Invalidate(bg, "k"), cacheguard.ErrInvalid)
		check("Invalidate empty key", g.Invalidate(bg, ""), cacheguard.ErrInvalid)
		check("Invalidate long key", g.Invalidate(bg, "ok", longKey), cacheguard.ErrInvalid)
	})
	g.Close()
	w.silent(t, "closed guard", func() {
		_, err := cacheguard.Get(bg, g, "k", load)
		check("Get after Close", err, cacheguard.ErrClosed)
		check("Invalidate after Close", g.Invalidate(bg, "k"), cacheguard.ErrClosed)
	})
	fig.Note = "each refused with its sentinel and nothing sent"
	fig.Report(t)
}
