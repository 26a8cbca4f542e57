package gormplugin

import (
	"errors"
	"fmt"

	"github.com/cacheguard/cacheguard/locks"
)

var (
	// ErrInvalid marks a bad argument or configuration, reported before
	// anything is sent to Redis or the database.
	ErrInvalid = errors.New("gormplugin: invalid argument")
	// ErrStaleWrite means a guarded write was refused because its writer no
	// longer held the row's lock: a newer holder's fence is already in the row,
	// or the lock was known to be lost before the write was sent. The statement
	// changed nothing and its transaction is rolled back. The error is a
	// *StaleWriteError.
	ErrStaleWrite = errors.New("gormplugin: stale write refused")
	// ErrLock means a row lock could not be taken (held too long by another
	// writer, the context ended, or Redis is unreachable). The write was not
	// sent. The error also matches locks.ErrNotObtained and its cause:
	// locks.ErrBusy when another owner held the row, locks.ErrUnavailable when
	// the lock service could not be asked (see UnavailableAfter), the
	// context's error when the caller's context ended the wait.
	ErrLock = errors.New("gormplugin: row lock not obtained")
	// ErrUnkeyed means a write whose rows cannot be named by primary key (a
	// batch Update or Delete with a Where condition) was refused: see Unkeyed.
	ErrUnkeyed = errors.New("gormplugin: write without a primary key refused")
	// ErrUnnamedRows means a write was refused before the database: the
	// plugin cannot name every row it can change the way the database will
	// match them (see the package doc). The message says what to write instead.
	ErrUnnamedRows = errors.New("gormplugin: rows not named, write refused")
	// ErrLockOrder means a transaction needed a row lock that sorts before one
	// it already holds while another writer held it. Waiting could deadlock, so
	// the statement fails instead; declare the rows up front with Transaction.
	ErrLockOrder = errors.New("gormplugin: row lock needed out of order")
	// ErrForeignTx means a guarded write ran inside a transaction the plugin
	// did not see begin (for example one begun on a *sql.Conn from
	// db.Connection), so it could not hold the row lock until that
	// transaction's COMMIT.
	ErrForeignTx = errors.New("gormplugin: write inside a transaction the plugin cannot follow")
	// ErrInvalidate is returned by Shutdown when its context ended before
	// every invalidation owed to a committed write was made: those keys may
	// be served stale until they expire. A write whose invalidation fails
	// returns nil (it has committed); the invalidation is retried in the
	// background and reported to the Observer.
	ErrInvalidate = errors.New("gormplugin: committed, but cache invalidation failed")
)

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalid}, args...)...)
}

// StaleWriteError is the error of a refused stale write. It matches
// ErrStaleWrite and locks.ErrNotHeld with errors.Is (the writer no longer
// holds the row's lock, or never held it under the version it read), so an
// HTTP error mapper that knows only package locks answers it as a lost lock.
type StaleWriteError struct {
	Name   string // the row's lock name, "<table>:<primary key>"
	Fence  uint64 // the refused writer's fence token (0 when unknown)
	Stored uint64 // the fence stored in the row (0 when Lost)
	Read   uint64 // the fence the written struct carried (its version), when the row no longer has it
	// Missing: the row no longer exists, though the struct was read from it
	// (Read): it was deleted since, and a Save must not bring it back.
	Missing bool
	Lost    bool  // the lock was known lost before the write; the database was not asked
	Err     error // the Locker's error when it found the scope lost (locks.ErrLost), or nil
}

func (e *StaleWriteError) Error() string {
	switch {
	case e.Lost && e.Err != nil:
		return fmt.Sprintf("gormplugin: stale write refused: the lock scope of %q was lost before the write: %v", e.Name, e.Err)
	case e.Lost:
		return fmt.Sprintf("gormplugin: stale write refused: the lock on %q (fence %d) was lost before the write", e.Name, e.Fence)
	case e.Missing:
		return fmt.Sprintf("gormplugin: stale write refused: row %q, read with fence %d, has been deleted since", e.Name, e.Read)
	case e.Read != 0 || e.Stored <= e.Fence:
		return fmt.Sprintf("gormplugin: stale write refused: row %q carries fence %d, not the %d the written struct carries: another writer committed since the struct was read (or it was built, not read)", e.Name, e.Stored, e.Read)
	}
	return fmt.Sprintf("gormplugin: stale write refused: row %q carries fence %d, newer than this writer's %d", e.Name, e.Stored, e.Fence)
}

// Unwrap returns ErrStaleWrite, locks.ErrNotHeld and the Locker's error, if any.
func (e *StaleWriteError) Unwrap() []error {
	errs := []error{ErrStaleWrite, locks.ErrNotHeld}
	if e.Err != nil {
		errs = append(errs, e.Err)
	}
	return errs
}

// PanicError is returned by Transaction when its function panicked; the
// transaction was rolled back and its row locks released.
type PanicError struct {
	Value any    // the value passed to panic
	Stack []byte // the panicking goroutine's stack
}

func (e *PanicError) Error() string {
	return fmt.Sprintf("gormplugin: transaction function panicked: %v", e.Value)
}

// Unwrap returns the panic value when it is an error.
func (e *PanicError) Unwrap() error {
	err, _ := e.Value.(error)
	return err
}
