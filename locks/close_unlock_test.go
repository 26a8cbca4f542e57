package locks_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/cacheguard/cacheguard/internal/redistest"
	"github.com/cacheguard/cacheguard/locks"
)

// TestUnlockDuringCloseGivesKeyBack: an Unlock of a lock that Close has
// dropped gives its key back (Lock.Unlock), also while Close is still
// closing — with a context shorter than the command's bound, which queues a
// call for a sender that Close cancels. TestGenLocks at 6× its budget, 12-07:
// "Redis keeps hold … 1.017s after its calls returned, and an Unlock begun
// after its process's Close returned in calm".
func TestUnlockDuringCloseGivesKeyBack(t *testing.T) {
	s := redistest.Start(t)
	rdb := s.Client()
	ctx := context.Background()
	const rounds = 40
	for i := range rounds {
		c := locks.New(rdb, locks.CommandTimeout(500*time.Millisecond))
		name := fmt.Sprintf("close-unlock-%d", i)
		lk, err := c.Lock(ctx, name, locks.Lease(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		closed := make(chan struct{})
		go func() {
			c.Close()
			close(closed)
		}()
		select {
		case <-lk.Lost(): // Close dropped it: its key stays until Unlock or the lease
		case <-time.After(10 * time.Second):
			t.Fatal("Close did not drop the lock held")
		}
		uctx, cancel := context.WithTimeout(ctx, 400*time.Millisecond) // shorter than the command's bound
		err = lk.Unlock(uctx)
		cancel()
		<-closed
		if n, xerr := rdb.Exists(ctx, "cg:lock:{"+name+"}").Result(); xerr != nil || n != 0 {
			t.Fatalf("round %d: Unlock (%v) of a lock Close dropped left its key (exists %d, %v)", i, err, n, xerr)
		}
	}
}
