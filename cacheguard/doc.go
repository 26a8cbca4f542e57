// Package cacheguard is a stampede-safe cache-aside loader on Redis: when a hot
// entry expires, one request across every process sharing the Redis loads it
// while the others wait a few milliseconds for the value or are served the stale one.
//
//	g := cacheguard.New(rdb, cacheguard.TTL(time.Minute)) // one per process
//	defer g.Close()
//	repo, err := cacheguard.Get(ctx, g, "repos:42", func(ctx context.Context) (Repo, error) {
//		return loadRepo(ctx, 42)
//	})
//	err = g.Invalidate(ctx, "repos:42") // after a commit that changed it, in any process
//
// Examples: Get, Get's serveStale, failFast and notFound, Guard.Invalidate. New
// panics with a "cacheguard:" message on programmer error (a nil client, a bad
// option value); bad input to a call fails with ErrInvalid before Redis.
//
// # Options
//
// New takes Options — Prefix ("cg:"; no braces), CommandTimeout (500ms),
// MaxConcurrentLoads, NearCache, Observer, Logger (slog.Default(),
// rate-limited; silence it with Logger(slog.New(slog.DiscardHandler))) — and
// every Setting as the Guard's default. Get and GetMany take CallOptions —
// Variant, Tags, ReportTo — and every Setting, overriding that default; a
// misplaced option does not compile. Settings: TTL (1 minute), Jitter (0.1),
// Lease (the fill lease, 3s), LoadTimeout (10s), NegativeTTL (5s), Encoding
// (JSON, or MsgPack); the miss policy Wait (the default), ServeStale(window)
// or FailFast, with WaitBudget (10s) and OnWaitTimeout; EarlyRefresh (β = 1);
// FailSafe and SoftTimeout; FailClosed.
//
// # How a miss is served
//
// An entry is a key, a value type, a Variant and a set of Tags. On a miss the
// callers of one process share one flight per entry, and across processes one
// flight takes the entry's fill lease and runs the loader under a context
// detached from every caller; the others get the stored value pushed to them.
// If the holder dies, its lease runs out and one waiter takes the fill over. A
// failed load is not retried by each waiter: callers in the holder's process
// get the loader's error, waiters elsewhere one matching ErrRemoteLoad (and a
// *PanicError for a panic). ErrNotFound is cached as an absence (NegativeTTL);
// ErrUncached is not, and every waiter's error matches it. GetMany runs the same
// engine. MaxConcurrentLoads(n) queues a process's loads past n, misses first.
//
// A hot key does not expire under its readers: a hit refreshes it before
// expiry, timed by its last load; past expiry it is served Stale for a grace
// (twice that load, TTL/4 to TTL/2), then up to the TTL to a call that finds a
// reload running it did not start (EarlyRefresh; 0: none).
//
// # Consistency
//
// For a key whose writers invalidate it after they commit:
//
//   - Read-your-writes across the fleet: a Get that begins after an
//     Invalidate of its key returned — in any process — returns a value whose
//     load began after that invalidation, never data from before the write it
//     followed. It holds while this process cannot reach Redis too: a
//     fail-open call shares only a load that began after the call did.
//   - Reads do not go backwards across invalidations within a process: a Get
//     that begins after another Get of the key returned, in the same process,
//     never returns a value loaded before an invalidation the other's followed.
//   - InvalidateTags(tag) voids every value stored by a call with Tags(tag),
//     of every key, in every process, with the same read-your-writes
//     guarantee. A call with other tags, or none, reads an entry of its own; a
//     tagged value costs its tags' reads on every hit from Redis.
//
// Not guaranteed: a call that began before an invalidation may return what
// was loaded before it; between a write's commit and the return of its
// invalidation, a value loaded before the commit and one loaded after it can
// both be served, in either order (cache-aside's window: no cache can close it
// without being told of the write); and a value from a load that was not
// stored (fail-open, TimeoutLoad, a fill whose lease was lost or that an
// invalidation overtook) may be newer than a cached one served after it within
// that window. An Invalidate that a failed-over master acknowledged but did not
// replicate is lost like any other write to it. A value, generation or tag
// version lost in Redis (evicted, flushed, its node restarted) never makes an
// older value or load servable: an absent counter is newer than any (a miss).
//
// # Near cache
//
// NearCache(entries, ttl) keeps decoded values in the process: a hit costs no
// round trip and allocates nothing. Only fresh, stored values enter it. Every
// fill and invalidation drops the key's (or tag's) entries in every other
// process within a message's latency. Bypassed while its subscription is not
// proven to hear every message, flushed when it is back; ttl bounds how long
// a value whose message was lost is served; at most entries values (FIFO).
//
// # Redis unavailable
//
// Every Get returns within its wait budget (then OnWaitTimeout decides; 0: its
// read) and its context's deadline (a cancellation during a read is seen when
// it returns), each command within twice CommandTimeout of its send (once when
// Redis is quiet; a locks.Breaker counts the timeouts). Set ContextTimeoutEnabled,
// or ReadTimeout+WriteTimeout within CommandTimeout, or reads are handed off. When
// Redis fails, Get fails open (the loader runs uncached, shared by the
// process's callers: two loads per key at most) or, FailClosed, ErrUnavailable.
//
// # When the database fails
//
// With FailSafe(maxAge, backoff), a load that fails (other than ErrNotFound or
// ErrUncached), or runs out of its LoadTimeout, returns instead a value that
// stopped being fresh less than maxAge ago, marked Stale, and serves it so for
// backoff across the fleet (one load attempt per back-off); never past maxAge,
// never from before an invalidation. With SoftTimeout(d), a
// call that has such a value (or one within its stale window) waits at most d
// for a slow load, then returns it while the load goes on. LoadTimeout is the
// hard timeout: it frees the fill even when the loader ignores its context.
//
// # Guarantees
//
// Each checked by TestGuarantees against real redis-server processes (the
// readers in OS processes of their own where it is the fleet's), on every path
// it applies to (a dot: not the path's — no tags, no near cache, or a policy
// that serves the older value on its own):
//
//	A  one load per expiry across processes     E  near cache memory is bounded
//	B  read-your-writes after Invalidate        F  fail-safe never serves past max age
//	C  read-your-writes after InvalidateTags    G  fail-safe never serves from before
//	D  near cache distrusts a down subscription    an invalidation
//	H  every Redis command has a deadline within 2 CommandTimeouts
//
//	path                                   A  B  C  D  E  F  G  H
//	Get                                    ✓  ✓  .  .  .  ✓  ✓  ✓
//	GetMany                                ✓  ✓  .  .  .  ✓  ✓  ✓
//	Get, Tags / GetMany, Tags              ✓  ✓  ✓  .  .  ✓  ✓  ✓
//	Get, near cache                        ✓  ✓  .  ✓  ✓  .  .  ✓
//	GetMany, near cache, Tags              ✓  ✓  ✓  ✓  ✓  .  .  ✓
//	Get, ServeStale / Get, EarlyRefresh    ✓  ✓  .  .  .  .  .  ✓
//	Get, 3-master cluster                  ✓  ✓  .  .  .  ✓  ✓  ✓
//	GetMany, near cache, Tags, cluster     ✓  ✓  ✓  ✓  ✓  .  .  ✓
//
// # Limits
//
//   - Freshness is decided on wall clocks (the loading process's sets it, the
//     reader's judges it): keep them within a small fraction of the TTL (NTP).
//   - Cached bytes that are not a current envelope or do not decode are a miss,
//     counted in Stats.DecodeErrors, never a panic. Readers must use the codec
//     the writers used.
//   - A value's type is named in Redis by its package path and name (e.g.
//     "example.com/app/model.Repo"): types of one name in two packages never
//     share an entry; two types of one name declared in different functions
//     of one package do.
//   - A key leaves its values in Redis until the longest-lived one expires (TTL
//     plus the TTL, stale window or FailSafe's max age, the longest), and a
//     small generation key as long, at least a minute after a fill or an invalidation.
//
// # Lifetimes
//
// A flight outlives callers whose context ends. Shutdown lets loads and waits
// finish within its context and hands the rest over (a waiter elsewhere takes
// the fill at once); Close hands over at once; both stop every goroutine.
// Wire layout and mechanisms: cacheguard/DESIGN.md.
package cacheguard
