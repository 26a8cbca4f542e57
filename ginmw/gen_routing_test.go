package ginmw_test

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"pgregory.net/rapid"

	"github.com/cacheguard/cacheguard/ginmw"
	"github.com/cacheguard/cacheguard/internal/redistest"
	"github.com/cacheguard/cacheguard/internal/testing/gen"
)

// routingEngine is a router with several routes, catch-alls and NoRoute,
// whose handlers echo which of them ran, with the parameters and query Gin
// gave them and the Vary'd header: what a response must match to be served
// for a request. cache, when not nil, is used on the whole engine.
func routingEngine(cfg routingConfig, cache gin.HandlerFunc) *gin.Engine {
	r := gin.New()
	r.UseRawPath, r.UnescapePathValues = cfg.rawPath, cfg.unescape
	r.RemoveExtraSlash, r.RedirectTrailingSlash, r.RedirectFixedPath = cfg.removeSlash, cfg.trailing, cfg.fixed
	r.HandleMethodNotAllowed = cfg.notAllowed
	if cache != nil {
		r.Use(cache)
	}
	echo := func(id string) gin.HandlerFunc {
		return func(c *gin.Context) {
			status := http.StatusOK
			if c.Param("slug") == "missing" {
				status = http.StatusNotFound
			}
			echo := fmt.Sprintf("%s params=%v query=%s lang=%q", id, c.Params, c.Request.URL.Query().Encode(), c.GetHeader("Accept-Language"))
			c.Header("X-Echo", strconv.Quote(echo)) // a HEAD answer shows it too
			c.String(status, "%s", echo)
		}
	}
	r.GET("/api/data", echo("data"))
	r.GET("/api/data/", echo("data/"))
	r.GET("/p/:slug", echo("p"))
	r.HEAD("/p/:slug", echo("p (HEAD)"))
	r.GET("/p/:slug/edit", echo("edit"))
	r.GET("/app/*any", echo("app"))
	r.GET("/files/:dir/*rest", echo("files"))
	r.GET("/A/b", echo("Ab"))
	r.POST("/only-post", echo("post"))
	r.NoRoute(echo("noroute"))
	return r
}

type routingConfig struct {
	rawPath, unescape, removeSlash, trailing, fixed, notAllowed bool
}

var (
	genSegments = []string{"api", "data", "p", "app", "files", "edit", "A", "a", "b", "B", "x", "only-post",
		"..", ".", "", "%2F", "%3F", "%23", "%25", "%2e%2e", "%2E", "%41", "a%3Fb=c", "a%2Fb", "a%20b", "a+b", "missing", "%"}
	genQuery = []string{"a=1", "a=2", "b=c", "b=", "a", "a=1;b=2", "a=%3F", "x=%2F", "%3D=1", "a=1%26b=2", "?", "#", "q=a+b", "q=a%20b", "b=1", "=", "&", "%zz"}
	genLangs = []string{"", "", "en", "fr"}
)

// genTarget draws a request target: mostly one shaped like a route (a
// parameter or a catch-all filled with random segments), sometimes any path;
// maybe behind dot segments, maybe with a trailing slash, maybe with a query
// of repeated or reordered parameters.
func genTarget(rt *rapid.T) string {
	seg := rapid.SampledFrom(genSegments)
	var target string
	switch rapid.IntRange(0, 6).Draw(rt, "shape") {
	case 0:
		target = "/api/data"
	case 1:
		target = "/p/" + seg.Draw(rt, "slug")
	case 2:
		target = "/p/" + seg.Draw(rt, "slug") + "/edit"
	case 3:
		target = "/app/" + strings.Join(rapid.SliceOfN(seg, 0, 3).Draw(rt, "any"), "/")
	case 4:
		target = "/files/" + seg.Draw(rt, "dir") + "/" + strings.Join(rapid.SliceOfN(seg, 0, 2).Draw(rt, "rest"), "/")
	case 5:
		target = "/" + rapid.SampledFrom([]string{"A/b", "a/b", "A/B", "A//b", "A/./b", "A%2Fb"}).Draw(rt, "case")
	default:
		target = "/" + strings.Join(rapid.SliceOfN(seg, 1, 4).Draw(rt, "segments"), "/")
	}
	if rapid.IntRange(0, 3).Draw(rt, "dot prefix") == 0 {
		target = rapid.SampledFrom([]string{"/x/..", "/app/..", "/p/a/..", "/.", "/", "/%2e%2e", "/api/data/.."}).Draw(rt, "prefix") + target
	}
	if rapid.IntRange(0, 3).Draw(rt, "trailing slash") == 0 {
		target += "/"
	}
	if rapid.IntRange(0, 2).Draw(rt, "with query") > 0 {
		target += "?" + strings.Join(rapid.SliceOfN(rapid.SampledFrom(genQuery), 0, 3).Draw(rt, "query"), "&")
	}
	return target
}

