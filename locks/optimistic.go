package locks

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"

	"github.com/redis/go-redis/v9"
)

// OptimisticOption configures Optimistic.
type OptimisticOption func(*optimistic)

type optimistic struct {
	attempts int
	backoff  time.Duration
}

// OptimisticAttempts sets how many times Optimistic runs fn before giving up with
// ErrConflict. The default is 10.
func OptimisticAttempts(n int) OptimisticOption { return func(o *optimistic) { o.attempts = n } }

// OptimisticBackoff sets the base delay between attempts; each retry waits a random time
// up to base×2^attempt (capped at 100×base). The default base is 1ms.
func OptimisticBackoff(d time.Duration) OptimisticOption {
	return func(o *optimistic) { o.backoff = d }
}

// Optimistic runs fn as an optimistic transaction: it WATCHes keys, fn reads
// them through tx and queues its writes with tx.TxPipelined, and EXEC applies
// them only if no watched key changed meanwhile. On a conflict it retries with
// jittered exponential backoff; when every attempt conflicts it returns an
// error matching ErrConflict (and redis.TxFailedErr). Errors from fn are
// returned as they are, without retrying. On a Redis Cluster all keys must
// share a hash slot.
func Optimistic(ctx context.Context, rdb redis.UniversalClient, fn func(tx *redis.Tx) error, keys []string, opts ...OptimisticOption) error {
	o := optimistic{attempts: 10, backoff: time.Millisecond}
	for _, f := range opts {
		f(&o)
	}
	switch {
	case rdb == nil:
		return invalid("nil redis client")
	case fn == nil:
		return invalid("nil transaction function")
	case len(keys) == 0:
		return invalid("no keys to watch")
	case o.attempts < 1:
		return invalid("attempts %d < 1", o.attempts)
	case o.backoff < 0:
		return invalid("negative backoff")
	}
	for _, k := range keys {
		if k == "" {
			return invalid("empty key")
		}
	}
	var err error
	for i := 0; i < o.attempts; i++ {
		err = rdb.Watch(ctx, fn, keys...)
		if !errors.Is(err, redis.TxFailedErr) {
			return err
		}
		if i == o.attempts-1 {
			break
		}
		d := min(o.backoff<<i, 100*o.backoff)
		t := time.NewTimer(time.Duration(rand.Int64N(int64(d) + 1)))
		select {
		case <-ctx.Done():
			t.Stop()
			return errors.Join(ErrConflict, err, ctx.Err())
		case <-t.C:
		}
	}
	return errors.Join(ErrConflict, err)
}
