package systems

import (
	"context"
	"net"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
)

// Counter counts the commands a process's clients send to Redis. Pub/sub
// (SUBSCRIBE and friends) bypass go-redis hooks and are counted on the server
// instead (see the bench package).
type Counter struct{ n atomic.Int64 }

// Load returns the commands counted so far.
func (c *Counter) Load() int64 {
	if c == nil {
		return 0
	}
	return c.n.Load()
}

func (c *Counter) add(n int) {
	if c != nil {
		c.n.Add(int64(n))
	}
}

// hook is a go-redis hook that counts every command, pipelined ones included.
type hook struct{ c *Counter }

func (h hook) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) { return next(ctx, network, addr) }
}

func (h hook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.c.add(1)
		return next(ctx, cmd)
	}
}

func (h hook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.c.add(len(cmds))
		return next(ctx, cmds)
	}
}

// NewRedis returns a go-redis client on addr whose commands are counted by c
// (c may be nil). Pool and timeouts are go-redis defaults, the same for every
// go-redis-based system.
func NewRedis(addr string, c *Counter) *redis.Client {
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	if c != nil {
		rdb.AddHook(hook{c})
	}
	return rdb
}

// countingRueidis wraps a rueidis client and counts the commands it sends.
// DoCache's extra CLIENT CACHING/PTTL on a miss are not seen here.
type countingRueidis struct {
	rueidis.Client
	c *Counter
}

func (r countingRueidis) Do(ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
	r.c.add(1)
	return r.Client.Do(ctx, cmd)
}

func (r countingRueidis) DoMulti(ctx context.Context, multi ...rueidis.Completed) []rueidis.RedisResult {
	r.c.add(len(multi))
	return r.Client.DoMulti(ctx, multi...)
}

func (r countingRueidis) DoCache(ctx context.Context, cmd rueidis.Cacheable, ttl time.Duration) rueidis.RedisResult {
	r.c.add(1)
	return r.Client.DoCache(ctx, cmd, ttl)
}

func (r countingRueidis) DoMultiCache(ctx context.Context, multi ...rueidis.CacheableTTL) []rueidis.RedisResult {
	r.c.add(len(multi))
	return r.Client.DoMultiCache(ctx, multi...)
}
