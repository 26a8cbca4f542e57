package ginmw_test

import (
	"fmt"
	"net/http/httptest"

	"github.com/gin-gonic/gin"

	"github.com/cacheguard/cacheguard/ginmw"
	"github.com/cacheguard/cacheguard/locks"
)

// A handler hands whatever failed to Abort: here a write refused because the
// lock was lost before it (gormplugin's stale write matches locks.ErrNotHeld).
func ExampleAbort() {
	r := gin.New()
	r.PUT("/repos/:id", func(c *gin.Context) {
		err := fmt.Errorf("saving repo %s: %w", c.Param("id"), locks.ErrNotHeld)
		ginmw.Abort(c, err)
	})
	w := httptest.NewRecorder()
	r.ServeHTTP(w, httptest.NewRequest("PUT", "/repos/42", nil))
	fmt.Println(w.Code, "Retry-After:", w.Header().Get("Retry-After"))
	fmt.Println(w.Body.String())
	// Output:
	// 409 Retry-After: 1
	// {"error":"lock lost","retry_after":1}
}
