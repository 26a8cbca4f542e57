package locks

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

var (
	// ErrNodeTimeout is the cause recorded for a Redlock node that did not
	// answer within the per-node timeout (see NodeTimeout).
	ErrNodeTimeout = errors.New("locks: redlock node did not answer in time")
)

// NodeError is the failure of one Redlock node: no answer in time
// (ErrNodeTimeout), a network or Redis error, or the caller's context error.
type NodeError struct {
	Addr string // the node, as named in NewRedlock's documentation
	Err  error  // the cause
}

func (e NodeError) Error() string { return e.Addr + ": " + e.Err.Error() }

// Unwrap returns the cause.
func (e NodeError) Unwrap() error { return e.Err }

// RedlockError reports what each node answered to a Redlock operation that
// did not reach a quorum in time. For Op "lock" (Lock and TryLock; the last
// attempt) it matches ErrNotObtained with errors.Is, and the caller's context
// error too when the context ended the call, or ErrLost when the owner's
// scope was lost (see WithOwner); otherwise also ErrBusy when the nodes that
// refused (held by another owner) kept the quorum out of reach, or
// ErrUnavailable when failed nodes did (or the quorum came too late). Every
// node that granted a failed attempt was asked to release it before the
// error was returned.
type RedlockError struct {
	Op       string        // "lock", "extend" or "unlock"
	Name     string        // the lock name
	Nodes    int           // how many nodes the Redlock has
	Quorum   int           // how many of them had to agree
	Granted  []string      // nodes that granted the lock (or confirmed the extension or release)
	Refused  []string      // nodes where another owner holds the lock, or this hold (for a nested Lock, the owner's holding) was gone
	Failed   []NodeError   // nodes that did not answer usefully, each with its cause
	Attempts int           // "lock": how many attempts were made
	Waited   time.Duration // "lock": how long the call took
	Err      error         // ErrNoValidity, ErrLost, the caller's context error, or nil
}

func (e *RedlockError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "locks: redlock %s %q failed: %d of %d nodes granted, %d needed", e.Op, e.Name, len(e.Granted), e.Nodes, e.Quorum)
	if len(e.Granted) > 0 {
		fmt.Fprintf(&b, "; granted: %s", strings.Join(e.Granted, ", "))
	}
	if len(e.Refused) > 0 {
		fmt.Fprintf(&b, "; refused: %s", strings.Join(e.Refused, ", "))
	}
	if len(e.Failed) > 0 {
		b.WriteString("; failed: ")
		for i, f := range e.Failed {
			if i > 0 {
				b.WriteString(", ")
			}
			fmt.Fprintf(&b, "%s (%v)", f.Addr, f.Err)
		}
	}
	if e.Op == "lock" && e.Attempts > 1 {
		fmt.Fprintf(&b, "; %d attempts in %v", e.Attempts, e.Waited.Round(time.Millisecond))
	}
	if e.Err != nil {
		b.WriteString(": ")
		b.WriteString(e.Err.Error())
	}
	return b.String()
}

// Unwrap returns ErrNotObtained (for Op "lock"), Err, and each node's failure.
func (e *RedlockError) Unwrap() []error {
	var errs []error
	if e.Op == "lock" {
		errs = append(errs, ErrNotObtained)
		switch {
		case e.Err != nil && !unavailableCause(e.Err):
			// The caller's context ended the call, or the owner's scope was
			// lost: neither busy nor unavailable.
		case e.Err == nil && len(e.Refused) > 0 && len(e.Failed) <= e.Nodes-e.Quorum:
			// Without the refusals a quorum was within reach: contention.
			errs = append(errs, ErrBusy)
		default:
			errs = append(errs, ErrUnavailable)
		}
	}
	if e.Err != nil {
		errs = append(errs, e.Err)
	}
	for _, f := range e.Failed {
		errs = append(errs, f)
	}
	return errs
}
