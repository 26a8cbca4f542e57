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
// while its command is out — a Get's read, an Invalidate's scripts — returns
// with the deadline's error, and the command is not cut: go-redis closes the
// connection of a command its context cut, and the redials (each a
// handshake, under contexts as short) fed the overload. The command goes on,
// bounded by the command timeout, lands once Redis answers, and its
// connection returns to the pool.
func TestShortDeadlineKeepsConnection(t *testing.T) {
	for _, tc := range []struct {
		name   string
		call   func(context.Context, *cacheguard.Guard, string, *counter) error
		landed func(context.Context, *redis.Client) bool // what the command did, seen in Redis
		after  int                                       // the ID the next Get returns
	}{
		{"Get", func(ctx context.Context, g *cacheguard.Guard, key string, c *counter) error {
			_, err := cacheguard.Get(ctx, g, key, c.load)
			return err
		}, func(context.Context, *redis.Client) bool { return true }, 1},
		// A fresh server answers the invalidation's first EVALSHA with
		// NOSCRIPT, and its EVAL follows: wait for its effect.
		{"Invalidate", func(ctx context.Context, g *cacheguard.Guard, key string, _ *counter) error {
			return g.Invalidate(ctx, key)
		}, func(ctx context.Context, admin *redis.Client) bool { return len(admin.Keys(ctx, "cg:v:*").Val()) == 0 }, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
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
			err := tc.call(sctx, g, key, c)
			cancel()
			srv.Resume()
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("got %v, want the deadline's error", err)
			}
			eventually(t, 5*time.Second, "the command landed", func() bool { return tc.landed(ctx, admin) })
			eventually(t, 5*time.Second, "no connection busy", func() bool {
				st := rdb.PoolStats()
				return st.IdleConns == st.TotalConns
			})
			if st := rdb.PoolStats(); st.TotalConns != base.TotalConns || st.Misses != base.Misses {
				t.Fatalf("%d connections (%d before), %d dialled since: the command was cut with its caller",
					st.TotalConns, base.TotalConns, st.Misses-base.Misses)
			}
			if v, err := cacheguard.Get(ctx, g, key, c.load); err != nil || v.ID != tc.after {
				t.Fatalf("after: %+v, %v; want ID %d", v, err, tc.after)
			}
		})
	}
}
