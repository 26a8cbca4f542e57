package reliability

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/internal/childproc"
	"github.com/cacheguard/cacheguard/internal/redistest"
)

// redisAddr is the address of the server TestMain starts (unused by the
// scenarios, which start their own servers to break them).
var redisAddr string

func TestMain(m *testing.M) {
	childproc.Main(childEnv, childRoles())
	// go-redis logs every failed dial; the scenarios kill servers on purpose.
	redis.SetLogger(quiet{})
	redistest.Main(m, &redisAddr)
}

type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}
