package locks

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/cacheguard/cacheguard/internal/rcmd"
)

var (
	// ErrNotObtained means the lock is held by someone else (TryLock), or could
	// not be taken before the wait budget or the caller's context ended (Lock).
	ErrNotObtained = errors.New("locks: not obtained")
	// ErrNotHeld means the caller does not hold the lock (any more): it expired,
	// was deleted, or is held by another owner.
	ErrNotHeld = errors.New("locks: not held")
	// ErrLost is the cause of a nested acquisition (WithOwner) of a name whose
	// scope is lost: this process still has a Lock of the name under the same
	// owner, not yet Unlocked, that lost the lock. Granting the name afresh
	// would let a write based on what was read under the lost Lock land under
	// a newer fence, so the acquisition fails and takes nothing until every
	// Lock of that scope is Unlocked. It matches ErrNotHeld and ErrNotObtained,
	// and neither ErrBusy nor ErrUnavailable: waiting or retrying cannot help.
	ErrLost = fmt.Errorf("locks: lock scope lost: %w", ErrNotHeld)
	// ErrInvalid marks a bad argument, reported before anything is sent to Redis.
	ErrInvalid = errors.New("locks: invalid argument")
	// ErrClosed is the cause of an acquisition on a Client or Redlock that is
	// closing or closed (Close, Shutdown): refused, ended while waiting, or
	// granted too late and given back. Such failures also match
	// ErrNotObtained and ErrUnavailable (a process shutting down answers like
	// a lock service that is away: try again, elsewhere).
	ErrClosed = errors.New("locks: client closed")
	// ErrStillHeld is returned by Shutdown when its context ended while
	// locks were still held: the error names them; they were then dropped as
	// Close drops them (Lost closes with ErrClosed; they expire with their
	// lease in Redis).
	ErrStillHeld = errors.New("locks: locks still held at shutdown")
	// ErrConflict is returned by Optimistic when every retry met a conflicting write.
	ErrConflict = errors.New("locks: optimistic transaction kept conflicting")
	// ErrBusy marks an acquisition that failed because another owner held the
	// lock: TryLock found it held, or Lock's wait budget ran out behind a
	// holder. Every Locker's contention matches it (a *NotObtainedError of a
	// Client, a *RedlockError of a Redlock), and it also matches ErrNotObtained.
	ErrBusy = errors.New("locks: held by another owner")
	// ErrUnavailable marks an acquisition that failed because the lock service
	// could not be asked: Redis unreachable or answering errors, too few
	// replicas acknowledging in time (Replicas; a *ReplicaError), the
	// client closing (ErrClosed), for Redlock too many nodes failed for a
	// quorum or the quorum came too late. It also matches ErrNotObtained and
	// the cause. Retrying later can help; the lock was not held by another.
	// It is the same value as cacheguard.ErrUnavailable.
	ErrUnavailable = rcmd.ErrUnavailable
	// ErrNoValidity means an acquisition was granted only after its lease had
	// run out on the local clock, or so close to that end that less than a
	// hand-over margin was left (a hundredth of the lease plus 2 ms), counted
	// from before the command was sent (for a Redlock, the lease less the
	// clock-drift allowance, until a quorum granted it): the lock could
	// already have expired in Redis, or would before its caller could act
	// under it, so it is given
	// back and the attempt counts as failed (it matches ErrUnavailable): a
	// TryLock returns it, a Lock asks again within its wait budget. A lease
	// this short against Redis's latency cannot be granted safely.
	ErrNoValidity = errors.New("locks: granted with no validity left")
)

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalid}, args...)...)
}

// NotObtainedError is the error of a failed acquisition. It matches
// ErrNotObtained with errors.Is, and the context's error too when the caller's
// context ended the wait.
//
// RetryAfter is the holder's remaining lease when last seen: when the lock
// frees at the latest if its holder stopped renewing it (crashed, paused). It
// is an upper bound, not a forecast: a live holder renews every third of the
// lease, so its lock always shows between two thirds and all of the lease,
// and it frees when the holder unlocks, usually sooner.
type NotObtainedError struct {
	Name       string        // the lock name
	RetryAfter time.Duration // the holder's remaining lease when last seen (0 if unknown): an upper bound
	Waited     time.Duration // how long the call waited
	Err        error         // the cause: a context error, a Redis error, a *ReplicaError, or nil
}

func (e *NotObtainedError) Error() string {
	msg := fmt.Sprintf("locks: not obtained: %q", e.Name)
	if e.RetryAfter > 0 {
		msg += fmt.Sprintf(" (held for another %v)", e.RetryAfter.Round(time.Millisecond))
	}
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	return msg
}

// Unwrap returns ErrNotObtained and the cause, with ErrBusy when the lock was
// held by another owner (no cause) and ErrUnavailable when the cause is a
// failure of the lock service (not the caller's context, not ErrLost).
func (e *NotObtainedError) Unwrap() []error {
	switch {
	case e.Err == nil:
		return []error{ErrNotObtained, ErrBusy}
	case unavailableCause(e.Err):
		return []error{ErrNotObtained, ErrUnavailable, e.Err}
	}
	return []error{ErrNotObtained, e.Err}
}

// unavailableCause reports whether err, the cause of a failed acquisition,
// says that the lock service could not grant it (rather than the caller's
// context ending, bad input, or the owner's scope being lost).
func unavailableCause(err error) bool {
	return !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) &&
		!errors.Is(err, ErrInvalid) && !errors.Is(err, ErrNotHeld)
}

// ReplicaError reports that fewer replicas than asked acknowledged the lock's
// write in time (see Replicas), so the lock was released and not obtained.
type ReplicaError struct {
	Want, Got int
}

func (e *ReplicaError) Error() string {
	return fmt.Sprintf("locks: %d of %d replicas acknowledged the lock", e.Got, e.Want)
}
