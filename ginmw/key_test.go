package ginmw_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/cacheguard/cacheguard/cacheguard"
	"github.com/cacheguard/cacheguard/ginmw"
	"github.com/cacheguard/cacheguard/internal/redistest"
	"github.com/cacheguard/cacheguard/locks"
)

// Canonical extractors: /repos/01, /repos/+1 and /repos/1 name one resource —
// one lock, one cache entry — and ids that cannot name a row are refused
// before any Redis call (404 for a path parameter, 400 for a query value).
func TestIntKeyIsCanonicalAndValidated(t *testing.T) {
	s := redistest.Start(t)
	rdb := s.Client()
	cmds := &redistest.CommandCounter{}
	rdb.AddHook(cmds)
	l := locks.New(rdb)
	t.Cleanup(func() { l.Close() })
	g := cacheguard.New(rdb)
	t.Cleanup(func() { g.Close() })

	repo := ginmw.Resource("repos", ginmw.Int(ginmw.Param("id")))
	r := newEngine()
	entered, release := make(chan string, 1), make(chan struct{})
	r.PUT("/repos/:id", ginmw.Lock(l, repo, ginmw.LockOptions(locks.WaitBudget(0))), func(c *gin.Context) {
		lk, _ := ginmw.LockFromContext(c.Request.Context())
		if c.Query("hold") != "" {
			entered <- lk.Name()
			<-release
		}
		c.String(http.StatusOK, lk.Name())
	})
	var loads atomic.Int64
	r.GET("/repos/:id", ginmw.Cache(g, time.Minute, ginmw.CacheKey(repo)), func(c *gin.Context) {
		loads.Add(1)
		c.String(http.StatusOK, "repo")
	})
	r.GET("/search", ginmw.Cache(g, time.Minute, ginmw.CacheKey(ginmw.Resource("repos", ginmw.Int(ginmw.Query("id"))))), func(c *gin.Context) {
		c.String(http.StatusOK, "repo")
	})

	// One lock for every spelling.
	held := make(chan int, 1)
	go func() { held <- serve(r, http.MethodPut, "/repos/01?hold=1").Code }()
	if name := <-entered; name != "repos:1" {
		t.Fatalf("lock name of /repos/01: %q, want repos:1", name)
	}
	for _, alias := range []string{"/repos/1", "/repos/+1", "/repos/001"} {
		if w := serve(r, http.MethodPut, alias); w.Code != http.StatusConflict {
			t.Fatalf("PUT %s while /repos/01 holds the lock: %d, want 409", alias, w.Code)
		}
	}
	close(release)
	if code := <-held; code != http.StatusOK {
		t.Fatalf("holder: %d", code)
	}
	// One cache entry for every spelling.
	serve(r, http.MethodGet, "/repos/01")
	waitEntries(t, rdb, 1)
	if w := serve(r, http.MethodGet, "/repos/1"); w.Header().Get("X-Cache") != "HIT" || loads.Load() != 1 {
		t.Fatalf("GET /repos/1 after /repos/01: X-Cache %q, %d loads; want a hit", w.Header().Get("X-Cache"), loads.Load())
	}

	// Refused before any Redis call.
	before := cmds.Count()
	for _, tc := range []struct {
		method, target string
		want           int
	}{
		{http.MethodPut, "/repos/abc", http.StatusNotFound},
		{http.MethodPut, "/repos/1.5", http.StatusNotFound},
		{http.MethodPut, "/repos/99999999999999999999", http.StatusNotFound},
		{http.MethodPut, "/repos/0x10", http.StatusNotFound},
		{http.MethodGet, "/repos/" + strings.Repeat("9", 300), http.StatusNotFound},
		{http.MethodGet, "/search?id=x", http.StatusBadRequest},
		{http.MethodGet, "/search", http.StatusBadRequest},
	} {
		w := serve(r, tc.method, tc.target)
		if w.Code != tc.want {
			t.Fatalf("%s %s: %d, want %d (%s)", tc.method, tc.target, w.Code, tc.want, w.Body)
		}
		decodeError(t, w)
	}
	if n := cmds.Count() - before; n != 0 {
		t.Fatalf("%d Redis commands for ids that name no row", n)
	}
	if loads.Load() != 1 {
		t.Fatal("a handler ran for a refused id")
	}
}

func TestUUIDAndCheckKeys(t *testing.T) {
	l, _, _ := newLocker(t)
	errReserved := errors.New("reserved name")
	slug := ginmw.Check(ginmw.Param("slug"), func(v string) (string, error) {
		v = strings.ToLower(v)
		switch {
		case v == "admin":
			return "", errReserved // 400 with the error's text
		case strings.HasPrefix(v, "gone-"):
			return "", fmt.Errorf("%q: %w", v, ginmw.ErrNotFound) // 404
		}
		return v, nil
	})
	r := newEngine()
	names := func(c *gin.Context) {
		lk, _ := ginmw.LockFromContext(c.Request.Context())
		c.String(http.StatusOK, lk.Name())
	}
	r.PUT("/users/:id", ginmw.Lock(l, ginmw.Resource("users", ginmw.UUID(ginmw.Param("id")))), names)
	r.PUT("/orgs/:slug", ginmw.Lock(l, ginmw.Resource("orgs", slug)), names)

	const canonical = "users:0f8fad5b-d9cb-469f-a165-70867728950e"
	for _, id := range []string{"0f8fad5b-d9cb-469f-a165-70867728950e", "0F8FAD5B-D9CB-469F-A165-70867728950E", "0f8fad5bd9cb469fa16570867728950e", "{0f8fad5b-d9cb-469f-a165-70867728950e}", "urn:uuid:0f8fad5b-d9cb-469f-a165-70867728950e"} {
		if w := serve(r, http.MethodPut, "/users/"+id); w.Code != http.StatusOK || w.Body.String() != canonical {
			t.Fatalf("PUT /users/%s: %d %q, want %s", id, w.Code, w.Body, canonical)
		}
	}
	for _, id := range []string{"0f8fad5b-d9cb-469f-a165-70867728950", "0f8fad5b_d9cb_469f_a165_70867728950e", "zzzzzzzz-d9cb-469f-a165-70867728950e", "1"} {
		if w := serve(r, http.MethodPut, "/users/"+id); w.Code != http.StatusNotFound {
			t.Fatalf("PUT /users/%s: %d, want 404", id, w.Code)
		}
	}
	if w := serve(r, http.MethodPut, "/orgs/Acme"); w.Code != http.StatusOK || w.Body.String() != "orgs:acme" {
		t.Fatalf("PUT /orgs/Acme: %d %q", w.Code, w.Body)
	}
	if w := serve(r, http.MethodPut, "/orgs/admin"); w.Code != http.StatusBadRequest || decodeError(t, w).Error != "bad key: reserved name" {
		t.Fatalf("PUT /orgs/admin: %d %s", w.Code, w.Body)
	}
	if w := serve(r, http.MethodPut, "/orgs/gone-corp"); w.Code != http.StatusNotFound {
		t.Fatalf("PUT /orgs/gone-corp: %d %s", w.Code, w.Body)
	}
	_ = context.Background
}
