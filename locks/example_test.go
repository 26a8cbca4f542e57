package locks_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/locks"
)

func ExampleClient_Lock() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer rdb.Close()
	l := locks.New(rdb)
	defer l.Close()

	lk, err := l.Lock(ctx, "repos:42", locks.WaitBudget(5*time.Second))
	if err != nil {
		fmt.Println("not obtained:", err)
		return
	}
	defer lk.Unlock(context.WithoutCancel(ctx))
	// Work under lk.Context(): it is cancelled if the lock is lost.
	fmt.Println("editing repos:42 settings; fence token issued:", lk.Fence() > 0)
	// Output: editing repos:42 settings; fence token issued: true
}

func ExampleClient_TryLock() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer rdb.Close()
	l := locks.New(rdb)
	defer l.Close()

	first, _ := l.TryLock(ctx, "report:daily")
	_, err := l.TryLock(ctx, "report:daily")
	fmt.Println("second attempt refused:", errors.Is(err, locks.ErrNotObtained))
	first.Unlock(ctx)
	// Output: second attempt refused: true
}

func ExampleWithOwner() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer rdb.Close()
	l := locks.New(rdb)
	defer l.Close()

	// One owner per request: a nested Lock of the same name re-enters.
	ctx = locks.WithOwner(ctx, locks.NewOwnerID())
	outer, _ := l.Lock(ctx, "repos:7")
	inner, err := l.Lock(ctx, "repos:7")
	fmt.Println("re-entered:", err == nil, "same fence:", inner.Fence() == outer.Fence())
	inner.Unlock(ctx)
	outer.Unlock(ctx)
	// Output: re-entered: true same fence: true
}

func ExampleLock_Lost() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer rdb.Close()
	l := locks.New(rdb, locks.Lease(300*time.Millisecond))
	defer l.Close()

	lk, _ := l.Lock(ctx, "job:nightly")
	rdb.Del(ctx, "cg:lock:{job:nightly}") // someone deletes the lock out of band
	select {
	case <-lk.Lost():
		fmt.Println("lost; work context cancelled:", lk.Context().Err() != nil)
	case <-time.After(5 * time.Second):
		fmt.Println("still held")
	}
	fmt.Println("unlock:", lk.Unlock(ctx))
	// Output:
	// lost; work context cancelled: true
	// unlock: locks: not held
}

func ExampleOptimistic() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer rdb.Close()

	rdb.Set(ctx, "stock:apples", 10, 0)
	err := locks.Optimistic(ctx, rdb, func(tx *redis.Tx) error {
		n, err := tx.Get(ctx, "stock:apples").Int()
		if err != nil {
			return err
		}
		_, err = tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
			p.Set(ctx, "stock:apples", n-1, 0)
			return nil
		})
		return err
	}, []string{"stock:apples"})
	fmt.Println(err, rdb.Get(ctx, "stock:apples").Val())
	// Output: <nil> 9
}
