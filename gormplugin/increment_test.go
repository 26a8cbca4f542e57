package gormplugin_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/cacheguard/cacheguard/gormplugin"
)

const (
	writers   = 20
	perWriter = 5
)

// increment runs writers goroutines that each add 1 to the counter perWriter
// times by read-modify-write, through do, and returns the final count.
func increment(t *testing.T, db *gorm.DB, id uint, do func(ctx context.Context, inc func(tx *gorm.DB) error) error) int {
	t.Helper()
	if err := db.Create(&Counter{ID: id}).Error; err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	start := make(chan struct{})
	errs := make(chan error, writers*perWriter)
	var wg sync.WaitGroup
	for range writers {
		wg.Go(func() {
			<-start
			for range perWriter {
				errs <- do(ctx, func(tx *gorm.DB) error {
					var c Counter
					if err := tx.First(&c, id).Error; err != nil {
						return err
					}
					// Part of the scenario, not synchronisation: the gap
					// between read and write that an unguarded writer races in.
					time.Sleep(time.Millisecond)
					return tx.Model(&c).Update("n", c.N+1).Error
				})
			}
		})
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	var c Counter
	if err := db.First(&c, id).Error; err != nil {
		t.Fatal(err)
	}
	return c.N
}

func TestIncrementsExactWithGuard(t *testing.T) {
	forDBs(t, testIncrementsExactWithGuard)
}

func testIncrementsExactWithGuard(t *testing.T, e *env) {
	db := e.guarded(t)
	got := increment(t, db, 1, func(ctx context.Context, inc func(tx *gorm.DB) error) error {
		return gormplugin.Transaction(ctx, db, inc, &Counter{ID: 1})
	})
	if got != writers*perWriter {
		t.Fatalf("guarded: count %d, want exactly %d", got, writers*perWriter)
	}
	var c Counter
	db.First(&c, 1)
	if c.Fence == 0 {
		t.Fatal("guarded writes left no fence")
	}
}

func TestIncrementsLoseUpdatesWithoutGuard(t *testing.T) {
	forDBs(t, testIncrementsLoseUpdatesWithoutGuard)
}

func testIncrementsLoseUpdatesWithoutGuard(t *testing.T, e *env) {
	db := e.plain(t) // plain GORM, no plugin
	got := increment(t, db, 2, func(ctx context.Context, inc func(tx *gorm.DB) error) error {
		return inc(db.WithContext(ctx))
	})
	if got >= writers*perWriter {
		t.Fatalf("unguarded: count %d, expected lost updates below %d", got, writers*perWriter)
	}
	t.Logf("unguarded: %d of %d increments survived", got, writers*perWriter)
}
