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
	first, err := c.attempt(ctx, ks, boxKeys(ks), "owner-1", "acq-1", cfg, "")
	if err != nil || !first.ok {
		t.Fatalf("first attempt: %+v %v", first, err)
	}
	again, err := c.attempt(ctx, ks, boxKeys(ks), "owner-1", "acq-1", cfg, "")
	if err != nil || !again.ok || again.fence != first.fence || again.holds != 1 {
		t.Fatalf("retried attempt: %+v %v, want success with fence %d and 1 hold", again, err, first.fence)
	}
	if n := rdb.HGet(ctx, ks[0], "n").Val(); n != "1" {
		t.Fatalf("hold count %s after a retried acquire, want 1", n)
	}
}

// TestReleaseIdempotentUnderRetry: go-redis re-sends a release whose reply was
// lost; the second run finds that hold already given back and changes
// nothing, so a re-entered lock keeps its other hold.
func TestReleaseIdempotentUnderRetry(t *testing.T) {
	ctx := context.Background()
	s := redistest.Start(t)
	rdb := s.Client()
	c := New(rdb)
	defer c.Close()
	ks := keys("cg:", "rel")
	kv := boxKeys(ks)
	cfg := c.cfg
	for _, acq := range []string{"outer", "inner"} {
		if res, err := c.attempt(ctx, ks, kv, "owner-1", acq, cfg, ""); err != nil || !res.ok {
			t.Fatalf("acquire %s: %+v %v", acq, res, err)
		}
	}
	if n := rdb.HGet(ctx, ks[0], "n").Val(); n != "2" {
		t.Fatalf("hold count %s, want 2", n)
	}
	for range 2 { // the release and its retry
		n, err := c.releaseRaw(ctx, kv, "owner-1", "inner", cfg, "")
		if err != nil || n != 1 {
			t.Fatalf("release of the inner hold: %d %v, want 1 hold left", n, err)
		}
	}
	if n := rdb.HGet(ctx, ks[0], "n").Val(); n != "1" {
		t.Fatalf("hold count %s after a retried release, want 1", n)
	}
	if n, err := c.releaseRaw(ctx, kv, "owner-1", "outer", cfg, ""); err != nil || n != 0 {
		t.Fatalf("last release: %d %v", n, err)
	}
	if rdb.Exists(ctx, ks[0]).Val() != 0 {
		t.Fatal("lock left after the last hold")
	}
}

// releaseRaw releases hold acq of owner (and queue place mine), reporting the
// remaining holds.
func (c *Client) releaseRaw(ctx context.Context, kv []any, owner, acq any, cfg config, mine any) (int64, error) {
	return releaseS.runVia(ctx, c.b, nil, kv, owner, cfg.argsReleaseV, c.pubV, mine, acq).Int64()
}
