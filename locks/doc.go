// Package locks provides Redis locks that stay correct under crashes, process
// pauses, failover and contention: a lease, fencing tokens, background
// renewal with a lost-lock signal, reentrancy by owner, push-woken hand-off to
// the longest waiter, Redlock, replica acknowledgement (WAIT) and an
// optimistic WATCH helper.
//
//	l := locks.New(rdb) // any redis.UniversalClient: single, Sentinel failover, or Cluster
//	defer l.Close()
//
//	lk, err := l.Lock(ctx, "repos:42", locks.WaitBudget(5*time.Second))
//	if errors.Is(err, locks.ErrBusy) { /* held elsewhere: err is a *NotObtainedError with RetryAfter */ }
//	defer lk.Unlock(context.WithoutCancel(ctx))
//	write(lk.Context(), row, lk.Fence()) // lk.Context() is cancelled if the lock is lost
//
// A *Client (New) locks on one Redis deployment — a single server, Sentinel
// (redis.NewFailoverClient) or Cluster (redis.ClusterClient: every script
// touches one hash slot, waiters use sharded pub/sub and follow a slot that
// moves or fails over); a *Redlock (NewRedlock) on N independent masters
// (use 3 or 5; quorum N/2+1, validity = lease − elapsed − lease×1% − 2ms).
// Both are Lockers. New and NewRedlock panic with a "locks:" message on
// programmer error (a nil client, the same Redlock node twice, an invalid
// option value); every call that talks to Redis returns errors. Examples:
// Client.Lock, Client.TryLock, WithOwner, Lock.Lost, NewRedlock, Optimistic.
//
// # Guarantees
//
//   - Acquisition is one atomic step that sets the lease, so a crash never
//     leaves a lock without one. Its request is sent once: a lost reply
//     fails the call (ErrUnavailable), which gives back what it may take.
//   - Only the holder releases or extends: the owner token (128 random bits
//     per acquisition, or WithOwner's id) is compared inside Redis, so a
//     holder whose lease ran out never deletes or extends the next holder's
//     lock.
//   - A held lock renews itself every third of its lease until Unlock (one
//     goroutine per Client for all its locks). When renewal fails past the
//     local deadline, or the key was deleted or taken over, Lost closes,
//     Context is cancelled and the hold is given back. NoRenewal gives a fixed
//     lease (Lost closes when it runs out); Extend renews by hand.
//   - Lock.Fence strictly increases per name across all clients and
//     processes, also when the fence counter was lost, expired or left stale
//     by a failover, as long as the server's clock does not go back. Fence
//     the writes a lock protects with it.
//   - Waiting is woken by push, never a poll: Unlock hands the lock to the
//     longest-waiting live waiter and wakes it alone. By default processes
//     queue in arrival order (a process's own callers take turns); Fair
//     queues every caller in global arrival order. A waiter that died loses
//     its place within 2s.
//   - Reentrancy by owner: under WithOwner(ctx, id), a Lock of a name the
//     owner holds re-enters (a hold count, the same fence); each Unlock gives
//     one hold back. Once the owner's scope of a name is lost, nested
//     acquisitions fail with ErrLost and take nothing until every Lock of
//     that scope is Unlocked: a lost scope is never re-acquired behind the
//     caller's back. An owner's callers waiting for a name re-enter as soon
//     as the owner is granted it.
//   - Unlock is idempotent per handle: ErrNotHeld the first time after the
//     lock was lost (another holder may have had it), nil when the lease ran
//     out unnoticed but nobody took the lock since; never a hold back twice.
//   - A holder never believes it holds a lock Redis may have given away: its
//     local deadline (TTL, Lost) counts the lease of the command that set the
//     expiry in Redis from before it ran (monotonic clock), on every grant path
//     (attempt, hand-off, fair queue, re-entry, renewal, Extend, Redlock); a
//     grant read past it is given back (ErrNoValidity: Lock asks again), a
//     hand-off read late is confirmed first. No wall time is sent.
//   - Every acquisition or re-entry ends in one EventReleased or EventLost.
//   - Every call ends within its context and wait budget, every command
//     within 2 CommandTimeouts (500ms; one once Redis is quiet): a stalled
//     Redis turns a Lock, TryLock or Unlock into an error matching ErrUnavailable.
//     What a failed call may have taken is given back once Redis answers
//     (retried every 100ms for up to a minute; its request reaching Redis
//     later is refused), so no name stays locked after Redis recovers.
//   - Close and Shutdown end waiting Lock calls at once with ErrClosed, out of
//     the queues (another process is granted at once). Shutdown(ctx) keeps
//     the locks still held renewed until they are Unlocked, or reports them
//     (ErrStillHeld) when ctx ends. Every goroutine has ended when they return.
//
// # Limits
//
//   - A holder paused longer than its lease (GC, a stopped VM) cannot know it
//     lost the lock: only a fenced write (gormplugin) refuses it afterwards.
//   - Redis replicates asynchronously: a master can fail before a lock reaches
//     its replica, and the promoted replica grants it again. Replicas(n, t)
//     narrows that gap — every grant (direct, re-entry, hand-off) waits for
//     n acknowledgements or is given back — but does not make Redis strongly
//     consistent; the fence still protects the resource after any failover.
//   - A redis-server without persistence forgets every lock when it restarts.
//     Run lock servers with appendonly yes and appendfsync always (or
//     everysec, accepting up to a second), or rely on fencing. Run Redis with
//     maxmemory-policy noeviction.
//   - Redlock issues no fencing tokens (Fence is 0; gormplugin needs
//     NoFencing with it) and is not safe when a node restarts empty while a
//     lock is held: run its nodes with appendfsync always, or keep a crashed
//     node down for a lease.
//   - CommandTimeout reaches the socket only on a client with
//     ContextTimeoutEnabled; without it go-redis bounds each command by its
//     ReadTimeout and WriteTimeout (3s by default).
//   - Concurrent calls of a Client share round trips (calls that pile up
//     behind two in flight leave as one pipeline; a lone call never waits), so
//     go-redis hooks see them in ProcessPipelineHook, not ProcessHook.
//   - A name leaves a fence counter (about 70 bytes) in Redis for
//     FenceRetention after it was last taken (none under NoFencing).
//   - Mixing this version with older ones on the same names may make a waiter
//     miss a hand-off and wait out a lease: slower, never unsafe.
//
// # Options
//
// An Option configures a Locker (New, NewRedlock), a CallOption one call, a
// Setting both; a misplaced one does not compile. An option of the other kind
// of Locker (Fair, Replicas or FenceRetention on a Redlock; Drift or
// NodeTimeout on a Client) makes New and NewRedlock panic, and a call fail
// with ErrInvalid before any call to Redis. With their defaults:
//
//   - Settings: Lease (10s), NoRenewal, WaitBudget (30s; 0 is TryLock), Fair,
//     Replicas, NoFencing, NodeTimeout (Redlock).
//   - Options: Prefix ("cg:"), FenceRetention (10 minutes, or the lease),
//     CommandTimeout (500ms), Observer (an Event per outcome: EventAcquired,
//     EventReentered, EventNotObtained, EventReleased, EventLost, ...), Logger
//     (slog.Default(), rate-limited; silence it with
//     Logger(slog.New(slog.DiscardHandler))), Drift (Redlock, 2ms).
//
// # Errors
//
// ErrNotObtained (a *NotObtainedError with RetryAfter; joined with the
// caller's context error when that ended the wait) is classified as ErrBusy
// (another owner held the lock) or ErrUnavailable (the lock service could not
// grant it: Redis unreachable, too few replicas, the client closing, too many
// Redlock nodes failed), or neither (the caller's context ended it, or
// ErrLost). Besides: ErrNotHeld; ErrLost; ErrInvalid (bad input, before any
// Redis call); ErrClosed; ErrStillHeld; *ReplicaError; *RedlockError;
// ErrConflict (Optimistic).
//
// # Circuit breaker
//
// A Breaker on a go-redis client (rdb.AddHook(&locks.Breaker{})) is shared by
// every package using the client: after consecutive failures (connection
// errors, timeouts; not the caller's context ending), or one after 750ms
// without an answer, then a PING unanswered too (not a process's own pause),
// every command fails at once with ErrCircuitOpen (an ErrUnavailable: a lock
// attempt fails closed in microseconds, ginmw answers 503, gormplugin refuses
// the write unless FailOpen, Get fails open unless FailClosed) until a probe
// sees Redis answer; callers never wait for it (locks/DESIGN.md, "Measured").
//
// # Optimistic transactions
//
// Optimistic(ctx, rdb, fn, keys) runs a WATCH/MULTI/EXEC transaction and
// retries conflicts with jittered backoff within WaitBudget (1s by default;
// its only option), for counters and small read-modify-writes where a lock
// would be overkill. On a Redis Cluster its keys must share a hash slot.
//
// How the guarantees are kept, and why: locks/DESIGN.md in the repository.
package locks
