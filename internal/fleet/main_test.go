package fleet

import (
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/cacheguard/cacheguard/internal/pgtest"
	"github.com/cacheguard/cacheguard/internal/redistest"
)

// rep is the run's table.
var rep = &Report{ExpectFail: expectFail}

func TestMain(m *testing.M) {
	rep.Seed = 1
	if s := os.Getenv(SeedEnv); s != "" {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			fmt.Fprintf(os.Stderr, "%s=%q: %v\n", SeedEnv, s, err)
			os.Exit(2)
		}
		rep.Seed = n
	} else if os.Getenv(SoakEnv) != "" {
		rep.Seed = time.Now().UnixNano() % 1_000_000
	}
	code := m.Run()
	rep.Print(os.Stdout)
	if path := os.Getenv(ReportEnv); path != "" {
		f, err := os.Create(path)
		if err == nil {
			rep.Print(f)
			f.Close()
		}
	}
	RemoveBinary()
	pgtest.Stop()
	if code == 0 {
		if err := goleak.Find(redistest.LeakOptions()...); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}
