// Package ginmw provides Gin middleware for per-resource mutual exclusion (Lock)
// and stampede-safe response caching (Cache) on Redis.
//
// The constructors (Lock, Cache, InvalidateAfter, and the Key functions)
// panic with a "ginmw:" message on programmer error — a nil Locker or Guard,
// a zero Key, an invalid option value; at request time every failure is an
// HTTP answer (see Errors). Examples: Lock, Lock's conflict, Cache, Abort.
//
// # Lock
//
// Lock takes a Redis lock named after the resource a request touches before
// the rest of the chain runs, and releases it afterwards — also when a handler
// panics or the client goes away:
//
//	l := locks.New(rdb)
//	repo := ginmw.Resource("repos", ginmw.Int(ginmw.Param("id"))) // lock "repos:<id>"
//	r.PUT("/repos/:id/settings", ginmw.Lock(l, repo), updateSettings)
//	r.DELETE("/repos/:id", ginmw.Lock(l, repo), deleteRepo)
//
// Both routes lock "repos:<id>", so they exclude each other; gormplugin guards
// the row of table repos with the same name, so a GORM write inside the handler
// re-enters the lock instead of waiting for itself. Without Resource the
// route's full path scopes the name ("/repos/:id:42"). Any locks.Locker
// (a locks.Redlock too) answers alike:
//
//   - Contention: Lock waits (push-woken) up to a budget [5s, set with
//     LockOptions(locks.WaitBudget(d))], then answers 409 (ConflictStatus)
//     with a JSON body naming the resource and Retry-After: the holder's
//     remaining lease when known, rounded up, at least 1s — when the resource
//     frees at the latest; a live holder usually unlocks sooner. The handler
//     never runs without the lock, FailOpen included.
//   - Redis unavailable: 503 with Retry-After: 1 — mutual exclusion fails
//     closed [FailOpen runs the handler unlocked instead]; a closed Locker is
//     a 503 either way. A hold of the resource by this request's owner lost
//     further up the chain (locks.ErrLost): 409.
//   - A bad key (missing parameter, header or query value, a custom Key's
//     error, longer than MaxKeyLen): 400 (404 from Int, UUID or Check of a path
//     parameter). The client went away while waiting: 499, nothing written.
//   - The request context carries the lock's owner (locks.WithOwner; one already
//     there is kept, so nested acquisitions re-enter), its fence (Fence), the
//     lock (LockFromContext), and is cancelled with cause locks.ErrLost when the
//     lock is lost mid-handler; a handler that then answers nothing is answered
//     409, never a default 200. Lock never touches *gin.Context from another
//     goroutine.
//   - The release runs after the chain returns (bounded by 5s).
//
// Keys (Param, Header, Query, Func; canonical with Int, UUID, Check; scoped by
// Resource) run before any Redis call. Options: LockOptions, FailOpen,
// ConflictStatus, ErrorHandler, Methods.
//
// # Errors
//
// Abort(c, err) turns what a handler gets from locks, cacheguard, gormplugin
// and ginmw into a status, a JSON body {"error", "resource", "retry_after"}
// and Retry-After, by ErrorFor's table (bad key 400/404, contention or a write
// fenced out 409, not found 404, unavailable 503, else 500 without details);
// an *Error or HTTPError in the chain extends it. Lock and Cache use the same.
//
// # Cache
//
// Cache keeps the status, headers and body of GET and HEAD responses in Redis
// through cacheguard, so an expired entry is rebuilt by one request across
// every process while the others wait for its response:
//
//	g := cacheguard.New(rdb)
//	r.GET("/repos/:id", ginmw.Cache(g, time.Minute, ginmw.CacheKey(repo)), getRepo)
//	r.PUT("/repos/:id/settings", ginmw.Lock(l, repo), ginmw.InvalidateAfter(g, repo), updateSettings)
//
// It is a shared cache in RFC 9111's sense, like nginx's proxy_cache, Varnish
// or a CDN: it never stores, and never hands to another request, what a shared
// cache must not reuse; a response it does not store is answered to the
// request whose handler produced it.
//
//	Header (side)                  What Cache does                                        RFC 9111
//	no-store, private[="f"],       not stored, not shared (so a no-cache response is      §3, §4, §5.2.2.4,
//	no-cache[="f"] (response)      never reused, revalidated or not)                      §5.2.2.5, §5.2.2.7
//	Set-Cookie (response), Vary: * not stored, not shared                                 §4.1 (nginx, Varnish)
//	Vary: <header>                 keyed by it when a VaryByHeader header; else not       §4.1
//	                               stored, not shared
//	Authorization (request)        looked up; the response is stored and shared only with §3.5
//	                               public, s-maxage, must-revalidate, or when VaryByHeader
//	                               names Authorization
//	s-maxage, max-age, Expires     the first present (Expires minus Date), minus the      §4.2.1, §4.2.3,
//	(response), Age                response's age on arrival (its Age, or now minus its   §5.1, §5.3
//	                               Date, the larger), caps the TTL; a hit carries Age;
//	                               served past it only as ServeStale or FailSafe serve
//	                               past the TTL; stale on arrival, 0, an invalid or
//	                               repeated Expires (exact HTTP-date only): not stored,
//	                               not shared
//	CDN-Cache-Control (response)   when a valid Structured Field dictionary, replaces     RFC 9213
//	                               Cache-Control and Expires (private, no-store, no-cache
//	                               in it included); invalid: ignored
//	no freshness information       200, 203, 204: stored for the route's TTL (Cache's     §4.2.2
//	                               choice: a heuristic lifetime); any other 2xx only
//	                               with explicit freshness or public
//	public (response)              consent for Authorization; no other effect             §5.2.2.9
//	status                         2xx but 206 stored; others shared with the requests    §3
//	                               waiting for the load, not stored; 206, 304 not
//	                               shared; 1xx (103) sent on at once, never stored
//	body over MaxBody              streamed, shared with the waiters (up to               (size)
//	                               MaxSharedBody), not stored
//	no-store (request)             bypassed: the handler runs for it alone, not stored    §5.2.1.5
//	no-cache, max-age=0 (request), ignored (as nginx and Varnish); bypassed under         §5.2.1.4, §5.4
//	Pragma: no-cache               HonorRequestNoCache
//	Range (request)                bypassed                                               §3.3
//	If-None-Match,                 answered 304 from the stored or shared response; the   §4.3.2
//	If-Modified-Since (request)    handler never sees the client's validators
//	POST, PUT, DELETE, PATCH, any  after a status below 400, the entry of the target      §4.4
//	unsafe method (request)        (its key, every method, host and variant) is dropped,
//	                               before the response reaches the client
//	no route matched (request)     passed through: Gin's 404 or 405, never stored
//	Host (request)                 its name, without the port, is part of the key         §4
//	                               (IgnoreHost leaves it out)
//	other directives               ignored: max-stale, min-fresh, only-if-cached,
//	                               stale-while-revalidate, stale-if-error, immutable
//	ETag, Last-Modified (stored    once its own lifetime is over, the load sends them to  §4.3.1,
//	response)                      the handler (If-None-Match, If-Modified-Since); a 304  §4.3.4
//	                               refreshes the stored response's fields and keeps its
//	                               body. Past the TTL an entry is gone: reloaded whole
//
// Besides:
//
//   - The key is the path as the target spells it (escaped, never cleaned:
//     "/a/../b" is not "/b"'s entry; a raw "#" in it bypasses Cache), query
//     sorted (PathKey), or a resource name (CacheKey); Guard.Invalidate of it
//     (gormplugin after a commit, or InvalidateAfter) drops every stored
//     response of it in every process, with cacheguard's read-your-writes.
//   - X-Cache says what happened: HIT, STALE, MISS (this request's handler ran
//     for the load), COALESCED (it got a response another request loaded), or
//     BYPASS (its handler ran for it alone). The request that ran the handler
//     answers once the response is stored, so the next one is a HIT.
//   - The handler runs on its request's goroutine, under a context with the
//     request's values but not its cancellation (cacheguard's load timeout).
//     A response not stored is not shared with other processes (BYPASS there).
//   - Policy refusals (FailFast, the wait budget, FailClosed) answer 503 with
//     Retry-After: 1; Redis down otherwise: the handler runs uncached.
//   - Refreshes with no request waiting (ServeStale, FailFast, early refresh)
//     need BackgroundRefresh(engine); without it early refresh is off and a
//     stale entry is reloaded in the foreground.
//
// Options: CacheKey, VaryByHeader, IgnoreHost, MaxBody, MaxSharedBody,
// HonorRequestNoCache, BackgroundRefresh, CacheTags, CacheOptions.
//
// # Graceful shutdown
//
// srv.Shutdown(ctx) (then srv.Close() if it fails: locks are released all the
// same), then g.Shutdown(ctx) (loads finish or hand their fill over), then
// l.Close(). A process killed outright leaves its locks and fill leases to
// their leases. How the pieces work and why: ginmw/DESIGN.md.
package ginmw
