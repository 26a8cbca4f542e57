// Package gen runs the project's randomized state-machine tests
// (pgregory.net/rapid) with a fixed budget in `make test` and a larger one
// under `make gen-long`.
//
// Every generator in the repository calls Check instead of rapid.Check, so the
// budget, the seed and the replay instructions live in one place:
//
//   - `make test` runs each generator for its own number of checks (the n
//     given to Check), small enough for the suite's 20 minutes on 2 cores;
//   - CACHEGUARD_GEN_SCALE=k multiplies every budget (`make gen-long` sets 20);
//   - -rapid.checks=N or RAPID_CHECKS=N, when given, wins over both;
//   - a failure prints rapid's seed and the shrunk sequence of actions, and
//     -rapid.seed=S replays it (rapid also writes a fail file under
//     testdata/rapid/, which `-rapid.failfile` replays exactly);
//   - shrinking a failure takes at most -rapid.shrinktime (rapid's own flag,
//     30 s by default) and the candidate then running: see Check.
package gen

import (
	"flag"
	"io"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"pgregory.net/rapid"
)

var (
	mu sync.Mutex // serialises the rapid.checks flag between generators

	// chosen records, once and before Check first sets the flag itself,
	// whether the command line or RAPID_CHECKS chose the number of checks
	// (flag.Visit cannot tell a flag set there from one Check set).
	chosen = sync.OnceValue(explicit)
)

// Check runs prop for n checks (scaled by CACHEGUARD_GEN_SCALE) unless the
// command line or RAPID_CHECKS chose a number, and logs what it ran.
//
// A failure is reported within -rapid.shrinktime of the start of its first
// failing run, plus the run then in progress, however slow the runs are.
// rapid checks its shrink deadline only between candidates, and some of its
// rounds (a candidate for each pair of a state machine's actions) check it
// only between rounds: a generator whose failing runs each wait seconds
// (gormplugin's, for row locks left behind) would shrink past the test's
// timeout, which then reports nothing, not even the seed. Check therefore
// skips, as invalid data (rapid rejects the candidate), every shrink
// candidate that begins once shrinktime has passed since the first failing
// run began (a failure: rapid.T's Failed, after a Fatal, Error or Fail). It
// tells a candidate by its output, which rapid discards (rapid.T.Output is
// io.Discard, unless -rapid.v or -rapid.log); rapid's replays of the shrunk
// case, which it prints, run in full. A panic that is no failure of the T
// (a bug in the code tested) does not start the clock: that failure shrinks
// as under rapid alone.
func Check(t *testing.T, n int, prop func(*rapid.T)) {
	t.Helper()
	mu.Lock()
	defer mu.Unlock()
	if !chosen() {
		f := flag.Lookup("rapid.checks")
		old := f.Value.String()
		if err := flag.Set("rapid.checks", strconv.Itoa(n*Scale())); err != nil {
			t.Fatalf("gen: %v", err)
		}
		defer func() { _ = flag.Set("rapid.checks", old) }()
	}
	t.Logf("gen: %s: %s checks (replay a failure with -rapid.seed or -rapid.failfile as printed)",
		t.Name(), flag.Lookup("rapid.checks").Value.String())
	rapid.Check(t, shrinkBounded(t, prop))
}

// shrinkBounded returns prop, skipping the shrink candidates that begin more
// than -rapid.shrinktime after the first failing run began (see Check).
func shrinkBounded(t *testing.T, prop func(*rapid.T)) func(*rapid.T) {
	budget, _ := time.ParseDuration(flag.Lookup("rapid.shrinktime").Value.String())
	var failed time.Time // when the first run that failed began; rapid runs prop on one goroutine at a time
	skipped := 0
	return func(rt *rapid.T) {
		began := time.Now()
		if !failed.IsZero() && began.Sub(failed) > budget && rt.Output() == io.Discard {
			if skipped++; skipped == 1 {
				t.Logf("gen: %s: shrinking stopped %v after the first failure: the remaining candidates are skipped", t.Name(), budget)
			}
			rt.Skip("gen: shrink budget spent")
		}
		defer func() {
			if failed.IsZero() && rt.Failed() {
				failed = began
			}
		}()
		prop(rt)
	}
}

// Scale is CACHEGUARD_GEN_SCALE, or 1.
func Scale() int {
	if v, err := strconv.Atoi(os.Getenv("CACHEGUARD_GEN_SCALE")); err == nil && v > 0 {
		return v
	}
	return 1
}

func explicit() bool {
	if os.Getenv("RAPID_CHECKS") != "" {
		return true
	}
	set := false
	flag.Visit(func(f *flag.Flag) {
		if f.Name == "rapid.checks" {
			set = true
		}
	})
	return set
}
