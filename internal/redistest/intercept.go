package redistest

import (
	"context"

	"github.com/redis/go-redis/v9"
)

// Intercept is a go-redis hook made of one function: every command a client
// sends, alone or in a pipeline, passes through it as cmds, and reaches
// Redis only if it calls send (a test that fails a command without sending
// it sets the commands' errors and returns one). Add it with
// rdb.AddHook(redistest.Intercept(f)).
type Intercept func(ctx context.Context, cmds []redis.Cmder, send func() error) error

// DialHook implements redis.Hook.
func (f Intercept) DialHook(next redis.DialHook) redis.DialHook { return next }

// ProcessHook implements redis.Hook.
func (f Intercept) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		return f(ctx, []redis.Cmder{cmd}, func() error { return next(ctx, cmd) })
	}
}

// ProcessPipelineHook implements redis.Hook.
func (f Intercept) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		return f(ctx, cmds, func() error { return next(ctx, cmds) })
	}
}
