package cacheguard

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/internal/redistest"
)

// gateGets counts GET commands and holds each until release is closed.
type gateGets struct {
	n       atomic.Int64
	release chan struct{}
}

func (h *gateGets) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *gateGets) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() == "get" {
			h.n.Add(1)
			<-h.release
		}
		return next(ctx, cmd)
	}
}
func (h *gateGets) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestConcurrentReadsShareOneGet: requests arriving while a GET of their key
// is in flight share it, so a burst costs one GET per process.
func TestConcurrentReadsShareOneGet(t *testing.T) {
	ctx := context.Background()
	s := redistest.Start(t)
	rdb := s.Client()
	rdb.Set(ctx, "k", "v", 0)
	hook := &gateGets{release: make(chan struct{})}
	rdb.AddHook(hook)
	var r reads
	const n = 50
	var wg sync.WaitGroup
	got := make([]string, n+1)
	wg.Go(func() { b, _ := r.get(ctx, rdb, "k"); got[n] = string(b) })
	deadline := time.Now().Add(5 * time.Second)
	for hook.n.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	for i := range n {
		wg.Go(func() { b, _ := r.get(ctx, rdb, "k"); got[i] = string(b) })
	}
	joined := func() int {
		r.mu.Lock()
		defer r.mu.Unlock()
		if c := r.m["k"]; c != nil {
			return c.joined
		}
		return -1
	}
	for joined() < n {
		if time.Now().After(deadline) {
			t.Fatalf("only %d followers joined", joined())
		}
		time.Sleep(time.Millisecond)
	}
	close(hook.release)
	wg.Wait()
	if g := hook.n.Load(); g != 1 {
		t.Fatalf("%d GETs for %d concurrent reads, want 1", g, n+1)
	}
	for i, v := range got {
		if v != "v" {
			t.Fatalf("reader %d got %q", i, v)
		}
	}
}

// TestCancelledLeaderDoesNotFailFollowers: a follower whose leader's context
// ended reads for itself.
func TestCancelledLeaderDoesNotFailFollowers(t *testing.T) {
	s := redistest.Start(t)
	rdb := s.Client()
	rdb.Set(context.Background(), "k", "v", 0)
	var r reads
	lctx, cancel := context.WithCancel(context.Background())
	c := &readCall{done: make(chan struct{}), err: context.Canceled}
	r.m = map[string]*readCall{"k": c}
	cancel()
	_ = lctx
	res := make(chan string, 1)
	go func() { b, _ := r.get(context.Background(), rdb, "k"); res <- string(b) }()
	close(c.done) // the leader gives up with its context's error
	select {
	case v := <-res:
		if v != "v" {
			t.Fatalf("follower got %q", v)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("follower stuck")
	}
}
