package reliability

import (
	"math"
	"sync"
	"time"

	"github.com/anishathalye/porcupine"
)

// Never is the return time of an operation whose outcome is unknown (it timed
// out or failed in transit): it may take effect at any time after its call.
const Never = math.MaxInt64

// History records operations with their call and return times on the local
// monotonic clock, in nanoseconds since the history began. Safe for
// concurrent use.
type History struct {
	base time.Time

	mu  sync.Mutex // guards ops
	ops []porcupine.Operation
}

// NewHistory returns an empty history whose time base is now.
func NewHistory() *History { return &History{base: time.Now()} }

// Now is the current time in the history's base. time.Since reads the
// monotonic clock, so a wall-clock jump does not move it.
func (h *History) Now() int64 { return int64(time.Since(h.base)) }

// At converts a local time (with its monotonic reading) to the history's base.
func (h *History) At(t time.Time) int64 { return int64(t.Sub(h.base)) }

// Add records one operation.
func (h *History) Add(client int, call, ret int64, in, out any) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ops = append(h.ops, porcupine.Operation{ClientId: client, Input: in, Call: call, Output: out, Return: ret})
}

// Ops returns a copy of the operations recorded so far.
func (h *History) Ops() []porcupine.Operation {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]porcupine.Operation(nil), h.ops...)
}

// Len returns how many operations were recorded.
func (h *History) Len() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.ops)
}
