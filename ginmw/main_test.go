package ginmw_test

import (
	"testing"

	"github.com/gin-gonic/gin"

	"github.com/cacheguard/cacheguard/internal/redistest"
)

// redisAddr is the address of the server TestMain starts for examples.
var redisAddr string

func TestMain(m *testing.M) {
	gin.SetMode(gin.TestMode)
	redistest.Main(m, &redisAddr)
}
