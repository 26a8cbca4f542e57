package cacheguard_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/cacheguard"
	"github.com/cacheguard/cacheguard/internal/redistest"
)

// lateCtx is a context whose deadline has passed but that has not ended yet:
// what a caller's context is to a Redis call when the runtime runs the
// context's timer late, as it does on a starved CPU. A client that bounds its
// socket calls by the context's deadline (ContextTimeoutEnabled) fails such a
// call at once with a bare timeout.
type lateCtx struct {
	context.Context
	d time.Time
}

func (c lateCtx) Deadline() (time.Time, bool) { return c.d, true }

// TestPassedDeadlineIsNotARedisFailure (issue 33, the real-database mix's
// failures under CPU starvation): a call whose deadline has passed when its
// Redis command is sent, its context's timer not run yet, ends with the
// deadline's error. It is not a Redis failure: nothing is counted as one,
// and the loader never runs uncached (fail-open) for it — on a cold key and
// on a warm one.
func TestPassedDeadlineIsNotARedisFailure(t *testing.T) {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { rdb.Close() })
	g := cacheguard.New(rdb, cacheguard.EarlyRefresh(0))
	t.Cleanup(func() { g.Close() })
	warm := testKey(t, "warm")
	if _, err := cacheguard.Get(ctx, g, warm, (&counter{name: "warm"}).load); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{testKey(t, "cold"), warm} {
		base := g.Stats()
		c := &counter{name: "late"}
		late := lateCtx{ctx, time.Now().Add(-time.Millisecond)}
		_, err := cacheguard.Get(late, g, key, c.load)
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("%s: got %v, want the deadline's error", key, err)
		}
		st := g.Stats()
		if n := c.n.Load(); n != 0 || st.FailOpenLoads != base.FailOpenLoads || st.RedisErrors != base.RedisErrors {
			t.Errorf("%s: %d loads, %d fail-open loads, %d Redis errors, want none", key, n,
				st.FailOpenLoads-base.FailOpenLoads, st.RedisErrors-base.RedisErrors)
		}
	}
}

// TestShortDeadlineKeepsConnection (issue 33, the real-database mix's
// collapse: connection churn on a starved host): a call whose deadline ends
// while its read is out returns with the deadline's error, and the read is
// not cut: go-redis closes the connection of a command its context cut, and
// the redials (each a handshake, under contexts as short) fed the overload.
// The read goes on, bounded by the command timeout, and its connection
// returns to the pool.
func TestShortDeadlineKeepsConnection(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	rdb := srv.Client(func(o *redis.Options) { o.ContextTimeoutEnabled = true })
	g := cacheguard.New(rdb, cacheguard.EarlyRefresh(0))
	t.Cleanup(func() { g.Close() })
	key := testKey(t)
	c := &counter{name: "v"}
	if _, err := cacheguard.Get(ctx, g, key, c.load); err != nil {
		t.Fatal(err)
	}
	base := rdb.PoolStats()
	srv.Pause()
	sctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	_, err := cacheguard.Get(sctx, g, key, c.load)
	cancel()
	srv.Resume()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("got %v, want the deadline's error", err)
	}
	eventually(t, 5*time.Second, "no connection busy", func() bool {
		st := rdb.PoolStats()
		return st.IdleConns == st.TotalConns
	})
	if st := rdb.PoolStats(); st.TotalConns != base.TotalConns || st.Misses != base.Misses {
		t.Fatalf("%d connections (%d before), %d dialled since: the read was cut with its caller",
			st.TotalConns, base.TotalConns, st.Misses-base.Misses)
	}
	if v, err := cacheguard.Get(ctx, g, key, c.load); err != nil || v.ID != 1 {
		t.Fatalf("after: %+v, %v", v, err)
	}
}

// TestShortDeadlineInvalidateKeepsConnection: the same for Invalidate. The
// caller returns at its deadline with its error; the invalidation is not
// cut: it lands once Redis answers (the key's values are gone, the next Get
// loads again), and its connection stays in the pool.
func TestShortDeadlineInvalidateKeepsConnection(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	rdb := srv.Client(func(o *redis.Options) { o.ContextTimeoutEnabled = true })
	admin := srv.Client()
	g := cacheguard.New(rdb, cacheguard.EarlyRefresh(0))
	t.Cleanup(func() { g.Close() })
	key := testKey(t)
	c := &counter{name: "v"}
	if _, err := cacheguard.Get(ctx, g, key, c.load); err != nil {
		t.Fatal(err)
	}
	base := rdb.PoolStats()
	srv.Pause()
	sctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	err := g.Invalidate(sctx, key)
	cancel()
	srv.Resume()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("got %v, want the deadline's error", err)
	}
	eventually(t, 5*time.Second, "the invalidation landed", func() bool {
		return len(admin.Keys(ctx, "cg:v:*").Val()) == 0
	})
	eventually(t, 5*time.Second, "no connection busy", func() bool {
		st := rdb.PoolStats()
		return st.IdleConns == st.TotalConns
	})
	if st := rdb.PoolStats(); st.TotalConns != base.TotalConns || st.Misses != base.Misses {
		t.Fatalf("%d connections (%d before), %d dialled since: the invalidation was cut with its caller",
			st.TotalConns, base.TotalConns, st.Misses-base.Misses)
	}
	if v, err := cacheguard.Get(ctx, g, key, c.load); err != nil || v.ID != 2 {
		t.Fatalf("after: %+v, %v; want the value of a second load", v, err)
	}
}
