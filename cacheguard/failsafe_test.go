package cacheguard_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cacheguard/cacheguard/cacheguard"
)

// FailSafe: when the reload of an expired value fails, the older value is
// served (Stale, EventFailSafe) instead of the error, in this process and in
// another one, and no process tries the load again during the back-off; once
// the database is back, the next load after the back-off stores a fresh value.
func TestFailSafeServesOlderValueAndBacksOff(t *testing.T) {
	ctx := context.Background()
	opts := []cacheguard.Option{cacheguard.TTL(50 * time.Millisecond), cacheguard.Jitter(0), cacheguard.EarlyRefresh(0),
		cacheguard.FailSafe(time.Minute, 300*time.Millisecond)}
	a, _ := newGuard(t, opts...)
	b, _ := newGuard(t, opts...)
	key := testKey(t)
	var down atomic.Bool
	var loads atomic.Int64
	load := func(context.Context) (item, error) {
		n := loads.Add(1)
		if down.Load() {
			return item{}, errors.New("db down")
		}
		return item{ID: int(n), Name: "db"}, nil
	}
	if _, err := cacheguard.Get(ctx, a, key, load); err != nil {
		t.Fatal(err)
	}
	down.Store(true)
	var res cacheguard.Result
	eventually(t, 5*time.Second, "the older value served for a failed reload", func() bool {
		v, err := cacheguard.Get(ctx, a, key, load, cacheguard.ReportTo(&res))
		return err == nil && v.ID == 1 && res == cacheguard.Stale && a.Stats().FailSafe > 0
	})
	failed := loads.Load()
	// During the back-off: no load anywhere, the older value everywhere.
	for _, g := range []*cacheguard.Guard{a, b, a, b} {
		v, err := cacheguard.Get(ctx, g, key, load, cacheguard.ReportTo(&res))
		if err != nil || v.ID != 1 || res != cacheguard.Stale {
			t.Fatalf("during the back-off: %v, %v, %v; want the older value, stale", v, err, res)
		}
	}
	if n := loads.Load(); n != failed {
		t.Fatalf("%d loads during the back-off, want none", n-failed)
	}
	down.Store(false)
	eventually(t, 5*time.Second, "a fresh value after the back-off", func() bool {
		v, err := cacheguard.Get(ctx, b, key, load, cacheguard.ReportTo(&res))
		return err == nil && v.ID > 1 && res != cacheguard.Stale
	})
}

// SoftTimeout: a call with an older value to fall back on waits for a slow
// load only that long, then gets the older value while the load goes on and
// stores its value for the next calls.
func TestSoftTimeoutServesOlderValue(t *testing.T) {
	ctx := context.Background()
	g, _ := newGuard(t, cacheguard.TTL(50*time.Millisecond), cacheguard.Jitter(0), cacheguard.EarlyRefresh(0),
		cacheguard.FailSafe(time.Minute, time.Second), cacheguard.SoftTimeout(20*time.Millisecond))
	key := testKey(t)
	if _, err := cacheguard.Get(ctx, g, key, (&counter{name: "old"}).load); err != nil {
		t.Fatal(err)
	}
	slow := newGated("new")
	var res cacheguard.Result
	eventually(t, 5*time.Second, "the older value after the soft timeout", func() bool {
		v, err := cacheguard.Get(ctx, g, key, slow.load, cacheguard.ReportTo(&res))
		return err == nil && v.Name == "old" && res == cacheguard.Stale
	})
	<-slow.entered
	close(slow.release)
	eventually(t, 5*time.Second, "the slow load's value stored", func() bool {
		v, err := cacheguard.Get(ctx, g, key, slow.load, cacheguard.ReportTo(&res))
		return err == nil && v.Name == "new"
	})
}
