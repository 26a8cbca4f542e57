package reliability

import (
	"testing"

	"github.com/cacheguard/cacheguard/internal/childproc"
	"github.com/cacheguard/cacheguard/internal/redistest"
)

// redisAddr is the address of the server TestMain starts (unused by the
// scenarios, which start their own servers to break them).
var redisAddr string

func TestMain(m *testing.M) {
	childproc.Main(childEnv, childRoles())
	redistest.Main(m, &redisAddr)
}
