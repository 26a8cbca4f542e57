package cacheguard

import (
	"context"
	"errors"
	"sync"

	"github.com/redis/go-redis/v9"
)

// reads coalesces concurrent reads of one key in a process: when a hot entry
// expires, a process sends at most two GETs for it however many requests
// arrive at once, and those requests then share one flight on the miss path.
// (Without it a stampede of N requests costs N GETs before any coalescing.)
//
// A caller only ever shares a GET sent after it arrived, so a read never
// returns what Redis held before the call started (a Get that begins after an
// Invalidate returned never sees the invalidated value). Callers that arrive
// while a GET is in flight therefore wait for it to finish and share the next
// one, sent by the first of them. The zero value is ready to use.
type reads struct {
	mu sync.Mutex           // guards m and every keyReads and readCall.sent
	m  map[string]*keyReads // by key, while reads are in flight or queued
}

type keyReads struct {
	inflight *readCall // sent, answer pending
	next     *readCall // callers that arrived while inflight was out; not sent yet
}

type readCall struct {
	after  *readCall     // the GET that must finish before this one is sent (nil: none)
	sent   bool          // a leader has taken it
	done   chan struct{} // closed when b and err are set
	b      []byte
	err    error
	joined int // callers sharing it besides its leader
}

// get returns the value of key through a GET sent after this call began,
// shared with the other callers of the same key that it overlaps.
func (r *reads) get(ctx context.Context, rdb redis.UniversalClient, key string) ([]byte, error) {
	r.mu.Lock()
	if r.m == nil {
		r.m = map[string]*keyReads{}
	}
	kr := r.m[key]
	if kr == nil {
		kr = &keyReads{}
		r.m[key] = kr
	}
	if kr.inflight == nil && kr.next == nil {
		c := &readCall{done: make(chan struct{}), sent: true}
		kr.inflight = c
		r.mu.Unlock()
		return r.run(ctx, rdb, key, kr, c)
	}
	c := kr.next
	if c == nil {
		c = &readCall{done: make(chan struct{}), after: kr.inflight}
		kr.next = c
	} else {
		c.joined++
	}
	r.mu.Unlock()

	if c.after != nil {
		select {
		case <-c.after.done:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	r.mu.Lock()
	if !c.sent {
		// The first caller to get here sends the shared GET.
		c.sent = true
		if kr.next == c {
			kr.next = nil
		}
		kr.inflight = c
		r.mu.Unlock()
		return r.run(ctx, rdb, key, kr, c)
	}
	r.mu.Unlock()
	select {
	case <-c.done:
		if errors.Is(c.err, context.Canceled) || errors.Is(c.err, context.DeadlineExceeded) {
			return rdb.Get(ctx, key).Bytes() // the leader gave up: read for itself
		}
		return c.b, c.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// run sends c's GET under the leader's context and publishes the answer.
func (r *reads) run(ctx context.Context, rdb redis.UniversalClient, key string, kr *keyReads, c *readCall) ([]byte, error) {
	c.b, c.err = rdb.Get(ctx, key).Bytes()
	if c.err != nil && ctx.Err() != nil {
		c.err = ctx.Err()
	}
	r.mu.Lock()
	if kr.inflight == c {
		kr.inflight = nil
	}
	if kr.inflight == nil && kr.next == nil && r.m[key] == kr {
		delete(r.m, key)
	}
	r.mu.Unlock()
	close(c.done)
	return c.b, c.err
}
