// Package gormplugin is a GORM plugin that guards row writes with Redis locks,
// rejects writes from holders whose lock expired (fencing), and invalidates
// cached copies of a row after its write commits.
//
//	l := locks.New(rdb)
//	if err := db.Use(gormplugin.New(l, gormplugin.Invalidate(g, keysForRow))); err != nil { ... }
//
// Call db.Use right after gorm.Open. Configuration errors (a nil Locker, an
// invalid option, a Redlock without NoFencing) are returned by db.Use, which
// gets them from Initialize; New never fails or panics.
//
// # Row guard
//
// Every Update, Updates, UpdateColumn(s), Save and Delete whose rows the
// plugin can name takes the lock of each row before GORM opens its
// transaction and releases it after that transaction's COMMIT or ROLLBACK, so
// two writes to one row through GORM never interleave. Rows are named from the
// primary key of the model (a struct or a slice of structs), or else from a
// WHERE that pins the primary key with = or IN among AND-ed conditions
// (db.Delete(&Repo{}, 42), Where(&Repo{ID: 42}), Where("id", 42)); a WHERE
// written as SQL text ("id = ?") does not name rows. Create, Raw and Exec are
// not guarded.
//
// The lock name of a row is "<table>:<primary key>", the parts of a composite
// key joined by ":" (see RowName), the name ginmw.Resource gives the resource,
// so a request that holds "repos:42" through ginmw.Lock re-enters the lock
// when it writes that row through GORM with the request's context: a lock
// taken under an owner (locks.WithOwner) is re-entered, not waited for, by
// every acquisition under the same owner. A statement without an owner on its
// context gets a new one for its locks (and for its hooks' writes). Several
// rows are locked in sorted name order. A lock is awaited up to the Locker's
// wait budget; set it with LockOptions(locks.WithWait(d)).
//
// # Transactions
//
// The plugin wraps the database's connection pool, so it sees every
// transaction begun on it (db.Transaction, db.Begin, and the one GORM opens
// around a single write) end. Inside a transaction, row locks are held until
// its COMMIT or ROLLBACK, all under one owner (the context's, or a new one),
// and cache keys are invalidated after COMMIT. A transaction begun elsewhere
// (on a *sql.Conn from db.Connection) cannot be followed, so guarded writes in
// it fail with ErrForeignTx.
//
// The guard covers writes, not reads: a read-modify-write is only exact when
// the lock also spans the read. Transaction(ctx, db, fn, rows...) takes the
// locks of rows before BEGIN and holds them until after COMMIT, so fn can read
// then write (its writes re-enter the locks). Locks are taken in one global
// order, sorted by name, so two transactions never wait for each other in a
// cycle: declare every row a transaction writes. A row needed mid-transaction
// that sorts after every lock held is awaited; one that sorts before is only
// tried, and if busy the write fails with ErrLockOrder (waiting could
// deadlock). A panic in fn rolls back and is returned as a *PanicError.
//
// # Fencing
//
// A lock alone cannot stop a writer that was paused (a long GC, a stopped VM)
// past its lease: it resumes believing it holds the lock. A model with a Fence
// field (or an integer field tagged `gormplugin:"fence"`) stores the fence
// token of the last guarded write. A guarded Update or Delete of it adds
//
//	WHERE ... AND COALESCE(fence, 0) <= <token>
//
// and an Update sets fence = <token>, whatever Select, Omit, map or struct it
// was given. The comparison is <=, not <, because a re-entered lock shares the
// token of the acquisition it re-enters, and one holder may write a row twice
// under one acquisition; it is as safe against a stale holder, because every
// acquisition's token is strictly larger than all earlier ones, so a newer
// holder's write leaves a fence above the stale holder's token. Writing
// several rows in one statement compares each row with its own lock's token
// (a CASE on the primary key).
//
// When fewer rows than named were affected, the plugin reads the fence of
// each named row in the same transaction: a missing row is not an error (zero
// rows affected, as in plain GORM, and Save then inserts as usual); a fence
// newer than the writer's token fails the statement with a *StaleWriteError
// (errors.Is(err, ErrStaleWrite)) and rolls it back: never a silent success,
// and Save does not fall back to an insert. A lock already known to be lost
// when the statement is sent is refused the same way, with or without a fence
// column. After a successful single-row update the model's fence field holds
// the token written.
//
// Fencing needs tokens that increase across all holders: New refuses a Locker
// whose MonotonicFences is false (locks.Redlock) unless NoFencing is given.
//
// # Invalidation
//
// With Invalidate(inv, keys), the cache keys listed for each written row are
// invalidated (a *cacheguard.Guard is an Invalidator) after the COMMIT of the
// write's transaction, before its row locks are released; never after a
// ROLLBACK, never before the user's COMMIT. A COMMIT that returns an error may
// still have committed, so it is invalidated all the same (a needless
// invalidation costs one reload; a missing one serves stale data). When the
// invalidation fails the write has committed anyway, and the error matches
// ErrInvalidate. InvalidateAgain repeats each invalidation after a delay, for
// caches refilled from lagging replicas.
//
// # Writes without a primary key
//
// A batch Update or Delete whose rows cannot be named follows Unkeyed: Refuse
// (the default) fails it with ErrUnkeyed, because a write the plugin cannot
// guard would silently break its promise; LockTable takes "<table>:*" (which
// serialises unkeyed writes on the table with each other, not with row
// writes); PassThrough sends it unguarded. GORM's Association API (Replace,
// Delete, Clear) writes by foreign key, so its writes are unkeyed too. A
// context from Unguarded lets statements through under any policy.
// Invalidation still applies, with a nil primary key.
//
// # Redis unavailable
//
// When a row lock cannot be taken because Redis cannot be reached, the write
// is not sent and fails with ErrLock (which also matches locks.ErrNotObtained
// and the Redis error). FailOpen sends it without lock or fence instead,
// logging a warning, and logs failed invalidations instead of returning them.
//
// # Caveat
//
// A panic in a GORM hook during a guarded statement unwinds GORM's callback
// chain without its release step, as it leaves GORM's own transaction open:
// the row lock then stays held, renewed, until the Locker is closed. Recover
// in hooks, or write through Transaction, which recovers.
package gormplugin
