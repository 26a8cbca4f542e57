package cacheguard

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/internal/redistest"
)

// holdReplies counts GET commands and, while armed, holds each GET's reply
// (the command has run on the server) until release is closed.
type holdReplies struct {
	n       atomic.Int64
	armed   atomic.Bool
	release chan struct{}
}

// heldGets starts a server holding k = v. The replies to GETs through the
// client it returns are held by the hook it returns until hook.open.
func heldGets(t *testing.T, v string) (*redistest.Server, *redis.Client, *holdReplies) {
	t.Helper()
	s := redistest.Start(t)
	rdb := s.Client()
	if err := rdb.Set(context.Background(), "k", v, 0).Err(); err != nil {
		t.Fatal(err)
	}
	hook := &holdReplies{release: make(chan struct{})}
	hook.armed.Store(true)
	rdb.AddHook(hook)
	return s, rdb, hook
}

// open lets the held replies go and stops holding new ones.
func (h *holdReplies) open() {
	h.armed.Store(false)
	close(h.release)
}

func (h *holdReplies) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *holdReplies) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if cmd.Name() == "get" {
			h.n.Add(1)
			if h.armed.Load() {
				<-h.release
			}
		}
		return err
	}
}
func (h *holdReplies) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 5s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func (r *reads) queued(key string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	if kr := r.m[key]; kr != nil && kr.next != nil {
		return kr.next.joined + 1
	}
	return 0
}

// TestConcurrentReadsShareGets: a burst of reads costs two GETs — the one in
// flight when the burst arrives, and one more that all of the burst shares.
func TestConcurrentReadsShareGets(t *testing.T) {
	ctx := context.Background()
	_, rdb, hook := heldGets(t, "v")
	var r reads
	const n = 50
	var wg sync.WaitGroup
	got := make([]string, n+1)
	wg.Go(func() { b, _ := r.get(ctx, rdb, "k"); got[n] = string(b) })
	waitFor(t, "first GET out", func() bool { return hook.n.Load() == 1 })
	for i := range n {
		wg.Go(func() { b, _ := r.get(ctx, rdb, "k"); got[i] = string(b) })
	}
	waitFor(t, "burst queued", func() bool { return r.queued("k") == n })
	hook.open()
	wg.Wait()
	if g := hook.n.Load(); g != 2 {
		t.Fatalf("%d GETs for %d concurrent reads, want 2", g, n+1)
	}
	for i, v := range got {
		if v != "v" {
			t.Fatalf("reader %d got %q", i, v)
		}
	}
}

// TestReadAfterInvalidationNotServedOldValue: a read that begins after the
// value was deleted never shares a GET that was answered before the delete.
func TestReadAfterInvalidationNotServedOldValue(t *testing.T) {
	ctx := context.Background()
	s, rdb, hook := heldGets(t, "old")
	var r reads
	first := make(chan string, 1)
	go func() { b, _ := r.get(ctx, rdb, "k"); first <- string(b) }()
	waitFor(t, "first GET answered by the server", func() bool { return hook.n.Load() == 1 })
	// The invalidation completes while that GET's reply is still on its way.
	if err := s.Client().Del(ctx, "k").Err(); err != nil {
		t.Fatal(err)
	}
	later := make(chan error, 1)
	go func() {
		b, err := r.get(ctx, rdb, "k")
		if err == nil {
			err = errors.New("got " + string(b))
		}
		later <- err
	}()
	waitFor(t, "later read queued", func() bool { return r.queued("k") == 1 })
	hook.open()
	if v := <-first; v != "old" {
		t.Fatalf("first read got %q", v)
	}
	if err := <-later; !errors.Is(err, redis.Nil) {
		t.Fatalf("a read that began after the delete: %v, want redis.Nil", err)
	}
}

// TestCancelledLeaderDoesNotFailFollowers: a follower whose leader's context
// ended reads for itself.
func TestCancelledLeaderDoesNotFailFollowers(t *testing.T) {
	ctx := context.Background()
	_, rdb, hook := heldGets(t, "v")
	var r reads
	lctx, cancel := context.WithCancel(ctx)
	leader := make(chan error, 1)
	go func() { _, err := r.get(lctx, rdb, "k"); leader <- err }()
	waitFor(t, "first GET out", func() bool { return hook.n.Load() == 1 })
	// Queue a burst behind it whose own leader gives up.
	follower := make(chan string, 1)
	go func() { b, _ := r.get(ctx, rdb, "k"); follower <- string(b) }()
	waitFor(t, "follower queued", func() bool { return r.queued("k") == 1 })
	cancel()
	hook.open()
	<-leader
	select {
	case v := <-follower:
		if v != "v" {
			t.Fatalf("follower got %q", v)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("follower stuck")
	}
}

// TestGivenUpReadsLeaveNothing: a caller that queues behind a GET in flight
// and gives up leaves no entry behind once that GET is answered (50 keys, 50
// callers that gave up: an empty map).
func TestGivenUpReadsLeaveNothing(t *testing.T) {
	ctx := context.Background()
	_, rdb, hook := heldGets(t, "v")
	var r reads
	const n = 50
	var wg sync.WaitGroup
	for i := range n {
		key := "k" + string(rune('A'+i))
		wg.Go(func() { r.get(ctx, rdb, key) })
		waitFor(t, "GET out", func() bool { return hook.n.Load() == int64(i+1) })
		gctx, cancel := context.WithCancel(ctx)
		gave := make(chan struct{})
		go func() { r.get(gctx, rdb, key); close(gave) }()
		waitFor(t, "queued", func() bool { return r.queued(key) == 1 })
		cancel()
		<-gave
	}
	hook.open()
	wg.Wait()
	r.mu.Lock()
	left := len(r.m)
	r.mu.Unlock()
	if left != 0 {
		t.Fatalf("%d keys left in the coalescing map after every read ended", left)
	}
}
