package cacheguard

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/internal/rcmd"
	"github.com/cacheguard/cacheguard/internal/redistest"
)

// gateHook holds single commands (not pipelines) while armed, until release
// is closed, and records the size of each pipeline sent.
type gateHook struct {
	armed   atomic.Bool
	held    atomic.Int64
	release chan struct{}
	mu      sync.Mutex
	singles int
	pipes   []int
}

func (h *gateHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *gateHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if setupCmd(cmd) {
			return next(ctx, cmd)
		}
		h.mu.Lock()
		h.singles++
		h.mu.Unlock()
		if h.armed.Load() {
			h.held.Add(1)
			<-h.release
		}
		return next(ctx, cmd)
	}
}
func (h *gateHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if len(cmds) > 0 && !setupCmd(cmds[0]) {
			h.mu.Lock()
			h.pipes = append(h.pipes, len(cmds))
			h.mu.Unlock()
		}
		return next(ctx, cmds)
	}
}

func setupCmd(cmd redis.Cmder) bool { return cmd.Name() == "hello" || cmd.Name() == "client" }

func (h *gateHook) counts() (singles int, pipes []int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.singles, append([]int(nil), h.pipes...)
}

// TestHitsShareRoundTrips: a lone hit's read is one command sent by its
// caller; reads that arrive while every direct slot is on the wire queue,
// and the first of them sends them all in one pipeline when a slot frees,
// each caller given its own key's reply. A queued caller whose context ends
// stops waiting at once; its read still travels, and the queue drains
// without it.
func TestHitsShareRoundTrips(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Start(t).Client(func(o *redis.Options) { o.ContextTimeoutEnabled = true })
	const direct, queued = 2, 5
	for i := range direct + queued + 1 {
		if err := rdb.HSet(ctx, fmt.Sprint("h", i), "f", fmt.Sprint("v", i)).Err(); err != nil {
			t.Fatal(err)
		}
	}
	hook := &gateHook{release: make(chan struct{})}
	rdb.AddHook(hook)
	h := &hits{cmd: rcmd.New(rdb, time.Hour), direct: direct}
	read := func(ctx context.Context, i int) (string, error) {
		return h.do(ctx, []any{"hget", fmt.Sprint("h", i), "f"}).Text()
	}
	queueLen := func() int {
		h.mu.Lock()
		defer h.mu.Unlock()
		return len(h.queue)
	}

	if v, err := read(ctx, 0); err != nil || v != "v0" {
		t.Fatalf("lone read: %q, %v", v, err)
	}
	if s, p := hook.counts(); s != 1 || len(p) != 0 {
		t.Fatalf("lone read: %d commands and %d pipelines, want 1 command", s, len(p))
	}

	hook.armed.Store(true)
	type answer struct {
		i   int
		v   string
		err error
	}
	answers := make(chan answer, direct+queued)
	for i := range direct + queued {
		go func() {
			v, err := read(ctx, i)
			answers <- answer{i, v, err}
		}()
		if i < direct {
			waitFor(t, "direct reads on the wire", func() bool { return hook.held.Load() == int64(i+1) })
		} else {
			waitFor(t, "reads queued", func() bool { return queueLen() == i-direct+1 })
		}
	}
	cctx, cancel := context.WithCancel(ctx)
	gaveUp := make(chan error, 1)
	go func() {
		_, err := read(cctx, direct+queued)
		gaveUp <- err
	}()
	waitFor(t, "the last read queued", func() bool { return queueLen() == queued+1 })
	cancel()
	select {
	case err := <-gaveUp:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("queued read whose context ended: %v, want context.Canceled", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a queued read whose context ended still waits")
	}

	hook.armed.Store(false)
	close(hook.release)
	for range direct + queued {
		a := <-answers
		if want := fmt.Sprint("v", a.i); a.err != nil || a.v != want {
			t.Errorf("read %d: %q, %v; want %q", a.i, a.v, a.err, want)
		}
	}
	s, p := hook.counts()
	if s != 1+direct || len(p) != 1 || p[0] != queued+1 {
		t.Fatalf("%d commands and pipelines of %v; want %d commands and one pipeline of %d (the queue, its abandoned read among it)", s, p, 1+direct, queued+1)
	}
	waitFor(t, "no send on the wire, none queued", func() bool {
		h.mu.Lock()
		defer h.mu.Unlock()
		return h.busy == 0 && len(h.queue) == 0
	})
}

// TestGetHitsShareRoundTrips: Get's hits travel as TestHitsShareRoundTrips
// says on a client with ContextTimeoutEnabled (their reads are sent on the
// callers' goroutines), each caller served its own key's value, and none
// loads.
func TestGetHitsShareRoundTrips(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Start(t).Client(func(o *redis.Options) { o.ContextTimeoutEnabled = true })
	// A command's bound (up to twice the timeout) within the wait budget
	// (10s): the reads are sent on the callers' goroutines (see inline).
	g := New(rdb, CommandTimeout(2*time.Second), EarlyRefresh(0))
	defer g.Close()
	g.hits.direct = 2
	const n = 6
	key := func(i int) string { return fmt.Sprint("k", i) }
	for i := range n {
		if _, err := Get(ctx, g, key(i), func(context.Context) (string, error) { return fmt.Sprint("v", i), nil }); err != nil {
			t.Fatal(err)
		}
	}
	hook := &gateHook{release: make(chan struct{})}
	rdb.AddHook(hook)
	hook.armed.Store(true)
	errs := make(chan error, n)
	for i := range n {
		go func() {
			v, err := Get(ctx, g, key(i), func(context.Context) (string, error) { return "", errors.New("loaded a warm key") })
			if want := fmt.Sprint("v", i); err == nil && v != want {
				err = fmt.Errorf("%s: %q, want %q", key(i), v, want)
			}
			errs <- err
		}()
		if i < 2 {
			waitFor(t, "direct reads on the wire", func() bool { return hook.held.Load() == int64(i+1) })
		} else {
			waitFor(t, "reads queued", func() bool {
				g.hits.mu.Lock()
				defer g.hits.mu.Unlock()
				return len(g.hits.queue) == i-1
			})
		}
	}
	hook.armed.Store(false)
	close(hook.release)
	for range n {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	if s, p := hook.counts(); s != 2 || len(p) != 1 || p[0] != n-2 {
		t.Fatalf("%d commands and pipelines of %v; want 2 commands and one pipeline of %d", s, p, n-2)
	}
}

// pipeHold holds every pipeline of reads until release is closed.
type pipeHold struct{ release chan struct{} }

func (h *pipeHold) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h *pipeHold) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h *pipeHold) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if len(cmds) > 0 && !setupCmd(cmds[0]) {
			<-h.release
		}
		return next(ctx, cmds)
	}
}

