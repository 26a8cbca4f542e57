package reliability

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/cacheguard"
	"github.com/cacheguard/cacheguard/internal/redistest"
)

// TestReliabilityCacheBlackHoleBudget: with Redis black-holed (connections
// stay open, nothing comes back — a partition, not a refused connection), a
// Get returns within its wait budget, and within its context's deadline,
// whatever the go-redis client's own timeouts (left at their defaults here:
// 3s per read, 3 retries). Either answer is allowed — a fail-open load or
// ErrWaitTimeout — but not waiting for go-redis to give up.
func TestReliabilityCacheBlackHoleBudget(t *testing.T) {
	noLeaks(t)
	srv := redistest.Start(t)
	px := startProxy(t, srv)
	rdb := redis.NewClient(&redis.Options{Addr: px.Addr()})
	t.Cleanup(func() { rdb.Close() })
	g := cacheguard.New(rdb, cacheguard.EarlyRefresh(0))
	t.Cleanup(func() { g.Close() })
	// The stuck reads end when the proxy resets their connections (before
	// Close, which waits for them).
	t.Cleanup(func() { px.Set(Reset) })
	bg := context.Background()
	load := func(context.Context) (string, error) { return "loaded", nil }
	if _, err := cacheguard.Get(bg, g, "warm", load); err != nil {
		t.Fatal(err)
	}
	px.Set(BlackHole)

	const budget = 300 * time.Millisecond
	// The bound: far below what go-redis takes to give up on one read (3s).
	const bound = 2 * time.Second
	fig := Figures{Scenario: "cache: Redis black-holed, Get within its wait budget and ctx", Recovery: -1}
	var notes []string
	for _, tc := range []struct {
		name string
		key  string
		ctx  func() (context.Context, context.CancelFunc)
		opts []cacheguard.CallOption
	}{
		{"wait budget, cached key", "warm", nil, []cacheguard.CallOption{cacheguard.WaitBudget(budget)}},
		{"wait budget, cold key", "cold", nil, []cacheguard.CallOption{cacheguard.WaitBudget(budget)}},
		{"ctx deadline", "warm", func() (context.Context, context.CancelFunc) { return context.WithTimeout(bg, budget) }, nil},
		{"budget, FailClosed", "warm", nil, []cacheguard.CallOption{cacheguard.WaitBudget(budget), cacheguard.FailClosed()}},
		{"budget, ServeStale", "warm", nil, []cacheguard.CallOption{cacheguard.WaitBudget(budget), cacheguard.ServeStale(time.Minute)}},
		{"budget, FailFast", "cold2", nil, []cacheguard.CallOption{cacheguard.WaitBudget(budget), cacheguard.FailFast()}},
	} {
		ctx, cancel := bg, context.CancelFunc(func() {})
		if tc.ctx != nil {
			ctx, cancel = tc.ctx()
		}
		start := time.Now()
		v, err := cacheguard.Get(ctx, g, tc.key, load, tc.opts...)
		took := time.Since(start)
		cancel()
		fig.Attempted++
		ok := err == nil && v == "loaded" || errors.Is(err, cacheguard.ErrWaitTimeout) ||
			errors.Is(err, context.DeadlineExceeded) || errors.Is(err, cacheguard.ErrUnavailable) || errors.Is(err, cacheguard.ErrMiss)
		switch {
		case took > bound:
			fig.Violations++
			t.Errorf("%s: Get took %v with a %v budget (%q, %v)", tc.name, took.Round(time.Millisecond), budget, v, err)
		case !ok:
			fig.Violations++
			t.Errorf("%s: Get = %q, %v", tc.name, v, err)
		default:
			fig.Succeeded++
		}
		notes = append(notes, fmt.Sprintf("%s %v", tc.name, took.Round(10*time.Millisecond)))
	}
	fig.Note = fmt.Sprintf("budget %v; %v", budget, notes)
	fig.Report(t)
}
