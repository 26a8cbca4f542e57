package reliability

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/cacheguard"
	"github.com/cacheguard/cacheguard/internal/redistest"
	"github.com/cacheguard/cacheguard/locks"
)

// TestReliabilityBreaker: one locks.Breaker on the client that a lock Client
// and a cache Guard share. With Redis killed, then black-holed: once the
// breaker is open, a lock attempt fails at once with ErrUnavailable and a
// fail-open Get costs its loader and little more (the figures go in the
// note: latencies are reported, not asserted); every Get answers with the
// loader's value (nothing lost); after Redis is back, the breaker closes
// within its cooldown plus a round trip.
func TestReliabilityBreaker(t *testing.T) {
	noLeaks(t)
	for _, fault := range []string{"killed", "black-holed"} {
		t.Run(fault, func(t *testing.T) { testBreaker(t, fault) })
	}
}

func testBreaker(t *testing.T, fault string) {
	srv := redistest.Start(t)
	px := startProxy(t, srv)
	const cooldown = 200 * time.Millisecond
	b := &locks.Breaker{Threshold: 3, Cooldown: cooldown}
	rdb := redis.NewClient(&redis.Options{Addr: px.Addr(), ReadTimeout: 200 * time.Millisecond, WriteTimeout: 200 * time.Millisecond})
	t.Cleanup(func() { rdb.Close() })
	rdb.AddHook(b)
	l := locks.New(rdb)
	t.Cleanup(func() { l.Close() })
	g := cacheguard.New(rdb, cacheguard.EarlyRefresh(0))
	t.Cleanup(func() { g.Close() })
	t.Cleanup(func() { px.Set(Reset) }) // stuck reads end before Close waits for them
	bg := context.Background()

	const loaderTime = 20 * time.Millisecond
	load := func(ctx context.Context) (string, error) {
		select {
		case <-time.After(loaderTime):
			return "loaded", nil
		case <-ctx.Done():
			return "", ctx.Err()
		}
	}
	if _, err := cacheguard.Get(bg, g, "warm", load); err != nil {
		t.Fatal(err)
	}

	switch fault {
	case "killed":
		srv.Kill()
	default:
		px.Set(BlackHole)
	}
	fig := Figures{Scenario: "breaker: Redis " + fault + ", one Breaker shared by locks and cacheguard", Recovery: -1}
	// Open it: lock attempts fail (slowly, at first) until the breaker refuses.
	opened := false
	for range 50 {
		_, err := l.TryLock(bg, "breaker")
		if errors.Is(err, locks.ErrCircuitOpen) {
			opened = true
			break
		}
	}
	if !opened {
		t.Fatal("the breaker did not open")
	}

	var lockTimes, getTimes []time.Duration
	for i := range 100 {
		start := time.Now()
		_, err := l.TryLock(bg, "breaker")
		lockTimes = append(lockTimes, time.Since(start))
		fig.Attempted++
		if !errors.Is(err, locks.ErrUnavailable) {
			fig.Violations++
			t.Errorf("lock attempt while open: %v, want ErrUnavailable", err)
		} else {
			fig.Refused++
		}

		start = time.Now()
		v, err := cacheguard.Get(bg, g, fmt.Sprintf("k%d", i), load)
		getTimes = append(getTimes, time.Since(start))
		fig.Attempted++
		if err != nil || v != "loaded" {
			fig.Violations++
			t.Errorf("fail-open Get while open: %q, %v", v, err)
		} else {
			fig.Succeeded++
		}
	}

	healed := time.Now()
	switch fault {
	case "killed":
		if err := srv.Restart(); err != nil {
			t.Fatal(err)
		}
	default:
		px.Set(Pass)
	}
	redistest.Eventually(t, 10*time.Second, "a lock after Redis answered again", func() bool {
		lk, err := l.TryLock(bg, "breaker")
		if err != nil {
			return false
		}
		_ = lk.Unlock(bg)
		return true
	})
	fig.Recovery = time.Since(healed)
	if b.Open() {
		t.Error("the breaker is still open after a lock succeeded")
	}
	fig.Note = fmt.Sprintf("while open: lock attempt p50 %v p99 %v (fails closed); fail-open Get with a %v loader p50 %v p99 %v; recovery = Redis answering -> first lock (cooldown %v)",
		pct(lockTimes, 50), pct(lockTimes, 99), loaderTime, pct(getTimes, 50), pct(getTimes, 99), cooldown)
	fig.Report(t)
}

// pct returns the p-th percentile of ds.
func pct(ds []time.Duration, p int) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[min(len(s)-1, len(s)*p/100)].Round(10 * time.Microsecond)
}
