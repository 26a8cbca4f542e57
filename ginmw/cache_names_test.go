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
	"github.com/cacheguard/cacheguard/internal/redistest"
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

// A list page cached with CacheTags("repos") is dropped by a write to any
// repository through InvalidateAfter(Resource("repos", ...)), in every
// process (here a second engine with its own Guard and client stands for
// another process), while the pages of other kinds stay cached.
func TestCacheTagsDroppedByResourceWrite(t *testing.T) {
	s := redistest.Start(t)
	ga, _ := newGuard(t, s)
	gb, _ := newGuard(t, s)
	var version atomic.Int64
	version.Store(1)
	list := func(c *gin.Context) { c.String(http.StatusOK, "list v"+strconv.FormatInt(version.Load(), 10)) }
	orgs := func(c *gin.Context) { c.String(http.StatusOK, "orgs v"+strconv.FormatInt(version.Load(), 10)) }
	repo := ginmw.Resource("repos", ginmw.Int(ginmw.Param("id")))
	engine := func(g *cacheguard.Guard) *gin.Engine {
		r := newEngine()
		r.GET("/repos", ginmw.Cache(g, time.Minute, ginmw.CacheTags("repos")), list)
		r.GET("/orgs", ginmw.Cache(g, time.Minute, ginmw.CacheTags("orgs")), orgs)
		r.PUT("/repos/:id", ginmw.InvalidateAfter(g, repo), func(c *gin.Context) {
			version.Add(1)
			c.Status(http.StatusNoContent)
		})
		return r
	}
	a, b := engine(ga), engine(gb)
	eventually(t, 10*time.Second, "the list and the orgs cached", func() bool {
		return serve(b, http.MethodGet, "/repos").Header().Get("X-Cache") == "HIT" &&
			serve(b, http.MethodGet, "/orgs").Header().Get("X-Cache") == "HIT"
	})
	if w := serve(a, http.MethodPut, "/repos/7"); w.Code != http.StatusNoContent {
		t.Fatalf("PUT: %d", w.Code)
	}
	if w := serve(b, http.MethodGet, "/repos"); w.Body.String() != "list v2" || w.Header().Get("X-Cache") != "MISS" {
		t.Fatalf("list after a repository write: %q %s; want a MISS of v2", w.Body, w.Header().Get("X-Cache"))
	}
	if w := serve(b, http.MethodGet, "/orgs"); w.Body.String() != "orgs v1" || w.Header().Get("X-Cache") != "HIT" {
		t.Fatalf("orgs after a repository write: %q %s; want the cached v1", w.Body, w.Header().Get("X-Cache"))
	}
}