// neighbour respells target slightly: one character of its path
// percent-encoded, or one escape decoded or its hex case changed, a slash
// doubled, a dot segment inserted, its trailing slash toggled, or its query's
// parameters reversed. Gin may route the result as target or not (the twin
// says which); a key that confuses the two serves one's answer to the other —
// a pair the independent draws of genTarget seldom make within one check
// (keying by the unescaped path took 10,000 checks to find).
func neighbour(rt *rapid.T, target string) string {
	path, query, hasQuery := strings.Cut(target, "?")
	switch rapid.IntRange(0, 6).Draw(rt, "respelling") {
	case 0: // encode a character
		if i := rapid.IntRange(0, len(path)-1).Draw(rt, "at"); path[i] != '%' {
			path = path[:i] + fmt.Sprintf("%%%02X", path[i]) + path[i+1:]
		}
	case 1: // decode an escape
		if i := strings.IndexByte(path, '%'); i >= 0 && i+2 < len(path) {
			if b, err := strconv.ParseUint(path[i+1:i+3], 16, 8); err == nil {
				path = path[:i] + string(rune(b)) + path[i+3:]
			}
		}
	case 2: // change an escape's hex case
		if i := strings.IndexByte(path, '%'); i >= 0 && i+2 < len(path) {
			esc := path[i+1 : i+3]
			if up := strings.ToUpper(esc); up != esc {
				path = path[:i+1] + up + path[i+3:]
			} else {
				path = path[:i+1] + strings.ToLower(esc) + path[i+3:]
			}
		}
	case 3: // double a slash
		if i := strings.LastIndexByte(path, '/'); i >= 0 {
			path = path[:i] + "/" + path[i:]
		}
	case 4: // a dot segment
		path = rapid.SampledFrom([]string{"/.", "/x/..", "/%2e"}).Draw(rt, "dots") + path
	case 5: // the trailing slash
		if strings.HasSuffix(path, "/") && len(path) > 1 {
			path = strings.TrimSuffix(path, "/")
		} else {
			path += "/"
		}
	default: // the parameters in the other order
		ps := strings.Split(query, "&")
		slices.Reverse(ps)
		query, hasQuery = strings.Join(ps, "&"), true
	}
	if hasQuery {
		return path + "?" + query
	}
	return path
}

// parseTarget reads a request for target the way the server does, or nil
// when the server would refuse it.
func parseTarget(method, target, host, lang string) *http.Request {
	raw := method + " " + target + " HTTP/1.1\r\nHost: " + host + "\r\n"
	if lang != "" {
		raw += "Accept-Language: " + lang + "\r\n"
	}
	req, err := http.ReadRequest(bufio.NewReader(strings.NewReader(raw + "\r\n")))
	if err != nil {
		return nil
	}
	return req
}

