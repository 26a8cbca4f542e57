package locks_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cacheguard/cacheguard/locks"
)

// BenchmarkRedlockCycle measures one uncontended acquire + release on a
// 5-server Redlock (each goroutine locks its own names).
func BenchmarkRedlockCycle(b *testing.B) {
	// A generous node timeout: a stall of the shared test machine is not what this measures.
	s := newRedlockSet(b, 5, nil, locks.Lease(10*time.Second), locks.NodeTimeout(time.Second))
	ctx := context.Background()
	var next atomic.Int64
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		name := "rl:bench:" + strconv.FormatInt(next.Add(1), 10)
		for pb.Next() {
			lk, err := s.r.TryLock(ctx, name)
			if err != nil {
				b.Error(err)
				return
			}
			if err := lk.Unlock(ctx); err != nil {
				b.Error(err)
				return
			}
		}
	})
}
