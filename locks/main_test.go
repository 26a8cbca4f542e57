package locks_test

import (
	"os"
	"testing"

	"github.com/cacheguard/cacheguard/internal/redistest"
)

// redisAddr is the address of the server TestMain starts for examples.
var redisAddr string

func TestMain(m *testing.M) {
	if role := os.Getenv(childEnv); role != "" {
		os.Exit(runChild(role))
	}
	redistest.Main(m, &redisAddr)
}
