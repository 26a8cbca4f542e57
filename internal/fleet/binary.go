package fleet

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
)

// RaceEnv names the environment variable that builds the service with the
// race detector (FLEET_RACE=1): slower, and every data race a process hits
// counts as a crash.
const RaceEnv = "FLEET_RACE"

var built struct {
	once sync.Once
	dir  string // holds the binary; removed by RemoveBinary
	path string
	err  error
}

// Binary builds the example service once per test binary (go build into a
// temporary directory) and returns its path.
func Binary(tb testing.TB) string {
	tb.Helper()
	built.once.Do(func() { built.path, built.err = build() })
	if built.err != nil {
		tb.Fatal(built.err)
	}
	return built.path
}

// RemoveBinary deletes the built binary; call it from TestMain after the tests.
func RemoveBinary() {
	if built.dir != "" {
		os.RemoveAll(built.dir)
	}
}

func build() (string, error) {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return "", fmt.Errorf("fleet: cannot locate the sources")
	}
	src := filepath.Join(filepath.Dir(file), "..", "..", "example")
	goBin, err := exec.LookPath("go")
	if err != nil {
		return "", fmt.Errorf("fleet: the go command is needed to build the example: %w", err)
	}
	dir, err := os.MkdirTemp("", "cacheguard-fleet-")
	if err != nil {
		return "", err
	}
	built.dir = dir
	out := filepath.Join(dir, "example")
	args := []string{"build", "-o", out}
	if os.Getenv(RaceEnv) == "1" {
		args = append(args, "-race")
	}
	cmd := exec.Command(goBin, append(args, ".")...)
	cmd.Dir = src
	cmd.Env = append(os.Environ(), "CGO_ENABLED=1") // the sqlite driver
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("fleet: go build ./example: %v\n%s", err, b)
	}
	return out, nil
}
