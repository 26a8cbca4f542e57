package redistest

import (
	"fmt"
	"os"
	"testing"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"
)

// Main is a TestMain body for packages whose tests and testable examples need a
// server: it starts one, stores its address in *addr, runs the tests, stops the
// server, checks for leaked goroutines, and exits. When the binary is missing it
// prints the skip message and exits 0 (1 when CACHEGUARD_REQUIRE_REDIS=1).
func Main(m *testing.M, addr *string, leakOpts ...goleak.Option) {
	os.Exit(run(m, addr, nil, leakOpts))
}

// MainThen is Main with then called once the tests have run, before the leak
// check: the place to stop other shared servers (pgtest.Stop).
func MainThen(m *testing.M, addr *string, then func(), leakOpts ...goleak.Option) {
	os.Exit(run(m, addr, then, leakOpts))
}

func run(m *testing.M, addr *string, then func(), leakOpts []goleak.Option) int {
	log := &redisLog{counts: map[string]int{}}
	redis.SetLogger(log)
	defer log.summary()
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
	if then != nil {
		then()
	}
	s.Close()
	if code == 0 {
		if err := goleak.Find(append(LeakOptions(), leakOpts...)...); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			return 1
		}
	}
	return code
}

// LeakOptions are the goleak options every leak check of this project uses:
// they ignore go-redis's dial prober (ConnPool.tryDial), which a pool starts
// after repeated dial failures (a test that killed its server) and which
// sleeps a second between probes, noticing the pool's Close only when it
// wakes — a goroutine that ends by itself, which goleak's retries can miss on
// a loaded machine.
func LeakOptions() []goleak.Option {
	return []goleak.Option{goleak.IgnoreAnyFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).tryDial")}
}
