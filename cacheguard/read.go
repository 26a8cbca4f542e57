package cacheguard

import (
	"context"
	"errors"
	"strconv"
	"time"
)

// stored is what one read of a representation found: the envelope (nil when
// absent) and the cache key's generation (0 when absent), read together with
// one MGET (the two names share a slot).
type stored struct {
	b   []byte
	gen int64
	err error
}

// readStored reads a representation's envelope and its key's generation
// through g.reads: a GET sent after this call began, shared with the other
// callers of the same representation that overlap it. It returns when the
// read answers, ctx ends or the budget timer fires, whichever is first — the
// read itself runs on a goroutine of the queue's, so a Redis that does not
// answer (black-holed, paused) holds up no caller beyond its budget whatever
// the client's own timeouts.
func (g *Guard) readStored(ctx context.Context, genKey, valueKey string, budget <-chan time.Time) (stored, error) {
	w := g.reads.join(valueKey, func() stored { return g.mget(context.WithoutCancel(ctx), genKey, valueKey) })
	if w == nil {
		return stored{}, ErrClosed
	}
	select {
	case <-w.done:
		return w.r, nil
	case <-ctx.Done():
		g.reads.leave(valueKey, w)
		return stored{}, ctx.Err()
	case <-budget:
		g.reads.leave(valueKey, w)
		return stored{}, errBudget
	}
}

// errBudget means the wait budget ended before Redis answered a read.
var errBudget = errors.New("cacheguard: wait budget ended during a read")

func (g *Guard) mget(ctx context.Context, genKey, valueKey string) stored {
	v, err := g.rdb.MGet(ctx, valueKey, genKey).Result()
	if err != nil {
		return stored{err: err}
	}
	var s stored
	if len(v) == 2 {
		if b, ok := v[0].(string); ok {
			s.b = []byte(b)
		}
		if gs, ok := v[1].(string); ok {
			s.gen, _ = strconv.ParseInt(gs, 10, 64)
		}
	}
	return s
}
