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
// given back, never acted on. A holder renews at a third of its lease
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

// Spent reports whether g's local deadline has passed.
func (g Grant) Spent() bool { return !time.Now().Before(g.Deadline()) }

// RenewAt is when a holder of g renews it: a third of its lease past Sent.
func (g Grant) RenewAt() time.Time { return g.Sent.Add(g.Lease / 3) }

// Due reports whether g's renewal is due already.
func (g Grant) Due() bool { return !time.Now().Before(g.RenewAt()) }
