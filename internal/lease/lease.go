// Package lease is the one rule for a lease's local deadline, which every
// holder of a lease in this module follows: a locks holder (its grant from an
// acquisition, a hand-off, a renewal, an Extend, a Redlock round) and a
// cacheguard fill (its fill lease).
//
// A command that sets an expiry in Redis tells its holder a Grant: the lease
// it carried and when it was sent, a reading of the monotonic clock taken
// before Redis ran it. The holder's local deadline is
//
//	local deadline = sent + lease
//
// and Redis's expiry is never earlier, whenever the command ran and however
// late its reply came: a holder never believes it holds what Redis may have
// given away. A grant read past its deadline grants nothing (Spent): it is
// given back, never acted on — and so is one read with less than its hand-over
// margin left (Margin: a hundredth of the lease plus 2 ms, the size of
// Redlock's clock-drift allowance), which would reach its holder's caller with
// nothing to act under: the moments between the check and the caller's first
// look at it (joining an owner's scope, an event hook, a scheduler's delay)
// would spend it. A holder renews at a third of its lease
// (RenewAt), so that two renewals in a row can fail before the lease runs
// out.
package lease

import "time"

// Grant is a lease and the send of the command that set it.
type Grant struct {
	Sent  time.Time
	Lease time.Duration
}

// Deadline is g's local deadline: Sent + Lease.
func (g Grant) Deadline() time.Time { return g.Sent.Add(g.Lease) }

// Margin is the least validity a grant must leave to be handed over: a
// hundredth of its lease plus 2 ms.
func (g Grant) Margin() time.Duration { return g.Lease/100 + 2*time.Millisecond }

// Spent reports whether g leaves less than its Margin before its local
// deadline: it grants nothing.
func (g Grant) Spent() bool { return time.Until(g.Deadline()) < g.Margin() }

// RenewAt is when a holder of g renews it: a third of its lease past Sent.
func (g Grant) RenewAt() time.Time { return g.Sent.Add(g.Lease / 3) }

// Due reports whether g's renewal is due already.
func (g Grant) Due() bool { return !time.Now().Before(g.RenewAt()) }