// TestGenRouting sends random request targets to an engine with Cache on
// every route and to its twin without Cache, over a real redis-server:
// whatever Cache serves, a HIT included, must be what the twin — Gin alone —
// answers the same request with, so a response is only ever served to a
// request Gin routes to the same handler with the same parameters, query and
// Vary'd header. POSTs (which invalidate their target) are mixed in. Faults:
// the stored entries flushed between requests.
func TestGenRouting(t *testing.T) {
	s := redistest.Start(t)
	g, rdb := newGuard(t, s)
	var checks, steps, hits, flushes int
	gen.Check(t, 1500, func(rt *rapid.T) {
		checks++
		cfg := routingConfig{
			rawPath: rapid.Bool().Draw(rt, "UseRawPath"), unescape: rapid.Bool().Draw(rt, "UnescapePathValues"),
			removeSlash: rapid.Bool().Draw(rt, "RemoveExtraSlash"), trailing: rapid.Bool().Draw(rt, "RedirectTrailingSlash"),
			fixed: rapid.Bool().Draw(rt, "RedirectFixedPath"), notAllowed: rapid.Bool().Draw(rt, "HandleMethodNotAllowed"),
		}
		cached := routingEngine(cfg, ginmw.Cache(g, time.Minute, ginmw.VaryByHeader("Accept-Language")))
		twin := routingEngine(cfg, nil)
		host := fmt.Sprintf("check%d.test", checks) // this check's entries only
		var sent []string
		send := func(rt *rapid.T, target string) {
			steps++
			method := rapid.SampledFrom([]string{http.MethodGet, http.MethodGet, http.MethodGet, http.MethodHead, http.MethodPost}).Draw(rt, "method")
			lang := rapid.SampledFrom(genLangs).Draw(rt, "Accept-Language")
			a, b := parseTarget(method, target, host, lang), parseTarget(method, target, host, lang)
			if a == nil {
				return
			}
			sent = append(sent, target)
			wa, wb := httptest.NewRecorder(), httptest.NewRecorder()
			cached.ServeHTTP(wa, a)
			twin.ServeHTTP(wb, b)
			if wa.Header().Get("X-Cache") == "HIT" {
				hits++
			}
			bodyA, bodyB := wa.Body.String(), wb.Body.String()
			if method == http.MethodHead { // Cache writes no body for HEAD; the server would drop Gin's
				bodyA, bodyB = "", ""
			}
			if wa.Code != wb.Code || bodyA != bodyB || wa.Header().Get("X-Echo") != wb.Header().Get("X-Echo") ||
				wa.Header().Get("Location") != wb.Header().Get("Location") {
				rt.Fatalf("%s %s (Accept-Language %q): Cache answered %d %q (X-Cache %q, X-Echo %s, Location %q); Gin alone %d %q (X-Echo %s, Location %q)",
					method, target, lang, wa.Code, wa.Body, wa.Header().Get("X-Cache"), wa.Header().Get("X-Echo"), wa.Header().Get("Location"),
					wb.Code, wb.Body, wb.Header().Get("X-Echo"), wb.Header().Get("Location"))
			}
		}
		again := func(rt *rapid.T) {
			if len(sent) == 0 {
				rt.Skip("nothing sent yet")
			}
			send(rt, rapid.SampledFrom(sent).Draw(rt, "earlier target"))
		}
		rt.Repeat(map[string]func(*rapid.T){
			"request": func(rt *rapid.T) { send(rt, genTarget(rt)) },
			"neighbour": func(rt *rapid.T) {
				if len(sent) == 0 {
					rt.Skip("nothing sent yet")
				}
				send(rt, neighbour(rt, rapid.SampledFrom(sent).Draw(rt, "earlier target")))
			},
			"again":  again,
			"repeat": again, // twice as likely: hits are what may be served wrongly
			"flush": func(rt *rapid.T) {
				if rapid.IntRange(0, 9).Draw(rt, "flush now") != 0 {
					rt.Skip("flushes are rare")
				}
				flushes++
				if err := rdb.FlushDB(context.Background()).Err(); err != nil {
					rt.Fatal(err)
				}
			},
		})
	})
	t.Logf("gen: %d checks, %d requests (%d served as HIT), %d flushes", checks, steps, hits, flushes)
}
