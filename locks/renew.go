package locks

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"
)

var (
	// errNotOwner is what a renewal or Extend reports for a lock no longer
	// held by its owner: every Lock of the owner's scope is lost with it.
	errNotOwner = errors.New("locks: not owner")
	// errHoldGone is what a renewal or Extend reports for one hold (one
	// acquisition) that is no longer held — Redis does not have it, or its
	// validity ran out first — while the owner's holding may still be there:
	// only that Lock is lost (see held.refused).
	errHoldGone = errors.New("locks: hold gone")
	// errOvertaken is what a renewal or Extend reports that reached Redis
	// after a newer command of its holder (see extend.lua): it set nothing.
	errOvertaken = errors.New("locks: overtaken by a newer renewal")
	// errExpired is why a lock with a fixed lease (NoRenewal) is lost.
	errExpired = errors.New("locks: lease expired without renewal")
	// errNoRenewal is why a renewed lock is lost when no renewal was confirmed
	// before its local deadline (joined with the last renewal's error, if any).
	errNoRenewal = errors.New("locks: lease ran out before a renewal was confirmed")
)

// refusal reports whether err, a renewal's or Extend's outcome, is Redis
// saying the lock is gone (see held.refused), not a failure to ask it.
func refusal(err error) bool { return errors.Is(err, errNotOwner) || errors.Is(err, errHoldGone) }

// renewChunk bounds how many locks one renewal round trip carries.
const renewChunk = 1000

// renewer is the one background loop of a Client (or Redlock) that keeps every
// held lock's lease alive: each turn it sends the renewals that are due, in
// batches (one pipeline per node), so holding 10,000 locks costs a few
// goroutines and round trips, not a goroutine and a timer per lock.
//
// The loop never waits for Redis. A batch is on the wire on its own
// goroutine, and its outcomes apply lock by lock as each node answers, so a
// slow or paused node delays only the renewals of its own locks. The loop
// watches every lock's local deadline independently of the batches: a lock
// whose deadline passes with no renewal confirmed is lost then, even while
// its renewal is still on the wire — whether the go-redis client ends calls
// at their context deadline (ContextTimeoutEnabled) or not.
type renewer struct {
	// send renews hs (each by its own lease) and calls report once per lock,
	// as the lock's outcome becomes known: nil when extended, errNotOwner or
	// errHoldGone when the lock is gone (see refusal), another error when the
	// outcome is unknown. It returns
	// when every lock was reported.
	send func(ctx context.Context, hs []*held, report func(h *held, err error))

	ctx    context.Context // the batches'; cancelled by close
	cancel context.CancelFunc
	kick   chan struct{} // wakes the loop to look again
	done   chan struct{} // closed when the loop has returned
	sends  sync.WaitGroup

	mu      sync.Mutex // guards the fields below
	items   map[*held]struct{}
	running bool
	closed  bool
	next    time.Time     // when the loop plans to wake; zero when idle
	added   bool          // a lock was added since the loop's last scan
	period  time.Duration // how far ahead the last lock added was due for renewal
	emptied chan struct{} // closed when items becomes empty (made by waitEmpty)
}

func newRenewer(send func(ctx context.Context, hs []*held, report func(*held, error))) *renewer {
	ctx, cancel := context.WithCancel(context.Background())
	return &renewer{send: send, ctx: ctx, cancel: cancel, items: map[*held]struct{}{},
		kick: make(chan struct{}, 1), done: make(chan struct{})}
}

// add keeps h alive from now on. It reports false after close: then nothing
// would keep h alive.
func (r *renewer) add(h *held) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return false
	}
	r.items[h] = struct{}{}
	if !r.running {
		r.running = true
		go r.loop()
	}
	h.mu.Lock()
	t := h.nextRenew
	h.mu.Unlock()
	r.added, r.period = true, time.Until(t)
	if r.next.IsZero() || t.Before(r.next) {
		// Only a lock due before the loop's next wake-up needs to wake it
		// (see scan: while locks come and go, the loop keeps a wake-up
		// planned, so that taking a lock hands nothing to its goroutine).
		r.next = t
		r.poke()
	}
	return true
}

func (r *renewer) remove(h *held) {
	r.mu.Lock()
	delete(r.items, h)
	if len(r.items) == 0 && r.emptied != nil {
		close(r.emptied)
		r.emptied = nil
	}
	r.mu.Unlock()
}

// waitEmpty waits until no lock is kept alive, or ctx ends; it returns the
// names of the locks still kept alive.
func (r *renewer) waitEmpty(ctx context.Context) []string {
	for {
		r.mu.Lock()
		if len(r.items) == 0 {
			r.mu.Unlock()
			return nil
		}
		if r.emptied == nil {
			r.emptied = make(chan struct{})
		}
		emptied := r.emptied
		r.mu.Unlock()
		select {
		case <-emptied:
		case <-ctx.Done():
			r.mu.Lock()
			defer r.mu.Unlock()
			names := make([]string, 0, len(r.items))
			for h := range r.items {
				names = append(names, h.name)
			}
			return names
		}
	}
}

