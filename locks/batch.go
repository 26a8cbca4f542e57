package locks

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/internal/rcmd"
)

// maxDirect is how many script calls of one Client may be on the wire on
// their own at once; calls beyond it queue and travel together.
const maxDirect = 2

// batcher lets concurrent lock calls share round trips, led by the callers
// themselves. A call that finds fewer than maxDirect sends on the wire and
// nothing queued is sent on its own caller's goroutine, with its caller's
// context: an uncontended call hands nothing to another goroutine. A call
// that arrives while maxDirect sends are on the wire queues; when a send
// returns, the first queued caller that can lead is woken (the wake-up it
// would get for its reply anyway, one round trip early) and sends the whole
// queue, its own call among it, as one pipeline on its own goroutine, then
// hands each caller its reply. Under load many scripts then share one write,
// one read and one turn of the server's event loop: on loopback those
// syscalls, not the scripts, bound a lock cycle (rueidis pipelines every
// command the same way) — without a goroutine of ours in between.
//
// A queued caller waits for its reply or its context, whichever comes first;
// the pipeline itself runs to the end (bounded by the command timeout and
// Close), so a caller that gives up cannot fail the calls it travels with. A
// caller that leads waits for its pipeline (bounded by the command timeout),
// its context notwithstanding: the others' calls travel with it.
// Every call, direct or pipelined, goes through run (internal/rcmd): bounded
// by the command timeout, NOSCRIPT answered once with EVAL.
// A call whose caller gave up may still run: the caller then names a
// clean-up call (cleanup), which is sent once the reply shows that the call
// ran (an acquisition granted too late is released that way).
// A call whose caller's deadline ends before the command's bound is queued
// even when a slot is free: go-redis closes the connection of a command its
// context cuts, and on a starved host the late callers would cost a
// connection each, and their redials feed the overload. Nor does a caller
// lead whose deadline has come that close while it queued (mayLead): it would
// wait for its pipeline past its deadline. What no caller can lead (such
// calls, clean-ups) a sender goroutine sends.
type batcher struct {
	rdb  redis.UniversalClient
	run  *rcmd.Runner
	ctx  context.Context // the senders'; cancelled by close
	stop context.CancelFunc

	mu      sync.Mutex    // guards the fields below
	busy    int           // direct calls, leaders and senders on the wire
	queue   []*pending    // calls waiting for a leader or a sender
	spare   []*pending    // an array a leader has done with, for the next queue
	closed  bool          // Close: no more senders; every call goes direct
	drained chan struct{} // closed when nothing is busy or queued (made by drain)
	retries []*pending    // clean-ups to send again (see later), oldest first
	retry   *time.Timer   // sends retries again after retryEvery; nil when none is due
	wg      sync.WaitGroup
	senders sync.Pool    // of *sender, each with a pipeline of rdb
	started atomic.Int64 // sender goroutines started (tests)
}

// retryEvery is how long a clean-up that did not reach Redis (see later)
// waits before it is sent again: a stalled Redis, or a breaker that is open
// until its probe finds Redis answering, costs it one failed call each time.
const retryEvery = 100 * time.Millisecond

// States of a pending call.
const (
	waiting int32 = iota
	answered
	abandoned
	leading // woken to send the queue it was given (lead)
)

// pending is one queued call. It is pooled: whoever is last to use it — the
// caller that read the reply, or the sender when nobody waits — puts it back.
type pending struct {
	args     []any
	cmd      *redis.Cmd
	done     chan struct{} // one send when answered (buffered: the sender never blocks)
	state    atomic.Int32
	cleanup  []any       // sent by the sender when the caller gave up first and the call ran; may be nil
	keep     func() bool // when not nil, asked once the call ran: true keeps its effect (cleanup is not sent)
	until    time.Time   // a clean-up (later) that did not reach Redis is sent again until then (zero: once)
	deadline time.Time   // its caller's deadline (zero: none): see mayLead
	batch    []*pending  // what a leader sends (its own call among it)
}

var pendings = sync.Pool{New: func() any { return &pending{done: make(chan struct{}, 1)} }}

func getPending(args []any, state int32) *pending {
	p := pendings.Get().(*pending)
	p.args = args
	p.state.Store(state)
	return p
}

func putPending(p *pending) {
	p.args, p.cmd, p.cleanup, p.keep, p.until, p.deadline, p.batch = nil, nil, nil, nil, time.Time{}, time.Time{}, nil
	pendings.Put(p)
}

func newBatcher(run *rcmd.Runner) *batcher {
	ctx, stop := context.WithCancel(context.Background())
	b := &batcher{rdb: run.Client(), run: run, ctx: ctx, stop: stop}
	b.senders.New = func() any { return new(sender) }
	return b
}

