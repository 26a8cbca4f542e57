package ginmw_test

import (
	"testing"

	"github.com/gin-gonic/gin"

	"github.com/cacheguard/cacheguard/internal/childproc"
	"github.com/cacheguard/cacheguard/internal/redistest"
)

// redisAddr is the address of the server TestMain starts for examples.
var redisAddr string

func TestMain(m *testing.M) {
	// A child process of a multi-process test plays its role and exits.
	childproc.Main(childEnv, childRoles())
	gin.SetMode(gin.TestMode)
	redistest.Main(m, &redisAddr)
}
