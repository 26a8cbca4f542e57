package locks_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/locks"
)

func TestOptimisticRetriesConflicts(t *testing.T) {
	ctx := context.Background()
	_, rdb, _ := newClient(t)
	const workers, each = 8, 25
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for range workers {
		wg.Go(func() {
			for range each {
				err := locks.Optimistic(ctx, rdb, func(tx *redis.Tx) error {
					n, err := tx.Get(ctx, "opt:n").Int()
					if err != nil && !errors.Is(err, redis.Nil) {
						return err
					}
					_, err = tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
						p.Set(ctx, "opt:n", n+1, 0)
						return nil
					})
					return err
				}, []string{"opt:n"}, locks.WaitBudget(time.Minute))
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if n, _ := rdb.Get(ctx, "opt:n").Int(); n != workers*each {
		t.Fatalf("counter = %d, want %d", n, workers*each)
	}
}

func TestOptimisticGivesUp(t *testing.T) {
	ctx := context.Background()
	_, rdb, _ := newClient(t)
	attempts := 0
	err := locks.Optimistic(ctx, rdb, func(tx *redis.Tx) error {
		attempts++
		rdb.Incr(ctx, "opt:hot") // a conflicting write by someone else, every time
		_, err := tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
			p.Set(ctx, "opt:hot", 0, 0)
			return nil
		})
		return err
	}, []string{"opt:hot"}, locks.WaitBudget(20*time.Millisecond))
	if !errors.Is(err, locks.ErrConflict) || !errors.Is(err, redis.TxFailedErr) {
		t.Fatalf("err = %v, want ErrConflict and TxFailedErr", err)
	}
	// Within the budget a conflict is retried: two conflicts, then success.
	attempts = 0
	err = locks.Optimistic(ctx, rdb, func(tx *redis.Tx) error {
		attempts++
		if attempts <= 2 {
			rdb.Incr(ctx, "opt:hot")
		}
		_, err := tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
			p.Set(ctx, "opt:hot", 0, 0)
			return nil
		})
		return err
	}, []string{"opt:hot"}, locks.WaitBudget(time.Minute))
	if err != nil || attempts != 3 {
		t.Fatalf("err = %v after %d attempts, want success at the third", err, attempts)
	}
	// A budget of 0 runs fn once.
	attempts = 0
	err = locks.Optimistic(ctx, rdb, func(tx *redis.Tx) error {
		attempts++
		rdb.Incr(ctx, "opt:hot")
		_, err := tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
			p.Set(ctx, "opt:hot", 0, 0)
			return nil
		})
		return err
	}, []string{"opt:hot"}, locks.WaitBudget(0))
	if !errors.Is(err, locks.ErrConflict) || attempts != 1 {
		t.Fatalf("budget 0: err = %v after %d attempts, want ErrConflict after 1", err, attempts)
	}
	boom := errors.New("boom")
	if err := locks.Optimistic(ctx, rdb, func(*redis.Tx) error { return boom }, []string{"k"}); !errors.Is(err, boom) {
		t.Fatalf("fn's own error: %v", err)
	}
}
