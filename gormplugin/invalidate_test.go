package gormplugin_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"gorm.io/gorm"

	"github.com/cacheguard/cacheguard/gormplugin"
)

func TestInvalidateAfterCommitNotRollback(t *testing.T) {
	forDBs(t, testInvalidateAfterCommitNotRollback)
}

func testInvalidateAfterCommitNotRollback(t *testing.T, e *env) {
	ctx := context.Background()
	inv := newInvalidator(e.rdb)
	db := e.guarded(t, gormplugin.Invalidate(inv, cacheKeys))
	if err := db.Create(&Repo{ID: 1, Name: "a"}).Error; err != nil {
		t.Fatal(err)
	}
	const key = "cache:repos:1"
	cache := func() {
		t.Helper()
		if err := e.rdb.Set(ctx, key, "cached", 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	boom := errors.New("boom")

	// Each way of writing: a statement with GORM's own transaction, a user's
	// db.Transaction, and gormplugin.Transaction.
	ways := map[string]func(fn func(tx *gorm.DB) error) error{
		"db.Transaction": func(fn func(tx *gorm.DB) error) error { return db.Transaction(fn) },
		"gormplugin.Transaction": func(fn func(tx *gorm.DB) error) error {
			return gormplugin.Transaction(ctx, db, fn, &Repo{ID: 1})
		},
		"Begin/Commit": func(fn func(tx *gorm.DB) error) error {
			tx := db.Begin()
			if err := fn(tx); err != nil {
				tx.Rollback()
				return err
			}
			return tx.Commit().Error
		},
	}
	for name, run := range ways {
		t.Run(name+"/rollback", func(t *testing.T) {
			cache()
			err := run(func(tx *gorm.DB) error {
				if err := tx.Model(&Repo{ID: 1}).Update("name", "rolled back").Error; err != nil {
					return err
				}
				return boom
			})
			if !errors.Is(err, boom) {
				t.Fatalf("got %v, want boom", err)
			}
			if !exists(t, e.rdb, key) {
				t.Fatal("rollback invalidated the cache")
			}
			if exists(t, e.rdb, e.lockKey("repos:1")) {
				t.Fatal("row lock still held after rollback")
			}
		})
		t.Run(name+"/commit", func(t *testing.T) {
			cache()
			err := run(func(tx *gorm.DB) error {
				if err := tx.Model(&Repo{ID: 1}).Update("name", name).Error; err != nil {
					return err
				}
				if !exists(t, e.rdb, key) {
					return errors.New("invalidated before COMMIT")
				}
				if !exists(t, e.rdb, e.lockKey("repos:1")) {
					return errors.New("row lock released before COMMIT")
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if exists(t, e.rdb, key) {
				t.Fatal("commit did not invalidate the cache")
			}
			if exists(t, e.rdb, e.lockKey("repos:1")) {
				t.Fatal("row lock still held after commit")
			}
		})
	}

	t.Run("single statement", func(t *testing.T) {
		cache()
		if err := db.Model(&Repo{ID: 1}).Update("name", "b").Error; err != nil {
			t.Fatal(err)
		}
		if exists(t, e.rdb, key) {
			t.Fatal("committed update did not invalidate")
		}
		cache()
		if err := db.Delete(&Repo{ID: 1}).Error; err != nil {
			t.Fatal(err)
		}
		if exists(t, e.rdb, key) {
			t.Fatal("committed delete did not invalidate")
		}
	})
}

// A failed statement in GORM's own transaction is rolled back and not
// invalidated.
func TestFailedStatementNotInvalidated(t *testing.T) {
	forDBs(t, testFailedStatementNotInvalidated)
}

func testFailedStatementNotInvalidated(t *testing.T, e *env) {
	ctx := context.Background()
	inv := newInvalidator(e.rdb)
	db := e.guarded(t, gormplugin.Invalidate(inv, cacheKeys))
	if err := db.Create(&Repo{ID: 1}).Error; err != nil {
		t.Fatal(err)
	}
	boom := errors.New("hook failed")
	if err := db.Callback().Update().After("gorm:update").Before("gorm:commit_or_rollback_transaction").Register("test:fail", func(tx *gorm.DB) {
		if tx.Statement.Context.Value(failKey{}) != nil {
			tx.AddError(boom)
		}
	}); err != nil {
		t.Fatal(err)
	}
	e.rdb.Set(ctx, "cache:repos:1", "cached", 0)
	err := db.WithContext(context.WithValue(ctx, failKey{}, true)).Model(&Repo{ID: 1}).Update("name", "x").Error
	if !errors.Is(err, boom) {
		t.Fatalf("got %v, want the hook's error", err)
	}
	if !exists(t, e.rdb, "cache:repos:1") {
		t.Fatal("rolled-back statement invalidated the cache")
	}
	var r Repo
	db.First(&r, 1)
	if r.Name != "" {
		t.Fatalf("name %q: the statement was not rolled back", r.Name)
	}
}

type failKey struct{}

func TestInvalidateUnkeyedAndFailure(t *testing.T) {
	forDBs(t, testInvalidateUnkeyedAndFailure)
}

func testInvalidateUnkeyedAndFailure(t *testing.T, e *env) {
	ctx := context.Background()
	inv := newInvalidator(e.rdb)
	db := e.guarded(t, gormplugin.Invalidate(inv, cacheKeys), gormplugin.Unkeyed(gormplugin.PassThrough))
	if err := db.Create(&[]Widget{{ID: 1}, {ID: 2}}).Error; err != nil {
		t.Fatal(err)
	}
	e.rdb.Set(ctx, "cache:widgets:*", "cached", 0)
	if err := db.Model(&Widget{}).Where("size = ?", 0).Update("color", "red").Error; err != nil {
		t.Fatal(err)
	}
	if exists(t, e.rdb, "cache:widgets:*") {
		t.Fatal("unkeyed write did not invalidate the table-level keys (pk nil)")
	}
}

// A committed write is not an error (issue 15 B.9): when the invalidation
// after COMMIT fails, the write still returns nil (an app mapping err != nil
// to 500 would tell its client a committed edit failed), and the plugin
// retries the invalidation in the background until it succeeds.
func TestCommittedWriteIsNotAnError(t *testing.T) {
	forDBs(t, testCommittedWriteIsNotAnError)
}

func testCommittedWriteIsNotAnError(t *testing.T, e *env) {
	ctx := context.Background()
	inv := &flakyInvalidator{rdb: e.rdb}
	inv.failing.Store(true)
	db := e.guarded(t, gormplugin.Invalidate(inv, cacheKeys))
	if err := db.Create(&Widget{ID: 1}).Error; err != nil {
		t.Fatal(err)
	}
	e.rdb.Set(ctx, "cache:widgets:1", "cached", 0)
	if err := db.Model(&Widget{ID: 1}).Update("color", "blue").Error; err != nil {
		t.Fatalf("committed write whose invalidation failed: %v, want nil", err)
	}
	if err := gormplugin.Transaction(ctx, db, func(tx *gorm.DB) error {
		return tx.Model(&Widget{ID: 1}).Update("size", 2).Error
	}, &Widget{ID: 1}); err != nil {
		t.Fatalf("committed Transaction whose invalidation failed: %v, want nil", err)
	}
	var w Widget
	e.plain(t).First(&w, 1)
	if w.Color != "blue" || w.Size != 2 {
		t.Fatalf("row %+v: the writes should be committed", w)
	}
	if !exists(t, e.rdb, "cache:widgets:1") {
		t.Fatal("the failing invalidator deleted the key")
	}
	inv.failing.Store(false) // the cache is back
	eventually(t, 10*time.Second, "the retried invalidation", func() bool { return !exists(t, e.rdb, "cache:widgets:1") })
}

// flakyInvalidator deletes keys from Redis, or fails while failing is set.
type flakyInvalidator struct {
	rdb     *redis.Client
	failing atomic.Bool
	calls   atomic.Int32
}

func (f *flakyInvalidator) Invalidate(ctx context.Context, keys ...string) error {
	f.calls.Add(1)
	if f.failing.Load() {
		return errors.New("cache down")
	}
	return f.rdb.Del(ctx, keys...).Err()
}

func TestInvalidateAgain(t *testing.T) {
	forDBs(t, testInvalidateAgain)
}

func testInvalidateAgain(t *testing.T, e *env) {
	ctx := context.Background()
	inv := newInvalidator(e.rdb)
	db, p := e.guardedPlugin(t, &gorm.Config{}, gormplugin.Invalidate(inv, cacheKeys), gormplugin.InvalidateAgain(50*time.Millisecond))
	if err := e.plain(t).Create(&Repo{ID: 1}).Error; err != nil {
		t.Fatal(err)
	}
	if err := db.Model(&Repo{ID: 1}).Update("name", "x").Error; err != nil {
		t.Fatal(err)
	}
	if got := <-inv.calls; len(got) != 1 || got[0] != "cache:repos:1" {
		t.Fatalf("first invalidation %v", got)
	}
	// A reader served by a lagging replica caches the old row again...
	e.rdb.Set(ctx, "cache:repos:1", "stale", 0)
	// ...and the delayed second delete removes it.
	select {
	case <-inv.calls:
	case <-time.After(5 * time.Second):
		t.Fatal("no delayed invalidation")
	}
	if exists(t, e.rdb, "cache:repos:1") {
		t.Fatal("stale copy survived the delayed delete")
	}

	// Close drops pending repeats.
	if err := db.Model(&Repo{ID: 1}).Update("name", "y").Error; err != nil {
		t.Fatal(err)
	}
	<-inv.calls
	p.Close()
	e.rdb.Set(ctx, "cache:repos:1", "kept", 0)
	select {
	case keys := <-inv.calls:
		t.Fatalf("invalidation %v after Close", keys)
	case <-time.After(150 * time.Millisecond): // three times the delay: the dropped repeat would have run
	}
}
