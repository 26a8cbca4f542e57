package locks

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"
)

// Lock is one acquisition of a named lock. Its methods are safe for concurrent use.
type Lock struct {
	h      *held
	parent context.Context // the acquiring call's, for Context's values

	mu   sync.Mutex      // guards done and ctx
	done bool            // Unlock was called
	ctx  context.Context // Context's, made on first use
}

// Name returns the lock name.
func (l *Lock) Name() string { return l.h.name }

// Fence returns the fence token of this acquisition: a number larger than the
// token of every earlier acquisition of the same name, by any client or process
// (re-entries share the token of the acquisition they re-enter). Pass it to the
// resource you write, and have the resource refuse writes with a token smaller
// than one it has seen: a holder that was paused past its lease is then
// refused, which no lock alone can guarantee. A Fence of 0 means the Locker
// issues no tokens (Redlock: see its doc; NoFencing): there is nothing to
// fence with.
func (l *Lock) Fence() uint64 { return l.h.publicFence() }

// Lost returns a channel closed when ownership is lost while held: the lease
// ran out, the key was deleted or taken over, or renewal failed past the lease.
// It is not closed by Unlock.
func (l *Lock) Lost() <-chan struct{} { return l.h.lostChan() }

// Context returns a context cancelled when the lock is lost or released: run
// the critical section under it so that work stops when exclusion ends. It
// carries the values of the context the lock was acquired with (not its
// cancellation or deadline).
func (l *Lock) Context() context.Context {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ctx == nil {
		ctx, cancel := context.WithCancelCause(context.WithoutCancel(l.parent))
		l.h.onEnd(cancel)
		l.ctx = ctx
	}
	return l.ctx
}

// TTL returns how long the lock is certainly still held, on the local
// monotonic clock: the lease carried by the last command that set the lock's
// expiry in Redis (an acquisition, hand-off, renewal or Extend), counted from
// before that command ran, so it never exceeds what Redis keeps. Zero once
// lost or released.
func (l *Lock) TTL() time.Duration {
	l.h.mu.Lock()
	defer l.h.mu.Unlock()
	if l.h.ended {
		return 0
	}
	return max(0, time.Until(l.h.deadline))
}

// Unlock releases this acquisition: one hold of a re-entered lock, or the lock
// itself. Only the holder can release: the owner token is compared inside
// Redis. It returns ErrNotHeld when the lock had been lost (the first time;
// later calls return nil) and nil when called again after a release, so a hold
// is never given back twice. A lock whose lease ran out unnoticed while nobody
// else took it (its fence is still the latest) counts as released: nobody
// else held it meanwhile. A release that go-redis retried after a lost reply
// answers as the release it was. A lock that Close dropped while held (see
// Client.Close) returns ErrNotHeld too, but its key, which Close left to its
// lease, is released then, if this owner still holds it. Use a context that
// the caller's cancellation does not end (context.WithoutCancel) when the
// release must happen regardless.
func (l *Lock) Unlock(ctx context.Context) error {
	l.mu.Lock()
	if l.done {
		l.mu.Unlock()
		return nil
	}
	l.done = true
	l.mu.Unlock()

	h := l.h
	if h.sc != nil {
		h.sc.leave(h)
	}
	if err := h.beginRelease(); err != nil {
		if errors.Is(err, ErrClosed) {
			// Close dropped the holding but kept its key until its lease
			// ends, for the application was still using it (see lose): it
			// is done now, and the key goes, token-checked, so that the
			// name is free for others at once, not a lease later.
			_, _ = h.ops.release(ctx, h)
		}
		return ErrNotHeld
	}
	n, err := h.ops.release(ctx, h)
	switch {
	case err != nil:
		// The outcome is unknown; stop renewing so that the lease ends it.
		h.retire(ctx, err)
		return err
	case n == -2:
		h.lose(ErrNotHeld) // the owner's other holds stand
		return ErrNotHeld
	case n < 0:
		h.loseHolding(ErrNotHeld)
		return ErrNotHeld
	}
	h.retire(ctx, nil)
	return nil
}

// Extend sets the lease to d from now, if the lock is still held by this owner;
// ErrNotHeld otherwise (and the lock counts as lost). Under a ctx that has
// already ended it returns ctx's error and extends nothing.
func (l *Lock) Extend(ctx context.Context, d time.Duration) error {
	if d < MinLease {
		return invalid("lease %v is shorter than %v", d, MinLease)
	}
	h := l.h
	if err := h.lostErr(); err != nil {
		return ErrNotHeld
	}
	if err := ctx.Err(); err != nil {
		return err // its command would be sent detached from ctx, and run
	}
	sent, err := h.takeWire(ctx, d) // a renewal on the wire answers first
	if err != nil {
		return err
	}
	if err := h.ops.extend(ctx, h, d); err != nil {
		h.leaveWire(nil)
		if refusal(err) {
			h.refused(err)
			return ErrNotHeld
		}
		return err
	}
	h.mu.Lock()
	h.lease = d // what renewals carry from now on
	h.mu.Unlock()
	h.leaveWire(&grant{Sent: sent, Lease: d})
	return nil
}

