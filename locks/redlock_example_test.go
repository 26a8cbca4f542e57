package locks_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/locks"
)

// A Redlock normally spans 3 or 5 independent servers; this example uses the
// one server the tests start, which makes a quorum of 1.
func ExampleNewRedlock() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr, ContextTimeoutEnabled: true, MaxRetries: -1})
	defer rdb.Close()
	rl := locks.NewRedlock([]redis.UniversalClient{rdb})
	defer rl.Close()

	lk, err := rl.Lock(ctx, "example:redlock")
	if err != nil {
		fmt.Println(err)
		return
	}
	_, err = rl.TryLock(ctx, "example:redlock")
	var re *locks.RedlockError
	fmt.Println(errors.Is(err, locks.ErrNotObtained), errors.As(err, &re), len(re.Refused))
	fmt.Println(lk.Fence()) // Redlock issues no fence tokens
	fmt.Println(lk.Unlock(ctx))
	// Output:
	// true true 1
	// 0
	// <nil>
}
