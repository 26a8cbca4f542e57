package gen

import (
	"testing"

	"pgregory.net/rapid"
)

func TestCheckRunsTheBudget(t *testing.T) {
	if chosen() || Scale() != 1 {
		t.Skip("budget chosen on the command line")
	}
	runs := 0
	Check(t, 7, func(rt *rapid.T) {
		_ = rapid.IntRange(0, 10).Draw(rt, "x")
		runs++
	})
	if runs < 7 {
		t.Fatalf("ran %d checks, want at least 7", runs)
	}
}

// TestCheckTwice: a second generator in the same process gets its own
// budget, not rapid's default (Check's own flag.Set must not read as the
// command line's).
func TestCheckTwice(t *testing.T) {
	if chosen() || Scale() != 1 {
		t.Skip("budget chosen on the command line")
	}
	for _, n := range []int{3, 4} {
		runs := 0
		Check(t, n, func(rt *rapid.T) {
			_ = rapid.IntRange(0, 10).Draw(rt, "x")
			runs++
		})
		if runs < n || runs > n+1 {
			t.Fatalf("Check(%d) ran %d checks", n, runs)
		}
	}
}
