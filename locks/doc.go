// Package locks provides Redis locks that stay correct under crashes, process
// pauses, failover and contention: one-step acquisition with a lease, release
// and renewal checked against the owner's token inside Redis, background lease
// renewal with a lost-lock signal, fencing tokens, reentrancy by owner, waiting
// woken by push with hand-off to the longest waiter, Redlock over independent
// servers, replica acknowledgement (WAIT) and optimistic WATCH transactions.
package locks
