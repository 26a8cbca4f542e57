// Package locks provides Redis locks that stay correct under crashes, process
// pauses, failover and contention: one-step acquisition with a lease, release
// and renewal checked against the owner's token inside Redis, background lease
// renewal with a lost-lock signal, fencing tokens, reentrancy by owner, waiting
// woken by push with hand-off to the longest waiter, Redlock over independent
// servers, replica acknowledgement (WAIT) and optimistic WATCH transactions.
//
// # Decisions
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
// Replicas. WithReplicas holds on every grant path: a direct grant, a
// re-entry and a hand-off are each followed by WAIT on the connection that
// wrote them, and a grant too few replicas acknowledged is given back.
package locks
