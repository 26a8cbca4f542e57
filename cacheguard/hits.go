package cacheguard

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/internal/rcmd"
)

// hits lets the concurrent single reads of hits (a Get's HGET, sent by a
// worker or on its caller's goroutine under the command's bound: see read)
// share round trips, led by the callers themselves, as locks' batcher does
// for lock scripts. A read that finds fewer than direct sends on the wire and
// none queued is sent on its own, by the goroutine that asks (its caller's or
// a worker's): an uncontended hit hands nothing to another goroutine. A read
// that arrives while direct sends are on the wire queues; when a send
// returns, the first queued caller is woken (the wake-up its reply would cost
// it anyway) and sends the whole queue, its own read among it, as one
// pipeline on its own goroutine, then hands each caller its reply. Under load
// many reads then share one write and one read system call (on loopback
// those, not Redis, bound a hit).
//
// A queued caller waits for its reply or its context, whichever comes
// first; the pipeline runs bounded by the command timeout alone, whatever its
// leader's context (with ContextTimeoutEnabled an earlier deadline would cut
// it and close its connection, and fail the others' reads). So a caller leads
// only while its deadline leaves room for that bound (mayLead, asked when the
// slot frees: its deadline came closer while it queued), as locks' batcher
// rules; when none can, a worker of the Guard's sends the queue. Delaying a read's
// send is safe for what a read carries (its flight mark, its near-cache
// ticket): each is taken before the read is sent, and a later send only sees
// later writes.
type hits struct {
	cmd  *rcmd.Runner
	work *workers // sends a queue no queued caller may lead
	// direct is how many sends may be on the wire at once: two per P. With
	// fewer, the callers' threads sleep while the sends are out (table 5,
	// 16 goroutines on 2 Ps: 0.46 context switches per read with 2, 0.20 with
	// 4, against 0.31 for a GET per goroutine), with more each send carries
	// fewer reads (47k reads/s with 4, 55k with 2, 34k for a GET each).
	direct int

	mu    sync.Mutex // guards the fields below
	busy  int        // direct reads and leaders on the wire
	queue []*hitRead // reads waiting for a leader
	spare []*hitRead // an array a leader has done with, for the next queue
}

// States of a queued read.
const (
	hitWaiting int32 = iota
	hitAnswered
	hitAbandoned // its caller stopped waiting: the leader puts it back
	hitLeading   // woken to send the queue it was given
)

// hitRead is one queued read; pooled.
type hitRead struct {
	args  []any
	cmd   *redis.Cmd
	done  chan struct{} // one send per wake-up (buffered: the waker never blocks)
	state atomic.Int32
	batch []*hitRead // what a leader sends (its own read among it)
	// deadline is its caller's (zero: none): see callerDeadline, mayLead.
	deadline time.Time
}

var hitReads = sync.Pool{New: func() any { return &hitRead{done: make(chan struct{}, 1)} }}

func putHitRead(r *hitRead) {
	r.args, r.cmd, r.batch, r.deadline = nil, nil, nil, time.Time{}
	hitReads.Put(r)
}

// do sends args (one read) and returns its reply, or a command failed with
// ctx's error when ctx ends while the read is queued.
func (h *hits) do(ctx context.Context, args []any) *redis.Cmd {
	h.mu.Lock()
	if h.busy < h.direct && len(h.queue) == 0 {
		h.busy++
		h.mu.Unlock()
		cmd := h.cmd.Do(ctx, args...)
		h.next(nil)
		return cmd
	}
	r := hitReads.Get().(*hitRead)
	r.args, r.deadline = args, callerDeadline(ctx)
	r.state.Store(hitWaiting)
	if h.queue == nil {
		h.queue, h.spare = h.spare, nil
	}
	h.queue = append(h.queue, r)
	h.mu.Unlock()
	select {
	case <-r.done:
	case <-ctx.Done():
		if r.state.CompareAndSwap(hitWaiting, hitAbandoned) {
			cmd := redis.NewCmd(ctx, args...)
			cmd.SetErr(ctx.Err())
			return cmd // r is the leader's now
		}
		<-r.done // answered or made leader meanwhile
	}
	if r.state.Load() == hitLeading {
		h.lead(ctx, r)
	}
	cmd := r.cmd
	putHitRead(r)
	return cmd
}

// lead sends r.batch, r's own read among it (see send).
func (h *hits) lead(ctx context.Context, r *hitRead) { h.send(ctx, r.batch, r) }

// send sends batch as one pipeline under ctx (its values), hands each read
// but leader's (nil when a worker sends) its reply and frees the slot (or
// hands it to the next leader).
func (h *hits) send(ctx context.Context, batch []*hitRead, leader *hitRead) {
	cmds := make([]redis.Cmder, len(batch))
	for i, q := range batch {
		q.cmd = redis.NewCmd(ctx, q.args...)
		cmds[i] = q.cmd
	}
	h.cmd.Exec(context.WithoutCancel(ctx), nil, cmds, 0, false)
	for _, q := range batch {
		switch {
		case q == leader:
		case q.state.CompareAndSwap(hitWaiting, hitAnswered):
			q.done <- struct{}{}
		default: // abandoned: nobody else holds it
			putHitRead(q)
		}
	}
	clear(batch)
	h.next(batch[:0])
}

// mayLead reports whether q's caller may send a pipeline now, which it
// waits for whatever its context: its deadline does not cut a command sent
// now (rcmd.Runner.CutsAt, asked when the slot frees).
func (h *hits) mayLead(q *hitRead) bool { return !h.cmd.CutsAt(q.deadline, 0) }

// callerDeadline is the deadline of the caller that waits for a read sent
// under ctx: a read under a shared bound on its caller's goroutine (see
// Guard.shared) has its caller's; a worker's read, or one whose caller has
// no deadline (its context is the shared bound itself), has none — the
// bound is the read's, not a caller's.
func callerDeadline(ctx context.Context) time.Time {
	if b, ok := ctx.(*boundCtx); ok {
		d, _ := b.Context.Deadline()
		return d
	}
	return time.Time{}
}

// next frees the caller's slot, or hands it, with the queue, to the first
// queued read that may lead, or to a worker when none may; spare (may be
// nil) is an array a leader has done with.
func (h *hits) next(spare []*hitRead) {
	h.mu.Lock()
	if h.spare == nil {
		h.spare = spare
	}
	for len(h.queue) > 0 && h.queue[0].state.Load() == hitAbandoned {
		putHitRead(h.queue[0]) // its caller is gone, and it leads nothing
		h.queue = h.queue[1:]
	}
	if len(h.queue) == 0 {
		h.queue = nil
		h.busy--
		h.mu.Unlock()
		return
	}
	batch := h.queue
	h.queue = nil
	for _, q := range batch {
		if h.mayLead(q) && q.state.CompareAndSwap(hitWaiting, hitLeading) {
			q.batch = batch
			h.mu.Unlock()
			q.done <- struct{}{}
			return
		}
	}
	h.mu.Unlock()
	h.work.run(funcJob(func() { h.send(context.Background(), batch, nil) }))
}
