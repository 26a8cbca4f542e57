package cacheguard

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"time"
	"unsafe"

	"github.com/redis/go-redis/v9"
)

// stored is what one read of a representation found.
type stored struct {
	b []byte // the envelope; nil when absent
	// gen is the key's generation, read with the envelope (in one pipeline)
	// only when a flight of the representation was running in this process
	// as the read was sent; 0 when not read or absent.
	gen int64
	// mark is the serial of the last flight created before the read was
	// sent: a flight created after it sent its first script after the read
	// (see flights.join).
	mark uint64
	// tagVers are the versions of the call's tags, read with the value (0:
	// absent), for a tagged call.
	tagVers []uint64
	err     error
}

// A hit is one HGET of the representation's field in the key's values hash.
// An Invalidate deletes that hash in the script that moves the generation, so
// a value present in Redis is always of the current generation and a hit
// does not read the generation. The miss path needs it only to decide which
// flight of the process a call may join (see flights.join), and reads it —
// in the same round trip — only when such a flight is running.

// readStored reads a representation's envelope through g.reads: a read sent
// after this call began, shared with the other callers of the same
// representation that overlap it. It returns when the read answers, ctx ends
// or the budget ends (at deadline, or when budget fires), whichever is first.
//
// Unless the client bounds its socket calls by the context's deadline
// (ContextTimeoutEnabled), the read runs on a goroutine of the Guard's, so
// that a Redis that does not answer (black-holed, paused) holds no caller
// beyond its budget whatever the client's own timeouts (go-redis bounds a
// read by ReadTimeout and its retries then, not by the context). With it, a
// caller that reads alone (see reads) does so on its own goroutine, bounded
// by ctx and its deadline: a hit then costs what a plain HGET does.
func (g *Guard) readStored(ctx context.Context, values, field, rep string, tags []string, deadline time.Time, budget <-chan time.Time) (stored, error) {
	q := &g.reads
	w, solo := q.join(ctx, values, field, rep, tags)
	if w == nil {
		return stored{}, ErrClosed
	}
	if solo && g.ctxDeadlines {
		rctx, cancel := ctx, context.CancelFunc(nil)
		if d, ok := ctx.Deadline(); !ok || d.After(deadline) {
			rctx, cancel = context.WithDeadline(ctx, deadline)
		}
		s := g.read(rctx, values, field, rep, tags)
		budgetEnded := cancel != nil && errors.Is(rctx.Err(), context.DeadlineExceeded)
		if cancel != nil {
			cancel()
		}
		if n := q.end(w, s); n != nil {
			q.runner.run(n)
		}
		q.recycle(w)
		switch {
		case s.err == nil:
		case ctx.Err() != nil:
			return stored{}, ctx.Err()
		case budgetEnded:
			return stored{}, errBudget
		}
		return s, nil
	}
	if solo {
		q.runner.run(w)
		select {
		case <-w.ready:
			s := w.s
			q.recycle(w)
			return s, nil
		case <-ctx.Done():
			return stored{}, ctx.Err() // w ends on its worker, and is not reused
		case <-budget:
			return stored{}, errBudget
		}
	}
	select {
	case <-w.done:
		return w.s, nil
	case <-ctx.Done():
		q.leave(w)
		return stored{}, ctx.Err()
	case <-budget:
		q.leave(w)
		return stored{}, errBudget
	}
}

// read sends one read of a representation: an HGET, or when a flight of
// the representation runs in this process, or the call has tags, the HGET,
// the generation and the tags' versions in one pipeline.
func (g *Guard) read(ctx context.Context, values, field, rep string, tags []string) stored {
	mark, busy := g.flights.mark(rep)
	if !busy && len(tags) == 0 {
		v, err := g.rdb.HGet(ctx, values, field).Result()
		switch {
		case err == nil:
			return stored{b: bytesOf(v), mark: mark}
		case errors.Is(err, redis.Nil):
			return stored{mark: mark}
		}
		return stored{err: err}
	}
	// The generation's name: the values hash's, with "g:" for "v:".
	p := g.cfg.prefix
	gen := p + "g:" + values[len(p)+len("v:"):]
	pipe := g.rdb.Pipeline()
	hv := pipe.HGet(ctx, values, field)
	gv := pipe.Get(ctx, gen)
	tv := make([]*redis.StringCmd, len(tags))
	for i, t := range tags {
		tv[i] = pipe.Get(ctx, g.tagKey(t))
	}
	_, _ = pipe.Exec(ctx) // each command's error is read below
	s := stored{mark: mark}
	if len(tags) > 0 {
		s.tagVers = make([]uint64, len(tags))
		for i, c := range tv {
			switch v, err := c.Result(); {
			case err == nil:
				s.tagVers[i], _ = strconv.ParseUint(v, 10, 64)
			case !errors.Is(err, redis.Nil):
				return stored{err: err}
			}
		}
	}
	switch v, err := hv.Result(); {
	case err == nil:
		s.b = bytesOf(v)
	case !errors.Is(err, redis.Nil):
		return stored{err: err}
	}
	switch v, err := gv.Result(); {
	case err == nil:
		s.gen, _ = strconv.ParseInt(v, 10, 64)
	case !errors.Is(err, redis.Nil):
		return stored{err: err}
	}
	return s
}

