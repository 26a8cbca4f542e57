package reliability

import (
	"os"
	"testing"

	"github.com/cacheguard/cacheguard/internal/redistest"
)

// redisAddr is the address of the server TestMain starts (unused by the
// scenarios, which start their own servers to break them).
var redisAddr string

func TestMain(m *testing.M) {
	if role := os.Getenv(childEnv); role != "" {
		os.Exit(runChild(role))
	}
	redistest.Main(m, &redisAddr)
}
