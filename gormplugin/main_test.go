package gormplugin_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/cacheguard/cacheguard/internal/pgtest"
	"github.com/cacheguard/cacheguard/internal/redistest"
)

// redisAddr is the address of the server TestMain starts for examples.
var redisAddr string

// GORM's prepared-statement cache (PrepareStmt) starts an expiry goroutine
// that nothing can stop. The PostgreSQL server that pgtest starts on first
// use is stopped after the tests, before the leak check.
func TestMain(m *testing.M) {
	redistest.MainThen(m, &redisAddr, pgtest.Stop, goleak.IgnoreTopFunction("gorm.io/gorm/internal/lru.NewLRU[...].func1"))
}
