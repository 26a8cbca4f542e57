package gormplugin

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"time"
)

// Defaults of RetryInvalidation, and the bounds of the retry queue.
const (
	defaultInvalidateAttempts = 8
	defaultInvalidateBackoff  = 100 * time.Millisecond
	maxRetryBackoff           = 5 * time.Second
	// maxPendingKeys bounds the keys waiting for a retry; an invalidation
	// that would exceed it is dropped (EventInvalidateDropped).
	maxPendingKeys = 10000
	// flushPause separates two passes over the pending retries while
	// Shutdown flushes them.
	flushPause = 50 * time.Millisecond
)

// pendingInvalidation is a failed invalidation waiting for its next attempt.
type pendingInvalidation struct {
	keys     []string
	attempts int // made so far
	due      time.Time
	err      error // the last failure
}

// invalidate deletes the cached copies listed in keys after a COMMIT, and
// schedules the delayed repeat (InvalidateAgain). It never fails the write,
// which has committed: a failed invalidation is reported and retried in the
// background.
func (p *Plugin) invalidate(ctx context.Context, keys []string) {
	if p.cfg.inv == nil || len(keys) == 0 {
		return
	}
	err := p.invalidateOnce(ctx, keys)
	if p.cfg.again > 0 {
		p.later(keys)
	}
	if err != nil {
		p.retryLater(ctx, keys, err)
		return
	}
	p.mu.Lock()
	p.answeredLocked()
	p.mu.Unlock()
}

// answeredLocked brings every pending retry forward to now, and wakes the
// retry loop (p.mu held): an invalidation has just succeeded, so the cache
// answers again, and each copy a pending retry would delete may be served
// stale until it runs — a backoff past the outage's end otherwise.
func (p *Plugin) answeredLocked() {
	if len(p.pending) == 0 {
		return
	}
	now := time.Now()
	for _, r := range p.pending {
		if r.due.After(now) {
			r.due = now
		}
	}
	p.poke()
}

// invalidateOnce makes one bounded attempt.
func (p *Plugin) invalidateOnce(ctx context.Context, keys []string) error {
	ictx, cancel := context.WithTimeout(ctx, releaseTimeout)
	defer cancel()
	return p.cfg.inv.Invalidate(ictx, keys...)
}

// retryLater queues a failed invalidation for the retry loop, which it
// starts if it is not running. After Close, or beyond maxPendingKeys, the
// invalidation is dropped. The failure is reported under ctx, the write's
// (see EventInvalidateFailed).
func (p *Plugin) retryLater(ctx context.Context, keys []string, err error) {
	ctx = context.WithoutCancel(ctx)
	p.warn(ctx, "invalidate-failed", "gormplugin: invalidation after commit failed; retrying in the background",
		slog.Any("keys", keys), slog.Any("cause", err))
	p.emit(ctx, Event{Kind: EventInvalidateFailed, Keys: keys, Attempt: 1, Err: err})
	p.mu.Lock()
	if p.closed || p.pendingKeys+len(keys) > maxPendingKeys || p.cfg.attempts <= 1 {
		p.mu.Unlock()
		p.drop(&pendingInvalidation{keys: keys, attempts: 1, err: err}, "")
		return
	}
	p.pending = append(p.pending, &pendingInvalidation{keys: keys, attempts: 1, due: time.Now().Add(p.cfg.backoff), err: err})
	p.pendingKeys += len(keys)
	if !p.looping {
		p.looping = true
		p.loops.Add(1)
		go p.retryLoop()
	} else {
		p.poke()
	}
	p.changedLocked()
	p.mu.Unlock()
}

// drop gives an invalidation up and reports it.
func (p *Plugin) drop(r *pendingInvalidation, why string) {
	if why == "" {
		why = "gave up"
	}
	p.warn(context.Background(), "invalidate-dropped", "gormplugin: invalidation after commit given up; the keys may be served stale until they expire",
		slog.Any("keys", r.keys), slog.String("why", why), slog.Int("attempts", r.attempts), slog.Any("cause", r.err))
	p.emit(context.Background(), Event{Kind: EventInvalidateDropped, Keys: r.keys, Attempt: r.attempts, Err: r.err})
}

// backoffFor is the wait before the attempt after the n-th.
func (p *Plugin) backoffFor(n int) time.Duration {
	d := p.cfg.backoff
	for i := 1; i < n && d < maxRetryBackoff; i++ {
		d *= 2
	}
	return min(d, maxRetryBackoff)
}

// poke wakes the retry loop (p.mu held).
func (p *Plugin) poke() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// changedLocked tells Shutdown that the state it waits on changed (p.mu held).
func (p *Plugin) changedLocked() {
	close(p.changed)
	p.changed = make(chan struct{})
}

