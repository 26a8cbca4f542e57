package locks

import (
	"context"
	"errors"
	"sync"
	"time"
)

// Lock is one acquisition of a named lock. Its methods are safe for concurrent use.
type Lock struct {
	h *held

	mu   sync.Mutex // guards done
	done bool       // Unlock was called
}

// Name returns the lock name.
func (l *Lock) Name() string { return l.h.name }

// Fence returns the fence token of this acquisition: a number larger than the
// token of every earlier acquisition of the same name, by any client or process
// (re-entries share the token of the acquisition they re-enter). Pass it to the
// resource you write, and have the resource refuse writes with a token smaller
// than one it has seen: a holder that was paused past its lease is then
// refused, which no lock alone can guarantee. See Client.MonotonicFences for
// Redlock, whose tokens are not monotonic.
func (l *Lock) Fence() uint64 { return l.h.fence }

// Lost returns a channel closed when ownership is lost while held: the lease
// ran out, the key was deleted or taken over, or renewal failed past the lease.
// It is not closed by Unlock.
func (l *Lock) Lost() <-chan struct{} { return l.h.lost }

// Context returns a context cancelled when the lock is lost or released: run
// the critical section under it so that work stops when exclusion ends.
func (l *Lock) Context() context.Context { return l.h.ctx }

// TTL returns how long the lock is certainly still held, from the local
// monotonic clock (the lease measured from before the last successful
// acquire or renewal was sent). Zero once lost or released.
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
// is never given back twice. Use a context that the caller's cancellation does
// not end (context.WithoutCancel) when the release must happen regardless.
func (l *Lock) Unlock(ctx context.Context) error {
	l.mu.Lock()
	if l.done {
		l.mu.Unlock()
		return nil
	}
	l.done = true
	l.mu.Unlock()

	h := l.h
	if err := h.lostErr(); err != nil {
		h.dropRef(false)
		return ErrNotHeld
	}
	n, err := h.ops.release(ctx, h)
	switch {
	case err != nil:
		// The outcome is unknown; stop renewing so that the lease ends it.
		h.dropRef(true)
		return err
	case n < 0:
		h.lose(ErrNotHeld)
		h.dropRef(false)
		return ErrNotHeld
	}
	h.dropRef(n == 0)
	return nil
}

// Extend sets the lease to d from now, if the lock is still held by this owner;
// ErrNotHeld otherwise (and the lock counts as lost).
func (l *Lock) Extend(ctx context.Context, d time.Duration) error {
	if d < MinLease {
		return invalid("lease %v is shorter than %v", d, MinLease)
	}
	h := l.h
	if err := h.lostErr(); err != nil {
		return ErrNotHeld
	}
	sent := time.Now()
	ok, err := h.ops.extend(ctx, h, d)
	if err != nil {
		return err
	}
	if !ok {
		h.lose(ErrNotHeld)
		return ErrNotHeld
	}
	h.extended(sent, d)
	return nil
}

// ops are the Redis operations behind a held lock: one server (Client) or a
// quorum of servers (Redlock).
type ops interface {
	release(ctx context.Context, h *held) (remaining int64, err error)
	extend(ctx context.Context, h *held, lease time.Duration) (bool, error)
	renewer() *renewer
}

// held is one holding of a lock name by one owner in this process.
type held struct {
	ops   ops
	name  string
	keys  []string // lock, fence, queue, deadlines (hash-tagged to one slot)
	owner string
	fence uint64
	cfg   config
	ctx   context.Context
	stop  context.CancelFunc
	lost  chan struct{}

	mu        sync.Mutex // guards the fields below
	lease     time.Duration
	deadline  time.Time // the lease's end on the local monotonic clock
	nextRenew time.Time
	refs      int
	ended     bool  // released or lost
	err       error // why it was lost
}

// newHeld registers a lock acquired with the request sent at sent.
func newHeld(o ops, name string, keys []string, owner string, fence uint64, cfg config, sent time.Time) *held {
	return newHeldFirst(o, name, keys, owner, fence, cfg, sent, cfg.lease)
}

// newHeldFirst is newHeld for a lock whose current lease (first) is shorter
// than the configured one, as a hand-off's claim lease is: the first renewal
// comes at a third of first and restores the full lease.
func newHeldFirst(o ops, name string, keys []string, owner string, fence uint64, cfg config, sent time.Time, first time.Duration) *held {
	ctx, cancel := context.WithCancel(context.Background())
	h := &held{ops: o, name: name, keys: keys, owner: owner, fence: fence, cfg: cfg,
		ctx: ctx, stop: cancel, lost: make(chan struct{}), refs: 1}
	h.setDeadline(sent, min(first, cfg.lease))
	h.lease = cfg.lease
	o.renewer().add(h)
	return h
}

func (h *held) setDeadline(sent time.Time, lease time.Duration) {
	h.lease = lease
	h.deadline = sent.Add(lease)
	if h.cfg.renew {
		h.nextRenew = sent.Add(lease / 3)
	} else {
		h.nextRenew = h.deadline // checked for expiry only
	}
}

func (h *held) extended(sent time.Time, lease time.Duration) {
	h.mu.Lock()
	if !h.ended {
		h.setDeadline(sent, lease)
	}
	h.mu.Unlock()
}

func (h *held) lostErr() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.err
}

// lose marks the holding lost: Lost() closes and Context() is cancelled.
func (h *held) lose(err error) {
	h.mu.Lock()
	if h.ended {
		h.mu.Unlock()
		return
	}
	h.ended, h.err = true, err
	h.mu.Unlock()
	close(h.lost)
	h.stop()
	h.ops.renewer().remove(h)
	h.cfg.emit(Event{Kind: Lost, Name: h.name, Err: err})
}

// dropRef gives back one handle; released reports that Redis no longer has a
// hold of this owner (or that its fate is left to the lease).
func (h *held) dropRef(released bool) {
	h.mu.Lock()
	h.refs--
	end := !h.ended && (released || h.refs <= 0)
	if end {
		h.ended = true
	}
	h.mu.Unlock()
	if end {
		h.stop()
		h.ops.renewer().remove(h)
		h.cfg.emit(Event{Kind: Released, Name: h.name})
	}
}

var errExpired = errors.New("locks: lease expired without renewal")
