package gormplugin

import (
	"context"
	"log/slog"
)

// EventKind says what an Event reports.
type EventKind int

const (
	// EventInvalidateFailed: an invalidation after COMMIT failed (Err); the write
	// has committed and returned nil, and the invalidation will be retried in
	// the background (see RetryInvalidation). It is reported under the
	// write's context (its values; never cancelled), before the write
	// returns: a handler can tell its client that the write's keys may be
	// served stale until a retry succeeds (EventInvalidateRetried) or they
	// expire. (A delayed repeat's failure, InvalidateAgain, comes later,
	// under no request's context.)
	EventInvalidateFailed EventKind = iota + 1
	// EventInvalidateRetried: a retry of a failed invalidation succeeded.
	EventInvalidateRetried
	// EventInvalidateDropped: an invalidation was given up — its retries ran out,
	// too many were pending, or Close (or Shutdown's context) ended first.
	// Its keys may be served stale until they expire.
	EventInvalidateDropped
	// EventWroteUnguarded: FailOpen sent a write without its row locks because the
	// lock service was unavailable (Err).
	EventWroteUnguarded
)

func (k EventKind) String() string {
	switch k {
	case EventInvalidateFailed:
		return "invalidate_failed"
	case EventInvalidateRetried:
		return "invalidate_retried"
	case EventInvalidateDropped:
		return "invalidate_dropped"
	case EventWroteUnguarded:
		return "wrote_unguarded"
	}
	return "unknown"
}

// Event is what the plugin reports to an Observer.
type Event struct {
	Kind    EventKind
	Table   string   // EventWroteUnguarded: the table written
	Keys    []string // invalidation events: the cache keys
	Attempt int      // invalidation events: the attempts made so far
	Err     error    // the failure, when there is one
}

// Observer makes the plugin report what it does in the background, and what
// it let through, to f: failed, retried and dropped invalidations and
// unguarded (FailOpen) writes (each is also a warning: see Logger). ctx is
// the write's context for EventWroteUnguarded and a background one for the
// invalidations, which run after the write returned. f is called
// synchronously from the plugin's goroutines and from writes: it must be
// quick and must not block; a panic in it is recovered and logged. The
// default is none.
func Observer(f func(ctx context.Context, e Event)) Option {
	return func(c *config) {
		if f == nil {
			c.fail(invalid("nil Observer"))
			return
		}
		c.observer = f
	}
}

// emit reports e to the observer, if any.
func (p *Plugin) emit(ctx context.Context, e Event) {
	if p.cfg.observer == nil {
		return
	}
	defer func() {
		if v := recover(); v != nil {
			p.warn(ctx, "observer", "gormplugin: the Observer panicked", slog.String("event", e.Kind.String()), slog.Any("panic", v))
		}
	}()
	p.cfg.observer(ctx, e)
}
