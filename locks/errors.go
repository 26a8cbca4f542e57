package locks

import (
	"errors"
	"fmt"
	"time"
)

var (
	// ErrNotObtained means the lock is held by someone else (TryLock), or could
	// not be taken before the wait budget or the caller's context ended (Lock).
	ErrNotObtained = errors.New("locks: not obtained")
	// ErrNotHeld means the caller does not hold the lock (any more): it expired,
	// was deleted, or is held by another owner.
	ErrNotHeld = errors.New("locks: not held")
	// ErrInvalid marks a bad argument, reported before anything is sent to Redis.
	ErrInvalid = errors.New("locks: invalid argument")
	// ErrClosed is returned by calls on a Client after Close.
	ErrClosed = errors.New("locks: client closed")
	// ErrConflict is returned by Optimistic when every retry met a conflicting write.
	ErrConflict = errors.New("locks: optimistic transaction kept conflicting")
)

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalid}, args...)...)
}

// NotObtainedError is the error of a failed acquisition. It matches
// ErrNotObtained with errors.Is, and the context's error too when the caller's
// context ended the wait.
type NotObtainedError struct {
	Name       string        // the lock name
	RetryAfter time.Duration // the holder's remaining lease when last seen (0 if unknown)
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

// Unwrap returns ErrNotObtained and the cause.
func (e *NotObtainedError) Unwrap() []error {
	if e.Err == nil {
		return []error{ErrNotObtained}
	}
	return []error{ErrNotObtained, e.Err}
}

// ReplicaError reports that fewer replicas than asked acknowledged the lock's
// write in time (see WithReplicas), so the lock was released and not obtained.
type ReplicaError struct {
	Want, Got int
}

func (e *ReplicaError) Error() string {
	return fmt.Sprintf("locks: %d of %d replicas acknowledged the lock", e.Got, e.Want)
}
