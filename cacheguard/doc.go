// Package cacheguard is a stampede-safe cache-aside loader on Redis: when a hot
// entry expires, one request across every process sharing the Redis loads it
// while the others wait a few milliseconds for the value or are served the stale one.
//
// # How a miss is served
//
// A hit is one GET, shared by the callers of one process that read the same key
// at the same moment (so a stampede costs one GET per process, not one per
// request). On a miss those callers share one flight per key
// (golang.org/x/sync/singleflight). The flight subscribes to the key's
// wake-up channel (one shared subscription connection per Guard, see
// internal/wake), then runs one script that returns the value if it is fresh
// or else grants the fill lease (SET NX PX with a random token) — atomically,
// so a fill that completes between the miss and the script is never loaded
// twice. The lease holder runs the loader under a context detached from every
// caller, renews the lease every third of it while the loader runs, and stores
// the value with a compare-and-set on the lease token, deleting the lease and
// publishing the stored envelope on the wake-up channel in the same script.
// Waiters in other processes take the value from the message itself; they do
// not queue through a lock. A waiter also wakes a little after the holder's
// lease would end (pub/sub messages can be lost on a reconnect, and a holder
// can die): the lease is then free and one waiter takes it over.
//
// A load that fails is not retried by each waiter: the holder releases the
// lease and publishes the error's message, and every waiter of that fill
// returns an error matching ErrRemoteLoad (callers in the holder's process get
// the loader's own error). ErrNotFound is cached as an absence instead (see
// NegativeTTL).
//
// # Keys
//
// For a key k and the prefix p (default "cg:"): the envelope is stored at
// p+"v:{k}", the fill lease at p+"fl:{k}", and the wake-up channel is
// p+"fw:{k}" (published with SPUBLISH on a Redis Cluster). The hash tag keeps
// them in one slot, so the scripts work on a cluster.
//
// # The envelope
//
// A stored value is a 24-byte header — magic "cg", version 1, flags (bit 0: a
// cached absence), fresh-until and stale-until in Unix milliseconds, and the
// duration of the load that produced it (Δ of early refresh) — followed by the
// codec's bytes. Bytes that are not a version-1 envelope, or that the codec
// cannot decode, are a miss and counted in Stats.DecodeErrors, never a panic;
// the next fill replaces them.
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
// never a wall clock.
//
// # Invalidation
//
// Invalidate deletes the value and the fill lease: a fill that started before
// the invalidation then fails its compare-and-set and writes nothing, and its
// waiters are woken to take a new lease and load data that is newer than the
// invalidation. (A per-key generation counter would do the same with one more
// key per entry; deleting the lease needs nothing new.) A fill that lost its
// lease this way still returns what it loaded to the callers that were
// waiting for it, as those calls started before the invalidation.
//
// # Redis unavailable
//
// When a Redis call fails (other than by the caller's context), Get fails open
// by default: the loader runs, coalesced per process and key and optionally
// bounded by MaxConcurrentLoads, its result is returned and nothing is cached;
// Stats.FailOpenLoads counts it. FailClosed returns ErrUnavailable instead.
//
// # Lifetimes
//
// A flight outlives callers whose context ends (its load is shared); it stops
// waiting for another process's fill at the wait budget of the call that
// started it and a load it runs ends with the load timeout. Close cancels and
// waits for every flight, background refresh, lease renewal and the shared
// subscription.
package cacheguard
