package locks

import (
	"context"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// maxDirect is how many script calls of one Client may be on the wire on
// their own at once; calls beyond it queue and travel together.
const maxDirect = 2

// batcher lets concurrent lock calls share round trips. Up to maxDirect calls
// go straight to Redis, each with its caller's context, so a lone call adds
// no delay. Calls that arrive while those are on the wire queue; when one of
// them returns, a sender goroutine takes over its slot and sends the whole
// queue as one pipeline, again and again until the queue is empty. Under load
// many scripts then share one write, one read and one turn of the server's
// event loop: on loopback those syscalls, not the scripts, bound a lock
// cycle (rueidis pipelines every command the same way).
//
// A queued caller waits for its reply or its context, whichever comes first;
// the pipeline itself runs to the end (bounded by sendTimeout, the client's
// own timeouts and Close), so a caller that gives up cannot fail the calls it
// travels with.
// A call whose caller gave up may still run: the caller then names a
// clean-up call (cleanup), which the sender sends once the reply shows that
// the call ran (an acquisition granted too late is released that way).
type batcher struct {
	rdb  redis.UniversalClient
	ctx  context.Context // the senders'; cancelled by close
	stop context.CancelFunc

	mu      sync.Mutex    // guards the fields below
	busy    int           // direct calls and senders on the wire
	queue   []*pending    // calls waiting for a sender
	closed  bool          // Close: no more senders; every call goes direct
	drained chan struct{} // closed when nothing is busy or queued (made by drain)
	wg      sync.WaitGroup
}

// States of a pending call.
const (
	waiting int32 = iota
	answered
	abandoned
)

// pending is one queued call. It is pooled: whoever is last to use it — the
// caller that read the reply, or the sender when nobody waits — puts it back.
type pending struct {
	args    []any
	cmd     *redis.Cmd
	done    chan struct{} // one send when answered (buffered: the sender never blocks)
	state   atomic.Int32
	cleanup []any // sent by the sender when the caller gave up first and the call ran; may be nil
}

var pendings = sync.Pool{New: func() any { return &pending{done: make(chan struct{}, 1)} }}

func getPending(args []any, state int32) *pending {
	p := pendings.Get().(*pending)
	p.args = args
	p.state.Store(state)
	return p
}

func putPending(p *pending) {
	p.args, p.cmd, p.cleanup = nil, nil, nil
	pendings.Put(p)
}

// sendTimeout bounds one pipeline of queued calls (as far as the client
// honours contexts), so that a sender cannot hold its slot for ever.
const sendTimeout = 10 * time.Second

func newBatcher(rdb redis.UniversalClient) *batcher {
	ctx, stop := context.WithCancel(context.Background())
	return &batcher{rdb: rdb, ctx: ctx, stop: stop}
}

// do sends args (a script call) and returns its reply, or a command failed
// with ctx's error when ctx ends first. cleanup (may be nil) is called only
// when ctx ends while the call is queued: it returns the call that undoes
// this one, sent if this one runs after all. (It is called, never kept, so a
// closure passed here costs no allocation.)
func (b *batcher) do(ctx context.Context, args []any, cleanup func() []any) *redis.Cmd {
	b.mu.Lock()
	if b.busy < maxDirect || b.closed {
		b.busy++
		b.mu.Unlock()
		cmd := b.rdb.Do(ctx, args...)
		if noScript(cmd.Err()) && toEval(args) { // see script
			cmd = b.rdb.Do(ctx, args...)
		}
		b.next()
		return cmd
	}
	p := getPending(args, waiting)
	b.queue = append(b.queue, p)
	b.mu.Unlock()
	select {
	case <-p.done:
	case <-ctx.Done():
		if cleanup != nil {
			p.cleanup = cleanup() // read by the sender only once the swap below is done
		}
		if p.state.CompareAndSwap(waiting, abandoned) {
			cmd := redis.NewCmd(ctx, args...)
			cmd.SetErr(ctx.Err())
			return cmd // p is the sender's now
		}
		<-p.done // answered meanwhile: the reply is the truth
	}
	cmd := p.cmd
	putPending(p)
	return cmd
}

// next frees the caller's slot, or hands it to a sender for the queue.
func (b *batcher) next() {
	b.mu.Lock()
	b.busy--
	if len(b.queue) > 0 {
		b.startSender() // takes the slot just freed
	}
	b.idle()
	b.mu.Unlock()
}

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

// startSender takes a slot and starts a sender for the queue (b.mu held).
func (b *batcher) startSender() {
	q := b.queue
	b.queue = nil
	b.busy++
	b.wg.Add(1)
	go b.send(q)
}

// send pipelines q, then each queue that gathered meanwhile, until none is
// left; then it frees its slot.
func (b *batcher) send(q []*pending) {
	defer b.wg.Done()
	var s sender
	defer s.stop()
	for {
		s.exec(b, q)
		clear(q) // the pendings went back to their callers or the pool
		// Let the callers just answered run first: most send their next call
		// at once (an Unlock after a Lock), and it then leaves with this
		// sender's next pipeline instead of waiting a round trip for a slot.
		runtime.Gosched()
		b.mu.Lock()
		if len(b.queue) == 0 {
			b.busy--
			b.idle()
			b.mu.Unlock()
			return
		}
		q, b.queue = b.queue, q[:0] // the next queue gathers in this one's array
		b.mu.Unlock()
	}
}

// sender is what one send loop reuses from pipeline to pipeline.
type sender struct {
	ctx    context.Context // the pipelines'; renewed before sendTimeout/2 is left
	cancel context.CancelFunc
	until  time.Time // ctx's deadline
	pipe   redis.Pipeliner
	cmds   []*redis.Cmd
}

func (s *sender) stop() {
	if s.cancel != nil {
		s.cancel()
	}
}

func (s *sender) exec(b *batcher, q []*pending) {
	// No caller's context: each caller waits on its own, and one giving up
	// must not cancel the others' calls. Each pipeline has at least half of
	// sendTimeout.
	if now := time.Now(); s.ctx == nil || now.After(s.until.Add(-sendTimeout/2)) {
		s.stop()
		s.ctx, s.cancel = context.WithTimeout(b.ctx, sendTimeout)
		s.until = now.Add(sendTimeout)
	}
	if s.pipe == nil {
		s.pipe = b.rdb.Pipeline()
	}
	ctx := s.ctx
	s.cmds = s.cmds[:0]
	for _, p := range q {
		s.cmds = append(s.cmds, redis.NewCmd(ctx, p.args...))
	}
	s.run(ctx)
	for i, p := range q {
		p.cmd = s.cmds[i]
	}
	clear(s.cmds)
	for _, p := range q {
		if p.state.CompareAndSwap(waiting, answered) {
			p.done <- struct{}{}
			continue
		}
		if p.cleanup != nil && p.cmd.Err() == nil {
			b.later(p.cleanup)
		}
		putPending(p)
	}
}

// run sends s.cmds in one pipeline (see pipeline: a script a node does not
// have yet is sent again as EVAL).
func (s *sender) run(ctx context.Context) {
	pipeline(ctx, reusedPipe{s}, s.cmds, false)
}

// reusedPipe hands pipeline the sender's Pipeliner (empty after each Exec).
type reusedPipe struct{ s *sender }

func (r reusedPipe) Pipeline() redis.Pipeliner { return r.s.pipe }

// later sends args with the next pipeline, nobody waiting for the reply
// (starting a sender when a slot is free): for clean-ups that must not delay
// their caller, or that run on a sender. After close it sends them directly,
// bounded by a second.
func (b *batcher) later(args []any) {
	b.mu.Lock()
	if !b.closed {
		b.queue = append(b.queue, getPending(args, abandoned))
		if b.busy < maxDirect {
			b.startSender()
		}
		b.mu.Unlock()
		return
	}
	b.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if noScript(b.rdb.Do(ctx, args...).Err()) && toEval(args) {
		b.rdb.Do(ctx, args...) // best effort: what it releases otherwise expires with its lease
	}
}

// close makes every later call go direct, fails what is still queued or on
// the wire in a pipeline (its callers get a context error; a clean-up is
// dropped, and what it would have released expires with its lease), and waits
// for the senders: no queue can form after it.
func (b *batcher) close() {
	b.stop()
	b.mu.Lock()
	b.closed = true
	if len(b.queue) > 0 {
		b.startSender()
	}
	b.mu.Unlock()
	b.wg.Wait()
}
