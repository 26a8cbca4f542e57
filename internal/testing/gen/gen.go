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
//     testdata/rapid/, which `-rapid.failfile` replays exactly).
package gen

import (
	"flag"
	"os"
	"strconv"
	"sync"
	"testing"

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
	rapid.Check(t, prop)
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
