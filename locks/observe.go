package locks

import (
	"context"
	"time"
)

// EventKind names a lock outcome reported to an observer.
type EventKind int

// Lock outcomes.
const (
	Acquired      EventKind = iota + 1 // the lock was obtained (Event.Wait says how long it took)
	NotObtained                        // TryLock found it held, or Lock gave up (Event.Err says why)
	Released                           // Unlock released the owner's last hold (not an inner re-entry's, not a failed Unlock)
	Lost                               // ownership was lost while held
	RenewalFailed                      // one renewal attempt failed (the lock may still be held)
	BreakerOpened                      // a Breaker opened: Redis commands fail at once (Event.Err: the failure that opened it)
	BreakerClosed                      // a Breaker closed: Redis answered its probe
)

func (k EventKind) String() string {
	switch k {
	case Acquired:
		return "acquired"
	case NotObtained:
		return "not_obtained"
	case Released:
		return "released"
	case Lost:
		return "lost"
	case RenewalFailed:
		return "renewal_failed"
	case BreakerOpened:
		return "breaker_opened"
	case BreakerClosed:
		return "breaker_closed"
	}
	return "unknown"
}

// Event is one lock outcome.
type Event struct {
	Kind  EventKind
	Name  string        // the lock name
	Wait  time.Duration // time spent acquiring (Acquired, NotObtained)
	Fence uint64        // the fence token (Acquired, Released, Lost): with Name, it identifies a holding
	Err   error         // the cause (NotObtained, Lost, RenewalFailed)
}

func (c *config) emit(ctx context.Context, e Event) {
	if c.observer != nil {
		c.observer(ctx, e)
	}
}
