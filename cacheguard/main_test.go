package cacheguard_test

import (
	"testing"

	"github.com/cacheguard/cacheguard/internal/childproc"
	"github.com/cacheguard/cacheguard/internal/redistest"
)

// redisAddr is the address of the server TestMain starts for tests and examples.
var redisAddr string

func TestMain(m *testing.M) {
	// A child process of a multi-process test runs its part and exits.
	childproc.Main(childEnv, childRoles())
	redistest.Main(m, &redisAddr)
}
