// Package locks provides Redis locks that stay correct under crashes, process
// pauses, failover and contention: one-step acquisition with a lease, release
// and renewal checked against the owner's token inside Redis, background lease
// renewal with a lost-lock signal, fencing tokens, reentrancy by owner, waiting
// woken by push with hand-off to the longest waiter, Redlock over independent
// servers, replica acknowledgement (WAIT) and optimistic WATCH transactions.
//
// New and NewRedlock panic with a "locks:" message on programmer error (a
// nil client, the same Redlock node twice, an invalid option value); every
// call that talks to Redis returns errors.
//
//	l := locks.New(rdb) // any redis.UniversalClient: single, Sentinel failover, or Cluster
//	defer l.Close()
//
//	lk, err := l.Lock(ctx, "repos:42", locks.WaitBudget(5*time.Second))
//	if errors.Is(err, locks.ErrBusy) { /* held elsewhere: err is a *NotObtainedError with RetryAfter */ }
//	defer lk.Unlock(context.WithoutCancel(ctx))
//	write(lk.Context(), row, lk.Fence()) // lk.Context() is cancelled if the lock is lost
//
// # On the wire
//
// Acquire is one EVALSHA. It takes a free lock (a hash cg:lock:{name}
// holding owner, hold count and fence) with its lease in the same step —
// there is no SETNX-then-EXPIRE window in which a crash leaves a lock without
// a lease — or re-enters it for the same owner, or queues the caller; on
// failure it returns the holder's remaining lease. A retried call (go-redis
// re-sends commands whose reply was lost) is recognised by its acquisition id
// and answered as the success it was.
//
// Only the holder releases or extends: the owner token (128 random bits per
// acquisition, or the id given with WithOwner) is compared inside the script,
// so a holder whose lease ran out can never delete or extend the next
// holder's lock.
//
// Fencing: Lock.Fence strictly increases per name across all clients and
// processes (see Fence tokens below). Run Redis with maxmemory-policy
// noeviction.
//
// Watchdog: a held lock renews itself every third of its lease until Unlock.
// One goroutine per Client renews every due lock, one pipeline per master
// node in parallel, so 10,000 held locks cost one goroutine and no extra
// connections. When renewal fails past the local deadline, or the key was
// deleted or taken over, Lost closes and Context is cancelled. NoRenewal
// gives a fixed lease (Lost closes when it runs out); Extend renews by hand.
//
// Waiting is push, and wakes one waiter: a waiter listens on its client's
// channel for the lock (cg:lock:{name}:w:<client id>; one shared subscription
// connection per process, per master on a cluster, and one subscription per
// name however many of the client's callers wait for it, each hand-off routed
// to the caller it names) before its queued attempt, then sleeps. Unlock hands the lock straight to the longest-waiting live
// waiter inside the release script and publishes the grant on that waiter's
// client's channel alone: no waiter polls, no other process is woken, and the
// hand-off costs no extra round trip. A lock with waiters queued carries a
// flag set by whoever queued them, so the release of an uncontended lock
// reads one hash and deletes it, no more than a plain compare-and-delete.
// (The flag and the per-client channel are new in this version: while a
// fleet mixes it with older versions on the same names, a waiter of one
// version may miss a hand-off from the other and take the lock on its
// fallback timer instead — slower, never unsafe.) A waiter that died loses its place
// within 2 s, and a hand-off to it is granted with a short claim lease (at
// most 2 s) that only a live waiter renews. The fallback timer is the
// holder's remaining lease, never a blind poll. By default a process holds
// one place in the queue per name (its goroutines queue locally, and the
// place passes from one to the next through the lock: the release of a lock
// granted after waiting queues the process's next waiter in the same script,
// or hands it the lock when nobody else waits, so a contended acquisition
// costs one request); Fair queues every caller individually, in global
// arrival order.
//
// Reentrancy by owner: under WithOwner(ctx, id), a nested Lock of a name the
// owner holds re-enters (hold count in the hash); each Unlock gives one hold
// back. Unlock is idempotent per handle, returns ErrNotHeld the first time
// after the lock was lost, and never decrements twice. It answers nil when
// the lease ran out unnoticed but nobody took the lock since (the fence
// counter still holds its token): ErrNotHeld means another holder may have
// had the lock meanwhile.
//
// Concurrent calls share round trips: up to two lock calls of a Client go to
// Redis on their own, each under its caller's context, so a lone call waits
// for nothing; calls made while those are on the wire queue and leave
// together as one pipeline. A lock cycle on a name used recently allocates
// about a dozen objects (its keys are built once per name and client). A caller whose context ends while its call is
// queued returns at once; if the call then took the lock (or a queue place),
// it is given back, and a direct attempt whose reply never came (a timeout,
// a broken connection) is followed by a release of the hold it may have
// taken. go-redis hooks see the shared calls in
// ProcessPipelineHook, not ProcessHook.
//
// Time is the local monotonic clock: validity and renewal deadlines are
// measured from before the request was sent; no wall-clock timestamp is ever
// sent to Redis.
//
// # Failover, the replication gap and WAIT
//
// Redis replicates asynchronously: a master can die before a lock reaches
// its replica, and the promoted replica grants the lock again.
// Replicas(n, timeout) closes most of that gap: after a grant it sends
// WAIT n timeout on the same connection, to the master that owns the lock's
// slot (WAIT counts only its own connection's writes), and treats fewer
// acknowledgements as not obtained, giving back what it took. WAIT does not
// make Redis strongly consistent; what protects the resource is the fence:
// after any failover the next holder's token is larger, so a fenced write
// from the old holder is refused.
//
// A single redis-server without persistence forgets every lock when it
// restarts, so a second client can take a lock whose first holder still
// runs; the fence still refuses the first holder's late write. Run lock
// servers with appendonly yes and appendfsync always (or everysec, accepting
// up to a second), or rely on fencing.
//
// Redis Cluster works through redis.ClusterClient: every script touches keys
// of one hash slot, waiters use sharded pub/sub (SSUBSCRIBE, one connection
// per master), and a channel whose slot moves or whose master fails over is
// re-subscribed where its slot now lives. Sentinel works through
// redis.NewFailoverClient.
//
// # Redlock
//
// NewRedlock(clients) takes the lock on N independent masters (use 3 or 5):
// quorum N/2+1, per-node attempts in parallel with a small timeout, validity
// = lease − elapsed − drift (drift = lease × 1% + 2 ms) on the monotonic
// clock, release on every node after a failed attempt, retry after a random
// delay, quorum renewal. A node call still queued when its node timeout ends
// is given up, and a grant it makes later is released on that node. Redlock
// gives no fencing tokens (independent counters cannot be made monotonic:
// Fence is 0; gormplugin needs NoFencing with it),
// and no safety when a node restarts empty while a lock is held (run nodes
// with appendfsync always, or keep a crashed node down for a lease).
//
// # Options
//
// An Option configures a Locker (New and NewRedlock take its defaults), a
// CallOption one call, a Setting both; a misplaced one does not compile.
//
//   - Lease(d), everywhere, default 10s: how long a lock outlives a holder
//     that stops renewing (at least 30ms).
//   - NoRenewal(), everywhere: a fixed lease; renew by hand with Extend.
//   - WaitBudget(d), everywhere, default 30s: how long Lock waits (the caller's
//     ctx can end it sooner); 0 is TryLock.
//   - Fair(), New and per call on a Client: strict global FIFO per caller
//     (default: FIFO per process).
//   - Replicas(n, t), New and per call on a Client: require n replica
//     acknowledgements within t (default: no WAIT).
//   - FenceRetention(d), New, default 10 minutes (or the lease, if
//     longer): the lifetime of a name's fence counter after the name was last
//     taken.
//   - Prefix(p), New and NewRedlock, default "cg:": the prefix of every
//     key and channel.
//   - Observer(f), New and NewRedlock: f(ctx, Event) for every outcome
//     (acquired, not obtained, released, lost, renewal failed), with the
//     call's context.
//   - Logger(l), New and NewRedlock, default discard: a *slog.Logger for
//     warnings (a lock lost, a renewal failed), rate-limited.
//   - CommandTimeout(d), New and NewRedlock, default 500ms: how long one
//     Redis command (or pipeline) may go unanswered (see Stalls).
//   - Drift(d), NewRedlock, default 2ms; NodeTimeout(d), NewRedlock
//     and per call on a Redlock, default lease/20 within [5ms, 250ms].
//   - NoFencing(), everywhere: keep no fence counter (Fence reports 0).
//
// An option of the other kind of Locker (Fair or FenceRetention on a
// Redlock, Drift or NodeTimeout on a Client) makes New and NewRedlock panic,
// and a call fail with ErrInvalid before any call to Redis. Optimistic takes
// WaitBudget (1s by default), and refuses every other option.
//
// # Errors
//
// ErrNotObtained (a *NotObtainedError with RetryAfter; joined with the
// caller's context error when that ended the wait), classified as ErrBusy or
// ErrUnavailable (see Decisions); ErrNotHeld; ErrLost (a nested acquisition
// of a lost scope); ErrInvalid (bad input, before any Redis call); ErrClosed;
// ErrStillHeld (Shutdown); *ReplicaError; *RedlockError; ErrConflict
// (Optimistic).
//
// # Circuit breaker
//
// A Breaker installed on a go-redis client (rdb.AddHook(&locks.Breaker{}))
// is shared by everything using that client: after consecutive failures
// (connection errors, timeouts, commands our command timeout ended — a
// stall; not the caller's own context ending) every command fails at once with
// ErrCircuitOpen, which matches ErrUnavailable, so a lock attempt fails
// closed in microseconds, ginmw answers 503, gormplugin refuses the write
// (or lets it through under FailOpen) and a cacheguard Get fails open to its
// loader (or closed, under FailClosed). A probe PING, sent in the background
// after a cooldown, closes it once Redis answers; callers never wait for it.
// Measured with Redis killed and black-holed (internal/reliability,
// TestReliabilityBreaker): a refused lock attempt p99 80-110µs, a fail-open
// Get p99 1.3ms above its loader's 20ms, service back 50-320ms after Redis
// answers; without it, each call waits for go-redis's dial retries and read
// timeouts (seconds).
//
// # Stalls
//
// Every Redis command of this package (internal/rcmd, shared with
// cacheguard) is bounded on its own by the command timeout (CommandTimeout,
// 500ms by default), separately from the wait budget and the caller's
// context, which can only end a call sooner. A paused or black-holed Redis
// therefore turns a Lock, TryLock or Unlock into an error matching
// ErrUnavailable within the command timeout, and a Breaker on the client
// opens once Threshold commands failed so; a waiter whose wait depends on
// another caller's call (the next local waiter, claimed by a release that
// hangs) still returns when its own context or budget ends. What a failed
// call may have done in Redis — an attempt that ran when Redis resumed, an
// Unlock's release — is given back, or released, by a clean-up sent again
// every 100ms until Redis answers (at most for the lease it concerns), so
// no name stays locked for a lease after Redis recovers. The command
// timeout reaches the socket only on a client with ContextTimeoutEnabled;
// without it, go-redis bounds each command by its ReadTimeout and
// WriteTimeout (3s by default). Measured (TestStallFailsFast, Redis
// SIGSTOPped and black-holed, README client, Breaker defaults): each attempt
// failed after 0.50s, the breaker opened 1.0s after the stall began
// (clean-ups count too), then TryLock, Lock and Unlock failed in under 2ms;
// once Redis answered again the breaker closed in 0.26s and every name was
// free again 0.32s after it.
//
// # Optimistic transactions
//
// Optimistic(ctx, rdb, fn, keys) runs a WATCH/MULTI/EXEC transaction and
// retries conflicts with jittered backoff (within WaitBudget, 1s by default), for
// counters and small read-modify-writes where a lock would be overkill.
//
// # Decisions
//
// Shared subscriptions. locks and cacheguard share internal/wake (one
// subscription connection per process, per master on a cluster) rather than
// each running their own.
//
// Defaults. A lease of 10 s, renewed every third; Lock waits 30 s (ginmw.Lock
// 5 s); a hand-off's claim lease at most 2 s. The default mode already hands
// the lock to the longest-waiting process; Fair queues every caller
// individually. Both wake one waiter, never all.
//
// Shared round trips. A Client pipelines the lock calls that pile up behind
// two direct ones (what rueidis does for every command) instead of asking
// users to pipeline: the calls come from independent requests, and only the
// library sees them together. A lone call is never delayed.
//
// Clocks. The wall-clock-jump guarantee is proven by a source check (every
// deadline is a monotonic time.Now reading), not by an injected clock: Go
// cannot fake a monotonic reading apart from a wall reading.
//
// Lost scopes. Under WithOwner, the Locks of one name not yet Unlocked form
// the owner's scope of it. A nested acquisition only ever re-enters that
// holding (sharing its fence); once the scope is lost, nested acquisitions
// fail with ErrLost and take nothing until every Lock of it is Unlocked, so
// a write prepared under a lost scope can never land under a newer fence.
//
// Renewal. One loop per Client renews every held lock in batches, one
// pipeline per node; outcomes apply as each node answers, and each lock's
// Lost closes at its local deadline (the lease measured on the monotonic
// clock from before the last confirmed renewal was sent) even while a
// renewal is still on the wire. A paused or slow shard thus delays only its
// own locks, whatever the go-redis client's ContextTimeoutEnabled.
//
// Errors. Every failed acquisition matches ErrNotObtained and is classified
// for callers that answer for it (ginmw, gormplugin): ErrBusy when another
// owner held the lock (TryLock, or Lock's wait budget spent behind it; for
// Redlock, refusals kept the quorum out of reach); ErrUnavailable when the
// lock service could not grant it (Redis unreachable or failing, too few
// replicas acknowledging, the client closing, for Redlock too many nodes
// failed or the quorum came too late); neither when the caller's context
// ended it or the owner's scope was lost (ErrLost).
//
// Closing. Close and Shutdown end waiting Lock calls at once with ErrClosed
// and withdraw them from the locks' queues, so a release goes to another
// process at once; a grant arriving meanwhile is given back. Shutdown(ctx),
// for rolling restarts, then keeps the locks still held renewed until the
// application Unlocks them (nested re-entries still work) and sends queued
// releases, reporting (ErrStillHeld) and dropping what is still held when
// ctx ends; Close drops it at once. Every goroutine has ended when they
// return.
//
// Keys. A lock's keys share a hash tag, so every script runs on one cluster
// slot: the name itself (cg:lock:{repos:42}), or, for a name containing '}',
// a hash of the name followed by the name (cg:lock:{#1f0c…}a}b).
//
// Fence tokens. A token is the larger of the name's counter plus one and the
// server's clock in microseconds, so tokens keep increasing when the counter
// is lost, expired or stale after a failover, unless the server's clock goes
// back; the counter (about 70 bytes) lives for the fence retention after the
// name was last taken, 10 minutes by default, which bounds what names leave
// behind in Redis.
//
// Replicas. Replicas holds on every grant path: a direct grant, a
// re-entry and a hand-off are each followed by WAIT on the connection that
// wrote them, and a grant too few replicas acknowledged is given back.
package locks
