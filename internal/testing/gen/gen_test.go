package gen

import (
	"context"
	"flag"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

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

// shrinkChild names the environment variable that makes TestShrinkChild run.
const shrinkChild = "GEN_SHRINK_CHILD"

// TestShrinkBounded: a failing generator whose runs are slow reports its
// failure, with the seed that replays it, once -rapid.shrinktime has passed
// since its first failure: no shrink candidate runs after that. The child
// (TestShrinkChild) counts the candidates its prop began beyond the budget:
// rapid alone begins the next candidate of a round past its deadline (one
// here, where rounds are short; a state machine's expensive rounds try a
// candidate for each pair of its actions, with no deadline check between).
func TestShrinkBounded(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestShrinkChild$", "-test.v",
		"-rapid.shrinktime=200ms", "-rapid.nofailfile")
	cmd.Env = []string{shrinkChild + "=1"}
	for _, kv := range os.Environ() { // the child's budgets are its own
		if !strings.HasPrefix(kv, "RAPID_") && !strings.HasPrefix(kv, "CACHEGUARD_GEN_SCALE=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("the failing generator passed:\n%s", out)
	}
	for _, want := range []string{"-rapid.seed=", "GEN-LATE-CANDIDATES 0\n", "shrinking stopped"} {
		if !strings.Contains(string(out), want) {
			t.Fatalf("child output lacks %q:\n%s", want, out)
		}
	}
}

// TestShrinkChild is TestShrinkBounded's failing generator: each run takes
// 20 ms, and fails when its numbers add up to more than 2^20 (rapid shrinks
// each number by bisection: tens of candidates). It prints how many
// shrink candidates (runs whose output rapid discards) began more than the
// shrink budget after its first failure.
func TestShrinkChild(t *testing.T) {
	if os.Getenv(shrinkChild) == "" {
		t.Skip("run by TestShrinkBounded")
	}
	budget, err := time.ParseDuration(flag.Lookup("rapid.shrinktime").Value.String())
	if err != nil {
		t.Fatal(err)
	}
	var failed time.Time
	late := 0
	t.Cleanup(func() { os.Stdout.WriteString("GEN-LATE-CANDIDATES " + strconv.Itoa(late) + "\n") })
	// 100 checks: rapid draws small numbers first, and 5 of them once added up
	// to no more than 2^20 in 2 of 30 runs, which failed TestShrinkBounded.
	Check(t, 100, func(rt *rapid.T) {
		if !failed.IsZero() && time.Since(failed) > budget && rt.Output() == io.Discard {
			late++
		}
		xs := rapid.SliceOfN(rapid.IntRange(0, 1<<20), 8, 8).Draw(rt, "xs")
		time.Sleep(20 * time.Millisecond) // a slow run, as a generator's that polls for row locks
		if sum := xs[0] + xs[1] + xs[2] + xs[3] + xs[4] + xs[5] + xs[6] + xs[7]; sum > 1<<20 {
			if failed.IsZero() {
				failed = time.Now()
			}
			rt.Fatalf("sum %d > %d", sum, 1<<20)
		}
	})
}
