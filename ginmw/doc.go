// Package ginmw provides Gin middleware for per-resource mutual exclusion (Lock)
// and stampede-safe response caching (Cache) on Redis.
//
// The constructors (Lock, Cache, InvalidateAfter, and the Key functions)
// panic with a "ginmw:" message on programmer error — a nil Locker or Guard,
// a zero Key, an invalid option value; at request time every failure is an
// HTTP answer (see Errors).
//
// # Lock
//
// Lock takes a Redis lock named after the resource a request touches before
// the rest of the chain runs, and releases it afterwards — also when a handler
// panics or the client goes away:
//
//	l := locks.New(rdb)
//	r.PUT("/repos/:id/settings", ginmw.Lock(l, ginmw.Resource("repos", ginmw.Int(ginmw.Param("id")))), updateSettings)
//	r.DELETE("/repos/:id", ginmw.Lock(l, ginmw.Resource("repos", ginmw.Int(ginmw.Param("id")))), deleteRepo)
//
// Both routes lock "repos:<id>", so they exclude each other; gormplugin guards
// the row of table repos with the same name, so a GORM write inside the handler
// re-enters the lock instead of waiting for itself. Without Resource the
// route's full path scopes the name ("/repos/:id:42"), so two routes that share
// a parameter name never collide by accident.
//
// Decisions, with the defaults in brackets:
//   - Every Locker's failures are told apart alike, through the locks
//     sentinels, so a locks.Redlock behind Lock answers as a locks.Client does.
//   - Contention (locks.ErrBusy): Lock waits up to a budget [5s, set with
//     LockOptions(locks.WaitBudget(d)); push-woken, not polled], then answers
//     409 Conflict (see ConflictStatus)
//     with Retry-After (the holder's remaining lease when the Locker reports
//     it, rounded up to whole seconds, at least 1 — when the resource frees
//     at the latest if its holder died; a live holder usually unlocks
//     sooner, so a client may retry earlier) and a JSON body naming the
//     resource. The handler never runs without the lock — FailOpen included.
//   - Redis unavailable (locks.ErrUnavailable): 503 with Retry-After: 1,
//     because mutual exclusion fails closed [FailOpen runs the handler
//     unlocked instead]. A closed Locker is a 503, FailOpen or not.
//   - A hold of the same resource by this request's owner was lost further up
//     the chain (locks.ErrLost): 409 with locks.ErrLost.
//   - A bad key (missing parameter, header or query value, a custom Key's
//     error, longer than MaxKeyLen): 400 with a JSON body.
//   - The client went away while waiting: the chain is aborted with status 499
//     and nothing else is written.
//   - The request context carries the lock: its owner (locks.WithOwner; an owner
//     already on the context is kept, so nested acquisitions re-enter), its fence
//     token (Fence), the lock itself (LockFromContext), and it is
//     cancelled with cause locks.ErrLost when the lock is lost mid-handler. A
//     handler that then answers nothing (its write refused, or it gave up) is
//     answered 409 with locks.ErrLost, never a default 200.
//   - The release runs after the chain returns, under a context that the
//     client's disconnect cannot cancel (bounded by 5s).
//   - Lock never touches *gin.Context from another goroutine: lock loss reaches
//     the handler only through the request's context.
//
// # Keys
//
// A Key names the resource of a request and runs before any Redis call:
// Param, Header, Query or Func take a value, Int, UUID and Check bring it to
// a canonical form and refuse what cannot name a row (404 from a path
// parameter, 400 otherwise), and Resource scopes it to a kind:
//
//	repo := ginmw.Resource("repos", ginmw.Int(ginmw.Param("id"))) // /repos/01 and /repos/1 are both "repos:1"
//
// # Errors
//
// Abort(c, err) is the one place that turns what a handler gets from locks,
// cacheguard, gormplugin and ginmw into an answer: a documented status, a JSON
// body {"error", "resource", "retry_after"} and Retry-After (see ErrorFor for
// the table). In short: bad key 400/404; contention 409 with the holder's
// remaining lease; lock lost or a write fenced out (locks.ErrNotHeld, which
// gormplugin's stale write matches) 409; not found 404; the cache's policy
// refused or a remote load failed 503; Redis or the lock service unavailable
// 503; anything else 500 without its details. Errors that know their answer
// (an *Error in the chain, or an HTTPError) extend the table. Lock's refusals
// and Cache's 503s use the same body.
//
// # Cache
//
// Cache keeps the status, headers and body of GET and HEAD responses in Redis
// through cacheguard, so an expired entry is rebuilt by one request across
// every process while the others wait for its response:
//
//	g := cacheguard.New(rdb)
//	repo := ginmw.Resource("repos", ginmw.Int(ginmw.Param("id")))
//	r.GET("/repos/:id", ginmw.Cache(g, time.Minute, ginmw.CacheKey(repo)), getRepo)
//	r.PUT("/repos/:id/settings", ginmw.Lock(l, repo), ginmw.InvalidateAfter(g, repo), updateSettings)
//
// It is a shared cache in RFC 9111's sense — it sits where nginx's
// proxy_cache, Varnish or a CDN would, in front of every user of every
// process — and follows the rules of one: it never stores, and never hands to
// another request, a response that a shared cache must not reuse. One
// function decides it for every response a handler produces for Cache (a load
// for the requests of every process, or a background refresh); a response
// it does not store is answered to the request whose handler produced it.
//
//	Header (side)                   What Cache does                                                  RFC 9111
//	no-store (response)             not stored, not shared                                           §3, §5.2.2.5
//	private, private="f" (resp.)    not stored, not shared (the qualified form too)                  §3, §5.2.2.7
//	no-cache, no-cache="f" (resp.)  not stored, not shared: Cache does not revalidate with the       §4, §5.2.2.4
//	                                handler, so it never reuses such a response
//	Set-Cookie (response)           not stored, not shared                                           (nginx, Varnish)
//	Vary: *                         not stored, not shared                                           §4.1
//	Vary: <header>                  keyed by that header's values when it is a VaryByHeader          §4.1
//	                                header; otherwise not stored, not shared
//	Authorization (request)         looked up as usual; the response is stored and shared only       §3.5
//	                                with public, s-maxage or must-revalidate, or when Authorization
//	                                is a VaryByHeader header
//	s-maxage, max-age, Expires      the first present is the response's lifetime (Expires minus      §4.2.1, §5.3
//	(response)                      Date); it is served for at most that lifetime or the TTL,
//	                                whichever is shorter (past it only as ServeStale or FailSafe
//	                                serve past the TTL); a lifetime of 0 (max-age=0, an invalid
//	                                value, Expires not after Date) is not stored, not shared
//	must-revalidate,                never served stale: ServeStale, FailSafe and SoftTimeout do not  §4.2.4,
//	proxy-revalidate, s-maxage      apply to it; the request waits for a fresh one                   §5.2.2.2, .8
//	public (response)               consent for Authorization (above); no other effect               §5.2.2.9
//	status                          2xx but 206 stored; others shared with the requests waiting      §3
//	                                for the load, not stored; 206 and 304 not shared
//	body over MaxBody               streamed to its client, shared with the requests waiting for     (size)
//	                                the load (kept up to MaxSharedBody), not stored
//	no-store (request)              bypassed: the handler runs for it alone, nothing stored          §5.2.1.5
//	no-cache, max-age=0 (request),  ignored by default (the response and the TTL decide, as in       §5.2.1.4, §5.4
//	Pragma: no-cache                nginx and Varnish); bypassed under HonorRequestNoCache
//	Range (request)                 bypassed                                                         §3.3
//	If-None-Match,                  answered 304 from the stored or shared response when it          §4.3.2
//	If-Modified-Since (request)     matches; the handler always sees an unconditional request
//	Host (request)                  its name is part of the key, without the port as nginx's $host   §4
//	                                (IgnoreHost leaves it out)
//	other directives                ignored: max-stale, min-fresh, only-if-cached,
//	                                stale-while-revalidate, stale-if-error, immutable
//
// How that compares with the caches it stands in for. nginx's proxy_cache by
// default does not cache a response with Set-Cookie, with private, no-cache
// or no-store, or with max-age=0, keeps responses apart by their Vary headers
// and does not cache Vary: *, keys by scheme, proxied host and URI, and
// ignores the request's Cache-Control; it pays no attention to
// Authorization, and a response's max-age replaces its configured validity,
// longer or shorter — Cache keeps an Authorization response out unless it
// consents (RFC 9111 §3.5), and a response's lifetime only ever shortens the
// TTL. Varnish's built-in VCL does not look up requests with Authorization or
// a Cookie at all, hashes the URL and the host, and turns a response with
// Set-Cookie, no-cache, no-store or private, Vary: * or no lifetime into a
// hit-for-miss marker for two minutes; Cache looks every request up (a
// response's headers decide, so a page must say private or Vary: Cookie when
// it depends on the session) and stores no marker, so a later storable
// response is stored at once. Souin, an RFC 9111 cache in Go, refuses
// private and Authorization responses unless Vary names Authorization, keys
// any Vary header it meets, lets s-maxage, max-age or Expires set the TTL,
// honours a request's no-cache, and shares a coalesced response with
// concurrent requests whose varied headers match; Cache keys only the Vary
// headers it is told of (VaryByHeader), and keeps out what varies on others.
//
// Other decisions:
//   - Key: the cleaned path plus the query with its parameters sorted
//     (PathKey), or a resource name (CacheKey). The stored responses are
//     cacheguard variants of that name — one per method (a handler may write
//     no body for HEAD), host name (unless IgnoreHost) and VaryByHeader
//     combination, and one per shorter lifetime a response declared — kept
//     apart from each other and from what cacheguard.Get stores under the
//     same name; Guard.Invalidate of the name (what gormplugin calls after a
//     commit, or InvalidateAfter here) drops them all at once, for every
//     host, in every process, and a request that begins after it returned
//     never gets a response loaded before it (see cacheguard, Consistency; a
//     response answered with X-Cache BYPASS was not stored, like
//     cacheguard's fail-open loads).
//   - A response whose lifetime is shorter than the TTL is stored with it,
//     and once the lifetime is over it leads the requests to an entry of its
//     own, stored for that lifetime and loaded by one request across the
//     fleet like any other. Lifetimes are counted on the wall clock of the
//     process that stored the response, as cacheguard counts TTLs.
//   - X-Cache says what happened: HIT, STALE, MISS (this request's handler
//     ran for the load), COALESCED (it got the response another request
//     loaded, stored or shared), BYPASS (its handler ran for it alone: a
//     bypassed request, or one that waited for a load whose response it may
//     not be given). A load whose response is not stored is reported to the
//     Guard's observer with an error matching cacheguard.ErrUncached that
//     says why — an answer, not a failed load (cgotel counts it without
//     error); a 5xx is a failed load.
//   - Sharing a load that stored nothing: the requests of the same process
//     that waited for it are handed its response when decide lets it be
//     shared (an error page, a body over MaxBody); otherwise, or when the
//     handler panicked or streamed (flushed), each runs its own handler.
//     Waiters in other processes run their own handler.
//   - The handler always runs on its own request's goroutine: the request
//     waits for its cacheguard.Get (on a goroutine of its own), and runs the
//     handler when the load asks for it. It runs under a context that keeps
//     the request's values but not its cancellation, since others may wait
//     for its response, bounded by cacheguard's load timeout; it sees the
//     request without its validators (If-None-Match, If-Modified-Since, ...),
//     and Cache answers conditional requests from the stored response (304).
//   - The request that ran the handler answers once its response is stored,
//     so a request that follows it is a HIT.
//   - Policy refusals — FailFast with nothing servable, the wait budget ended,
//     Redis down under cacheguard.FailClosed — answer 503 with Retry-After: 1.
//     Redis down otherwise: cacheguard fails open and the handler runs uncached.
//   - Refreshes with no request waiting (ServeStale, FailFast, early refresh)
//     need BackgroundRefresh(engine), which replays a copy of the request
//     through the engine; without it early refresh is off, a stale entry is
//     reloaded in the foreground once its stale window ends, and a FailFast
//     miss is served directly. (A refresh that asks while the request that
//     started it is still in Cache is run by that request.)
//
// # Graceful shutdown
//
// Stop a process in this order (tested in TestServerShutdownCompletesInFlight
// and TestServerCloseReleasesLocks):
//
//	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
//	defer cancel()
//	if err := srv.Shutdown(ctx); err != nil { // stop accepting; requests in flight finish
//		srv.Close() // grace over: cancel the requests still running
//	}
//	g.Shutdown(ctx) // loads still running finish, or hand their fill over to another process
//	l.Close()       // the lock client last: its locks were released by the requests
//
// http.Server.Shutdown waits for the requests in flight without cancelling
// them: a locked request finishes, then Lock releases its lock (the next
// holder elsewhere is granted at once) and InvalidateAfter's invalidation
// runs before the request ends, so no committed write's invalidation is left
// behind; a request that runs the handler for Cache stores its response, and
// the requests of other processes that waited for it get it. When the grace
// ends first, http.Server.Close cancels the requests' contexts: a request
// still waiting for a lock or a cached response gives up (499), a handler
// holding a lock sees its context end — Lock then releases the lock under a
// context the cancellation does not reach, so nothing stays locked until its
// lease runs out. A handler that loads for Cache runs under the load's
// context, not the client's: Guard.Shutdown lets it finish within its context
// and otherwise cancels it and hands the fill over (the other processes' waiters
// take it over with no error). A process killed outright leaves its locks
// and fill leases to expire with their leases.
package ginmw
