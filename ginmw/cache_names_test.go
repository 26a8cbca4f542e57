package ginmw_test

import (
	"context"
	"net/http"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/cacheguard/cacheguard/cacheguard"
	"github.com/cacheguard/cacheguard/ginmw"
)

// One resource name reaches every representation: the GET and HEAD responses
// Cache stored for "repos:1" and the value cacheguard.Get stored under the
// same name live side by side (neither clobbers the other), and one
// Guard.Invalidate("repos:1") — what gormplugin calls after a commit — drops
// them all.
func TestCacheOneNameInvalidatesEveryRepresentation(t *testing.T) {
	ctx := context.Background()
	g, _ := startGuard(t)
	var version atomic.Int64
	version.Store(1)
	r := newEngine()
	repo := ginmw.Resource("repos", ginmw.Param("id"))
	mw := ginmw.Cache(g, time.Minute, ginmw.CacheKey(repo))
	h := func(c *gin.Context) {
		c.Header("X-Version", strconv.FormatInt(version.Load(), 10))
		c.String(http.StatusOK, "v"+strconv.FormatInt(version.Load(), 10))
	}
	r.GET("/repos/:id", mw, h)
	r.HEAD("/repos/:id", mw, h)
	type row struct{ Version int64 }
	get := func() (row, cacheguard.Result, error) {
		var res cacheguard.Result
		v, err := cacheguard.Get(ctx, g, "repos:1", func(context.Context) (row, error) { return row{version.Load()}, nil }, cacheguard.ReportTo(&res))
		return v, res, err
	}
	xcache := func(method string) (string, string) {
		w := serve(r, method, "/repos/1")
		return w.Header().Get("X-Cache"), w.Header().Get("X-Version")
	}
	// Fill all three, then read them back as hits.
	eventually(t, 10*time.Second, "GET, HEAD and Get cached", func() bool {
		xg, _ := xcache(http.MethodGet)
		xh, _ := xcache(http.MethodHead)
		_, res, err := get()
		return xg == "HIT" && xh == "HIT" && err == nil && res == cacheguard.Hit
	})
	if st := g.Stats(); st.DecodeErrors != 0 {
		t.Fatalf("%d decode errors: the representations share an entry", st.DecodeErrors)
	}

	version.Store(2)
	if err := g.Invalidate(ctx, "repos:1"); err != nil {
		t.Fatal(err)
	}
	for _, m := range []string{http.MethodGet, http.MethodHead} {
		if x, v := xcache(m); x != "MISS" || v != "2" {
			t.Fatalf("%s after Invalidate: X-Cache %q version %q, want a MISS of version 2", m, x, v)
		}
	}
	if v, res, err := get(); err != nil || res != cacheguard.Miss || v.Version != 2 {
		t.Fatalf("Get after Invalidate: %v, %v, %v; want a miss of version 2", v, res, err)
	}
}