// retryLoop retries pending invalidations, the earliest due first, until
// none is left (then it ends; the next failure starts another) or Close
// stops it. While Shutdown flushes, every pending invalidation is due at
// once.
func (p *Plugin) retryLoop() {
	defer p.loops.Done()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		p.mu.Lock()
		if len(p.pending) == 0 || p.stopping {
			p.looping = false
			p.changedLocked()
			p.mu.Unlock()
			return
		}
		r := slices.MinFunc(p.pending, func(a, b *pendingInvalidation) int { return a.due.Compare(b.due) })
		wait := time.Until(r.due)
		if p.flushing {
			wait = min(wait, 0)
		}
		p.mu.Unlock()

		if wait > 0 {
			timer.Reset(wait)
			select {
			case <-timer.C:
			case <-p.wake:
				if !timer.Stop() {
					<-timer.C
				}
				continue
			}
		}
		err := p.invalidateOnce(p.bg, r.keys)

		p.mu.Lock()
		i := slices.Index(p.pending, r)
		if i < 0 { // dropped by Close meanwhile
			p.mu.Unlock()
			continue
		}
		r.attempts++
		var dropped bool
		switch {
		case err == nil:
			p.pending = slices.Delete(p.pending, i, i+1)
			p.pendingKeys -= len(r.keys)
			p.answeredLocked()
		case r.attempts >= p.cfg.attempts && !p.flushing:
			r.err = err
			p.pending = slices.Delete(p.pending, i, i+1)
			p.pendingKeys -= len(r.keys)
			dropped = true
		default:
			r.err = err
			r.due = time.Now().Add(p.backoffFor(r.attempts))
			if p.flushing {
				r.due = time.Now().Add(flushPause)
			}
		}
		p.changedLocked()
		p.mu.Unlock()
		switch {
		case err == nil:
			p.emit(context.Background(), Event{Kind: EventInvalidateRetried, Keys: r.keys, Attempt: r.attempts})
		case dropped:
			p.drop(r, "")
		}
	}
}

// later invalidates keys again after the InvalidateAgain delay, unless Close
// comes first; a failure is retried like any other.
func (p *Plugin) later(keys []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	var t *time.Timer
	t = time.AfterFunc(p.cfg.again, func() {
		p.mu.Lock()
		if _, ok := p.timers[t]; !ok { // dropped by Close
			p.mu.Unlock()
			return
		}
		p.running++
		p.mu.Unlock()
		err := p.invalidateOnce(p.bg, keys)
		if err != nil {
			p.retryLater(p.bg, keys, err)
		}
		p.mu.Lock()
		delete(p.timers, t)
		p.running--
		p.changedLocked()
		p.mu.Unlock()
	})
	p.timers[t] = struct{}{}
}

// begin counts a guarded statement or transaction in flight (Shutdown waits
// for them).
func (p *Plugin) begin() {
	p.mu.Lock()
	p.inflight++
	p.mu.Unlock()
}

// end counts one off.
func (p *Plugin) end() {
	p.mu.Lock()
	p.inflight--
	p.changedLocked()
	p.mu.Unlock()
}

// Shutdown is the plugin's part of a graceful shutdown: call it after the
// HTTP server's Shutdown (which waits for the requests in flight), before
// closing the Locker and the database. It waits for the guarded statements
// and transactions still in flight to end (their locks are released and
// their invalidations made as usual), for the delayed repeats of
// InvalidateAgain to come due and run, and retries every failed invalidation
// at once, again and again (beyond RetryInvalidation's attempts), until none
// is left. When ctx ends first, what is
// left is dropped (each reported as EventInvalidateDropped) and Shutdown returns
// an error matching ErrInvalidate and ctx's error. Writes made after
// Shutdown began are still guarded and invalidated, and waited for; after it
// returns, the plugin is closed (see Close).
func (p *Plugin) Shutdown(ctx context.Context) error {
	p.mu.Lock()
	p.flushing = true
	p.poke()
	p.mu.Unlock()
	for {
		p.mu.Lock()
		idle := p.inflight == 0 && len(p.timers) == 0 && p.running == 0 && len(p.pending) == 0 && !p.looping
		changed := p.changed
		p.mu.Unlock()
		if idle {
			p.close() // drained: it drops nothing
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			n := p.close()
			if n == 0 {
				return nil
			}
			return fmt.Errorf("%w: Shutdown ended with the invalidation of %d keys not done: %w", ErrInvalidate, n, ctx.Err())
		}
	}
}

// Close stops the plugin's background work at once: it drops the delayed
// repeats not yet due and the failed invalidations waiting for a retry (each
// reported as EventInvalidateDropped), and waits for the attempts already running
// (bounded by the Redis client's timeouts). Use Shutdown to flush them
// instead. Writes after Close are still guarded and invalidated once; a
// failed invalidation is then dropped, not retried. Close does not close the
// Locker or the Invalidator.
func (p *Plugin) Close() error {
	p.close()
	return nil
}

// close implements Close and returns how many keys it dropped.
func (p *Plugin) close() int {
	p.mu.Lock()
	p.closed, p.stopping = true, true
	var dropped []*pendingInvalidation
	for t := range p.timers {
		if t.Stop() {
			delete(p.timers, t)
		}
	}
	dropped = append(dropped, p.pending...)
	p.pending, p.pendingKeys = nil, 0
	p.poke()
	p.changedLocked()
	p.mu.Unlock()
	p.stopBg() // ends the attempts running in the background, where the Invalidator honours it
	n := 0
	for _, r := range dropped {
		n += len(r.keys)
		p.drop(r, "dropped by Close")
	}
	p.loops.Wait()
	for {
		p.mu.Lock()
		busy, changed := len(p.timers) > 0 || p.running > 0, p.changed
		p.mu.Unlock()
		if !busy {
			break
		}
		<-changed
	}
	p.attempts.Wait()
	return n
}
