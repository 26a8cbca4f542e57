package ginmw

import (
	"crypto/sha256"
	"encoding/base64"
	"net/url"
	"strings"

	"github.com/gin-gonic/gin"

	"github.com/cacheguard/cacheguard/cacheguard"
)

// PathKey is the key Cache stores a GET of path with query under by default:
// "http:" + the path as the request target spells it (escaped, as
// url.URL.EscapedPath returns it, never cleaned: "/a/../b" is not "/b") +
// "?" + the query with its parameters sorted by name (no "?" without a
// query). An escaped path holds no raw "?", so no path and query share a
// key. A key longer than cacheguard.MaxKeyLen is stored under its hash,
// "http:#" + base64url(SHA-256), which PathKey returns too. Pass it to
// Invalidate.
func PathKey(p string, query url.Values) string {
	return storedName(pathKey(p, query))
}

// storedName is the name Cache stores an entry named k under: k, or its
// hash when k is longer than cacheguard.MaxKeyLen. PathKey and every
// request's entry pass through it.
func storedName(k string) string {
	if len(k) <= cacheguard.MaxKeyLen {
		return k
	}
	sum := sha256.Sum256([]byte(k))
	return "http:#" + base64.RawURLEncoding.EncodeToString(sum[:])
}

func pathKey(p string, query url.Values) string {
	if !strings.HasPrefix(p, "/") {
		p = "/" + p
	}
	if len(query) == 0 {
		return "http:" + p
	}
	return "http:" + p + "?" + query.Encode()
}

// requestKey is PathKey of the request's target, before storedName: its escaped path — the
// path Gin routed, whichever of URL.Path and URL.RawPath the engine matched,
// since the one names the other (a RawPath that EscapedPath does not return,
// which names no escaped path, bypasses Cache: see bypass) — and its query. A query that does not parse
// cleanly (a ";", a bad escape) is kept verbatim after "?!", which no
// encoded query starts with: a handler reading RawQuery sees what the key
// says.
func requestKey(u *url.URL) string {
	if u.RawQuery == "" {
		return pathKey(u.EscapedPath(), nil)
	}
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil || len(q) == 0 {
		return pathKey(u.EscapedPath(), nil) + "?!" + u.RawQuery
	}
	return pathKey(u.EscapedPath(), q)
}

// cacheKey returns the name of the request's entry (the resource name given
// to CacheKey, or PathKey) and its variant: the method — a handler may write
// no body for HEAD (http.ServeContent does not), so HEAD never shares GET's
// entry — the host name, lower-cased and without its port (unless
// IgnoreHost), and the hash of the
// VaryByHeader values. cacheguard keeps each variant apart from the others
// and from values cached under the same name by cacheguard.Get, and
// Invalidate(name) voids them all: the host is in the variant, not the name,
// so that one Invalidate (InvalidateAfter, gormplugin's) reaches the entries
// of every host.
func (m *cacheMW) cacheKey(c *gin.Context) (name, variant string, err error) {
	r := c.Request
	var k string
	if m.cfg.key != nil {
		name, err := m.cfg.key.name(c)
		if err != nil {
			return "", "", err
		}
		k = name
	} else {
		k = requestKey(r.URL)
	}
	variant = r.Method
	if !m.cfg.ignoreHost {
		variant += " " + hostname(r.Host)
	}
	if len(m.cfg.vary) > 0 {
		h := sha256.New()
		for _, name := range m.cfg.vary {
			h.Write([]byte(name))
			for _, v := range r.Header.Values(name) {
				h.Write([]byte{0})
				h.Write([]byte(v))
			}
			h.Write([]byte{1})
		}
		variant += " vary:" + base64.RawURLEncoding.EncodeToString(h.Sum(nil)[:16])
	}
	return storedName(k), variant, nil
}

// hostname is the name of a Host header, lower-cased and without its port,
// as nginx's $host: the processes of one service, each on its own port,
// share their entries.
func hostname(host string) string {
	if i := strings.LastIndexByte(host, ':'); i >= 0 && !strings.Contains(host[i:], "]") {
		host = host[:i]
	}
	return strings.ToLower(host)
}
