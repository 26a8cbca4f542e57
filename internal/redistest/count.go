package redistest

import (
	"context"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
)

// CommandCounter is a go-redis hook that counts the commands a client sends
// (pipelined ones included), e.g. to show that bad input reaches no server.
// Add it with rdb.AddHook(c).
type CommandCounter struct{ n atomic.Int64 }

// Count returns the number of commands sent so far.
func (c *CommandCounter) Count() int64 { return c.n.Load() }

// DialHook implements redis.Hook.
func (c *CommandCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

// ProcessHook implements redis.Hook.
func (c *CommandCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { c.n.Add(1); return next(ctx, cmd) }
}

// ProcessPipelineHook implements redis.Hook.
func (c *CommandCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error { c.n.Add(int64(len(cmds))); return next(ctx, cmds) }
}
