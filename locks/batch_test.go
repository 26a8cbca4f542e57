package locks_test

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/internal/redistest"
	"github.com/cacheguard/cacheguard/locks"
)

// gateHook holds every command sent on its own (not pipelined) until open is
// closed, and records the size of every pipeline.
type gateHook struct {
	open    chan struct{}
	entered chan struct{} // one send per command held
	release func()        // closes open once (gatedClient)

	mu    sync.Mutex
	pipes []int
}

func newGateHook() *gateHook {
	return &gateHook{open: make(chan struct{}), entered: make(chan struct{}, 64)}
}

func (h *gateHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *gateHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() == "evalsha" || cmd.Name() == "eval" {
			h.entered <- struct{}{}
			<-h.open
		}
		return next(ctx, cmd)
	}
}

func (h *gateHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.mu.Lock()
		h.pipes = append(h.pipes, len(cmds))
		h.mu.Unlock()
		return next(ctx, cmds)
	}
}

func (h *gateHook) pipelines() []int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]int(nil), h.pipes...)
}

// pipeCounter records the size of every pipeline.
type pipeCounter struct {
	mu    sync.Mutex
	pipes []int
}

func (h *pipeCounter) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h *pipeCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h *pipeCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if cmds[0].Name() == "client" {
			return next(ctx, cmds) // a new connection's set-up
		}
		h.mu.Lock()
		h.pipes = append(h.pipes, len(cmds))
		h.mu.Unlock()
		return next(ctx, cmds)
	}
}

func (h *pipeCounter) pipelines() []int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]int(nil), h.pipes...)
}

// occupy starts calls that take the client's direct slots and waits until
// they are held in the hook.
func occupy(t *testing.T, c *locks.Client, h *gateHook, names ...string) *sync.WaitGroup {
	t.Helper()
	var wg sync.WaitGroup
	for _, name := range names {
		wg.Go(func() {
			lk, err := c.TryLock(context.Background(), name)
			if err != nil {
				t.Error(err)
				return
			}
			lk.Unlock(context.Background())
		})
	}
	for range names {
		select {
		case <-h.entered:
		case <-time.After(5 * time.Second):
			t.Fatal("direct calls not sent")
		}
	}
	return &wg
}

// gatedClient returns a server and a Client on it whose two direct slots are
// taken by calls held in the returned hook until h.release is called (busy
// ends when they have).
func gatedClient(t *testing.T) (*redistest.Server, *locks.Client, *gateHook, *sync.WaitGroup) {
	t.Helper()
	s := redistest.Start(t)
	rdb := s.Client()
	h := newGateHook()
	rdb.AddHook(h)
	c := locks.New(rdb)
	var once sync.Once
	open := func() { once.Do(func() { close(h.open) }) }
	h.release = open
	t.Cleanup(func() { open(); c.Close() }) // a test that failed early must not leave calls held
	return s, c, h, occupy(t, c, h, "slot-1", "slot-2")
}

// TestCallsShareRoundTrips: calls made while the direct slots are busy travel
// together in one pipeline, and each gets its own answer.
func TestCallsShareRoundTrips(t *testing.T) {
	_, c, h, busy := gatedClient(t)

	const n = 10
	got := make(chan error, n+1)
	for i := range n {
		name := "shared"
		if i%2 == 1 {
			name = "own-" + string(rune('a'+i))
		}
		go func() {
			lk, err := c.TryLock(context.Background(), name)
			if err == nil {
				err = lk.Extend(context.Background(), time.Minute)
			}
			got <- err
		}()
	}
	eventually(t, 5*time.Second, "calls queued", func() bool { return c.Queued() == n })
	h.release()
	busy.Wait()
	var obtained, refused int
	for range n {
		switch err := <-got; {
		case err == nil:
			obtained++
		case errors.Is(err, locks.ErrNotObtained):
			refused++
		default:
			t.Fatal(err)
		}
	}
	// One of the five calls on "shared" wins; the five on their own names all do.
	if obtained != 6 || refused != 4 {
		t.Fatalf("obtained %d, refused %d; want 6 and 4", obtained, refused)
	}
	if p := h.pipelines(); !slices.Contains(p, n) {
		t.Fatalf("pipelines %v, want one carrying all %d queued calls", p, n)
	}
	if s := c.Senders(); s != 0 {
		t.Fatalf("%d sender goroutines started; want none: a queued caller sends the queue", s)
	}
}