// ops are the Redis operations behind a held lock: one server (Client) or a
// quorum of servers (Redlock).
type ops interface {
	// release gives back h's hold: the owner's remaining holds, -1 when the
	// owner's holding is gone, -2 when only this hold is (see Unlock).
	release(ctx context.Context, h *held) (remaining int64, err error)
	// extend sets h's lease: nil, errNotOwner or errHoldGone (see refusal),
	// another error when the outcome is unknown.
	extend(ctx context.Context, h *held, lease time.Duration) error
	// abandon gives back h's hold in Redis without waiting, after h ended;
	// expired: h ended at or past its local deadline (see held.lose).
	abandon(h *held, expired bool)
	renewer() *renewer
}

// held is one holding of a lock name by one owner in this process.
type held struct {
	ops    ops
	name   string
	keys   []string // lock, fence, queue, deadlines (hash-tagged to one slot)
	keyv   []any    // keys, boxed once for script calls (Client only)
	owner  string
	ownerv any // owner, boxed once (Client only)
	acqv   any // this hold's acquisition id, boxed (Client only)
	fenceV any // fence as a reply carried it, when it did (Client only)
	fence  uint64
	cfg    *config
	sc     *scope    // the owner's scope of the name (WithOwner only), set before the renewer sees h
	since  time.Time // when the grant came back: its events' Held counts from here

	mu        sync.Mutex                // guards the fields below
	lost      chan struct{}             // made on first use: most callers never ask
	cancels   []context.CancelCauseFunc // of its Locks' Contexts (onEnd)
	turn      *turnKeeper               // its process's gate turn for the name, kept after waiting (Client only)
	lease     time.Duration             // the lease renewals carry
	deadline  time.Time                 // the lease's end on the local monotonic clock (see grant)
	nextRenew time.Time
	wire      bool          // a renewal or Extend is on the wire (see takeWire)
	wireFree  chan struct{} // closed when wire clears (made by a waiting Extend)
	wireLease time.Duration // the lease the command on the wire carries
	seq       int64         // the sequence number of h's last renewal or Extend (see extend.lua)
	releasing bool          // its Unlock's release is on the wire: the release's reply, not renewals or the deadline, decides how it ends
	lastErr   error         // the last renewal's error, while none succeeded since
	ended     bool          // released or lost
	giving    bool          // a release of it was sent or is about to be (Redlock: see Redlock.releasing)
	err       error         // why it was lost
}

// newHeld returns the holding of a lock granted by g (a hand-off's claim
// lease may be shorter than the configured one: the first renewal comes at a
// third of it and restores the full lease). The caller registers it with the
// renewer.
func newHeld(o ops, name string, keys []string, owner string, fence uint64, cfg *config, g grant) *held {
	h := &held{ops: o, name: name, keys: keys, owner: owner, fence: fence, cfg: cfg, since: time.Now(), lease: cfg.lease}
	h.apply(g)
	return h
}

func (h *held) lostChan() <-chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.lost == nil {
		h.lost = make(chan struct{})
		if h.err != nil {
			close(h.lost)
		}
	}
	return h.lost
}

// onEnd arranges for cancel to be called, with the reason, when h ends (at
// once if it has): the Contexts of h's Locks.
func (h *held) onEnd(cancel context.CancelCauseFunc) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.ended {
		cancel(h.endCause())
		return
	}
	h.cancels = append(h.cancels, cancel)
}

// endCause is why h's Contexts are cancelled: the loss, or context.Canceled
// after a release. h.mu is held.
func (h *held) endCause() error {
	if h.err != nil {
		return h.err
	}
	return context.Canceled
}

// end marks the holding over (lost when err is non-nil), closing Lost and
// cancelling Context if they were asked for. It reports false when it was over already.
func (h *held) end(err error) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.ended {
		return false
	}
	h.ended, h.err = true, err
	if err != nil && h.lost != nil {
		close(h.lost)
	}
	for _, cancel := range h.cancels {
		cancel(h.endCause())
	}
	h.cancels = nil
	if t := h.turn; t != nil {
		h.turn = nil
		defer t.pass(nil, turnOutcome{}) // after h.mu
	}
	return true
}

