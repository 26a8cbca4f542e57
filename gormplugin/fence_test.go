package gormplugin_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/cacheguard/cacheguard/gormplugin"
	"github.com/cacheguard/cacheguard/locks"
)

type writePause struct {
	started chan<- struct{}
	resume  <-chan struct{}
}

// pausedWriter starts writer A's write on db; A takes the row lock, passes
// the plugin's checks, reports it on started, and pauses just before its
// statement is sent until resume is closed (a stop-the-world GC, a SIGSTOP, a
// slow network). Its result arrives on the returned channel. The write is
// not in a transaction of its own yet holding the row (as one declared to
// gormplugin.Transaction would: the next writer would wait for it).
func pausedWriter(t *testing.T, db *gorm.DB, write func(tx *gorm.DB) error, started chan<- struct{}, resume <-chan struct{}) <-chan error {
	t.Helper()
	hook := func(tx *gorm.DB) {
		if wp, ok := tx.Statement.Context.Value(writePause{}).(*writePause); ok {
			close(wp.started)
			<-wp.resume
		}
	}
	if db.Callback().Update().Get("test:pause") == nil {
		if err := db.Callback().Update().After("gormplugin:fence").Before("gorm:update").Register("test:pause", hook); err != nil {
			t.Fatal(err)
		}
		if err := db.Callback().Delete().After("gormplugin:fence").Before("gorm:delete").Register("test:pause", hook); err != nil {
			t.Fatal(err)
		}
	}
	ctx := context.WithValue(context.Background(), writePause{}, &writePause{started: started, resume: resume})
	done := make(chan error, 1)
	go func() { done <- write(db.WithContext(ctx)) }()
	return done
}

func write111(tx *gorm.DB) error { return tx.Model(&Counter{ID: 1}).Update("n", 111).Error }

// A writer whose lease ran out in Redis while it was paused, but which has not
// noticed yet (its process was not running), is refused by the fence in the
// database: the newer writer's value survives.
func TestPausedWriterRefusedByFence(t *testing.T) {
	forDBs(t, testPausedWriterRefusedByFence)
}

func testPausedWriterRefusedByFence(t *testing.T, e *env) {
	ctx := context.Background()
	// A long lease: A's first renewal, which would tell it the lock is gone,
	// is twenty seconds off.
	db := e.guarded(t, gormplugin.LockOptions(locks.Lease(time.Minute)))
	if err := db.Create(&Counter{ID: 1, N: 1}).Error; err != nil {
		t.Fatal(err)
	}
	started, resume := make(chan struct{}), make(chan struct{})
	done := pausedWriter(t, db, write111, started, resume)
	<-started
	// The lease ends while A is paused; from Redis's side that is the key
	// going away. A has not run since, so it does not know.
	if err := e.rdb.Del(ctx, e.lockKey("counters:1")).Err(); err != nil {
		t.Fatal(err)
	}
	b := Counter{ID: 1}
	if err := db.Model(&b).Update("n", 222).Error; err != nil {
		t.Fatalf("newer writer: %v", err)
	}
	close(resume)
	err := <-done
	var stale *gormplugin.StaleWriteError
	if !errors.Is(err, gormplugin.ErrStaleWrite) || !errors.As(err, &stale) {
		t.Fatalf("paused writer: %v, want ErrStaleWrite", err)
	}
	if stale.Lost || stale.Stored != uint64(b.Fence) || stale.Fence >= stale.Stored {
		t.Fatalf("refusal %+v: want the database's fence %d above the writer's", stale, b.Fence)
	}
	var c Counter
	db.First(&c, 1)
	if c.N != 222 || c.Fence != b.Fence {
		t.Fatalf("row %+v, want the newer write n=222 fence=%d", c, b.Fence)
	}
}

// A writer paused past its (unrenewed) lease is refused whichever layer sees
// it first: its own lock's lost signal or the fence.
func TestWriterPausedPastLeaseRefused(t *testing.T) {
	forDBs(t, testWriterPausedPastLeaseRefused)
}