// do sends args (a script call) and returns its reply, or a command failed
// with ctx's error when ctx ends first. cleanup (may be nil) is called only
// when ctx ends while the call is queued: it returns the call that undoes
// this one, sent if this one runs after all, and keep (may be nil), asked
// then, once the reply shows that it ran: whether its effect is wanted after
// all (a Redlock node's grant to an attempt that succeeded without it), so
// that nothing is undone. (cleanup is called, never kept, so a closure
// passed here costs no allocation.)
func (b *batcher) do(ctx context.Context, args []any, cleanup func() (call []any, keep func() bool)) *redis.Cmd {
	short := b.run.Cuts(ctx, 0)
	b.mu.Lock()
	if b.closed || b.busy < maxDirect && !short && len(b.queue) == 0 {
		b.busy++
		b.mu.Unlock()
		return b.sendNow(ctx, args)
	}
	p := getPending(args, waiting)
	p.deadline, _ = ctx.Deadline()
	if b.busy < maxDirect && !short {
		// A slot is free and calls are queued (clean-ups, short callers):
		// take them along, now.
		p.batch = append(b.queue, p)
		b.queue = nil
		b.busy++
		p.state.Store(leading)
		b.mu.Unlock()
		return b.lead(p)
	}
	if b.queue == nil {
		b.queue, b.spare = b.spare, nil
	}
	b.queue = append(b.queue, p)
	b.handOff() // a short caller with a slot free: a sender takes it (see batcher)
	b.mu.Unlock()
	select {
	case <-p.done:
	case <-ctx.Done():
		if cleanup != nil {
			p.cleanup, p.keep = cleanup() // read by the sender only once the swap below is done
		}
		if p.state.CompareAndSwap(waiting, abandoned) {
			cmd := redis.NewCmd(ctx, args...)
			cmd.SetErr(ctx.Err())
			return cmd // p is the sender's now
		}
		<-p.done // answered or made leader meanwhile: the reply is the truth
	}
	if p.state.Load() == leading {
		return b.lead(p)
	}
	cmd := p.cmd
	putPending(p)
	return cmd
}

// direct sends args on the caller's goroutine, queued behind nothing: a
// call that must reach Redis whatever close does meanwhile (close cancels
// the senders of what is queued).
func (b *batcher) direct(ctx context.Context, args []any) *redis.Cmd {
	b.mu.Lock()
	b.busy++
	b.mu.Unlock()
	return b.sendNow(ctx, args)
}

// sendNow sends args on the caller's goroutine, in a slot taken (busy) for
// it, and frees the slot.
func (b *batcher) sendNow(ctx context.Context, args []any) *redis.Cmd {
	// The caller waits for the reply on its goroutine: its cancellation
	// could end only the wait for a connection (see rcmd.Uncancelled).
	cmd := b.run.Do(rcmd.Uncancelled(ctx), args...)
	b.next(nil)
	return cmd
}

// lead sends p.batch, p's own call among it, as one pipeline on the
// caller's goroutine, hands the others their replies, frees its slot (waking
// the next leader when more calls queued meanwhile) and returns p's reply.
func (b *batcher) lead(p *pending) *redis.Cmd {
	s := b.senders.Get().(*sender)
	s.exec(b, p.batch, p)
	b.senders.Put(s)
	clear(p.batch)
	if len(p.batch) > 1 {
		// Let the callers just answered run first: most send their next
		// call at once (an Unlock after a Lock), and it then joins the next
		// leader's pipeline instead of waiting a round trip for a slot.
		runtime.Gosched()
	}
	b.next(p.batch[:0]) // the next queue gathers in this batch's array
	cmd := p.cmd
	putPending(p)
	return cmd
}

// next frees the caller's slot, or hands it to a leader for the queue;
// spare (may be nil) is an array a sender has done with.
func (b *batcher) next(spare []*pending) {
	b.mu.Lock()
	b.busy--
	if b.spare == nil {
		b.spare = spare
	}
	b.handOff()
	b.idle()
	b.mu.Unlock()
}

// handOff gives the queue to a sender while a slot is free (b.mu held): to
// the first queued caller that can lead, woken for it, or, when none can (see
// batcher), to a sender goroutine.
func (b *batcher) handOff() {
	if len(b.queue) == 0 || b.busy >= maxDirect {
		return
	}
	if !b.closed {
		for _, p := range b.queue {
			if b.mayLead(p) && p.state.CompareAndSwap(waiting, leading) {
				p.batch = b.queue
				b.queue = nil
				b.busy++
				p.done <- struct{}{}
				return
			}
		}
	}
	b.startSender()
}

// mayLead reports whether p's caller may send a pipeline now, which it
// waits for whatever its context: its deadline does not cut a command sent
// now (rcmd.Runner.CutsAt, asked when the slot frees).
func (b *batcher) mayLead(p *pending) bool { return !b.run.CutsAt(p.deadline, 0) }

// idle tells drain when nothing is on the wire or queued (b.mu held).
func (b *batcher) idle() {
	if b.busy == 0 && len(b.queue) == 0 && b.drained != nil {
		close(b.drained)
		b.drained = nil
	}
}

