package ginmw

import (
	"crypto/sha256"
	"encoding/base64"
	"net/url"
	"path"
	"strings"

	"github.com/gin-gonic/gin"

	"github.com/cacheguard/cacheguard/cacheguard"
)

// PathKey is the key Cache stores a GET of path with query under by default:
// "http:" + the cleaned path + "?" + the query with its parameters sorted by
// name (no "?" without a query). Pass it to Invalidate.
func PathKey(p string, query url.Values) string {
	if !strings.HasPrefix(p, "/") {
		p = "/" + p
	}
	clean := path.Clean(p)
	if strings.HasSuffix(p, "/") && clean != "/" {
		clean += "/"
	}
	if len(query) == 0 {
		return "http:" + clean
	}
	return "http:" + clean + "?" + query.Encode()
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
		var q url.Values
		if r.URL.RawQuery != "" {
			q = r.URL.Query()
		}
		k = PathKey(r.URL.Path, q)
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
	if len(k) > cacheguard.MaxKeyLen {
		sum := sha256.Sum256([]byte(k))
		k = "http:#" + base64.RawURLEncoding.EncodeToString(sum[:])
	}
	return k, variant, nil
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