// TestHitsQueuedReadLeadsOnlyWithinItsDeadline: a read that queued with time
// to spare, but whose caller's deadline came closer than a command's bound
// while it waited, does not send the queue when a slot frees (a leader waits
// for its pipeline, its context notwithstanding): a worker does, and the
// caller stops waiting at its deadline.
func TestHitsQueuedReadLeadsOnlyWithinItsDeadline(t *testing.T) {
	rdb := redistest.Start(t).Client(func(o *redis.Options) { o.ContextTimeoutEnabled = true })
	if err := rdb.HSet(context.Background(), "h", "f", "v").Err(); err != nil {
		t.Fatal(err)
	}
	hook := &gateHook{release: make(chan struct{})}
	rdb.AddHook(hook)
	pipes := &pipeHold{release: make(chan struct{})}
	rdb.AddHook(pipes)
	const timeout = 200 * time.Millisecond // a command's bound: at most rcmd.Patience (2) times it
	w := &workers{jobs: make(chan job), quit: make(chan struct{})}
	h := &hits{cmd: rcmd.New(rdb, timeout), work: w, direct: 2}
	var released, pipesReleased sync.Once
	release := func() { released.Do(func() { close(hook.release) }) }
	releasePipes := func() { pipesReleased.Do(func() { close(pipes.release) }) }
	var busy sync.WaitGroup
	t.Cleanup(func() { release(); releasePipes(); busy.Wait(); w.close() })
	read := func(ctx context.Context) error { return h.do(ctx, []any{"hget", "h", "f"}).Err() }

	hook.armed.Store(true)
	for i := range 2 {
		busy.Go(func() { _ = read(context.Background()) }) // held: only their slots matter
		waitFor(t, "direct reads on the wire", func() bool { return hook.held.Load() == int64(i+1) })
	}
	deadline := time.Now().Add(2*timeout + 300*time.Millisecond) // room for a bound as it queues
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	done := make(chan error, 1)
	// Sent on its caller's goroutine, as Get's hits are: under the
	// caller's context bounded by a shared deadline (see Guard.shared).
	go func() { done <- read(&boundCtx{Context: ctx, end: ctx, d: deadline}) }()
	waitFor(t, "the read queued", func() bool {
		h.mu.Lock()
		defer h.mu.Unlock()
		return len(h.queue) == 1
	})
	// Less than any bound left (it is at least the command timeout): a
	// pipeline it sent could outlast its deadline.
	time.Sleep(time.Until(deadline.Add(-timeout / 2)))
	hook.armed.Store(false)
	release()
	select {
	case err := <-done:
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("read = %v, want context.DeadlineExceeded", err)
		}
		if late := time.Since(deadline); late > 150*time.Millisecond {
			t.Fatalf("the read returned %v past its caller's deadline", late)
		}
	case <-time.After(time.Until(deadline) + 2*time.Second):
		releasePipes()
		t.Fatal("a read whose caller's deadline was near led the queue and waited for its pipeline past the deadline")
	}
	releasePipes()
	waitFor(t, "no send on the wire, none queued", func() bool {
		h.mu.Lock()
		defer h.mu.Unlock()
		return h.busy == 0 && len(h.queue) == 0
	})
}
