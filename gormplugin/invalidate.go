package gormplugin

import (
	"context"
	"fmt"
	"time"
)

// invalidate deletes the cached copies listed in keys, after a COMMIT, and
// schedules the delayed repeat (InvalidateAgain).
func (p *Plugin) invalidate(ctx context.Context, keys []string) error {
	if p.cfg.inv == nil || len(keys) == 0 {
		return nil
	}
	ictx, cancel := context.WithTimeout(ctx, releaseTimeout)
	err := p.cfg.inv.Invalidate(ictx, keys...)
	cancel()
	if p.cfg.again > 0 {
		p.later(keys)
	}
	if err == nil {
		return nil
	}
	if p.cfg.failOpen {
		p.warn(ctx, "gormplugin: invalidating %v after commit failed (FailOpen): %v", keys, err)
		return nil
	}
	return fmt.Errorf("%w: %v: %w", ErrInvalidate, keys, err)
}

// later invalidates keys again after the InvalidateAgain delay, unless Close
// comes first.
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
		delete(p.timers, t)
		p.running.Add(1)
		p.mu.Unlock()
		defer p.running.Done()

		ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
		defer cancel()
		if err := p.cfg.inv.Invalidate(ctx, keys...); err != nil {
			p.warn(ctx, "gormplugin: delayed invalidation of %v failed: %v", keys, err)
		}
	})
	p.timers[t] = struct{}{}
}
