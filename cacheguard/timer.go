package cacheguard

import (
	"sync"
	"time"
)

// timers recycles the budget timers of Get calls, which every call needs
// (the read of a hit is bounded by the budget too) and most stop unfired.
// Since Go 1.23 a stopped timer's channel holds no stale value, so a timer
// can be reused after Stop.
var timers = sync.Pool{New: func() any {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return t
}}

func getTimer(d time.Duration) *time.Timer {
	t := timers.Get().(*time.Timer)
	t.Reset(d)
	return t
}

func putTimer(t *time.Timer) {
	t.Stop()
	timers.Put(t)
}
