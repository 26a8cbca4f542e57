package cacheguard

import (
	"context"
	"errors"
	"sync"

	"github.com/redis/go-redis/v9"
)

// reads coalesces concurrent reads of one key in a process: when a hot entry
// expires, a process sends one GET for it however many requests arrive at
// once, and those requests then share one flight on the miss path. (Without
// it a stampede of N requests still costs N GETs before any coalescing.)
// The zero value is ready to use.
type reads struct {
	mu sync.Mutex           // guards m
	m  map[string]*readCall // in-flight GETs by key
}

type readCall struct {
	done   chan struct{} // closed when b and err are set
	b      []byte
	err    error
	joined int // followers sharing this GET (guarded by reads.mu)
}

// get returns the value of key, sharing a GET already in flight. The GET runs
// under the context of the caller that started it; a follower whose leader
// was cancelled reads for itself.
func (r *reads) get(ctx context.Context, rdb redis.UniversalClient, key string) ([]byte, error) {
	r.mu.Lock()
	if c, ok := r.m[key]; ok {
		c.joined++
		r.mu.Unlock()
		select {
		case <-c.done:
			if errors.Is(c.err, context.Canceled) || errors.Is(c.err, context.DeadlineExceeded) {
				return rdb.Get(ctx, key).Bytes()
			}
			return c.b, c.err
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	c := &readCall{done: make(chan struct{})}
	if r.m == nil {
		r.m = map[string]*readCall{}
	}
	r.m[key] = c
	r.mu.Unlock()

	c.b, c.err = rdb.Get(ctx, key).Bytes()
	if c.err != nil && ctx.Err() != nil {
		c.err = ctx.Err()
	}
	r.mu.Lock()
	delete(r.m, key)
	r.mu.Unlock()
	close(c.done)
	return c.b, c.err
}
