package redistest

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/internal/rcmd"
)

// FillWaiting returns a channel closed once a cacheguard Guard on rdb waits
// for another process's fill: its get-or-lease script answered twice
// {2, pttl, holder, generation} (another fill holds the lease). A flight asks
// again once subscribed, so the second such answer means it waits for the
// holder's push. Tests in cacheguard and ginmw use it instead of a sleep.
func FillWaiting(rdb redis.UniversalClient) <-chan struct{} {
	seen := make(chan struct{})
	var once sync.Once
	var n atomic.Int64
	rdb.AddHook(Intercept(func(_ context.Context, cmds []redis.Cmder, send func() error) error {
		err := send()
		for _, cmd := range cmds {
			c, ok := rcmd.AsCmd(cmd)
			if name := cmd.Name(); !ok || c.Err() != nil || name != "evalsha" && name != "eval" {
				continue
			}
			replies, _ := c.Slice()
			for _, r := range replies {
				if v, _ := r.([]any); len(v) == 4 && v[0] == int64(2) && n.Add(1) == 2 {
					once.Do(func() { close(seen) })
				}
			}
		}
		return err
	}))
	return seen
}