// keepTurn gives h its process's gate turn for the name (see gate), passed on
// by its release, or when it ends.
func (h *held) keepTurn(t *turnKeeper) {
	h.mu.Lock()
	if !h.ended {
		h.turn, t = t, nil
	}
	h.mu.Unlock()
	if t != nil {
		t.pass(nil, turnOutcome{})
	}
}

// takeTurn takes h's gate turn, for its release to pass on (nil if none).
func (h *held) takeTurn() *turnKeeper {
	h.mu.Lock()
	defer h.mu.Unlock()
	t := h.turn
	h.turn = nil
	return t
}

// beginRelease marks h as being released, unless it was lost (its error):
// from now on its renewal stops, and neither a renewal still on the wire nor
// its local deadline passing ends it — a renewal that runs after the
// release's DEL (or hand-off) finds the key gone, and the lease may run out
// while the reply travels, yet the lock was held until the release; the
// release's reply says how it ended.
// givenBack reports whether h is being given back or has ended.
func (h *held) givenBack() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.giving || h.ended
}

func (h *held) beginRelease() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.err == nil {
		h.releasing = true
	}
	return h.err
}

func (h *held) lostErr() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.err
}

// lose marks the holding lost: Lost() closes and Context() is cancelled. Its
// hold is given back: Redis may keep it although it is lost here — a renewal
// whose reply never came, another hold of its owner with a longer lease, the
// nodes of a Redlock that still have it — and nobody holds it now; left
// there, it would keep the name from everyone else. Only a Close keeps it
// (it then expires with its lease: the application may still be using it).
//
// A hold lost at or past its local deadline is given back no earlier than
// Redis may expire it on its own (see grant): the holder stops at its
// deadline, and whatever margin lies between that and Redis's expiry (a
// Redlock's drift allowance) stays between it and the next holder. A hold
// lost before its deadline was shown gone by Redis, and is given back at once.
func (h *held) lose(err error) {
	if !h.end(err) {
		return
	}
	if !errors.Is(err, ErrClosed) {
		h.mu.Lock()
		expired := !time.Now().Before(h.deadline)
		h.mu.Unlock()
		h.ops.abandon(h, expired)
	}
	if h.sc != nil {
		h.sc.lost(err)
	}
	h.ops.renewer().remove(h)
	h.cfg.emit(context.Background(), Event{Kind: EventLost, Name: h.name, Fence: h.publicFence(), Held: time.Since(h.since), Err: err})
	h.cfg.log.Warn(context.Background(), "lost", "locks: lock lost while held",
		slog.String("lock", h.name), slog.Any("cause", err))
}

// refused ends h, whose renewal or Extend Redis refused (err, see refusal),
// unless its Unlock is on its way: the release's reply decides how it ends
// (the refusal may be that release, overtaking the command). errHoldGone:
// this hold is gone, but the owner's others may stand (a later one that
// re-entered after the key was lost, a Redlock's on the nodes that still
// have them): h alone is lost, and every other Lock of the scope goes on by
// its own renewals. errNotOwner: the owner's holding is gone, and every Lock
// of the scope is lost with it.
func (h *held) refused(err error) {
	h.mu.Lock()
	releasing := h.releasing
	h.mu.Unlock()
	switch {
	case releasing:
	case errors.Is(err, errHoldGone):
		h.lose(ErrNotHeld)
	default:
		h.loseHolding(ErrNotHeld)
	}
}

// loseHolding marks h lost because Redis no longer has its holding (the key
// is gone or another owner's): every Lock of h's scope shares that holding,
// so they are all lost.
func (h *held) loseHolding(err error) {
	if h.sc != nil {
		h.sc.reg.lose(h.sc, err)
	}
	h.lose(err) // h itself, when its Unlock took it out of the scope already
}

// retire ends h after its Unlock: renewal stops, and the Released event
// counts the end of this hold — the owner's last (the lock is free), an inner
// one (other holds of the owner remain), or, with unknown (the release's
// error), one whose release may not have reached Redis (its lease ends it).
func (h *held) retire(ctx context.Context, unknown error) {
	if h.end(nil) {
		h.ops.renewer().remove(h)
		h.cfg.emit(ctx, Event{Kind: EventReleased, Name: h.name, Fence: h.publicFence(), Held: time.Since(h.since), Err: unknown})
	}
}

// publicFence is the fence token as callers see it: 0 under NoFencing, where
// the token only identifies the holding inside this package.
func (h *held) publicFence() uint64 {
	if h.cfg.noFencing {
		return 0
	}
	return h.fence
}

// fenceArg is the fence token as a script argument, boxed once.
func (h *held) fenceArg() any {
	if h.fenceV != nil {
		return h.fenceV
	}
	return h.fence
}
