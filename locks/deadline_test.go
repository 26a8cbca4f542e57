package locks_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/internal/redistest"
	"github.com/cacheguard/cacheguard/locks"
)

// TestShortDeadlineKeepsConnection (issue 33: connection churn on a starved
// host): a TryLock whose deadline ends while its acquisition is out returns
// with the deadline's error, and the call is not cut — go-redis closes the
// connection of a command its context cut, and on a starved host the late
// callers' redials feed the overload. The call goes on, bounded by the
// command timeout (and the WAIT's, with Replicas: the script and its WAIT
// share one connection); what it was granted once Redis answered is given
// back. No connection is dialled, and the lock is free.
func TestShortDeadlineKeepsConnection(t *testing.T) {
	for _, c := range []struct {
		name     string
		replicas bool
	}{{"plain", false}, {"Replicas", true}} {
		t.Run(c.name, func(t *testing.T) {
			ctx := context.Background()
			var s *redistest.Server
			var opts []locks.CallOption
			if c.replicas {
				ss := redistest.StartN(t, 2)
				s = ss[0]
				if _, err := ss[1].Do(ctx, "REPLICAOF", "127.0.0.1", s.Port()); err != nil {
					t.Fatal(err)
				}
				redistest.Eventually(t, 15*time.Second, "replica linked", func() bool {
					info, _ := ss[1].Info(ctx, "replication")
					return info["master_link_status"] == "up"
				})
				opts = append(opts, locks.Replicas(1, time.Second))
			} else {
				s = redistest.Start(t)
			}
			rdb := s.Client(func(o *redis.Options) { o.ContextTimeoutEnabled = true })
			cl := locks.New(rdb)
			t.Cleanup(func() { cl.Close() })
			lk, err := cl.TryLock(ctx, "warm", opts...)
			if err != nil {
				t.Fatal(err)
			}
			if err := lk.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			base := rdb.PoolStats()
			s.Pause()
			sctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
			_, err = cl.TryLock(sctx, "short", opts...)
			cancel()
			s.Resume()
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("got %v, want the deadline's error", err)
			}
			other := locks.New(s.Client())
			t.Cleanup(func() { other.Close() })
			redistest.Eventually(t, 5*time.Second, "the abandoned acquisition given back", func() bool {
				lk, err := other.TryLock(ctx, "short")
				if err != nil {
					return false
				}
				return lk.Unlock(ctx) == nil
			})
			redistest.Eventually(t, 5*time.Second, "no connection busy", func() bool {
				st := rdb.PoolStats()
				return st.IdleConns == st.TotalConns
			})
			if st := rdb.PoolStats(); st.TotalConns != base.TotalConns || st.StaleConns != base.StaleConns || st.Misses != base.Misses {
				t.Fatalf("%d connections (%d before), %d closed as stale, %d dialled since: the call was cut with its caller",
					st.TotalConns, base.TotalConns, st.StaleConns-base.StaleConns, st.Misses-base.Misses)
			}
		})
	}
}
