package locks

import (
	"context"
	"log/slog"
	"time"

	"github.com/cacheguard/cacheguard/internal/ratelog"
)

// EventKind names a lock outcome reported to an observer.
type EventKind int

// Lock outcomes. Every Lock that Lock or TryLock returns is counted once
// when it begins (EventAcquired or EventReentered) and once when it ends
// (EventReleased or EventLost), so begins and ends balance.
const (
	EventAcquired      EventKind = iota + 1 // a Lock with a new holding of the lock (Event.Wait says how long it took)
	EventReentered                          // a Lock re-entering a holding its owner has already (WithOwner; Event.Wait)
	EventNotObtained                        // TryLock found it held, or Lock gave up (Event.Err says why)
	EventReleased                           // a Lock's Unlock gave back its hold (Event.Held; Event.Err when the release's outcome is unknown and its lease will end it)
	EventLost                               // a Lock's holding was lost while held (Event.Held, Event.Err)
	EventRenewalFailed                      // one renewal attempt failed (the lock may still be held)
	EventBreakerOpened                      // a Breaker opened: Redis commands fail at once (Event.Err: the failure that opened it)
	EventBreakerClosed                      // a Breaker closed: Redis answered its probe
)

func (k EventKind) String() string {
	switch k {
	case EventAcquired:
		return "acquired"
	case EventReentered:
		return "reentered"
	case EventNotObtained:
		return "not_obtained"
	case EventReleased:
		return "released"
	case EventLost:
		return "lost"
	case EventRenewalFailed:
		return "renewal_failed"
	case EventBreakerOpened:
		return "breaker_opened"
	case EventBreakerClosed:
		return "breaker_closed"
	}
	return "unknown"
}

// Event is one lock outcome.
type Event struct {
	Kind  EventKind
	Name  string        // the lock name
	Wait  time.Duration // time spent acquiring (EventAcquired, EventReentered, EventNotObtained)
	Held  time.Duration // how long the Lock was held (EventReleased, EventLost)
	Fence uint64        // the fence token (EventAcquired, EventReentered, EventReleased, EventLost): with Name, it identifies a holding
	Err   error         // the cause (EventNotObtained, EventLost, EventRenewalFailed; EventReleased: see above)
}

func (c *config) emit(ctx context.Context, e Event) { notify(ctx, c.observer, c.log, e) }

// notify calls the user's observer obs (nil: none) with e; every Event of the
// package (a Client's, a Redlock's, a Breaker's) passes through it. A panic in
// obs is recovered and logged through log, once a second per event kind, and
// the operation that reported e goes on as if obs had returned: a panic never
// leaves a lock held behind its caller or ends a goroutine of the package.
func notify(ctx context.Context, obs func(context.Context, Event), log *ratelog.Logger, e Event) {
	if obs == nil {
		return
	}
	defer func() {
		if p := recover(); p != nil {
			log.Warn(ctx, "observer:"+e.Kind.String(), "locks: Observer panicked; the panic is ignored",
				slog.String("event", e.Kind.String()), slog.String("lock", e.Name), slog.Any("panic", p))
		}
	}()
	obs(ctx, e)
}
