package ginmw

import (
	"errors"
	"fmt"
	"net/http"
	"slices"

	"github.com/cacheguard/cacheguard/cacheguard"
	"github.com/cacheguard/cacheguard/internal/isnil"
)

// The defaults of MaxBody and MaxSharedBody.
const (
	defaultMaxBody       = 1 << 20
	defaultMaxSharedBody = 16 << 20
)

// CacheOption configures Cache.
type CacheOption func(*cacheConfig)

type cacheConfig struct {
	key            *Key     // nil: the normalised path and query
	vary           []string // canonical header names, sorted
	guardOpts      []cacheguard.CallOption
	engine         http.Handler
	maxBody        int
	maxSharedBody  int
	ignoreHost     bool
	requestNoCache bool
	tags           []string
}

// CacheKey names the cached entry with key instead of the normalised path and
// query. With a Resource key the entry is named like the lock and the row
// ("repos:42"), so gormplugin's invalidate-after-commit and InvalidateAfter on
// a write route can drop it by that name. The default is the request's path,
// cleaned, plus its query with the parameters sorted (see PathKey).
func CacheKey(key Key) CacheOption {
	if key.fn == nil {
		panic("ginmw: CacheKey called with a zero Key")
	}
	return func(c *cacheConfig) { c.key = &key }
}

// VaryByHeader keeps one entry per combination of the values of these request
// headers (e.g. "Accept-Language"), and adds them to the response's Vary
// header. A response whose own Vary names a header not listed here (or "*")
// is never stored nor shared with other requests, since Cache would serve it
// across values of that header. The default varies by none. Invalidate of the
// entry's name drops every combination.
func VaryByHeader(names ...string) CacheOption {
	return func(c *cacheConfig) {
		for _, n := range names {
			n = http.CanonicalHeaderKey(n)
			if !slices.Contains(c.vary, n) {
				c.vary = append(c.vary, n)
			}
		}
		slices.Sort(c.vary)
	}
}

// CacheOptions passes call options to every cacheguard.Get: the miss policy
// (cacheguard.Wait, ServeStale, FailFast), the wait budget, the fill lease,
// the load timeout, jitter, early refresh, FailClosed. The TTL given to Cache
// and the codec are set by Cache and override cacheguard.TTL and Encoding
// here. The default is the Guard's own defaults.
func CacheOptions(opts ...cacheguard.CallOption) CacheOption {
	return func(c *cacheConfig) { c.guardOpts = append(c.guardOpts, opts...) }
}

// BackgroundRefresh lets Cache refresh an entry when no request is waiting
// for it: the refreshes of ServeStale and FailFast, probabilistic early
// refresh, and a load whose first requester went away. Such a refresh sends a
// copy of the request that triggered it through h — the Gin engine the route
// is on — in the background; the copy runs the whole chain again (so
// middleware before Cache sees it too), and its response is stored, not sent
// anywhere. The copy is a request of its own: it keeps the values of the
// request's context but not its lock owner nor its held lock, so a Lock
// before Cache takes the lock for it anew, waiting for any holder. Without
// it (the default) early refresh is turned off and such refreshes fail, so
// a stale entry is reloaded in the foreground once its stale window ends,
// and under FailFast nothing is ever stored.
func BackgroundRefresh(h http.Handler) CacheOption {
	if h == nil || isnil.Pointer(h) {
		panic("ginmw: BackgroundRefresh called with a nil http.Handler")
	}
	return func(c *cacheConfig) { c.engine = h }
}

// MaxBody sets the largest response body Cache stores; a larger response is
// streamed to its client as the handler writes it, and not stored, but still
// shared with the requests of this process that waited for it (see
// MaxSharedBody). The default is 1 MiB.
func MaxBody(n int) CacheOption { return func(c *cacheConfig) { c.maxBody = n } }

// MaxSharedBody sets the largest response body kept in memory, once the
// handler has written more than MaxBody, for the requests of this process
// that waited for the same load; past it they run their own handler. It is at
// least MaxBody. The default is 16 MiB.
func MaxSharedBody(n int) CacheOption { return func(c *cacheConfig) { c.maxSharedBody = n } }

// IgnoreHost leaves the request's host out of the key, for an engine that
// serves a single site under several names. By default the host name
// (lower-cased, without the port, as nginx's $host) is part of the key, so
// that two virtual hosts never share an entry.
func IgnoreHost() CacheOption { return func(c *cacheConfig) { c.ignoreHost = true } }

// HonorRequestNoCache makes a request that asks not to be served from a
// cache — Cache-Control: no-cache or max-age=0, or Pragma: no-cache without
// Cache-Control — bypass Cache: its handler runs for it alone, its response is
// not stored, and the stored entry stays. By default those request
// directives are ignored, as nginx and Varnish ignore them: the response's own
// directives and the TTL decide, and a client's reload never makes a hot key
// miss for everyone. A request's no-store always bypasses.
func HonorRequestNoCache() CacheOption { return func(c *cacheConfig) { c.requestNoCache = true } }

// CacheTags stores the responses as depending on tags (see cacheguard.Tags),
// e.g. CacheTags("repos") on a list page that shows repositories: a
// cacheguard Guard.InvalidateTags of any of them drops the page in every
// process, and so does InvalidateAfter on a write route whose key is a
// Resource of that kind ("repos"). The default is none.
func CacheTags(tags ...string) CacheOption {
	return func(c *cacheConfig) { c.tags = append(c.tags, tags...) }
}

// validate checks the options of a Cache on g that passes guardOpts to every
// cacheguard.Get, as the Get checks them (Guard.CheckCallOptions: CacheTags
// and CacheOptions included).
func (c *cacheConfig) validate(g *cacheguard.Guard, guardOpts []cacheguard.CallOption) error {
	if c.maxBody <= 0 || c.maxSharedBody <= 0 {
		return errors.New("ginmw: MaxBody and MaxSharedBody must be positive")
	}
	for _, n := range c.vary {
		if !isToken(n) {
			return fmt.Errorf("ginmw: VaryByHeader called with %q, which is not a header name", n)
		}
	}
	if err := g.CheckCallOptions(guardOpts...); err != nil && !errors.Is(err, cacheguard.ErrClosed) {
		return fmt.Errorf("ginmw: Cache: %w", err)
	}
	return nil
}