// TestUncontendedCallsHandNothingOff: calls made one at a time, or by fewer
// callers than the direct slots, each go on the wire from their caller's
// goroutine, alone: no pipeline, no goroutine of the batcher's.
func TestUncontendedCallsHandNothingOff(t *testing.T) {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	h := &pipeCounter{}
	rdb.AddHook(h)
	c := locks.New(rdb)
	t.Cleanup(func() { c.Close(); rdb.Close() })
	var wg sync.WaitGroup
	for g := range 2 {
		wg.Go(func() {
			for range 50 {
				lk, err := c.Lock(ctx, "alone-"+strconv.Itoa(g))
				if err != nil {
					t.Error(err)
					return
				}
				if err := lk.Unlock(ctx); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	if p := h.pipelines(); len(p) != 0 || c.Senders() != 0 {
		t.Fatalf("pipelines %v, sender goroutines %d; want none", p, c.Senders())
	}
}

// doneRecorder records the Done channel of every EVALSHA's context.
type doneRecorder struct {
	mu    sync.Mutex
	dones map[<-chan struct{}]int
	calls int
}

func (h *doneRecorder) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *doneRecorder) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() == "evalsha" { // (a script new to the server is sent again as eval)
			h.mu.Lock()
			h.dones[ctx.Done()]++
			h.calls++
			h.mu.Unlock()
		}
		return next(ctx, cmd)
	}
}
func (h *doneRecorder) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestDirectCallsShareADeadlineUnderARequestContext: a call sent on its
// caller's goroutine under a context that can be cancelled (a request's) is
// bounded by a deadline shared with the calls sent about then, not by a
// context, a timer and a registration with the caller's context of its own
// (about 9 µs, 0.2 context switches and 6 allocations per lock cycle:
// BenchmarkCycleLone). Its caller waits for the reply on its goroutine
// either way; the command's context keeps the caller's deadline.
func TestDirectCallsShareADeadlineUnderARequestContext(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr, ContextTimeoutEnabled: true})
	h := &doneRecorder{dones: map[<-chan struct{}]int{}}
	rdb.AddHook(h)
	c := locks.New(rdb, locks.CommandTimeout(2*time.Second))
	t.Cleanup(func() { c.Close(); rdb.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const cycles = 20
	for range cycles {
		lk, err := c.TryLock(ctx, "request-context")
		if err != nil {
			t.Fatal(err)
		}
		if err := lk.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.calls != 2*cycles {
		t.Fatalf("%d script calls, want %d", h.calls, 2*cycles)
	}
	// Consecutive calls share a deadline for a 32nd of the command timeout
	// (62 ms here); a slow run may span a few.
	if len(h.dones) > cycles/2 {
		t.Fatalf("%d script calls ran under %d contexts of their own; want them to share a few deadlines", h.calls, len(h.dones))
	}
	if _, ok := h.dones[ctx.Done()]; ok {
		t.Fatal("a script call ran under the caller's own context, unbounded by the command timeout")
	}
}

// TestAbandonedAttemptGivesTheLockBack: a caller that gives up while its
// attempt is queued returns at once; when the attempt then takes the lock,
// the lock is released again, so nobody is locked out until the lease ends.
func TestAbandonedAttemptGivesTheLockBack(t *testing.T) {
	s, c, h, busy := gatedClient(t)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := c.TryLock(ctx, "abandoned")
		done <- err
	}()
	eventually(t, 5*time.Second, "attempt queued", func() bool { return c.Queued() == 1 })
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("TryLock = %v, want context.Canceled", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a cancelled caller kept waiting for its queued attempt")
	}
	h.release()
	busy.Wait()
	direct := s.Client()
	eventually(t, 5*time.Second, "abandoned lock released", func() bool {
		return direct.Exists(context.Background(), "cg:lock:{abandoned}").Val() == 0
	})
	other := locks.New(direct)
	defer other.Close()
	lk, err := other.TryLock(context.Background(), "abandoned")
	if err != nil {
		t.Fatalf("after the abandoned attempt: %v", err)
	}
	lk.Unlock(context.Background())
}

// pipeGate holds every pipeline of script calls until open is closed.
type pipeGate struct{ open chan struct{} }

func (h *pipeGate) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h *pipeGate) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h *pipeGate) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if n := cmds[0].Name(); n == "evalsha" || n == "eval" {
			<-h.open
		}
		return next(ctx, cmds)
	}
}

// TestQueuedCallerLeadsOnlyWithinItsDeadline: a caller that queued with time
// to spare, but whose deadline came closer than a command's bound while it
// waited, does not send the queue itself when a slot frees (a leader waits
// for its pipeline, its context notwithstanding): a sender does, and the
// caller returns at its deadline.
func TestQueuedCallerLeadsOnlyWithinItsDeadline(t *testing.T) {
	s := redistest.Start(t)
	rdb := s.Client()
	h := newGateHook()
	rdb.AddHook(h)
	pipes := &pipeGate{open: make(chan struct{})}
	rdb.AddHook(pipes)
	const timeout = 200 * time.Millisecond // a command's bound: at most Patience (2) times it
	c := locks.New(rdb, locks.CommandTimeout(timeout))
	var openOnce, pipesOnce sync.Once
	release := func() { openOnce.Do(func() { close(h.open) }) }
	releasePipes := func() { pipesOnce.Do(func() { close(pipes.open) }) }
	t.Cleanup(func() { release(); releasePipes(); c.Close() })
	var busy sync.WaitGroup
	for _, name := range []string{"slot-1", "slot-2"} {
		busy.Go(func() {
			// Held past their bound, they may fail: only their slots matter.
			if lk, err := c.TryLock(context.Background(), name); err == nil {
				lk.Unlock(context.Background())
			}
		})
		select {
		case <-h.entered:
		case <-time.After(5 * time.Second):
			t.Fatal("direct calls not sent")
		}
	}

	deadline := time.Now().Add(2*timeout + 300*time.Millisecond) // room for a bound as it queues
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := c.TryLock(ctx, "late-leader")
		done <- err
	}()
	eventually(t, 5*time.Second, "attempt queued", func() bool { return c.Queued() == 1 })
	// Less than any bound left (it is at least the command timeout): a
	// pipeline it sent could outlast its deadline.
	time.Sleep(time.Until(deadline.Add(-timeout / 2)))
	release()
	select {
	case err := <-done:
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("TryLock = %v, want context.DeadlineExceeded", err)
		}
		if late := time.Since(deadline); late > 150*time.Millisecond {
			t.Fatalf("TryLock returned %v past its deadline", late)
		}
	case <-time.After(time.Until(deadline) + 2*time.Second):
		releasePipes()
		t.Fatal("a caller whose deadline was near led the queue and waited for its pipeline past its deadline")
	}
	releasePipes()
	busy.Wait()
}
