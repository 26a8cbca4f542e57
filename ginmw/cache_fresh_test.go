package ginmw_test

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/cacheguard/cacheguard/ginmw"
)

// What the origin's freshness fields let Cache store, one row per rule the
// HTTP caching conformance suite found missing (issue 45, part B).
func TestCacheFreshnessFields(t *testing.T) {
	g, _ := startGuard(t)
	for i, tc := range []struct {
		name   string
		status int
		header [][2]string
		stored bool
	}{
		{"Age past max-age", 200, [][2]string{{"Cache-Control", "max-age=3600"}, {"Age", "7200"}}, false},
		{"Age too large for 31 bits", 200, [][2]string{{"Cache-Control", "max-age=3600"}, {"Age", "2147483648"}}, false},
		{"first Age of a list", 200, [][2]string{{"Cache-Control", "max-age=3600"}, {"Age", "7200, 0"}}, false},
		{"invalid Age ignored", 200, [][2]string{{"Cache-Control", "max-age=3600"}, {"Age", "-7200"}}, true},
		{"Age within max-age", 200, [][2]string{{"Cache-Control", "max-age=3600"}, {"Age", "30"}}, true},
		{"Date older than Expires minus Age", 200, [][2]string{{"Date", date(-10)}, {"Expires", date(10)}, {"Age", "25"}}, false},
		{"valid Expires", 200, [][2]string{{"Date", date(0)}, {"Expires", date(3600)}}, true},
		{"Expires with a 1-digit hour", 200, [][2]string{{"Date", date(0)}, {"Expires", "Thu, 18 Aug 2050 2:01:18 GMT"}}, false},
		{"Expires with two spaces", 200, [][2]string{{"Date", date(0)}, {"Expires", "Thu, 18  Aug 2050 02:01:18 GMT"}}, false},
		{"Expires in asctime form, wrong weekday", 200, [][2]string{{"Date", date(0)}, {"Expires", "Thu Aug  8 02:01:18 2050"}}, true},
		{"Expires in RFC 850 form", 200, [][2]string{{"Date", date(0)}, {"Expires", "Thursday, 18-Aug-50 02:01:18 GMT"}}, true},
		{"Expires with a lower-case weekday", 200, [][2]string{{"Date", date(0)}, {"Expires", "thu, 18 Aug 2050 02:01:18 GMT"}}, false},
		{"Expires in UTC", 200, [][2]string{{"Date", date(0)}, {"Expires", "Thu, 18 Aug 2050 02:01:18 UTC"}}, false},
		{"201 without freshness", 201, nil, false},
		{"202 with Last-Modified only", 202, [][2]string{{"Last-Modified", date(-3600)}}, false},
		{"201 with max-age", 201, [][2]string{{"Cache-Control", "max-age=60"}}, true},
		{"200 without freshness: the route's TTL", 200, nil, true},
		{"CDN-Cache-Control private over max-age", 200, [][2]string{{"CDN-Cache-Control", "private"}, {"Cache-Control", "max-age=600"}}, false},
		{"CDN-Cache-Control no-store over max-age", 200, [][2]string{{"CDN-Cache-Control", "no-store"}, {"Cache-Control", "max-age=600"}}, false},
		{"CDN-Cache-Control no-cache over max-age", 200, [][2]string{{"CDN-Cache-Control", "no-cache"}, {"Cache-Control", "max-age=600"}}, false},
		{"CDN-Cache-Control max-age=0 over Expires", 200, [][2]string{{"CDN-Cache-Control", "max-age=0"}, {"Date", date(0)}, {"Expires", date(600)}}, false},
		{"CDN-Cache-Control max-age past Age", 200, [][2]string{{"CDN-Cache-Control", "max-age=3600"}, {"Age", "7200"}}, false},
		{"CDN-Cache-Control max-age over no-store", 200, [][2]string{{"CDN-Cache-Control", "max-age=600"}, {"Cache-Control", "no-store"}}, true},
		{"invalid CDN-Cache-Control ignored", 200, [][2]string{{"CDN-Cache-Control", "max-age=600, &&&"}, {"Cache-Control", "no-store"}}, false},
		{"CDN-Cache-Control max-age as a string ignored", 200, [][2]string{{"CDN-Cache-Control", `max-age="600"`}, {"Cache-Control", "no-store"}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var calls atomic.Int64
			r := newEngine()
			r.GET("/r", ginmw.Cache(g, time.Minute), func(c *gin.Context) {
				calls.Add(1)
				for _, kv := range tc.header {
					c.Header(kv[0], kv[1])
				}
				c.String(tc.status, "ok")
			})
			target := "/r?case=" + strconv.Itoa(i)
			serve(r, http.MethodGet, target)
			w := serve(r, http.MethodGet, target)
			if hit := w.Header().Get("X-Cache") == "HIT"; hit != tc.stored {
				t.Errorf("second request: X-Cache %q, want stored=%v", w.Header().Get("X-Cache"), tc.stored)
			}
		})
	}
}

func date(offset int) string {
	return time.Now().Add(time.Duration(offset) * time.Second).UTC().Format(http.TimeFormat)
}