// bytesOf returns the bytes of s without copying them. The envelope is
// only ever read (decodeEnvelope, Codec.Unmarshal, which must not modify
// its input), never written.
func bytesOf(s string) []byte { return unsafe.Slice(unsafe.StringData(s), len(s)) }

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

// reads coalesces the reads of a representation in a process so that a
// caller only ever shares a read sent after it arrived: a read never returns
// what Redis held before the call began (a Get that begins after an
// Invalidate returned never sees the invalidated value). A caller that finds
// fewer than max reads of its representation out sends its own (a solo read:
// callers on different cores do not wait for each other); callers that arrive
// while max reads are out queue for the next one, sent as soon as one of
// them answers and shared by all of them — so a burst of N calls costs max+1
// reads, not N. A queued read whose callers all gave up is dropped, so
// nothing is left behind.
//
// A solo read is the hit path: its readWork comes from a pool and goes back
// to it, and its caller is signalled on a reusable channel, so that it
// allocates nothing here. The zero value is not usable: see New.
type reads struct {
	read   func(ctx context.Context, values, field, rep string, tags []string) stored // sends one read (Guard.read)
	runner *runner
	max    int // reads of one representation out at once, before callers queue

	mu     sync.Mutex          // guards m, closed, and the waiting and s of queued reads
	m      map[string]readSlot // by representation, while reads are out
	closed bool
	wg     sync.WaitGroup // the reads out
	pool   sync.Pool      // of solo *readWork
}

// readSlot is the state of a representation's reads.
type readSlot struct {
	out  int       // reads out
	next *readWork // callers that arrived while max reads were out; sent when one answers
}

// readWork is one read. A job handed to a worker carries its caller's context
// (a solo read) or a context detached from its callers (a shared one): it is
// the only place the package keeps a context outside a call, for as long as
// the read runs.
type readWork struct {
	ctx                context.Context
	values, field, rep string
	tags               []string

	// solo: the caller that started it waits on ready (buffered, one send
	// per use), and the work is reused once the caller received it.
	solo  bool
	ready chan struct{}
	// shared (queued) work: its callers wait for done to close.
	done    chan struct{}
	waiting int // callers still waiting for it, counted while it is queued
	s       stored
}

// join returns the read whose answer the caller shares: a new solo read when
// fewer than max are out (the caller must run or hand it over, and end it),
// or the read queued behind them. It returns nil after close.
func (q *reads) join(ctx context.Context, values, field, rep string, tags []string) (w *readWork, solo bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return nil, false
	}
	st := q.m[rep]
	if st.out < q.max {
		st.out++
		q.m[rep] = st
		w, _ = q.pool.Get().(*readWork)
		if w == nil {
			w = &readWork{solo: true, ready: make(chan struct{}, 1)}
		}
		w.ctx, w.values, w.field, w.rep, w.tags = ctx, values, field, rep, tags
		q.wg.Add(1)
		return w, true
	}
	if st.next == nil {
		// Shared by callers that may give up: detached from this one.
		st.next = &readWork{ctx: context.WithoutCancel(ctx), values: values, field: field, rep: rep, tags: tags, done: make(chan struct{})}
		q.m[rep] = st
	}
	st.next.waiting++
	return st.next, false
}

// leave is called by a caller of a shared read that stops waiting for it: a
// queued read that nobody waits for any more is dropped.
func (q *reads) leave(w *readWork) {
	q.mu.Lock()
	defer q.mu.Unlock()
	w.waiting--
	if st, ok := q.m[w.rep]; ok && st.next == w && w.waiting <= 0 {
		st.next = nil
		q.m[w.rep] = st
	}
}

// end ends w, a read out, with s, and returns the read queued behind the
// reads out, which the caller must send (it is out now), if any.
func (q *reads) end(w *readWork, s stored) *readWork {
	defer q.wg.Done()
	q.mu.Lock()
	defer q.mu.Unlock()
	w.s = s
	if w.solo {
		w.ready <- struct{}{}
	} else {
		close(w.done)
	}
	st := q.m[w.rep]
	st.out--
	n := st.next
	st.next = nil
	switch {
	case n == nil:
	case q.closed:
		n.s = stored{err: ErrClosed}
		close(n.done)
		n = nil
	default:
		st.out++
		q.wg.Add(1)
	}
	if st.out == 0 {
		delete(q.m, w.rep)
	} else {
		q.m[w.rep] = st
	}
	return n
}

// recycle returns a solo read, ended and received by its caller, to the pool.
func (q *reads) recycle(w *readWork) {
	if len(w.ready) > 0 {
		<-w.ready
	}
	w.ctx, w.s, w.tags = nil, stored{}, nil
	q.pool.Put(w)
}

// work sends w, ends it, and goes on with the read queued behind it, if any
// (on this goroutine: its callers are already waiting).
func (q *reads) work(w *readWork) {
	for w != nil {
		w = q.end(w, q.read(w.ctx, w.values, w.field, w.rep, w.tags))
	}
}

// close makes later joins return nil and queued reads end with ErrClosed
// instead of being sent, and waits for the reads out.
func (q *reads) close() {
	q.mu.Lock()
	q.closed = true
	q.mu.Unlock()
	q.wg.Wait()
}
