package reliability

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/cacheguard"
	"github.com/cacheguard/cacheguard/internal/redistest"
	"github.com/cacheguard/cacheguard/locks"
)

// TestReliabilityWakeAfterOutage: push wake-ups survive a Redis outage
// longer than the shared subscription's linger (2 s). Before and after
// redis-server is killed for 1 s and 4 s and restarted empty, a lock waiter
// behind another client's hold, and a cacheguard waiter behind another
// guard's load, are woken by push: the waiter's channel is subscribed at the
// server within 1 s of being waited on, and the waiter returns well inside
// its fallback timer (a lock waiter re-polls every 0.8–1 s; a fill waiter
// waits out the 3 s fill lease). Both used to fall back to their timers for
// good after an outage longer than the linger. (internal/wake's
// TestPushAfterOutage covers 30 s outages and the cluster.)
func TestReliabilityWakeAfterOutage(t *testing.T) {
	for _, outage := range []time.Duration{time.Second, 4 * time.Second} {
		t.Run(outage.String(), func(t *testing.T) {
			noLeaks(t)
			srv := redistest.Start(t)
			rdb := srv.Client() // as users build it: go-redis defaults
			a, b := locks.New(srv.Client()), locks.New(srv.Client())
			defer a.Close()
			defer b.Close()
			ga, gb := cacheguard.New(srv.Client()), cacheguard.New(srv.Client())
			defer ga.Close()
			defer gb.Close()

			fig := Figures{Scenario: fmt.Sprintf("wake: redis-server killed for %v (> linger), lock and fill waiters woken by push after it", outage)}
			var notes []string
			round := func(stage string) {
				lockWait := lockWake(t, rdb, a, b, stage)
				fillWait := fillWake(t, rdb, ga, gb, stage)
				fig.Attempted += 2
				if lockWait < 600*time.Millisecond && fillWait < 1500*time.Millisecond {
					fig.Succeeded += 2
				} else {
					fig.Violations++
					t.Errorf("%s: lock waiter woken %v after the release (re-poll fallback 0.8-1s), fill waiter %v after the load (fallback: the 3s fill lease)",
						stage, lockWait, fillWait)
				}
				notes = append(notes, fmt.Sprintf("%s: lock %v, fill %v", stage, lockWait.Round(time.Millisecond), fillWait.Round(time.Millisecond)))
			}
			round("before")
			srv.Kill()
			time.Sleep(outage) // the outage's length is the subject
			if err := srv.Restart(); err != nil {
				t.Fatal(err)
			}
			answering := time.Now()
			round("after")
			fig.Recovery = time.Since(answering)
			fig.Note = fmt.Sprintf("%v", notes)
			fig.Report(t)
		})
	}
}

// lockWake has a hold b's waiter and returns how long after a's Unlock b got
// the lock.
func lockWake(t *testing.T, rdb *redis.Client, a, b *locks.Client, stage string) time.Duration {
	t.Helper()
	ctx := context.Background()
	const name = "wake:hot"
	var held *locks.Lock
	redistest.Eventually(t, 10*time.Second, stage+": lock taken", func() bool {
		lk, err := a.TryLock(ctx, name)
		held = lk
		return err == nil
	})
	got := make(chan error, 1)
	var lk *locks.Lock
	go func() {
		var err error
		lk, err = b.Lock(ctx, name, locks.WaitBudget(10*time.Second))
		got <- err
	}()
	redistest.Eventually(t, 5*time.Second, stage+": lock waiter queued", func() bool {
		return rdb.ZCard(ctx, "cg:q:{"+name+"}").Val() == 1
	})
	// The waiter's client listens on the lock's channel for that client.
	redistest.Eventually(t, time.Second, stage+": lock waiter's channel subscribed at the server", func() bool {
		return len(rdb.PubSubChannels(ctx, "cg:lock:{"+name+"}:w:*").Val()) == 1
	})
	start := time.Now()
	if err := held.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("%s: lock waiter: %v", stage, err)
	}
	wait := time.Since(start)
	lk.Unlock(ctx)
	return wait
}

// fillWake has ga load a key while gb waits for it, and returns how long after
// the load ended gb got the value.
func fillWake(t *testing.T, rdb *redis.Client, ga, gb *cacheguard.Guard, stage string) time.Duration {
	t.Helper()
	ctx := context.Background()
	key := "wake:" + stage
	loading, finish := make(chan struct{}), make(chan struct{})
	loaded := make(chan error, 1)
	go func() {
		_, err := cacheguard.Get(ctx, ga, key, func(context.Context) (string, error) {
			close(loading)
			<-finish
			return "v", nil
		})
		loaded <- err
	}()
	select {
	case <-loading:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: the load never started", stage)
	}
	got := make(chan error, 1)
	go func() {
		v, err := cacheguard.Get(ctx, gb, key, func(context.Context) (string, error) { return "second load", nil })
		if err == nil && v != "v" {
			err = fmt.Errorf("got %q, want the one load's value", v)
		}
		got <- err
	}()
	ch := "cg:fw:{" + key + "}"
	redistest.Eventually(t, time.Second, stage+": fill waiter's channel subscribed at the server", func() bool {
		return rdb.PubSubNumSub(ctx, ch).Val()[ch] == 1
	})
	start := time.Now()
	close(finish)
	if err := <-loaded; err != nil {
		t.Fatalf("%s: loader: %v", stage, err)
	}
	if err := <-got; err != nil {
		t.Fatalf("%s: fill waiter: %v", stage, err)
	}
	return time.Since(start)
}
