// Package pgtest gives tests a real PostgreSQL database: one server per test
// binary (started on first use, stopped by Main), a new database per call.
package pgtest

import (
	"context"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/cacheguard/cacheguard/internal/pgserver"
)

// RequireEnv names the environment variable that turns a missing PostgreSQL
// from a skip into a failure (CI sets it).
const RequireEnv = "CACHEGUARD_REQUIRE_REDIS"

var (
	mu     sync.Mutex // guards server, err
	server *pgserver.Server
	err    error
	dbs    atomic.Int64
)

func shared() (*pgserver.Server, error) {
	mu.Lock()
	defer mu.Unlock()
	if server == nil && err == nil {
		server, err = pgserver.Start(context.Background(), pgserver.Options{})
	}
	return server, err
}

// Main runs the tests of a package and stops the shared server after them:
// call it from TestMain (after other set-up) instead of os.Exit(m.Run()).
func Main(m *testing.M) {
	code := m.Run()
	Stop()
	os.Exit(code)
}

// Stop stops the shared server, if one was started.
func Stop() {
	mu.Lock()
	defer mu.Unlock()
	if server != nil {
		server.Stop()
		server = nil
	}
}

// DSN creates a new database on the shared server (started on first use) and
// returns its connection string. A missing PostgreSQL skips tb, or fails it
// when CACHEGUARD_REQUIRE_REDIS=1 (CI installs both servers).
func DSN(tb testing.TB) string {
	tb.Helper()
	s, err := shared()
	if err != nil {
		if os.Getenv(RequireEnv) == "1" {
			tb.Fatalf("pgtest: %v", err)
		}
		tb.Skip(err.Error())
	}
	name := fmt.Sprintf("t%d_%d", os.Getpid(), dbs.Add(1))
	if err := s.CreateDB(context.Background(), name); err != nil {
		tb.Fatal(err)
	}
	return s.DSN(name)
}

// Server returns the shared server (started on first use), skipping tb as DSN does.
func Server(tb testing.TB) *pgserver.Server {
	tb.Helper()
	DSN(tb) // starts it, or skips
	s, _ := shared()
	return s
}
