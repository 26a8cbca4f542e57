package locks

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"

	"github.com/redis/go-redis/v9"
)

// Optimistic's defaults: how long it retries, and the base of its backoff.
const (
	defaultOptimisticBudget = time.Second
	optimisticBackoff       = time.Millisecond
)

// Optimistic runs fn as an optimistic transaction: it WATCHes keys, fn reads
// them through tx and queues its writes with tx.TxPipelined, and EXEC applies
// them only if no watched key changed meanwhile. On a conflict it retries
// after a jittered exponential backoff (1ms doubling per attempt, up to
// 100ms) until its wait budget ends (WaitBudget; 1s by default) or ctx does;
// then it returns an error matching ErrConflict (and redis.TxFailedErr). fn
// runs at least once. Errors from fn are returned as they are, without
// retrying. WaitBudget is its only option: any other fails with ErrInvalid.
// On a Redis Cluster all keys must share a hash slot.
func Optimistic(ctx context.Context, rdb redis.UniversalClient, fn func(tx *redis.Tx) error, keys []string, opts ...CallOption) error {
	base := defaults()
	base.wait = defaultOptimisticBudget
	cfg := base
	err := applyAll(&cfg, opts)
	switch {
	case err != nil:
		return err
	case rdb == nil:
		return invalid("nil redis client")
	case fn == nil:
		return invalid("nil transaction function")
	case len(keys) == 0:
		return invalid("no keys to watch")
	case cfg.wait < 0:
		return invalid("negative wait budget %v", cfg.wait)
	case cfg.lease != base.lease || cfg.renew != base.renew || cfg.fair || cfg.replicas != 0 || cfg.noFencing || cfg.nodeTimeout != 0:
		return invalid("Optimistic takes no option but WaitBudget")
	}
	for _, k := range keys {
		if k == "" {
			return invalid("empty key")
		}
	}
	deadline := time.Now().Add(cfg.wait)
	for i := 0; ; i++ {
		err = rdb.Watch(ctx, fn, keys...)
		if !errors.Is(err, redis.TxFailedErr) {
			return err
		}
		d := time.Duration(rand.Int64N(int64(min(optimisticBackoff<<min(i, 20), 100*optimisticBackoff)) + 1))
		if time.Until(deadline) < d {
			return errors.Join(ErrConflict, err)
		}
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return errors.Join(ErrConflict, err, ctx.Err())
		case <-t.C:
		}
	}
}
