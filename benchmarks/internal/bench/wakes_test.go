package bench

import (
	"testing"
	"time"
)

// TestWakesTellHandOffsFromReplies checks the counter on what it must tell
// apart: a goroutine woken by another goroutine (a channel send) is a
// hand-off; one woken by the runtime (a timer) is not.
func TestWakesTellHandOffsFromReplies(t *testing.T) {
	const n = 200
	w, err := traceWakes(func() int64 {
		ping, pong := make(chan struct{}), make(chan struct{})
		done := make(chan struct{})
		go func() {
			defer close(done)
			for range ping {
				pong <- struct{}{}
			}
		}()
		for range n {
			ping <- struct{}{}
			<-pong
		}
		close(ping)
		<-done
		return n
	})
	if err != nil {
		t.Fatal(err)
	}
	// Each round trip wakes the other goroutine once each way; the
	// goroutine's start and end add two, the runtime's own goroutines (a
	// GC's workers, woken by the one that starts it) a few.
	if w.handOffs < 2*n || w.handOffs > 2*n+n/20 {
		t.Errorf("ping-pong: %d hand-offs for %d round trips between two goroutines, want %d to %d (%+v)", w.handOffs, n, 2*n, 2*n+n/20, w)
	}

	w, err = traceWakes(func() int64 {
		for range n {
			time.Sleep(20 * time.Microsecond)
		}
		return n
	})
	if err != nil {
		t.Fatal(err)
	}
	// The runtime's own goroutines (a GC's workers, woken by the one that
	// starts it) may add a few hand-offs to any run.
	if w.handOffs > n/20 || w.byRuntime < n {
		t.Errorf("sleeps: %d hand-offs and %d wake-ups by the runtime for %d timers, want at most %d (the runtime's own) and at least %d (%+v)",
			w.handOffs, w.byRuntime, n, n/20, n, w)
	}
}