func testWriterPausedPastLeaseRefused(t *testing.T, e *env) {
	db := e.guarded(t, gormplugin.LockOptions(locks.Lease(100*time.Millisecond), locks.NoRenewal()))
	if err := db.Create(&Counter{ID: 1, N: 1}).Error; err != nil {
		t.Fatal(err)
	}
	started, resume := make(chan struct{}), make(chan struct{})
	done := pausedWriter(t, db, write111, started, resume)
	<-started
	eventually(t, 5*time.Second, "the lease to run out", func() bool { return !exists(t, e.rdb, e.lockKey("counters:1")) })
	// The newer writer has a lease of the default length: with 100ms and no
	// renewal, a loaded machine can end its own lease before its write.
	if err := e.guarded(t).Model(&Counter{ID: 1}).Update("n", 222).Error; err != nil {
		t.Fatalf("newer writer: %v", err)
	}
	close(resume)
	if err := <-done; !errors.Is(err, gormplugin.ErrStaleWrite) {
		t.Fatalf("paused writer: %v, want ErrStaleWrite", err)
	}
	var c Counter
	db.First(&c, 1)
	if c.N != 222 {
		t.Fatalf("n = %d, want the newer write 222", c.N)
	}
}

func TestFenceWrittenAndReported(t *testing.T) {
	forDBs(t, testFenceWrittenAndReported)
}

func testFenceWrittenAndReported(t *testing.T, e *env) {
	db := e.guarded(t)
	if err := db.Create(&Counter{ID: 1}).Error; err != nil {
		t.Fatal(err)
	}
	c := Counter{ID: 1}
	if err := db.Model(&c).Update("n", 1).Error; err != nil {
		t.Fatal(err)
	}
	first := c.Fence
	if first == 0 {
		t.Fatal("model's fence not stamped")
	}
	// Save writes the struct back whole: the fence it carries is its
	// version, zero included (a struct built, or read before the write
	// above, is refused), and the token replaces it.
	c.N = 2
	c.Fence = 0
	if err := db.Save(&c).Error; !errors.Is(err, gormplugin.ErrStaleWrite) {
		t.Fatalf("Save of a struct without the row's fence: %v, want ErrStaleWrite", err)
	}
	if c.Fence != 0 {
		t.Fatalf("refused struct's fence %d, want 0 as it was", c.Fence)
	}
	c.Fence = gormplugin.Fence(first)
	if err := db.Save(&c).Error; err != nil {
		t.Fatal(err)
	}
	var got Counter
	db.First(&got, 1)
	if got.N != 2 || got.Fence <= first || got.Fence != c.Fence {
		t.Fatalf("after Save: %+v (model fence %d), want n=2 and a fence above %d", got, c.Fence, first)
	}
	// Select restricts the update's columns; the fence is written all the same.
	if err := db.Model(&Counter{ID: 1}).Select("n").Updates(map[string]any{"n": 3}).Error; err != nil {
		t.Fatal(err)
	}
	var again Counter
	db.First(&again, 1)
	if again.N != 3 || again.Fence <= got.Fence {
		t.Fatalf("after Select(n).Updates: %+v, want n=3 and a fence above %d", again, got.Fence)
	}
}

// Zero rows affected because the row does not exist is not a stale write:
// the update reports 0 rows, as GORM does without the plugin.
func TestMissingRowIsNotStale(t *testing.T) {
	forDBs(t, testMissingRowIsNotStale)
}

func testMissingRowIsNotStale(t *testing.T, e *env) {
	db := e.guarded(t)
	res := db.Model(&Counter{ID: 404}).Update("n", 1)
	if res.Error != nil || res.RowsAffected != 0 {
		t.Fatalf("update of a missing row: err=%v rows=%d, want nil and 0", res.Error, res.RowsAffected)
	}
	res = db.Delete(&Counter{ID: 404})
	if res.Error != nil || res.RowsAffected != 0 {
		t.Fatalf("delete of a missing row: err=%v rows=%d, want nil and 0", res.Error, res.RowsAffected)
	}
	// Save of a missing row falls back to GORM's insert.
	if err := db.Save(&Counter{ID: 405, N: 7}).Error; err != nil {
		t.Fatal(err)
	}
	var c Counter
	if err := db.First(&c, 405).Error; err != nil || c.N != 7 {
		t.Fatalf("saved row %+v, %v", c, err)
	}
}

// A stale Delete is refused too, and a stale Save does not fall back to an
// insert that would overwrite the newer row.
func TestStaleDeleteAndSaveRefused(t *testing.T) {
	forDBs(t, testStaleDeleteAndSaveRefused)
}

