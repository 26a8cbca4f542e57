package cacheguard

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
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
// through g.reads: an MGET sent after this call began, shared with the other
// callers of the same representation that overlap it. It returns when the
// read answers, ctx ends or the budget ends (at deadline, or when budget
// fires), whichever is first. Unless the client bounds its socket calls by
// the context's deadline (ContextTimeoutEnabled), the read runs on a
// goroutine of the Guard's, so that a Redis that does not answer
// (black-holed, paused) holds no caller beyond its budget whatever the
// client's own timeouts; with it, a caller that finds the key idle reads on
// its own goroutine, bounded by its deadline, and saves the hand-off.
func (g *Guard) readStored(ctx context.Context, genKey, valueKey string, deadline time.Time, budget <-chan time.Time) (stored, error) {
	w, led := g.reads.join(valueKey, func() stored { return g.mget(context.WithoutCancel(ctx), genKey, valueKey) }, g.ctxDeadlines)
	switch {
	case w == nil:
		return stored{}, ErrClosed
	case led:
		rctx, cancel := context.WithDeadline(ctx, deadline)
		s := g.mget(rctx, genKey, valueKey)
		budgetEnded := errors.Is(rctx.Err(), context.DeadlineExceeded)
		cancel()
		g.reads.end(valueKey, w, s)
		switch {
		case s.err == nil:
		case ctx.Err() != nil:
			return stored{}, ctx.Err()
		case budgetEnded:
			return stored{}, errBudget
		}
		return s, nil
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

// honoursDeadlines reports whether rdb bounds every socket call by its
// context's deadline (go-redis's ContextTimeoutEnabled): then a read may run
// on the caller's goroutine.
func honoursDeadlines(rdb redis.UniversalClient) bool {
	switch c := rdb.(type) {
	case *redis.Client:
		return c.Options().ContextTimeoutEnabled
	case *redis.ClusterClient:
		return c.Options().ContextTimeoutEnabled
	case *redis.Ring:
		return c.Options().ContextTimeoutEnabled
	}
	return false
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
