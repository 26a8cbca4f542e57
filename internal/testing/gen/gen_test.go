package gen

import (
	"testing"

	"pgregory.net/rapid"
)

func TestCheckRunsTheBudget(t *testing.T) {
	if explicit() || Scale() != 1 {
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
