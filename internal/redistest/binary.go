package redistest

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"testing"
)

// RequireEnv names the environment variable that turns a missing redis-server
// from a skip into a failure (CI sets it).
const RequireEnv = "CACHEGUARD_REQUIRE_REDIS"

// BinEnv names the environment variable that points at a redis-server binary.
const BinEnv = "REDIS_SERVER_BIN"

// ErrNoBinary reports that no redis-server binary could be found.
var ErrNoBinary = errors.New("redistest: redis-server not found: install the Debian package redis-server (apt-get install redis-server) or set " + BinEnv)

var findOnce = sync.OnceValues(func() (string, error) {
	if p := os.Getenv(BinEnv); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("%w (%s=%s: %v)", ErrNoBinary, BinEnv, p, err)
		}
		return p, nil
	}
	p, err := exec.LookPath("redis-server")
	if err != nil {
		return "", ErrNoBinary
	}
	return p, nil
})

// Binary returns the path of the redis-server binary to use.
func Binary() (string, error) { return findOnce() }

// Required reports whether a missing binary must fail the run.
func Required() bool { return os.Getenv(RequireEnv) == "1" }

// Need skips tb (or fails it, when CACHEGUARD_REQUIRE_REDIS=1) when no
// redis-server binary is available, and returns its path otherwise.
func Need(tb testing.TB) string {
	tb.Helper()
	p, err := Binary()
	if err != nil {
		if Required() {
			tb.Fatalf("%v (%s=1)", err, RequireEnv)
		}
		tb.Skip(err.Error())
	}
	return p
}
