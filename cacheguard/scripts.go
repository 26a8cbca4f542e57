package cacheguard

import (
	"context"
	_ "embed"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

var (
	//go:embed getlease.lua
	getLeaseLua string
	//go:embed fill.lua
	fillLua string
	//go:embed release.lua
	releaseLua string
	//go:embed renew.lua
	renewLua string

	getLeaseScript = redis.NewScript(getLeaseLua)
	fillScript     = redis.NewScript(fillLua)
	releaseScript  = redis.NewScript(releaseLua)
	renewScript    = redis.NewScript(renewLua)
)

// leaseReply is the answer of the get-or-lease script.
type leaseReply struct {
	fresh   bool          // value is fresh enough
	value   []byte        // the envelope, when fresh
	granted bool          // the fill lease is this caller's
	pttl    time.Duration // the other holder's remaining lease
	holder  string        // the other holder's token
}

// getLease runs the get-or-lease script: it returns the value when it is
// fresh until later than after (unix ms), else takes the fill lease unless
// another fill holds it. With force the stored value is never fresh enough
// (it could not be decoded).
func (g *Guard) getLease(ctx context.Context, ks keySet, tok string, lease time.Duration, after int64, force bool) (leaseReply, error) {
	v, err := getLeaseScript.Run(ctx, g.rdb, []string{ks.value, ks.lease}, tok, lease.Milliseconds(), after, flag(force)).Slice()
	if err != nil {
		return leaseReply{}, err
	}
	var r leaseReply
	var status int64 = -1
	if len(v) > 0 {
		status, _ = v[0].(int64)
	}
	switch {
	case status == 0 && len(v) == 2:
		s, _ := v[1].(string)
		r.fresh, r.value = true, []byte(s)
	case status == 1:
		r.granted = true
	case status == 2 && len(v) == 3:
		pttl, _ := v[1].(int64)
		r.pttl = time.Duration(pttl) * time.Millisecond
		r.holder, _ = v[2].(string)
	default:
		return leaseReply{}, fmt.Errorf("cacheguard: unexpected get-or-lease reply %v", v)
	}
	return r, nil
}

// store writes env with the fill lease's compare-and-set, releases the lease
// and publishes the envelope to the waiters. It reports whether it wrote.
func (g *Guard) store(ctx context.Context, ks keySet, tok string, env []byte, ttl time.Duration) (bool, error) {
	n, err := fillScript.Run(ctx, g.rdb, []string{ks.value, ks.lease}, tok, env, max(ttl.Milliseconds(), 1), ks.wake, g.pub).Int64()
	return n == 1, err
}

// release gives up the fill lease and publishes msg to the waiters.
func (g *Guard) release(ctx context.Context, ks keySet, tok, msg string) error {
	return releaseScript.Run(ctx, g.rdb, []string{ks.lease}, tok, ks.wake, g.pub, msg).Err()
}

// renewLease keeps the fill lease alive every third of it until the returned
// stop function is called (which waits for the goroutine), ctx ends, or the
// lease turns out to be gone (expired or invalidated).
func (g *Guard) renewLease(ctx context.Context, ks keySet, tok string, lease time.Duration) (stop func()) {
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(lease / 3)
		defer t.Stop()
		for {
			select {
			case <-quit:
				return
			case <-ctx.Done():
				return
			case <-t.C:
			}
			rctx, cancel := context.WithTimeout(ctx, lease)
			n, err := renewScript.Run(rctx, g.rdb, []string{ks.lease}, tok, lease.Milliseconds()).Int64()
			cancel()
			if err == nil && n == 0 {
				return // lost: the store's compare-and-set will fail too
			}
		}
	}()
	return func() { close(quit); <-done }
}

func flag(b bool) string {
	if b {
		return "1"
	}
	return "0"
}
