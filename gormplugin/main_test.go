package gormplugin_test

import (
	"testing"

	"github.com/cacheguard/cacheguard/internal/redistest"
)

// redisAddr is the address of the server TestMain starts for examples.
var redisAddr string

func TestMain(m *testing.M) { redistest.Main(m, &redisAddr) }
