package redistest

import (
	"testing"
	"time"
)

// Eventually polls cond until it holds, failing tb after d: for waiting on an
// observable event (a key written, a counter reached) with a bounded
// deadline instead of sleeping a guessed time.
func Eventually(tb testing.TB, d time.Duration, what string, cond func() bool) {
	tb.Helper()
	for deadline := time.Now().Add(d); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			tb.Fatalf("not within %v: %s", d, what)
		}
	}
}