// A hit carries the response's age: the origin's Age plus the time it spent
// in the cache (RFC 9111 §5.1, §4.2.3).
func TestCacheHitCarriesAge(t *testing.T) {
	g, _ := startGuard(t)
	r := newEngine()
	r.GET("/r", ginmw.Cache(g, time.Minute), func(c *gin.Context) {
		c.Header("Cache-Control", "max-age=100000")
		c.Header("Age", "30")
		c.String(http.StatusOK, "ok")
	})
	serve(r, http.MethodGet, "/r")
	w := serve(r, http.MethodGet, "/r")
	if age, err := strconv.Atoi(w.Header().Get("Age")); w.Header().Get("X-Cache") != "HIT" || err != nil || age < 30 || age > 40 {
		t.Fatalf("X-Cache %q, Age %q, want a HIT with Age 30 or a little more", w.Header().Get("X-Cache"), w.Header().Get("Age"))
	}
}

// A successful unsafe request drops the stored responses of its target
// (RFC 9111 §4.4), before its response reaches the client; a failed one does
// not.
func TestCacheInvalidatesAfterUnsafeMethod(t *testing.T) {
	g, _ := startGuard(t)
	var calls atomic.Int64
	r := newEngine()
	r.Any("/*path", ginmw.Cache(g, time.Minute), func(c *gin.Context) {
		if c.Request.Method != http.MethodGet {
			status, _ := strconv.Atoi(c.GetHeader("X-Status"))
			c.Header("Transfer-Encoding", "chunked")
			c.Status(status)
			c.Writer.Flush() // the status reaches the client before the handler returns
			return
		}
		calls.Add(1)
		c.String(http.StatusOK, "page %d", calls.Load())
	})
	for _, method := range []string{http.MethodPost, http.MethodPut, http.MethodDelete, http.MethodPatch} {
		target := "/doc/" + method
		serve(r, http.MethodGet, target)
		if w := serve(r, http.MethodGet, target); w.Header().Get("X-Cache") != "HIT" {
			t.Fatalf("%s: not stored: X-Cache %q", target, w.Header().Get("X-Cache"))
		}
		serve(r, method, target, "X-Status", "500")
		if w := serve(r, http.MethodGet, target); w.Header().Get("X-Cache") != "HIT" {
			t.Errorf("after a failed %s: X-Cache %q, want HIT", method, w.Header().Get("X-Cache"))
		}
		serve(r, method, target, "X-Status", "204")
		if w := serve(r, http.MethodGet, target); w.Header().Get("X-Cache") == "HIT" {
			t.Errorf("after a successful %s: X-Cache HIT %q", method, w.Body)
		}
	}
}

// A stored response whose own lifetime ended is revalidated with its ETag:
// the handler's 304 refreshes it, and the client still gets the whole
// response (RFC 9111 §4.3.1, §4.3.4).
func TestCacheRevalidatesStaleResponse(t *testing.T) {
	g, _ := startGuard(t)
	var full, notModified atomic.Int64
	r := newEngine()
	r.GET("/doc", ginmw.Cache(g, time.Minute), func(c *gin.Context) {
		c.Header("Cache-Control", "max-age=1, must-revalidate")
		c.Header("ETag", `"v1"`)
		if c.GetHeader("If-None-Match") == `"v1"` {
			notModified.Add(1)
			c.Header("X-Revalidated", "yes")
			c.Status(http.StatusNotModified)
			return
		}
		full.Add(1)
		c.String(http.StatusOK, "document")
	})
	serve(r, http.MethodGet, "/doc")
	var w *httptest.ResponseRecorder
	eventually(t, 10*time.Second, "a revalidation", func() bool {
		w = serve(r, http.MethodGet, "/doc")
		return notModified.Load() > 0
	})
	if w.Code != http.StatusOK || w.Body.String() != "document" || w.Header().Get("X-Revalidated") != "yes" {
		t.Fatalf("revalidated: %d %q %v", w.Code, w.Body, w.Header())
	}
	if full.Load() != 1 {
		t.Fatalf("the handler answered in full %d times, want 1", full.Load())
	}
}

// A client's If-Modified-Since is compared with the stored response's Date
// when it has no Last-Modified (RFC 9111 §4.3.2).
func TestCacheIfModifiedSinceAgainstDate(t *testing.T) {
	g, _ := startGuard(t)
	generated := date(-60)
	r := newEngine()
	r.GET("/doc", ginmw.Cache(g, time.Minute), func(c *gin.Context) {
		c.Header("Date", generated)
		c.Header("Cache-Control", "max-age=600")
		c.String(http.StatusOK, "document")
	})
	serve(r, http.MethodGet, "/doc")
	if w := serve(r, http.MethodGet, "/doc", "If-Modified-Since", date(0)); w.Code != http.StatusNotModified {
		t.Errorf("If-Modified-Since after Date: %d, want 304", w.Code)
	}
	if w := serve(r, http.MethodGet, "/doc", "If-Modified-Since", date(-3600)); w.Code != http.StatusOK {
		t.Errorf("If-Modified-Since before Date: %d, want 200", w.Code)
	}
}
