package locks

import (
	"context"
	"errors"
	"sync"
	"time"
)

// errNotOwner is what a batch renewal reports for a lock no longer held by its owner.
var errNotOwner = errors.New("locks: not owner")

// renewer is the one background loop of a Client that keeps every held lock's
// lease alive: each tick it renews all locks that are due in one pipeline, so
// holding 10,000 locks costs one goroutine and a handful of round trips, not a
// goroutine and a timer per lock.
type renewer struct {
	// batch renews hs (each by its own lease) and reports, per lock, nil when
	// extended, errNotOwner when the lock is gone, or another error when the
	// outcome is unknown.
	batch func(ctx context.Context, hs []*held) []error

	mu      sync.Mutex // guards items, running, closed, next
	items   map[*held]struct{}
	running bool
	closed  bool
	next    time.Time // when the loop plans to wake; zero when idle
	kick    chan struct{}
	quit    chan struct{}
	done    chan struct{}
}

func newRenewer(batch func(ctx context.Context, hs []*held) []error) *renewer {
	return &renewer{batch: batch, items: map[*held]struct{}{}, kick: make(chan struct{}, 1),
		quit: make(chan struct{}), done: make(chan struct{})}
}

func (r *renewer) add(h *held) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		go h.lose(ErrClosed) // the client is closed: nothing keeps this lock alive
		return
	}
	r.items[h] = struct{}{}
	if !r.running {
		r.running = true
		go r.loop()
	}
	h.mu.Lock()
	t := h.nextRenew
	h.mu.Unlock()
	if r.next.IsZero() || t.Before(r.next) {
		// Only a lock due before the loop's next wake-up needs to wake it.
		r.next = t
		select {
		case r.kick <- struct{}{}:
		default:
		}
	}
}

func (r *renewer) remove(h *held) {
	r.mu.Lock()
	delete(r.items, h)
	r.mu.Unlock()
}

// Len returns the number of locks being kept alive.
func (r *renewer) len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.items)
}

// close stops the loop and reports every lock still held as lost.
func (r *renewer) close() {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return
	}
	r.closed = true
	running := r.running
	items := make([]*held, 0, len(r.items))
	for h := range r.items {
		items = append(items, h)
	}
	r.mu.Unlock()
	close(r.quit)
	if running {
		<-r.done
	}
	for _, h := range items {
		h.lose(ErrClosed)
	}
}

func (r *renewer) loop() {
	defer close(r.done)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-r.quit:
			cancel()
		case <-ctx.Done():
		}
	}()
	for {
		select {
		case <-r.quit:
			return
		default:
		}
		due, next := r.due(time.Now())
		if len(due) > 0 {
			r.renew(ctx, due)
			continue
		}
		wait := time.Hour
		if !next.IsZero() {
			wait = max(time.Until(next), 0)
		}
		timer.Reset(wait)
		select {
		case <-r.quit:
			return
		case <-r.kick:
			if !timer.Stop() {
				select {
				case <-timer.C:
				default:
				}
			}
		case <-timer.C:
		}
	}
}

// due returns the locks whose renewal (or expiry check) is due, and the
// earliest time another one will be. A renewal due within an eighth of the
// time its lock has left after it (a twelfth of the lease, normally) is taken
// early, so locks taken at different moments share batches. (Relative to the
// current deadline, not the lease: a hand-off's first deadline is a short
// claim, and an early window from the full lease would renew it at once.)
func (r *renewer) due(now time.Time) (due []*held, next time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for h := range r.items {
		h.mu.Lock()
		t, early := h.nextRenew, h.deadline.Sub(h.nextRenew)/8
		if !h.cfg.renew || early < 0 {
			early = 0 // an expiry check is never early
		}
		h.mu.Unlock()
		if !t.Add(-early).After(now) {
			due = append(due, h)
		} else if next.IsZero() || t.Before(next) {
			next = t
		}
	}
	r.next = next
	if len(due) > 0 {
		r.next = now
	}
	return due, next
}

func (r *renewer) renew(ctx context.Context, due []*held) {
	var send []*held
	for _, h := range due {
		if !h.cfg.renew {
			h.lose(errExpired)
			continue
		}
		send = append(send, h)
	}
	if len(send) == 0 {
		return
	}
	const chunk = 1000
	for i := 0; i < len(send); i += chunk {
		part := send[i:min(i+chunk, len(send))]
		sent := time.Now()
		errs := r.batch(ctx, part)
		if ctx.Err() != nil {
			return
		}
		for j, h := range part {
			switch err := errs[j]; {
			case err == nil:
				h.mu.Lock()
				lease := h.lease
				h.mu.Unlock()
				h.extended(sent, lease)
			case errors.Is(err, errNotOwner):
				h.loseHolding(ErrNotHeld)
			default:
				h.cfg.emit(Event{Kind: RenewalFailed, Name: h.name, Err: err})
				h.mu.Lock()
				now := time.Now()
				expired := !now.Before(h.deadline)
				// Retry soon, and once more at the deadline at the latest.
				retry := now.Add(min(max(h.deadline.Sub(now)/4, 5*time.Millisecond), h.lease/6))
				if retry.After(h.deadline) {
					retry = h.deadline
				}
				h.nextRenew = retry
				h.mu.Unlock()
				if expired {
					h.lose(errors.Join(ErrNotHeld, err))
				}
			}
		}
	}
}
