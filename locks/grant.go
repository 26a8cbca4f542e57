package locks

import (
	"context"
	"time"

	"github.com/cacheguard/cacheguard/internal/lease"
)

// grant is what a command that set a lock's expiry in Redis — an
// acquisition, a hand-off by a release, a re-entry, a renewal, an Extend, a
// Redlock round — tells its holder, under the one rule for a holder's local
// deadline on every path (internal/lease): sent + lease, where lease is the
// lease that very command carried (for Redlock, its validity: lease − drift)
// and sent a reading of the monotonic clock taken before that command ran in
// Redis: the command's own send, or, for a hand-off that another process's
// release made, the send of this waiter's last command whose reply showed it
// not yet holding (Redis ran that release after it). A hold lost at its
// deadline is never given back before Redis's own expiry of it (see
// held.lose): the next holder never starts before that.
//
// A grant read Spent grants nothing (the lock may already have expired in
// Redis, or be about to: less than its hand-over margin, lease/100 + 2 ms,
// is left): the acquisition is given back and fails with
// ErrNoValidity (Client.granted, Redlock's attempt; a Lock asks again within
// its budget), so no caller is handed a Lock it does not hold. A hand-off,
// whose start this process cannot know, is confirmed before that can happen:
// one read once its renewal is Due is extended from now before it is handed
// over (see acquisition.wait).
type grant = lease.Grant

// apply makes g h's local deadline, and schedules its next renewal (RenewAt).
// h.mu is held.
func (h *held) apply(g grant) {
	if h.ended {
		return
	}
	h.deadline = g.Deadline()
	if h.cfg.renew {
		h.nextRenew = g.RenewAt()
	} else {
		h.nextRenew = h.deadline // checked for expiry only
	}
}

// A held's renewals and Extends go on the wire one at a time (wire): Redis
// runs them in the order they were sent, and their replies apply in that
// order, each with the lease it carried, so an older command's reply can
// never lengthen the deadline a newer one set. Each carries a sequence
// number (seq) that the script compares with the last one it applied: a
// command whose reply never came and that reaches Redis late never shortens
// what a newer one set (see extend.lua). A command may shorten the lease
// (Extend to less than is left), and Redis may apply it before its reply
// comes, or without its reply ever coming: from its send on, the deadline
// is therefore at most its grant's (onWire), whatever its outcome.

// onWire puts a command carrying lease, sent at sent, on h's wire. h.mu is held.
func (h *held) onWire(sent time.Time, lease time.Duration) {
	h.wire, h.wireLease = true, lease
	h.seq++
	if d := (grant{Sent: sent, Lease: lease}).Deadline(); d.Before(h.deadline) {
		h.deadline = d
		defer h.ops.renewer().poke() // Lost closes at the new deadline
	}
}

// takeWire waits until no renewal or Extend of h is on the wire, or ctx
// ends, then puts one carrying lease on it, to be sent from the time it
// returns; ErrNotHeld once h's Unlock began or h ended. The caller ends it
// with leaveWire.
func (h *held) takeWire(ctx context.Context, lease time.Duration) (time.Time, error) {
	for {
		h.mu.Lock()
		if h.releasing || h.ended {
			// Its Unlock began, or it was lost: a command sent now could set a
			// lease on a hold nobody keeps (its release still on its way).
			h.mu.Unlock()
			return time.Time{}, ErrNotHeld
		}
		if !h.wire {
			sent := time.Now()
			h.onWire(sent, lease)
			h.mu.Unlock()
			return sent, nil
		}
		if h.wireFree == nil {
			h.wireFree = make(chan struct{})
		}
		free := h.wireFree
		h.mu.Unlock()
		select {
		case <-free:
		case <-ctx.Done():
			return time.Time{}, ctx.Err()
		}
	}
}

// leaveWire ends the command on h's wire; g, when the command set the
// expiry, becomes h's deadline (see grant).
func (h *held) leaveWire(g *grant) {
	h.mu.Lock()
	if g != nil {
		h.apply(*g)
	}
	h.wire = false
	if h.wireFree != nil {
		close(h.wireFree)
		h.wireFree = nil
	}
	h.mu.Unlock()
}
