// Package cacheguard is a stampede-safe cache-aside loader on Redis: when a hot
// entry expires, one request across every process sharing the Redis loads it
// while the others wait a few milliseconds for the value or are served the stale one.
//
// New panics with a "cacheguard:" message on programmer error (a nil client,
// an invalid option value); everything that talks to Redis returns errors.
// Options are typed by scope: New takes Options (the Guard-wide ones —
// Prefix, CommandTimeout, MaxConcurrentLoads, NearCache, Observer, Logger —
// and every Setting, as the Guard's default), Get and GetMany take
// CallOptions (Variant, Tags, ReportTo, and every Setting, overriding that
// default), so a misplaced option does not compile.
//
// # How a miss is served
//
// A hit is one HGET of the value (see Keys). The callers of one process that
// read the same key at once send up to one read per core; the others share
// the next one (so a stampede costs a few reads per process, not one per
// request; a caller shares only a read sent after it arrived). On a miss
// those callers share one flight per entry — key, type, Variant and Tags —
// (see Consistency for which flight a call may join); a background refresh
// (ServeStale, EarlyRefresh, FailFast) is a flight nobody waits for, and a
// GetMany's misses join flights the same way, its new ones run together (one
// round trip for their leases, one loader call, one for their stores). The
// flight runs one script
// that returns the value if it is fresh or else grants the fill lease (SET
// with a random token) — atomically, so a fill that completes between the
// miss and the script is never loaded twice. A flight that finds another fill
// running subscribes to the key's wake-up channel (one shared subscription
// connection per Guard, see internal/wake) and runs the script once more
// before it waits, so a push cannot be missed; the lease holder, everyone's
// critical path, never waits for a subscription. The lease holder runs the
// loader under a context detached from every caller, renews the lease every
// third of it while the loader runs, and stores the value with a
// compare-and-set on the lease token and the generation, deleting the lease
// and publishing the stored envelope on the wake-up channel in the same
// script. Waiters in other processes take the value from the message itself;
// they do not queue through a lock. A waiter also wakes a little after the
// holder's lease would end (pub/sub messages can be lost on a reconnect, and a
// holder can die): the lease is then free and one waiter takes it over.
//
// A load that fails is not retried by each waiter: the holder releases the
// lease and publishes the error's message, and every waiter of that fill
// returns an error matching ErrRemoteLoad (callers in the holder's process get
// the loader's own error). ErrNotFound is cached as an absence instead (see
// NegativeTTL).
//
// # Consistency
//
// Every cache key has a generation in Redis: a number created by the key's
// first fill and moved forward by every Invalidate, never to a value it held
// before. Invalidate deletes the key's values in the script that moves its
// generation, so a value present in Redis is always of the current generation
// and a hit reads nothing else; a fill stores only if the generation has not
// moved since its lease was granted; and a call joins only a flight of its
// process whose value can only have been loaded under the generation current
// when the call's read was sent, or a later one (a flight created after that
// read, or one whose get-or-lease script has seen at least the generation the
// read fetched: a read sent while a flight of its representation runs fetches
// the generation with the value, in the same round trip). For a key whose
// writers invalidate it after they commit, this gives:
//
//   - Read-your-writes across the fleet: a Get that begins after an
//     Invalidate of its key returned — in any process — returns a value whose
//     load began after that invalidation, never data from before the write it
//     followed. It holds while this process cannot reach Redis too: a
//     fail-open call shares only a load that began after the call did.
//   - Reads do not go backwards across invalidations within a process: a Get
//     that begins after another Get of the key returned, in the same process,
//     returns a value loaded under the same generation or a later one.
//
// Not guaranteed: a call that began before an invalidation may return what
// was loaded before it; between a write's commit and the return of its
// invalidation, a value loaded before the commit and one loaded after it can
// both be served, in either order (cache-aside's window: no cache can close it
// without being told of the write); and a value from a load that was not
// stored (fail-open, TimeoutLoad, a fill whose lease was lost) may be newer
// than a cached one served after it within that window. A generation lost in
// Redis (evicted, flushed, a failover that lost the last writes) never turns
// an invalidated value into a hit, since the invalidation deleted it; the
// values hash and the generation live in one slot and any of them may be
// evicted alone. An Invalidate that a failed-over master acknowledged but did
// not replicate is lost like any other write to it.
//
// # Keys
//
// For a key k, the prefix p (default "cg:") and a representation r — the Go
// name of the value type (reflect.Type.String, e.g. "main.Repo", hashed when
// longer than 64 bytes), followed by "|" and the Variant if the call has one,
// and by "|#" and a hash of the tag set if it has Tags: the generation is
// p+"g:{k}", the envelopes are the fields of the hash p+"v:{k}" (field r),
// the fill lease is p+"fl:{k}|r" (holding the generation and the holder's
// token), and the wake-up channel p+"fw:{k}" (published with SPUBLISH on a
// Redis Cluster). Values of different types, variants or tag sets therefore
// never share an entry or a flight, and Invalidate(k) reaches them all. The
// hash tag keeps every name of k in one slot, so the scripts work on a
// cluster: a key that contains '}' is tagged with '#' and a hash of itself,
// and follows the tag (p+"v:{#1f0c…}a}b"), as the names of a lock are (see
// locks), so that no key splits its names over slots, while every other key
// stays readable. A prefix must not contain braces. What a key leaves in
// Redis: its values hash until the longest-lived envelope in it expires (TTL
// plus the stale window or FailSafe's max age; a fill drops the envelopes of
// other representations that are past their stale window), and its
// generation for as long as the hash, or a lease, or at least a minute after
// a fill or an invalidation.
//
// # The envelope
//
// A stored value is a 32-byte header — magic "cg", version 2, flags (bit 0: a
// cached absence), fresh-until and stale-until in Unix milliseconds, the
// duration of the load that produced it (Δ of early refresh) and the
// generation it was loaded under — followed by the codec's bytes. Bytes that
// are not a version-2 envelope, or that the codec cannot decode, are a miss
// and counted in Stats.DecodeErrors, never a panic; the next fill replaces
// them. (Version-1 envelopes of earlier releases are such bytes.)
//
// # Clocks
//
// Fresh-until and stale-until are written from the loading process's wall
// clock, and whether a value is fresh or stale is decided with the reading
// process's wall clock (the get-or-lease script compares with the time the
// reader passes in). Processes sharing a Redis are assumed to have clocks
// within a small fraction of the TTL of each other (NTP); a reader whose clock
// runs ahead sees values expire early and refreshes them sooner, one that runs
// behind serves them a little longer. Leases use Redis's own expiry (PX) and
// never a wall clock; generations come from Redis's clock and only ever move
// forward.
//
// # Invalidation
//
// Invalidate moves the key's generation forward, deletes its values and
// publishes on its wake-up channel, in one script: every value of the key
// stops being served at once, a fill that started before the invalidation
// fails its compare-and-set and writes nothing, and its
// waiters are woken to take a new lease (the old one is void) and load data
// that is newer than the invalidation. A fill that lost its lease this way
// still returns what it loaded to the callers that were waiting for it, as
// those calls started before the invalidation; it takes no new callers.
//
// # Redis unavailable
//
// Every Get returns within its wait budget and its context whatever the
// go-redis client's timeouts: a caller stops waiting for Redis when its budget
// or context ends (what it returns then is set by OnWaitTimeout). Each Redis
// command is bounded on its own too, by CommandTimeout (5s): a Redis that
// does not answer (paused, black-holed) counts as unreachable within it —
// the call fails open, or closed — not at the end of the budget. A go-redis
// client bounds its socket calls by the context's deadline only with
// ContextTimeoutEnabled; without it a Get hands its read to a goroutine of the
// Guard's, so that it can stop waiting — a hand-off that costs a few
// microseconds of latency (two goroutine wake-ups; BenchmarkGetHit). With
// ContextTimeoutEnabled set on the client (as we recommend), a Get that reads
// alone does so on its own goroutine, bounded by its deadline, and a hit
// costs what a plain HGET and decode do (BenchmarkGetHitContextTimeout).
// (Reading on the caller's goroutine whenever the budget is longer than what
// the client's own timeouts allow was rejected: with go-redis's defaults that
// bound — dial retries, pool wait, read and write timeouts, command retries —
// is minutes, and no wait budget is that long.) When a Redis call fails (other than
// by the caller's context), Get fails open by default: the loader runs, shared
// by the callers of the process that arrived before it began (so at most two
// loads per key run at once in a process: one running, one queued) and
// optionally bounded by MaxConcurrentLoads, its result is returned and nothing
// is cached; Stats.FailOpenLoads counts it. FailClosed returns ErrUnavailable
// instead.
//
// # Tags
//
// A call with Tags("repos", ...) stores its value as depending on those tags,
// and InvalidateTags("repos") voids every such value, of every key, in every
// process. Each tag has a version in Redis, prefix+"t:{tag}" (one small key
// per tag, in the tag's own slot, living at least as long as the values that
// recorded it), which InvalidateTags moves forward (never back) and which a
// tagged load reads before it begins and records in the envelope. A tagged
// call reads its tags' versions with the value, in the same round trip (one
// pipeline; on a cluster one per node, in parallel), and a value recorded
// under older versions is not served: the call loads again, under the fill
// lease as for a miss. A call that shares a flight whose load began under
// older versions than the call read does not take its value either. The tag
// set is part of the entry (see Keys): a call with other tags, or none, never
// reads a tagged value — it reads and fills an entry of its own. So a Get or
// GetMany that begins after InvalidateTags returned never returns a value
// whose load began before it, as for Invalidate, whatever its own tags; no
// tag→key set is kept (nothing grows with the keys), and no command spans two
// slots. A tagged value costs its tags' reads on every hit from Redis (not
// from the near cache, which drops tagged entries on the tag's message).
//
// # Near cache
//
// With NearCache, a Guard also keeps decoded values in its process: a hit
// there costs no round trip and allocates nothing (about 100ns at 16
// goroutines on 2 cores, against about 7µs for a read from Redis:
// BenchmarkGetNearHit). Only fresh values enter it — read from Redis, loaded
// by this process, or received from another process's fill — and only stored
// ones (never a fail-open or TimeoutLoad result). Every fill, Invalidate and
// InvalidateTags publishes, in the same script as its write, one message on
// the channel prefix+"nc", on which every Guard with a near cache listens:
// the entries of that key (or tag) are dropped in every other process within
// the message's latency (about a millisecond on loopback:
// TestNearCacheInvalidatedAcrossProcesses). Every Guard publishes these
// messages, near cache or not, so that any process may turn it on. On a
// Redis Cluster the channel is a classic one (PUBLISH is forwarded to every
// node over the cluster bus): each fill and invalidation costs one message
// per node, whatever the number of listeners — fine for read-mostly data,
// worth measuring for write-heavy keys.
//
// Read-your-writes with a near cache holds as documented under Consistency
// once the invalidation's message has reached the reading process: a Get
// that begins between the return of an Invalidate and that moment (a
// millisecond or so) may still be served the near-cached value. Without a
// near cache it holds exactly.
//
// The near cache is trusted only while its subscription provably hears every
// message: it subscribes through the Guard's wake-up hub (the connection it
// shares with the fills' wake-ups, see internal/wake), which PINGs the
// connection when it is quiet; Redis answers in order, so an answer proves
// that every message published before it arrived. When no proof came for a
// second (a black hole, a restart), or at once when the connection fails,
// the near cache is bypassed; when the subscription is back it is flushed,
// since messages may have been lost. (On a cluster the answer proves what the
// subscribed master had received: a message published through another master
// reaches it over the cluster bus, within the bus's latency.) The near cache's own TTL bounds how long a value whose message was
// lost unseen can be served. A value is kept only if no message about its key
// (or, for a tagged value, about any tag) arrived since before the command
// that read or stored it was sent, so a read or a fill that races an
// invalidation cannot put the old value back, even when the invalidation's
// message arrives before the command's reply. The near cache is a sync.Map
// (lock-free reads: about 13ns per lookup at 16 goroutines, where otter v2
// took 18–70ns and a sharded map under read locks 33–100ns), bounded by its
// number of entries — every value taken in, new or replacing one, takes the
// next place in a ring of that many and evicts the one there, so expired and
// replaced values never hold more — evicted first in, first out. It keeps
// state only for the tags its values carry.
//
// # When the database fails
//
// With FailSafe(maxAge, backoff), a load that fails (an error other than
// ErrNotFound or ErrUncached, or its LoadTimeout) does not fail its callers
// when the key has a value that stopped being fresh less than maxAge ago:
// that value is returned, marked Stale (EventFailSafe, Stats.FailSafe), and
// stored again — under the fill lease's compare-and-set, pushed to the
// waiters of every process — to be served, still marked stale, for backoff,
// so that the fleet tries the failing load once per back-off instead of once
// per request; never past maxAge after the value first stopped being fresh,
// and never a value from before an invalidation: the older value stands in
// only if it was loaded under the generation (and the tags' versions) the
// failed load's lease was granted under.
// Values are kept in Redis maxAge past their TTL for it. With
// SoftTimeout(d), a call that has such an older value (or one within its
// stale window) waits at most d for a slow load, then returns the older value
// while the load goes on under the fill lease; LoadTimeout is the hard
// timeout: the loader's context ends, and the lease is renewed no longer, so
// that even a loader that ignores its context frees the fill within a lease.
//
// # Guarantees
//
// Whether a value may be served to a call is decided in one place (judge)
// that every path asks: a hit in Redis, a hit in the near cache, a value
// another process's fill pushed or stored, a flight the call joined, a stale
// value, an early refresh, an older value standing in for a failed load.
// Get and GetMany run the same engine (a Get is the one-key case). What
// holds, each checked by TestGuarantees against real redis-server processes
// (the readers in OS processes of their own where it is the fleet's), on
// every path it applies to:
//
//	A  one load per expiry across processes (2 processes × 16 calls on a cold
//	   key: one load; 2 processes reading without pause for five TTLs: one
//	   load per expiry)
//	B  read-your-writes after Invalidate, made by a third process (with a
//	   near cache: once its message was delivered — the near cache never
//	   serves what a delivered message voided)
//	C  read-your-writes after InvalidateTags, the same way
//	D  the near cache does not trust itself while its subscription is down
//	E  the near cache's memory is bounded (values; tag state)
//	F  fail-safe never serves a value past its max age
//	G  fail-safe never serves a value from before an invalidation
//
//	path                                   A  B  C  D  E  F  G
//	Get                                    ✓  ✓  .  .  .  ✓  ✓
//	GetMany                                ✓  ✓  .  .  .  ✓  ✓
//	Get, Tags                              ✓  ✓  ✓  .  .  ✓  ✓
//	GetMany, Tags                          ✓  ✓  ✓  .  .  ✓  ✓
//	Get, near cache                        ✓  ✓  .  ✓  ✓  .  .
//	GetMany, near cache, Tags              ✓  ✓  ✓  ✓  ✓  .  .
//	Get, ServeStale                        ✓  ✓  .  .  .  .  .
//	Get, EarlyRefresh                      ✓  ✓  .  .  .  .  .
//	Get, 3-master cluster                  ✓  ✓  .  .  .  ✓  ✓
//	GetMany, near cache, Tags, cluster     ✓  ✓  ✓  ✓  ✓  .  .
//
// (A dot: the guarantee is not the path's — no tags, no near cache, or a
// policy that serves the older value on its own.) Besides:
// TestNearCacheHearsInvalidationDuringStore (Get, GetMany: an invalidation
// whose message arrives while this process's store reply is on its way is
// not missed), TestTagsHoldOnEveryPath (a value loaded by a tagged Get or
// GetMany before InvalidateTags is served by no path after it),
// TestReadYourWritesChecker (randomized, 3 processes) and
// TestReadYourWritesAcrossProcesses.
//
// # Lifetimes
//
// A flight outlives callers whose context ends (its load is shared); it stops
// waiting for another process's fill at the wait budget of the call that
// started it and a load it runs ends with the load timeout. Shutdown lets the
// loads and waits that are running finish within its context and hands the
// rest over (a waiter in another process takes a handed-over fill at once and
// sees no error); Close does the same without waiting. Both then stop every
// background refresh, lease renewal, read and the shared subscription.
package cacheguard
