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

// TestFailSafeNeverFromBeforeInvalidation (issue 31, item 1): a value loaded
// before an Invalidate never stands in for a failed load that began after it.
// Process A reads V0 (expired, within the fail-safe max age) and waits for
// the fill of process B (a child); the row is written and the key
// invalidated, which voids B's lease; A takes the lease over and its load
// fails. A third process C (a child) whose Get begins after Invalidate
// returned must load the new version, not be served V0. B dies once its
// lease is void: its renewal finds the lease gone and its caller reads
// again, and a lease it takes then, for a loader that never returns, would
// be renewed for as long as C's budget (a hung loader holds its key: by
// design), which made C's answer a race (3 in 10 runs on a loaded host).
func TestFailSafeNeverFromBeforeInvalidation(t *testing.T) {
	ctx := context.Background()
	rdb := shared(t)
	key := testKey(t)
	if err := rdb.Set(ctx, dbKey(key), 1, time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	c := startChild(t, "writer", childKey+"="+key)
	if line, err := c.Next(30 * time.Second); err != nil || line != "ready" {
		t.Fatalf("child: %q, %v", line, err)
	}
	// V0: version 1, fresh for 50ms, kept a minute longer for fail-safe.
	failSafe := cacheguard.FailSafe(time.Minute, 5*time.Second)
	p, _ := newGuard(t, cacheguard.TTL(50*time.Millisecond), cacheguard.Jitter(0), cacheguard.EarlyRefresh(0), failSafe)
	if v, err := cacheguard.Get(ctx, p, key, versionLoad(rdb, key)); err != nil || v.ID != 1 {
		t.Fatalf("V0: %v, %v", v, err)
	}
	loaded := time.Now()
	eventually(t, time.Second, "V0 expired", func() bool { return time.Since(loaded) > 60*time.Millisecond })

	// B takes the fill lease and loads without end.
	b := startChild(t, "holder", childKey+"="+key)
	eventually(t, 30*time.Second, "B to hold the lease and load", func() bool {
		return rdb.Exists(ctx, loadingKey(key)).Val() == 1
	})
	a, ra := newGuard(t, failSafe, cacheguard.EarlyRefresh(0))
	waiting := watchWaiting(ra)
	done := make(chan error, 1)
	go func() {
		_, err := cacheguard.Get(ctx, a, key, func(context.Context) (item, error) { return item{}, errors.New("db down") })
		done <- err
	}()
	<-waiting // A waits for B's fill, V0 in hand

	if got := ask(t, c, "write"); got != "ok 2" { // version 2 committed, the key invalidated
		t.Fatalf("C: %q", got)
	}
	// B dies: a lease it took again lapses (150 ms) unrenewed.
	b.Kill()
	<-done // A took the lease over and its load failed
	if got := ask(t, c, "get"); got != "got 2" {
		t.Fatalf("a Get that began after Invalidate returned: %q, want version 2 (V0 came back through fail-safe)", got)
	}
}