// drain waits until nothing is on the wire or queued (clean-ups included),
// or ctx ends.
func (b *batcher) drain(ctx context.Context) {
	for {
		b.mu.Lock()
		if b.busy == 0 && len(b.queue) == 0 {
			b.mu.Unlock()
			return
		}
		if b.drained == nil {
			b.drained = make(chan struct{})
		}
		drained := b.drained
		b.mu.Unlock()
		select {
		case <-drained:
		case <-ctx.Done():
			return
		}
	}
}

// startSender takes a slot and starts a sender goroutine for the queue
// (b.mu held): it sends it, then hands the slot on as a caller would.
func (b *batcher) startSender() {
	q := b.queue
	b.queue = nil
	b.busy++
	b.wg.Add(1)
	b.started.Add(1)
	go b.send(q)
}

func (b *batcher) send(q []*pending) {
	defer b.wg.Done()
	s := b.senders.Get().(*sender)
	s.exec(b, q, nil)
	b.senders.Put(s)
	clear(q) // the pendings went back to their callers or the pool
	b.next(q[:0])
}

// sender is what a pipeline's sender reuses (pooled).
type sender struct {
	pipe redis.Pipeliner
	cmds []redis.Cmder
}

// exec sends q as one pipeline and hands each call its reply; leader, when
// not nil, is the caller sending it, whose reply it only sets.
func (s *sender) exec(b *batcher, q []*pending, leader *pending) {
	// No caller's context: each caller waits on its own, and one giving up
	// must not cancel the others' calls. The pipeline is bounded by the
	// command timeout (and close).
	if s.pipe == nil {
		s.pipe = b.rdb.Pipeline()
	}
	s.cmds = s.cmds[:0]
	for _, p := range q {
		s.cmds = append(s.cmds, redis.NewCmd(b.ctx, p.args...))
	}
	b.run.Exec(b.ctx, reusedPipe{s}, s.cmds, 0, false)
	for i, p := range q {
		p.cmd = s.cmds[i].(*redis.Cmd)
	}
	clear(s.cmds)
	for _, p := range q {
		if p == leader {
			continue
		}
		if p.state.CompareAndSwap(waiting, answered) {
			p.done <- struct{}{}
			continue
		}
		if p.cleanup != nil && p.cmd.Err() == nil && (p.keep == nil || !p.keep()) {
			b.later(p.cleanup)
		}
		if !p.until.IsZero() && undelivered(p.cmd.Err()) && time.Now().Before(p.until) {
			b.again(p)
			continue
		}
		putPending(p)
	}
}

// undelivered reports an error that may mean the call never ran: not a
// reply of Redis's (an error reply, or the script's answer, says it ran).
func undelivered(err error) bool {
	var re redis.Error
	return err != nil && !errors.As(err, &re)
}

// again keeps p, a clean-up that may not have reached Redis, to be sent again
// after retryEvery (dropped once the batcher is closed).
func (b *batcher) again(p *pending) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		putPending(p)
		return
	}
	b.retries = append(b.retries, p)
	if b.retry == nil {
		b.retry = time.AfterFunc(retryEvery, b.resend)
	}
}

// resend queues the clean-ups kept by again that are still worth sending.
func (b *batcher) resend() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.retry = nil
	if b.closed {
		return
	}
	now := time.Now()
	for _, p := range b.retries {
		if now.Before(p.until) {
			b.queue = append(b.queue, p)
		} else {
			putPending(p)
		}
	}
	clear(b.retries)
	b.retries = b.retries[:0]
	b.handOff()
}

// reusedPipe hands pipeline the sender's Pipeliner (empty after each Exec).
type reusedPipe struct{ s *sender }

func (r reusedPipe) Pipeline() redis.Pipeliner { return r.s.pipe }

// later sends args with the next pipeline, nobody waiting for the reply
// (starting a sender when a slot is free): for clean-ups that must not delay
// their caller, or that run on a sender. A clean-up that did not reach Redis
// (Redis stalled, the breaker open) is sent again every retryEvery until it
// does, for up to rcmd.CleanupHorizon: a release must reach Redis when it answers
// again, not leave a lock to run out its lease. After close it is dropped
// (what it releases expires with its lease).
func (b *batcher) later(args []any) {
	until := time.Now().Add(rcmd.CleanupHorizon)
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		// Dropped, as close drops the clean-ups queued: it would be sent on
		// its caller's goroutine, past that caller's context (an Unlock
		// whose release failed), and what it releases expires with its
		// lease anyway.
		return
	}
	p := getPending(args, abandoned)
	p.until = until
	b.queue = append(b.queue, p)
	b.handOff()
}

// close makes every later call go direct, fails what is still queued or on
// the wire in a pipeline (its callers get a context error; a clean-up is
// dropped, and what it would have released expires with its lease), and waits
// for the senders: no queue can form after it.
func (b *batcher) close() {
	b.stop()
	b.mu.Lock()
	b.closed = true
	if b.retry != nil {
		b.retry.Stop()
		b.retry = nil
	}
	for _, p := range b.retries {
		putPending(p)
	}
	b.retries = nil
	if len(b.queue) > 0 {
		b.startSender()
	}
	b.mu.Unlock()
	b.wg.Wait()
}