func testStaleDeleteAndSaveRefused(t *testing.T, e *env) {
	ctx := context.Background()
	db := e.guarded(t, gormplugin.LockOptions(locks.Lease(time.Minute)))
	if err := db.Create(&Counter{ID: 1}).Error; err != nil {
		t.Fatal(err)
	}
	for name, write := range map[string]func(tx *gorm.DB) error{
		"delete": func(tx *gorm.DB) error { return tx.Delete(&Counter{ID: 1}).Error },
		"save":   func(tx *gorm.DB) error { return tx.Save(&Counter{ID: 1, N: 999}).Error },
	} {
		t.Run(name, func(t *testing.T) {
			started, resume := make(chan struct{}), make(chan struct{})
			done := pausedWriter(t, db, write, started, resume)
			<-started
			if err := e.rdb.Del(ctx, e.lockKey("counters:1")).Err(); err != nil {
				t.Fatal(err)
			}
			if err := db.Model(&Counter{ID: 1}).Update("n", 5).Error; err != nil {
				t.Fatal(err)
			}
			close(resume)
			if err := <-done; !errors.Is(err, gormplugin.ErrStaleWrite) {
				t.Fatalf("stale %s: %v, want ErrStaleWrite", name, err)
			}
			var c Counter
			if err := db.First(&c, 1).Error; err != nil || c.N != 5 {
				t.Fatalf("row %+v, %v: want the newer n=5", c, err)
			}
		})
	}
}

func TestCompositeKeyAndTaggedFence(t *testing.T) {
	forDBs(t, testCompositeKeyAndTaggedFence)
}

func testCompositeKeyAndTaggedFence(t *testing.T, e *env) {
	db := e.guarded(t)
	if err := db.Create(&Pair{A: 1, B: "x"}).Error; err != nil {
		t.Fatal(err)
	}
	var during string
	if err := db.Callback().Update().Before("gorm:update").Register("test:observe", func(tx *gorm.DB) {
		during = e.holds(t, "pairs:1:x")
	}); err != nil {
		t.Fatal(err)
	}
	p := Pair{A: 1, B: "x"}
	if err := db.Model(&p).Update("v", 9).Error; err != nil {
		t.Fatal(err)
	}
	if during != "1" {
		t.Fatalf("lock pairs:1:x hold count during the write = %q, want 1", during)
	}
	var got Pair
	db.First(&got, "a = ? AND b = ?", 1, "x")
	if got.V != 9 || got.Fence == 0 || got.Fence != p.Fence {
		t.Fatalf("row %+v (model fence %d): want v=9 with the fence written", got, p.Fence)
	}
}

// With NoFencing nothing compares fence tokens, so the plugin's locks keep no
// fence counters in Redis: after every kind of guarded write has run and its
// locks are released, no cg:fence:* key is left behind.
func TestNoFencingWritesNoFenceCounters(t *testing.T) {
	forDBs(t, testNoFencingWritesNoFenceCounters)
}

func testNoFencingWritesNoFenceCounters(t *testing.T, e *env) {
	ctx := context.Background()
	db := e.guarded(t, gormplugin.NoFencing())
	if err := db.Create(&Counter{ID: 1, N: 1}).Error; err != nil {
		t.Fatal(err)
	}
	if err := db.Model(&Counter{ID: 1}).Update("n", 2).Error; err != nil {
		t.Fatal(err)
	}
	c := Counter{ID: 1}
	if err := db.First(&c).Error; err != nil {
		t.Fatal(err)
	}
	c.N = 3
	if err := db.Save(&c).Error; err != nil {
		t.Fatal(err)
	}
	if err := gormplugin.Transaction(ctx, db, func(tx *gorm.DB) error {
		return tx.Model(&Counter{ID: 1}).Update("n", 4).Error
	}, &Counter{ID: 1}); err != nil {
		t.Fatal(err)
	}
	if err := db.Delete(&Counter{ID: 1}).Error; err != nil {
		t.Fatal(err)
	}
	keys, err := e.rdb.Keys(ctx, "cg:fence:*").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) > 0 {
		t.Fatalf("fence counters left in Redis with NoFencing: %v", keys)
	}
	// The writes took the row's lock all the same.
	if held := e.held(t, "counters:1"); held {
		t.Fatal("the row's lock is still held")
	}
}
