package cacheguard

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
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
	//go:embed invalidate.lua
	invalidateLua string
	//go:embed getleasemany.lua
	getLeaseManyLua string
	//go:embed readmany.lua
	readManyLua string

	getLeaseScript     = redis.NewScript(getLeaseLua)
	fillScript         = redis.NewScript(fillLua)
	releaseScript      = redis.NewScript(releaseLua)
	renewScript        = redis.NewScript(renewLua)
	invalidateScript   = redis.NewScript(invalidateLua)
	getLeaseManyScript = redis.NewScript(getLeaseManyLua)
	readManyScript     = redis.NewScript(readManyLua)
)

// genTTL is the shortest life of a key's generation in Redis: a generation
// created by a miss or an invalidation lives at least this long, and as long
// as every lease granted and value stored under it. A flight is joined only
// while younger than this (see maxJoinAge), so a generation that expired and
// is read as absent again can never lead a call into a flight that began
// before an invalidation. It costs one small key per cache key invalidated or
// filled, for at most this long past its last value.
const genTTL = time.Minute

// leaseReply is the answer of the get-or-lease script.
type leaseReply struct {
	fresh   bool          // value is fresh enough
	value   []byte        // the envelope, when fresh
	granted bool          // the fill lease is this caller's
	pttl    time.Duration // the other holder's remaining lease
	holder  string        // the other holder's token
	gen     int64         // the key's generation
}

// lease is a fill lease as stored: the generation it was granted under and
// the holder's token.
type lease struct {
	gen   int64
	token string
}

func (l lease) String() string { return strconv.FormatInt(l.gen, 10) + " " + l.token }

// getLease runs the get-or-lease script: it returns the value when it is of
// the current generation and fresh until later than after (unix ms), else
// takes the fill lease unless another fill of the current generation holds
// it. With force the stored value is never fresh enough (it could not be
// decoded).
func (g *Guard) getLease(ctx context.Context, ks keySet, tok string, leaseFor time.Duration, after int64, force bool) (leaseReply, error) {
	v, err := getLeaseScript.Run(ctx, g.rdb, []string{ks.values, ks.lease, ks.gen}, tok, leaseFor.Milliseconds(), after, flag(force), genTTL.Milliseconds(), ks.field).Slice()
	if err != nil {
		return leaseReply{}, err
	}
	return parseLeaseReply(v)
}

// parseLeaseReply reads one reply of the get-or-lease script.
func parseLeaseReply(v []any) (leaseReply, error) {
	var r leaseReply
	var status int64 = -1
	if len(v) > 0 {
		status, _ = v[0].(int64)
	}
	var err error
	gen := func(x any) bool {
		s, _ := x.(string)
		r.gen, err = strconv.ParseInt(s, 10, 64)
		return err == nil && r.gen > 0
	}
	switch {
	case status == 0 && len(v) == 3 && gen(v[2]):
		s, _ := v[1].(string)
		r.fresh, r.value = true, []byte(s)
	case status == 1 && len(v) == 2 && gen(v[1]):
		r.granted = true
	case status == 2 && len(v) == 4 && gen(v[3]):
		pttl, _ := v[1].(int64)
		r.pttl = time.Duration(pttl) * time.Millisecond
		r.holder, _ = v[2].(string)
	default:
		return leaseReply{}, fmt.Errorf("cacheguard: unexpected get-or-lease reply %v", v)
	}
	return r, nil
}

// store writes env (whose generation is l's) with the fill lease's
// compare-and-set, releases the lease and publishes the envelope to the
// waiters. It reports whether it wrote.
func (g *Guard) store(ctx context.Context, key string, ks keySet, l lease, env []byte, ttl time.Duration) (bool, error) {
	n, err := fillScript.Run(ctx, g.rdb, []string{ks.values, ks.lease, ks.gen},
		l.String(), env, max(ttl.Milliseconds(), 1), ks.wake, g.pub, l.token, strconv.FormatInt(l.gen, 10), ks.field, time.Now().UnixMilli(),
		g.ncChannel, g.origin+" f"+key).Int64()
	return n == 1, err
}

// release gives up the fill lease and publishes msg to the waiters.
func (g *Guard) release(ctx context.Context, ks keySet, l lease, msg string) error {
	return releaseScript.Run(ctx, g.rdb, []string{ks.lease}, l.String(), ks.wake, g.pub, msg).Err()
}

// renewLease keeps the fill lease alive every third of it until the returned
// stop function is called (which waits for the goroutine), ctx ends, or the
// lease turns out to be gone (expired, taken over, or its generation
// invalidated), when lost is called.
func (g *Guard) renewLease(ctx context.Context, ks keySet, l lease, leaseFor time.Duration, lost func()) (stop func()) {
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(leaseFor / 3)
		defer t.Stop()
		for {
			select {
			case <-quit:
				return
			case <-ctx.Done():
				return
			case <-t.C:
			}
			rctx, cancel := context.WithTimeout(ctx, leaseFor)
			n, err := renewScript.Run(rctx, g.rdb, []string{ks.lease, ks.gen}, l.String(), leaseFor.Milliseconds(), strconv.FormatInt(l.gen, 10)).Int64()
			cancel()
			if err == nil && n == 0 {
				lost() // the store's compare-and-set will fail too
				return
			}
		}
	}()
	return func() { close(quit); <-done }
}

// invalidate moves the generation of each key forward, deletes its values
// and wakes its waiters, in one pipeline. The script goes as EVAL (it is short, and an
// invalidation is rare next to reads), so a server that has not seen it yet —
// restarted, or a cluster master not asked before — needs no second try.
func (g *Guard) invalidate(ctx context.Context, keys []string) error {
	pipe := g.rdb.Pipeline()
	cmds := make([]*redis.Cmd, len(keys))
	for i, k := range keys {
		gen, values, wake := g.cacheKeys(k)
		cmds[i] = invalidateScript.Eval(ctx, pipe, []string{gen, values}, wake, g.pub, genTTL.Milliseconds(), g.ncChannel, g.origin+" i"+k)
	}
	if _, err := pipe.Exec(ctx); err == nil {
		return nil
	}
	var errs []error
	for i, c := range cmds {
		if err := c.Err(); err != nil {
			errs = append(errs, fmt.Errorf("%q: %w", keys[i], err))
		}
	}
	return errors.Join(errs...)
}

func flag(b bool) string {
	if b {
		return "1"
	}
	return "0"
}
