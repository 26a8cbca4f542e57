package redistest

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"
)

// Main is a TestMain body for packages whose tests and testable examples need a
// server: it starts one, stores its address in *addr, runs the tests, stops the
// server, checks for leaked goroutines, and exits. When the binary is missing it
// prints the skip message and exits 0 (1 when CACHEGUARD_REQUIRE_REDIS=1).
func Main(m *testing.M, addr *string, leakOpts ...goleak.Option) {
	os.Exit(run(m, addr, leakOpts))
}

func run(m *testing.M, addr *string, leakOpts []goleak.Option) int {
	bin, err := Binary()
	if err != nil {
		fmt.Fprintln(os.Stderr, "SKIP:", err)
		if Required() {
			return 1
		}
		return 0
	}
	dir, err := os.MkdirTemp("", "redistest-main-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	s, err := newServer(bin, dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	*addr = s.Addr()
	code := m.Run()
	s.Close()
	if code == 0 {
		if err := goleak.Find(leakOpts...); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			return 1
		}
	}
	return code
}
