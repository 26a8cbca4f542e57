package gormplugin_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/cacheguard/cacheguard/cacheguard"
	"github.com/cacheguard/cacheguard/gormplugin"
)

// With a real *cacheguard.Guard: a rolled-back write leaves the cached row, a
// committed one invalidates it, and the next reads reload it once.
func TestInvalidateThroughCacheguard(t *testing.T) {
	forDBs(t, testInvalidateThroughCacheguard)
}

func testInvalidateThroughCacheguard(t *testing.T, e *env) {
	ctx := context.Background()
	g := cacheguard.New(e.rdb)
	t.Cleanup(func() { g.Close() })
	db := e.guarded(t, gormplugin.Invalidate(g, func(table string, pk any) []string {
		return []string{gormplugin.RowName(table, pk)}
	}))
	if err := db.Create(&Repo{ID: 1, Name: "a"}).Error; err != nil {
		t.Fatal(err)
	}
	var loads atomic.Int32
	load := func(ctx context.Context) (Repo, error) {
		loads.Add(1)
		var r Repo
		err := db.WithContext(ctx).First(&r, 1).Error
		return r, err
	}
	get := func() string {
		t.Helper()
		r, err := cacheguard.Get(ctx, g, "repos:1", load, cacheguard.TTL(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		return r.Name
	}
	if first, second := get(), get(); first != "a" || second != "a" || loads.Load() != 1 {
		t.Fatalf("warm-up: %d loads, want 1", loads.Load())
	}

	boom := errors.New("boom")
	err := db.Transaction(func(tx *gorm.DB) error {
		if err := tx.Model(&Repo{ID: 1}).Update("name", "rolled back").Error; err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatal(err)
	}
	if get() != "a" || loads.Load() != 1 {
		t.Fatalf("after rollback: %d loads, want the cached row (1 load)", loads.Load())
	}

	if err := db.Model(&Repo{ID: 1}).Update("name", "b").Error; err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	names := make(chan string, 10)
	for range 10 {
		wg.Go(func() {
			r, err := cacheguard.Get(ctx, g, "repos:1", load, cacheguard.TTL(time.Minute))
			if err != nil {
				names <- err.Error()
				return
			}
			names <- r.Name
		})
	}
	wg.Wait()
	close(names)
	for n := range names {
		if n != "b" {
			t.Fatalf("read after commit: %q, want b", n)
		}
	}
	if loads.Load() != 2 {
		t.Fatalf("%d loads, want one reload after the commit (2)", loads.Load())
	}
}