// poke wakes the loop (it coalesces).
func (r *renewer) poke() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// Len returns the number of locks being kept alive.
func (r *renewer) len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.items)
}

// close stops the loop and the batches on the wire (as far as the client
// honours a cancelled context; otherwise it waits for them), and reports every
// lock still held as lost with ErrClosed.
func (r *renewer) close() {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return
	}
	r.closed = true
	running := r.running
	r.mu.Unlock()
	r.cancel()
	if running {
		<-r.done
	}
	r.sends.Wait()
	r.mu.Lock()
	items := make([]*held, 0, len(r.items))
	for h := range r.items {
		items = append(items, h)
	}
	r.mu.Unlock()
	for _, h := range items {
		h.lose(ErrClosed)
	}
}

func (r *renewer) loop() {
	defer close(r.done)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for r.ctx.Err() == nil {
		due, expired, next := r.scan(time.Now())
		for _, h := range expired {
			h.lose(h.expiry())
		}
		for i := 0; i < len(due); i += renewChunk {
			r.sends.Add(1)
			go r.renew(due[i:min(i+renewChunk, len(due))])
		}
		wait := time.Hour
		if !next.IsZero() {
			wait = max(time.Until(next), 0)
		}
		timer.Reset(wait)
		select {
		case <-r.ctx.Done():
			return
		case <-r.kick:
		case <-timer.C:
		}
	}
}

// scan returns the locks whose renewal is due (marking them in flight), those
// whose local deadline has passed, and the earliest time either will happen
// to another lock. A renewal due within an eighth of the time its lock has
// left after it (a twelfth of the lease, normally) is taken early, so locks
// taken at different moments share batches. (Relative to the current
// deadline, not the lease: a hand-off's first deadline is a short claim, and
// an early window from the full lease would renew it at once.)
func (r *renewer) scan(now time.Time) (due, expired []*held, next time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	soonest := func(t time.Time) {
		if next.IsZero() || t.Before(next) {
			next = t
		}
	}
	for h := range r.items {
		h.mu.Lock()
		switch {
		case h.releasing: // its release decides (see beginRelease)
		case !now.Before(h.deadline):
			expired = append(expired, h)
		case !h.cfg.renew || h.wire:
			soonest(h.deadline)
		case !h.nextRenew.Add(-h.deadline.Sub(h.nextRenew) / 8).After(now):
			h.onWire(now, h.lease) // sent after now
			due = append(due, h)
			soonest(h.deadline)
		default:
			soonest(h.nextRenew)
		}
		h.mu.Unlock()
	}
	if next.IsZero() && r.added {
		// Nothing held now, but locks come and go: wake one renewal
		// period on anyway, so that the next lock taken, due no sooner,
		// need not wake the loop. Once a period passes with none taken,
		// the loop sleeps until one is.
		next = now.Add(max(r.period, 0))
	}
	r.added = false
	r.next = next
	return due, expired, next
}

// renew sends one batch and applies each lock's outcome as it is reported.
func (r *renewer) renew(hs []*held) {
	defer r.sends.Done()
	sent := time.Now()
	r.send(r.ctx, hs, func(h *held, err error) {
		var g *grant
		if r.ctx.Err() == nil {
			g = h.renewed(sent, err)
		}
		h.leaveWire(g)
		r.poke()
	})
}

// renewed handles the outcome of h's renewal sent at sent: the grant it
// makes when it succeeded. Once h is being released, its release decides
// instead (see beginRelease).
func (h *held) renewed(sent time.Time, err error) *grant {
	h.mu.Lock()
	over := h.releasing || h.ended
	if !over && err == nil {
		h.lastErr = nil
		g := &grant{Sent: sent, Lease: h.wireLease}
		h.mu.Unlock()
		return g
	}
	h.mu.Unlock()
	switch {
	case over, err == nil:
	case refusal(err):
		h.refused(err)
	default:
		h.cfg.emit(context.Background(), Event{Kind: EventRenewalFailed, Name: h.name, Err: err})
		h.cfg.log.Warn(context.Background(), "renewal", "locks: lock renewal failed (retrying until the lease ends)",
			slog.String("lock", h.name), slog.Any("cause", err))
		h.mu.Lock()
		// Retry soon; the loop ends the lock at its deadline if none succeeds.
		now := time.Now()
		h.lastErr = err
		h.nextRenew = now.Add(min(max(h.deadline.Sub(now)/4, 5*time.Millisecond), h.lease/6))
		h.mu.Unlock()
	}
	return nil
}

// expiry is why h is lost when its local deadline passed.
func (h *held) expiry() error {
	if !h.cfg.renew {
		return errExpired
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.lastErr != nil {
		return errors.Join(ErrNotHeld, errNoRenewal, h.lastErr)
	}
	return errors.Join(ErrNotHeld, errNoRenewal)
}
