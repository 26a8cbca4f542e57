// Package gormplugin is a GORM plugin that guards row writes with Redis locks,
// rejects writes from holders whose lock expired (fencing), and invalidates
// cached copies of a row after its write commits.
//
//	l := locks.New(rdb)
//	plugin := gormplugin.New(l, gormplugin.Invalidate(g, keysForRow))
//	if err := db.Use(plugin); err != nil { ... }
//	defer plugin.Shutdown(ctx) // after the HTTP server's Shutdown
//
// Call db.Use right after gorm.Open. New panics with a "gormplugin:" message
// on programmer error (a nil Locker, an invalid option, a locks.Redlock
// without NoFencing); db.Use returns the errors that depend on the database
// (Initialize's). Warnings go to the Logger option's *slog.Logger
// (rate-limited; discarded by default), events to the Observer.
//
// # Row guard
//
// Every Update, Updates, UpdateColumn(s), Save and Delete takes the lock of
// each row it writes before GORM opens its transaction and releases it after
// that transaction's COMMIT or ROLLBACK, so two writes to one row through GORM
// never interleave. Rows are named from the primary key of the model (a
// struct or a slice of structs), or else from a WHERE that pins the primary
// key with = or IN among AND-ed conditions, written as clauses
// (db.Delete(&Repo{}, 42), Where(&Repo{ID: 42}), Where("id", 42)) or as SQL
// text (Where("id = ?", 42), Where("repos.id IN ?", ids), gorm.G[Repo](db).
// Where("id = ?", 42), inline conditions). Create, Raw and Exec are not
// guarded.
//
// A write whose rows are not named that way — a condition on other columns,
// db.Table("t") without a model, a global write with AllowGlobalUpdate, and
// the writes GORM's association API makes by foreign key (Append, Replace,
// Delete, Clear, Select(clause.Associations).Delete, generics
// Set(clause.Association{...})) — is guarded by the locks of the rows it
// matches (Unkeyed, default LockMatched): the plugin reads their primary
// keys with the write's own conditions (in the write's transaction, if any),
// locks them like named rows, and restricts the write to them (AND pk IN
// (...)), so it excludes, and is excluded by, every other writer of those
// rows. A row that starts to match between that read and the write is left
// out, as if the write had run first. The locks of the rows an association
// write changes exclude more than the owner's lock would (a writer holding
// one of those rows), and the owner's own row is locked by the statement
// GORM sends for it. A write matching more than MaxMatchedRows (1000) rows
// fails with ErrUnkeyed before anything is written. A table without a
// primary key has no rows to name: each guarded write of it takes the table's
// one lock, "<table>:*". A global write without AllowGlobalUpdate is left to
// GORM, which refuses it with gorm.ErrMissingWhereClause, as without the
// plugin.
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
// A lost lock scope is never re-acquired behind the caller's back: while a
// request still has a Lock of "repos:42" (from ginmw.Lock, or its own under
// locks.WithOwner) that lost the lock — its lease ran out while the process
// was stopped, and another process may have written the row since — a write
// of the row under that owner fails with a *StaleWriteError (ErrStaleWrite,
// also matching locks.ErrNotHeld) and nothing is written; it does not take the
// lock afresh under a newer token.
//
// # Transactions
//
// The plugin puts its own connection pool under the database's (beneath
// GORM's *gorm.PreparedStmtDB with PrepareStmt, which stays db.ConnPool), so
// it sees every transaction begun on it (db.Transaction, db.Begin, and the
// one GORM opens around a single write) end. Inside a transaction, row locks
// are held until its COMMIT or ROLLBACK, all under one owner (the context's,
// or a new one), and cache keys are invalidated after COMMIT. A transaction
// begun elsewhere (on a *sql.Conn from db.Connection) cannot be followed, so
// guarded writes in it fail with ErrForeignTx.
//
// The guard covers writes, not reads: a read-modify-write is only exact when
// the lock spans the read too. Transaction(ctx, db, fn, rows...) takes the
// locks of rows before BEGIN and holds them until after COMMIT, and claims
// each row as the transaction's first statement before fn runs:
//
//	UPDATE t SET fence = <token> WHERE pk = ? AND COALESCE(fence, 0) <= <token>
//
// (SET pk = pk on a row without a fence column). A previous holder that was
// stopped after its UPDATE and before its COMMIT still holds the database's
// row lock, so the claim waits for that COMMIT, and fn reads what it
// committed: the next holder never builds on a read taken before the
// previous holder's COMMIT. On PostgreSQL (READ COMMITTED) that wait is a row
// lock; on SQLite it is the database-wide write lock, for up to the busy
// timeout. A claim stamps the fence, so the row's cache keys are invalidated
// after the COMMIT as for a write. fn's writes re-enter the locks (same
// owner). Locks are taken in one global order, sorted by name, so two
// transactions never wait for each other in a cycle: declare every row a
// transaction writes. A row needed mid-transaction that sorts after every
// lock held is awaited; one that sorts before is only tried, and if busy the
// write fails with ErrLockOrder (waiting could deadlock). A panic in fn rolls
// back and is returned as a *PanicError.
//
// A transaction's context bounds its statements, the wait for a pooled
// connection and the transaction itself until COMMIT: a context that ends
// before COMMIT rolls the transaction back (as database/sql does; GORM's
// DefaultTransactionTimeout relies on it). Once COMMIT is sent it runs to its
// answer even if the context ends meanwhile (ginmw cancels a request's
// context when its lock is lost): pgx would otherwise give up on the reply,
// and a write the database committed would be reported as failed.
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
// The fence is also the row's version. A single-struct write (Save(&r),
// Model(&r).Updates(...)) whose struct carries a fence — the one it was read
// with, or the token of its last write — also requires the row to still
// carry that fence, or the writer's own token:
//
//	AND COALESCE(fence, 0) IN (<the struct's fence>, <token>)
//
// So a handler under ginmw.Lock that reads a row and saves the struct it read
// is refused (ErrStaleWrite, StaleWriteError.Read set) when another writer
// committed the row in between — such as a holder stopped after its UPDATE
// whose COMMIT landed after this read — instead of overwriting it. A struct
// with a zero fence (built, not read) has no version. After a successful
// single-row update the struct's fence holds the token written; a rollback
// puts back the fence it had. Compute a write from a read into another type,
// or from several rows, inside Transaction, whose claim covers it.
//
// When fewer rows than named were affected, the plugin reads the fence of
// each named row in the same transaction: a missing row is not an error (zero
// rows affected, as in plain GORM, and Save then inserts as usual); a fence
// newer than the writer's token, or other than the version, fails the
// statement with a *StaleWriteError (errors.Is(err, ErrStaleWrite)) and rolls
// it back: never a silent success, and Save does not fall back to an insert.
// A lock already known to be lost when the statement is sent is refused the
// same way, with or without a fence column.
//
// Fencing needs tokens that increase across all holders: New refuses a
// locks.Redlock, which issues none, unless NoFencing is given, and a write
// whose lock carries no token (Fence 0, from another Locker) fails with
// ErrInvalid.
//
// # Invalidation
//
// With Invalidate(inv, keys), the cache keys listed for each written row are
// invalidated (a *cacheguard.Guard is an Invalidator) after the COMMIT of the
// write's transaction, before its row locks are released; never after a
// ROLLBACK, never before the user's COMMIT. A COMMIT that returns an error may
// still have committed, so it is invalidated all the same (a needless
// invalidation costs one reload; a missing one serves stale data).
//
// A committed write is not an error: when its invalidation fails, the write
// returns nil all the same, and the plugin retries the invalidation in the
// background (RetryInvalidation: 8 attempts from 100 ms, doubling, at most
// 5 s apart; at most 10000 keys pending), reporting each failure, success and
// drop to the Observer and the Logger. InvalidateAgain repeats each
// invalidation after a delay, for caches refilled from lagging replicas.
//
// # Shutdown
//
// A graceful shutdown composes in this order: the HTTP server's Shutdown
// (requests in flight finish; their guarded writes commit or roll back and
// release their locks as usual), then plugin.Shutdown(ctx) (it waits for
// guarded statements and transactions still in flight, runs the delayed
// repeats, and retries every failed invalidation at once until none is left;
// what ctx cuts off is reported and returned as ErrInvalidate), then the
// Locker's Shutdown or Close, then the database. Close drops the background
// work instead. A process that exits without them leaves its locks to their
// leases (no longer than the lease: renewals stop with the process) and its
// pending invalidations to the entries' TTLs.
//
// # Redis unavailable
//
// The first attempt at a row lock is a TryLock bounded by UnavailableAfter
// (500 ms), on its own goroutine, whatever the go-redis client's timeouts:
// an unanswering Redis costs a write that long, not go-redis's retries or a
// Redlock's wait budget (only a lock held by another owner is then awaited).
// When a row lock cannot be taken because the lock service is unavailable
// (locks.ErrUnavailable, for every Locker), the write is not sent and fails
// with ErrLock (which also matches locks.ErrNotObtained and
// locks.ErrUnavailable). FailOpen sends it without lock or fence instead,
// logging a warning and reporting WroteUnguarded; contention (locks.ErrBusy)
// is never failed open.
//
// # Writes the plugin does not guard, and refusals
//
// Unguarded(ctx) lets statements through without locks or fence (they are
// still invalidated). Unkeyed(PassThrough) sends writes whose rows are not
// named without locks; Unkeyed(Refuse) fails them with ErrUnkeyed when they
// come — GORM's association operations are several statements, so run them
// in a transaction to have the refusal roll the whole operation back. With
// the defaults, the plugin refuses, where plain GORM would write: a write
// matching more than MaxMatchedRows rows (ErrUnkeyed); a guarded write inside
// a transaction it cannot follow (ErrForeignTx); a write whose rows are
// locked by another writer past the wait budget, or while Redis is
// unavailable (ErrLock); a stale write (ErrStaleWrite); a transaction needing
// a row out of lock order while another writer holds it (ErrLockOrder).
// GORM v1.31.2's own test suite (SQLite, 412 tests) passes with the plugin on
// its defaults and in the permissive configuration (Unkeyed(PassThrough),
// FailOpen(), NoFencing()); see internal/tools/gormsuite.sh.
//
// # Caveat
//
// A panic in a GORM hook during a guarded statement unwinds GORM's callback
// chain without its release step, as it leaves GORM's own transaction open:
// the row lock then stays held, renewed, until the Locker is closed (and
// Shutdown waits for the statement until its context ends). Recover in hooks,
// or write through Transaction, which recovers. Save of a row that turns out
// to be missing falls back to GORM's insert (ON CONFLICT UPDATE) after the
// row lock is released, and Create is not guarded: an upsert racing another
// writer of the same key is not excluded.
package gormplugin
