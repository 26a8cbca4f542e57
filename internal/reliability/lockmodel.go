package reliability

import (
	"fmt"
	"time"

	"github.com/anishathalye/porcupine"
)

// LockOp is an operation on one named lock.
type LockOp int

// Lock operations.
const (
	Acquire LockOp = iota + 1
	Release
)

// Outcome is what an operation returned.
type Outcome int

// Outcomes. Unknown is an operation that failed in transit or timed out: it
// may or may not have taken effect.
const (
	Unknown  Outcome = iota
	Granted          // Acquire: the lock is held, with Fence
	Refused          // Acquire: held by another; Write: a higher token was applied
	Released         // Release: the hold was given back
	NotHeld          // Release: the caller no longer held the lock
	Done             // Write or Read succeeded
)

func (o Outcome) String() string {
	return [...]string{"unknown", "granted", "refused", "released", "not-held", "ok"}[o]
}

// LockInput is the input of a lock operation. Call and Return repeat the
// operation's times (Return is Never for an unknown outcome) because the
// model's legality depends on them: a lease runs out in real time.
type LockInput struct {
	Op     LockOp
	Client int
	Lease  time.Duration // Acquire: the fixed lease asked for
	// Unfenced marks a lock that issues no fence tokens (Redlock): its
	// grants are not checked for increasing fences.
	Unfenced bool
	Call     int64
	Return   int64
}

// LockOutput is the output of a lock operation.
type LockOutput struct {
	Outcome Outcome
	Fence   uint64 // Granted
}

// lockState is the model's state: who holds the lock, until when at the
// earliest, and the largest fence granted.
type lockState struct {
	holder    int   // client id, or -1 when free
	leaseEnd  int64 // the earliest moment the holder's lease can have run out
	lastFence uint64
}

const free = -1

// LockModel is the sequential specification of a lock with leases and fencing
// tokens, for porcupine. It checks safety, not liveness:
//
//   - A grant is legal when the lock is free, or when the holder's lease may
//     have run out by the grant's return (leaseEnd ≤ Return). A holder's
//     leaseEnd is its acquisition's call time plus its lease: the server
//     started the lease no earlier than the call was made, so no correct
//     server can expire it sooner. A grant while that lease is surely still
//     running is illegal.
//   - A grant's fence must exceed every fence granted before it (unless the
//     lock issues no fences, as Redlock).
//   - A release succeeds only for the holder. NotHeld is always legal and
//     leaves the caller not holding: besides a lease that ran out, it is what
//     a release whose reply was lost answers when go-redis retries it (the
//     retry finds the lock already gone), which misreports but is safe.
//   - A refusal is always legal (liveness is not checked): a waiting Lock that
//     gave up may have been handed the lock and given it back within its call.
//   - An unknown outcome may or may not have taken effect; an unknown grant
//     keeps the lock until its lease runs out.
//
// Leases must be fixed (locks.NoRenewal) for the model to know them;
// with renewal the model would only know a lower bound, so it stays sound but
// becomes lenient.
var LockModel = porcupine.NondeterministicModel{
	Init: func() []any { return []any{lockState{holder: free}} },
	Step: func(state, input, output any) []any {
		s, in, out := state.(lockState), input.(LockInput), output.(LockOutput)
		switch in.Op {
		case Acquire:
			grant := func(fence uint64) lockState {
				return lockState{holder: in.Client, leaseEnd: in.Call + int64(in.Lease), lastFence: max(fence, s.lastFence)}
			}
			mayGrant := s.holder == free || s.leaseEnd <= in.Return
			switch out.Outcome {
			case Granted:
				if mayGrant && (in.Unfenced || out.Fence > s.lastFence) {
					return []any{grant(out.Fence)}
				}
				return nil
			case Refused:
				return []any{s}
			default: // unknown: the fence, if granted, is not known (only that it is larger)
				if mayGrant {
					return []any{s, grant(0)}
				}
				return []any{s}
			}
		case Release:
			mine := s.holder == in.Client
			gone := s
			gone.holder = free
			switch out.Outcome {
			case Released:
				if mine {
					return []any{gone}
				}
				return nil
			case NotHeld:
				if mine {
					return []any{gone}
				}
				return []any{s}
			default:
				if mine {
					return []any{s, gone}
				}
				return []any{s}
			}
		}
		return nil
	},
	DescribeOperation: func(input, output any) string {
		in, out := input.(LockInput), output.(LockOutput)
		if in.Op == Acquire {
			if out.Outcome == Granted {
				return fmt.Sprintf("acquire(c%d, %v) → granted %d", in.Client, in.Lease, out.Fence)
			}
			return fmt.Sprintf("acquire(c%d, %v) → %v", in.Client, in.Lease, out.Outcome)
		}
		return fmt.Sprintf("release(c%d) → %v", in.Client, out.Outcome)
	},
	DescribeState: func(state any) string {
		s := state.(lockState)
		if s.holder == free {
			return fmt.Sprintf("free (last fence %d)", s.lastFence)
		}
		return fmt.Sprintf("c%d until ≥%v (fence %d)", s.holder, time.Duration(s.leaseEnd), s.lastFence)
	},
}
