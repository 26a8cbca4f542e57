package locks

import (
	"context"
	"testing"

	"github.com/cacheguard/cacheguard/internal/redistest"
)

// TestAcquireIdempotentUnderRetry: go-redis re-sends a command whose reply was
// lost; the script sees its own acquisition id and answers success again
// without taking a second hold.
func TestAcquireIdempotentUnderRetry(t *testing.T) {
	ctx := context.Background()
	s := redistest.Start(t)
	rdb := s.Client()
	c := New(rdb)
	defer c.Close()
	ks := keys("cg:", "retry")
	cfg := c.cfg
	first, err := c.attempt(ctx, ks, boxKeys(ks), "owner-1", "acq-1", cfg, false)
	if err != nil || !first.ok {
		t.Fatalf("first attempt: %+v %v", first, err)
	}
	again, err := c.attempt(ctx, ks, boxKeys(ks), "owner-1", "acq-1", cfg, false)
	if err != nil || !again.ok || again.fence != first.fence || again.holds != 1 {
		t.Fatalf("retried attempt: %+v %v, want success with fence %d and 1 hold", again, err, first.fence)
	}
	if n := rdb.HGet(ctx, ks[0], "n").Val(); n != "1" {
		t.Fatalf("hold count %s after a retried acquire, want 1", n)
	}
}
