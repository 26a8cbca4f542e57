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
// without NoFencing). Examples: New, Transaction, StaleWriteError. Options:
// Invalidate, InvalidateAgain, RetryInvalidation, LockOptions, UnavailableAfter,
// FailOpen, Unkeyed, MaxMatchedRows, NoFencing, Observer, Logger (slog.Default,
// rate-limited; silence it with Logger(slog.New(slog.DiscardHandler))).
//
// # Which writes are guarded
//
// Every statement through which GORM can change an existing row locks each row
// it writes before GORM opens its transaction, until that transaction's COMMIT
// or ROLLBACK, so two writes to one row through GORM never interleave: Update,
// Updates, UpdateColumn(s), Save (its UPDATE, and its insert when the row is
// missing), Save of a slice, Create with ON CONFLICT DO UPDATE (an upsert),
// Delete, and GORM's association writes. It denies by default: a statement runs
// only when every row it can change is named the way the database will match
// it, and is restricted to the rows locked. Rows are named by the key GORM puts
// in the WHERE after the hooks: the model's, a Delete's value, a slice's
// elements (zero parts of a composite key included), an upsert's values when
// the primary key is its conflict target; a string key as stored, read where
// its column may match another spelling (COLLATE, citext, MySQL). A write whose
// model carries no key (Model(&Repo{}).Where(...), db.Delete(&Repo{}, 42),
// db.Table("t"), AllowGlobalUpdate, association writes by foreign key) and an
// upsert on another unique key (or OnConstraint) have their rows read from the
// database, as stored (Unkeyed, default LockMatched): locked, and the write
// restricted to them; a row that starts to match after that read is left out,
// as if the write ran first; beyond MaxMatchedRows (1000), ErrUnkeyed. A table
// without a primary key has one lock, "<table>:*". A Create of new rows (or ON
// CONFLICT DO NOTHING) takes no lock; its rows' cache keys (generated keys too)
// are invalidated after its COMMIT. A write that sets the primary key moves a
// row: both names are locked.
//
// Anything else is refused before the database with ErrUnnamedRows, whose
// message says what to write instead: an Or joined with a model's key, SQL
// text anywhere with an OR GORM does not parenthesize, Update(s) of a struct
// whose composite key has a zero part (GORM leaves it out of its WHERE), a
// slice with an element without a key, a table expression other than "t [AS]
// a", an upsert with DoUpdates and no conflict target, a key set or upserted
// to an expression (id + 1, excluded.id unless id is the conflict target) or
// a value of another kind. Never run unguarded, never silently narrowed.
//
// A row's lock name is "<table>:<primary key>" (RowName; a composite key's
// parts joined by ":"), the name ginmw.Resource gives, so a request holding
// "repos:42" through ginmw.Lock re-enters it when it writes that row with the
// request's context (locks.WithOwner); a statement without an owner gets a new
// one. Rows are locked in sorted name order, each awaited up to the Locker's
// wait budget (LockOptions(locks.WaitBudget(d)); past it, ErrLock; one that
// sorts before a lock held is only tried, and if busy, ErrLockOrder). A lost
// lock is never re-acquired behind the caller's back: a write under an owner
// whose Lock of the row was lost, or under a lock known lost when the
// statement is sent, fails with ErrStaleWrite and writes nothing.
//
// # Transactions
//
// Inside db.Transaction or db.Begin, row locks are held until COMMIT or
// ROLLBACK, under one owner, and cache keys are invalidated after COMMIT. A
// transaction begun elsewhere (a *sql.Conn from db.Connection) cannot be
// followed: guarded writes in it fail with ErrForeignTx. The guard covers
// writes, not reads: for a read-modify-write, Transaction(ctx, db, fn,
// rows...) locks the rows before BEGIN until after COMMIT and claims each row
// first, so fn reads what a previous holder (even one stopped before its
// COMMIT) committed; fn's writes re-enter the locks. The claim never vouches
// for a struct read before another writer's commit: ErrStaleWrite, as
// outside Transaction. The cache keys of every declared row are invalidated
// after COMMIT, a row fn inserts with Exec included. Declare every row it
// writes (one needed later may fail with ErrLockOrder). A panic in fn rolls
// back, returned as a *PanicError. The context bounds the transaction until COMMIT (an ended
// context rolls back); once sent, COMMIT runs to its answer.
//
// # Fencing and versions
//
// A lock cannot stop a writer paused past its lease; a fence can. A model
// with a Fence field (or an integer field tagged `gormplugin:"fence"`) stores
// the token of the last guarded write: an Update or Delete touches the row only
// while its fence is not newer than the writer's token (several rows: each
// with its own lock's token), and an Update sets it, whatever Select, Omit,
// map or struct it was given. A newer holder's fence refuses the stale write
// with a *StaleWriteError (ErrStaleWrite), rolled back: never a silent success.
//
// The fence is also the row's version: a write of a struct whose fence field
// holds the fence it was read with must find the row still carrying it, so a
// Save or Update of a struct read before another writer committed (or taken
// from a cache filled before the row's last write) is refused:
//
//   - Save(&s), Save of a slice, an upsert with UpdateAll and Updates(&s) on
//     Model(&s) write the struct back whole: its fence is its version even
//     when zero, so a struct built rather than read is refused over a row a
//     guarded write has stamped (read the row first, or use Updates/Select).
//   - Update, UpdateColumn(s), Updates of a map or another struct, and an
//     upsert with DoUpdates carry a version only when the fence is set: a
//     read-modify-write through them of a row whose fence is still zero is not
//     versioned (write the struct back, or use Transaction).
//
// After a single-row update or upsert the struct's fence holds the token
// written (a rollback puts back the one it had). A missing row is not an error
// (Save then inserts) unless the struct carries a version
// (StaleWriteError.Missing). Fenced upserts need PostgreSQL or SQLite (else
// ErrInvalid). New refuses a Redlock (no tokens) unless NoFencing.
//
// # Invalidation
//
// With Invalidate(inv, keys) (a *cacheguard.Guard is an Invalidator), the
// cache keys of each row a write inserted, updated or deleted, and the new
// key of a row a write moved (SET id = ...), are invalidated after its
// transaction's COMMIT, before its locks are released; never after a ROLLBACK,
// and also after a COMMIT that returned an error (it may have committed). A
// committed write returns nil even when its invalidation fails (the Observer
// hears EventInvalidateFailed under its context before it returns); until a
// retry succeeds (RetryInvalidation: 8 attempts, at most 10000 keys pending),
// reads may return the old value. InvalidateAgain repeats each (replicas).
//
// # Redis unavailable, refusals, shutdown
//
// The first attempt at a row lock is bounded by UnavailableAfter (500ms),
// whatever the client's timeouts. When the lock service is unavailable
// (locks.ErrUnavailable) the write is not sent and fails with ErrLock (also
// matching locks.ErrNotObtained and locks.ErrUnavailable); FailOpen sends it
// unguarded (a warning, EventWroteUnguarded), never on contention.
//
// Shut down in this order: the HTTP server's Shutdown, plugin.Shutdown(ctx)
// (waits for guarded statements in flight, runs delayed repeats, retries failed
// invalidations; what ctx cuts off is returned as ErrInvalidate), the Locker's
// Shutdown or Close, then the database; Close drops the background work.
// Without them, locks are left to their leases, invalidations to TTLs.
//
// # Limits
//
//   - Raw and Exec are not guarded (SQL text): run them inside Transaction,
//     declaring the rows they change, to have those locked, claimed and
//     invalidated. Unguarded(ctx) skips locks and fence (still invalidates);
//     Unkeyed(PassThrough) sends unnamed writes unlocked, Unkeyed(Refuse)
//     fails them with ErrUnkeyed (run association operations in a transaction
//     so a refusal rolls the whole back).
//   - A panic in a GORM hook during a guarded statement skips the release: the
//     row lock stays held, renewed, until the Locker is closed (Shutdown waits
//     for the statement until ctx ends). Recover in hooks, or use Transaction.
//   - Outside a transaction, Save of a missing row releases the lock between
//     its UPDATE and its insert (a row inserted in between may be refused).
//
// The SQL it adds, how it follows transactions, and why: gormplugin/DESIGN.md.
package gormplugin
