package locks

import (
	"context"
	"time"
)

// grant is what a command that set a lock's expiry in Redis — an
// acquisition, a hand-off by a release, a re-entry, a renewal, an Extend, a
// Redlock round — tells its holder. The one rule for a holder's local
// deadline, on every path:
//
//	local deadline = sent + lease
//
// where lease is the lease that very command carried (for Redlock, its
// validity: lease − drift) and sent a reading of the monotonic clock taken
// before that command ran in Redis: the command's own send, or, for a
// hand-off that another process's release made, the send of this waiter's
// last command whose reply showed it not yet holding (Redis ran that release
// after it). Redis's expiry is then never earlier than the local deadline: a
// holder never believes it holds a lock Redis may have given away. And a hold
// lost at its deadline is never given back before Redis's own expiry of it
// (see held.lose): the next holder never starts before that.
type grant struct {
	sent  time.Time
	lease time.Duration
}

// spent reports whether g's local deadline has passed: a grant read only
// then grants nothing (the lock may already have expired in Redis, or be
// about to), and the acquisition is given back and fails with ErrNoValidity
// (Client.granted, Redlock's attempt; a Lock asks again within its budget):
// no caller is handed a Lock it does not hold. A hand-off, whose start this
// process cannot know, is confirmed before that can happen (due).
func (g grant) spent() bool { return !time.Now().Before(g.sent.Add(g.lease)) }

// renewAt is when a holder of g renews it: at a third of its lease.
func (g grant) renewAt() time.Time { return g.sent.Add(g.lease / 3) }

// due reports whether g's renewal is due already: a hand-off read that late
// is confirmed (extended from now) before it is handed over (see
// acquisition.wait).
func (g grant) due() bool { return !time.Now().Before(g.renewAt()) }

// apply makes g h's local deadline, and schedules its next renewal (renewAt).
// h.mu is held.
func (h *held) apply(g grant) {
	if h.ended {
		return
	}
	h.deadline = g.sent.Add(g.lease)
	if h.cfg.renew {
		h.nextRenew = g.renewAt()
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
	if d := sent.Add(lease); d.Before(h.deadline) {
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
