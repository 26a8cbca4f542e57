package gormplugin_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"gorm.io/gorm"
	"gorm.io/gorm/clause"

	"github.com/cacheguard/cacheguard/gormplugin"
	"github.com/cacheguard/cacheguard/locks"
)

// observe registers a callback on db that runs f just before each Update or
// Delete statement is sent (inside the row guard).
func observe(t *testing.T, db *gorm.DB, f func(tx *gorm.DB)) {
	t.Helper()
	if err := db.Callback().Update().Before("gorm:update").Register("test:observe", f); err != nil {
		t.Fatal(err)
	}
	if err := db.Callback().Delete().Before("gorm:delete").Register("test:observe", f); err != nil {
		t.Fatal(err)
	}
}

// observeBuilt runs f each time an UPDATE's SET is built, after the
// plugin's SET builder, which locks the new key of a row the statement moves:
// what the statement holds then is what it holds when it is sent.
func observeBuilt(db *gorm.DB, f func(tx *gorm.DB)) {
	prev := db.ClauseBuilders["SET"]
	db.ClauseBuilders["SET"] = func(c clause.Clause, b clause.Builder) {
		if prev != nil {
			prev(c, b)
		} else {
			c.Build(b)
		}
		if stmt, ok := b.(*gorm.Statement); ok && !stmt.DB.DryRun {
			f(stmt.DB)
		}
	}
}

// A request that holds the row through ginmw.Lock (an owner on its context
// and the lock "repos:42") re-enters when GORM writes the row with that
// context: one lock key, hold count 2 during the write, 1 after, no wait.
func TestWriteReentersRequestLock(t *testing.T) {
	forLockers(t, testWriteReentersRequestLock)
}

func testWriteReentersRequestLock(t *testing.T, e *env) {
	db := e.guarded(t)
	if err := db.Create(&Repo{ID: 42, Name: "a"}).Error; err != nil {
		t.Fatal(err)
	}
	var during string
	var keysDuring []string
	observe(t, db, func(tx *gorm.DB) {
		during = e.holds(t, "repos:42")
		keysDuring = e.lockKeys(t)
	})

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ctx = locks.WithOwner(ctx, locks.NewOwnerID()) // what ginmw.Lock puts on the request
	lk, err := e.l.Lock(ctx, "repos:42")
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Unlock(context.Background())

	r := Repo{ID: 42}
	if err := db.WithContext(ctx).Model(&r).Update("name", "b").Error; err != nil {
		t.Fatalf("write under the request's lock: %v", err)
	}
	if during != "2" || len(keysDuring) != 1 || keysDuring[0] != e.lockKey("repos:42") {
		t.Fatalf("during the write: hold count %q, lock keys %v; want 2 and only %s", during, keysDuring, e.lockKey("repos:42"))
	}
	if n := e.holds(t, "repos:42"); n != "1" {
		t.Fatalf("hold count after the write %q, want 1", n)
	}
	if e.c != nil && uint64(r.Fence) != lk.Fence() {
		t.Fatalf("written fence %d, want the request's %d (re-entries share the token)", r.Fence, lk.Fence())
	}
	// A second write under the same acquisition passes the fence (<=, not <).
	if err := db.WithContext(ctx).Model(&Repo{ID: 42}).Update("stars", 1).Error; err != nil {
		t.Fatalf("second write under one acquisition: %v", err)
	}
	// And so does a Transaction with the same context.
	if err := gormplugin.Transaction(ctx, db, func(tx *gorm.DB) error {
		return tx.Model(&Repo{ID: 42}).Update("stars", 2).Error
	}, &Repo{ID: 42}); err != nil {
		t.Fatal(err)
	}
	if n := e.holds(t, "repos:42"); n != "1" {
		t.Fatalf("hold count after the transaction %q, want 1", n)
	}
}

// Writes through GORM to one row exclude each other for the whole statement
// and the transaction GORM opens for it: another owner cannot take the lock
// during the write, and it is still held once GORM has committed.
func TestStatementHoldsRowLock(t *testing.T) {
	forLockers(t, testStatementHoldsRowLock)
}

func testStatementHoldsRowLock(t *testing.T, e *env) {
	db := e.guarded(t)
	if err := db.Create(&Widget{ID: 1}).Error; err != nil {
		t.Fatal(err)
	}
	var tryErr error
	observe(t, db, func(tx *gorm.DB) {
		_, tryErr = e.l.TryLock(context.Background(), "widgets:1")
	})
	var afterCommit bool
	if err := db.Callback().Update().After("gorm:commit_or_rollback_transaction").Before("gormplugin:release").Register("test:after_commit", func(*gorm.DB) {
		afterCommit = e.held(t, "widgets:1")
	}); err != nil {
		t.Fatal(err)
	}
	if err := db.Model(&Widget{ID: 1}).Update("color", "red").Error; err != nil {
		t.Fatal(err)
	}
	if !errors.Is(tryErr, locks.ErrNotObtained) {
		t.Fatalf("TryLock during the write: %v, want ErrNotObtained", tryErr)
	}
	if !afterCommit {
		t.Fatal("the lock was released before GORM's COMMIT")
	}
	if e.held(t, "widgets:1") {
		t.Fatal("lock left after the write")
	}
}

func TestRowsNamedFromWhere(t *testing.T) {
	forLockers(t, testRowsNamedFromWhere)
}

func testRowsNamedFromWhere(t *testing.T, e *env) {
	db := e.guarded(t)
	if err := db.Create(&[]Repo{{ID: 1}, {ID: 2}, {ID: 3}}).Error; err != nil {
		t.Fatal(err)
	}
	var seen [][]string
	observe(t, db, func(tx *gorm.DB) {
		var held []string
		for _, n := range []string{"repos:1", "repos:2", "repos:3"} {
			if e.held(t, n) {
				held = append(held, n)
			}
		}
		seen = append(seen, held)
	})
	steps := []struct {
		name string
		run  func() error
		want []string
	}{
		{"Where(struct)", func() error { return db.Model(&Repo{}).Where(&Repo{ID: 2}).Update("name", "x").Error }, []string{"repos:2"}},
		{"Where(col, val)", func() error { return db.Model(&Repo{}).Where("id", 3).Update("name", "x").Error }, []string{"repos:3"}},
		{"Delete(model, ids)", func() error { return db.Delete(&Repo{}, []int{1, 2}).Error }, []string{"repos:1", "repos:2"}},
		{"Delete(slice)", func() error { return db.Delete(&[]Repo{{ID: 3}}).Error }, []string{"repos:3"}},
	}
	for i, s := range steps {
		if err := s.run(); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if len(seen) != i+1 || !equal(seen[i], s.want) {
			t.Fatalf("%s: locks held during the write %v, want %v", s.name, seen, s.want)
		}
	}
	var n int64
	db.Model(&Repo{}).Count(&n)
	if n != 0 {
		t.Fatalf("%d rows left, want 0", n)
	}
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestUnkeyedPolicies(t *testing.T) {
	forLockers(t, testUnkeyedPolicies)
}

func testUnkeyedPolicies(t *testing.T, e *env) {
	if err := e.plain(t).Create(&[]Widget{{ID: 1, Size: 1}, {ID: 2, Size: 1}}).Error; err != nil {
		t.Fatal(err)
	}
	batch := func(db *gorm.DB, color string) error {
		return db.Model(&Widget{}).Where("size = ?", 1).Update("color", color).Error
	}
	colors := func(t *testing.T) []string {
		var ws []Widget
		e.plain(t).Order("id").Find(&ws)
		out := make([]string, len(ws))
		for i, w := range ws {
			out[i] = w.Color
		}
		return out
	}

	t.Run("Refuse", func(t *testing.T) {
		db := e.guarded(t, gormplugin.Unkeyed(gormplugin.Refuse))
		if err := batch(db, "red"); !errors.Is(err, gormplugin.ErrUnkeyed) {
			t.Fatalf("got %v, want ErrUnkeyed", err)
		}
		if err := db.Where("size = ?", 5).Delete(&Widget{}).Error; !errors.Is(err, gormplugin.ErrUnkeyed) {
			t.Fatalf("batch delete: %v, want ErrUnkeyed", err)
		}
		if c := colors(t); !equal(c, []string{"", ""}) {
			t.Fatalf("refused write changed rows: %v", c)
		}
		if err := batch(db.WithContext(gormplugin.Unguarded(context.Background())), "red"); err != nil {
			t.Fatalf("Unguarded context: %v", err)
		}
		if c := colors(t); !equal(c, []string{"red", "red"}) {
			t.Fatalf("Unguarded write: %v", c)
		}
	})
	t.Run("PassThrough", func(t *testing.T) {
		db := e.guarded(t, gormplugin.Unkeyed(gormplugin.PassThrough))
		var keys []string
		observe(t, db, func(*gorm.DB) { keys = e.lockKeys(t) })
		if err := batch(db, "blue"); err != nil {
			t.Fatal(err)
		}
		if len(keys) != 0 {
			t.Fatalf("locks held during a pass-through write: %v", keys)
		}
		if c := colors(t); !equal(c, []string{"blue", "blue"}) {
			t.Fatalf("rows %v", c)
		}
	})
}

// With Redis gone, a guarded write is refused and nothing is written; with
// FailOpen it goes through unguarded.
func TestRedisDownRefusesWrite(t *testing.T) {
	forLockers(t, testRedisDownRefusesWrite)
}

func testRedisDownRefusesWrite(t *testing.T, e *env) {
	// A client that gives up on a dead server at once (go-redis's defaults
	// retry dialling for over a second per command).
	rdb := e.srv.Client(func(o *redis.Options) { o.MaxRetries, o.DialerRetries = -1, 1 })
	e.l = e.newLocker(t, rdb)
	db, open := e.guarded(t), e.guarded(t, gormplugin.FailOpen())
	if err := db.Create(&Counter{ID: 1, N: 1}).Error; err != nil {
		t.Fatal(err)
	}
	e.srv.Kill()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := db.WithContext(ctx).Model(&Counter{ID: 1}).Update("n", 2).Error
	if !errors.Is(err, gormplugin.ErrLock) || !errors.Is(err, locks.ErrNotObtained) || !errors.Is(err, locks.ErrUnavailable) {
		t.Fatalf("write with Redis down: %v, want ErrLock, locks.ErrNotObtained and locks.ErrUnavailable", err)
	}
	if err := gormplugin.Transaction(ctx, db, func(tx *gorm.DB) error { return nil }, &Counter{ID: 1}); !errors.Is(err, gormplugin.ErrLock) {
		t.Fatalf("Transaction with Redis down: %v, want ErrLock", err)
	}
	var c Counter
	db.First(&c, 1)
	if c.N != 1 {
		t.Fatalf("n = %d: an unguarded write went through", c.N)
	}

	if err := open.WithContext(ctx).Model(&Counter{ID: 1}).Update("n", 3).Error; err != nil {
		t.Fatalf("FailOpen write: %v", err)
	}
	db.First(&c, 1)
	if c.N != 3 {
		t.Fatalf("n = %d, want the fail-open write 3", c.N)
	}
}

// Two transactions writing the same rows in opposite orders never deadlock
// when they declare their rows: locks are taken in name order.
func TestOppositeOrdersDoNotDeadlock(t *testing.T) {
	forLockers(t, testOppositeOrdersDoNotDeadlock)
}

func testOppositeOrdersDoNotDeadlock(t *testing.T, e *env) {
	db := e.guarded(t)
	if err := db.Create(&[]Counter{{ID: 1}, {ID: 2}}).Error; err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, 20)
	for i := range 10 {
		first, second := uint(1), uint(2)
		if i%2 == 1 {
			first, second = second, first
		}
		wg.Go(func() {
			errs <- gormplugin.Transaction(ctx, db, func(tx *gorm.DB) error {
				for _, id := range []uint{first, second} {
					if err := tx.Model(&Counter{ID: id}).Update("n", gorm.Expr("n + 1")).Error; err != nil {
						return err
					}
				}
				return nil
			}, &Counter{ID: first}, &Counter{ID: second})
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	var cs []Counter
	db.Order("id").Find(&cs)
	if cs[0].N != 10 || cs[1].N != 10 {
		t.Fatalf("counters %+v, want 10 and 10", cs)
	}
}

// A transaction that needs, undeclared, a row sorting before one it holds
// does not wait for it (that could deadlock): ErrLockOrder when it is busy.
func TestOutOfOrderLockIsTriedNotAwaited(t *testing.T) {
	forLockers(t, testOutOfOrderLockIsTriedNotAwaited)
}

func testOutOfOrderLockIsTriedNotAwaited(t *testing.T, e *env) {
	db := e.guarded(t)
	if err := db.Create(&[]Counter{{ID: 1}, {ID: 2}}).Error; err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	other, err := e.l.Lock(ctx, "counters:1")
	if err != nil {
		t.Fatal(err)
	}
	err = db.Transaction(func(tx *gorm.DB) error {
		if err := tx.Model(&Counter{ID: 2}).Update("n", 1).Error; err != nil {
			return err
		}
		return tx.Model(&Counter{ID: 1}).Update("n", 1).Error
	})
	if !errors.Is(err, gormplugin.ErrLockOrder) {
		t.Fatalf("got %v, want ErrLockOrder", err)
	}
	other.Unlock(ctx)
	// Free, the same transaction takes it without waiting.
	if err := db.Transaction(func(tx *gorm.DB) error {
		if err := tx.Model(&Counter{ID: 2}).Update("n", 2).Error; err != nil {
			return err
		}
		return tx.Model(&Counter{ID: 1}).Update("n", 2).Error
	}); err != nil {
		t.Fatal(err)
	}
}

func TestTransactionPanicBecomesError(t *testing.T) {
	forLockers(t, testTransactionPanicBecomesError)
}

func testTransactionPanicBecomesError(t *testing.T, e *env) {
	db := e.guarded(t)
	if err := db.Create(&Counter{ID: 1}).Error; err != nil {
		t.Fatal(err)
	}
	err := gormplugin.Transaction(context.Background(), db, func(tx *gorm.DB) error {
		tx.Model(&Counter{ID: 1}).Update("n", 9)
		panic("bad handler")
	}, &Counter{ID: 1})
	var pe *gormplugin.PanicError
	if !errors.As(err, &pe) || pe.Value != "bad handler" {
		t.Fatalf("got %v, want a PanicError", err)
	}
	if e.held(t, "counters:1") {
		t.Fatal("lock left after the panic")
	}
	var c Counter
	db.First(&c, 1)
	if c.N != 0 {
		t.Fatal("panicking transaction was committed")
	}
}

// A transaction begun outside the plugin's pool (on a *sql.Conn) cannot be
// followed to its COMMIT: guarded writes in it are refused.
func TestForeignTransactionRefused(t *testing.T) {
	forDBs(t, testForeignTransactionRefused)
}

func testForeignTransactionRefused(t *testing.T, e *env) {
	db := e.guarded(t)
	if err := db.Create(&Counter{ID: 1}).Error; err != nil {
		t.Fatal(err)
	}
	err := db.Connection(func(conn *gorm.DB) error {
		return conn.Transaction(func(tx *gorm.DB) error {
			return tx.Model(&Counter{ID: 1}).Update("n", 1).Error
		})
	})
	if !errors.Is(err, gormplugin.ErrForeignTx) {
		t.Fatalf("got %v, want ErrForeignTx", err)
	}
	// A single statement on the connection is fine: GORM's transaction for it
	// is followed by the statement's own callbacks.
	if err := db.Connection(func(conn *gorm.DB) error {
		return conn.Model(&Counter{ID: 1}).Update("n", 2).Error
	}); err != nil {
		t.Fatal(err)
	}
}

// The guard works the same with prepared statements and without GORM's
// default transaction.
func TestGormModes(t *testing.T) {
	forDBs(t, testGormModes)
}

func testGormModes(t *testing.T, e *env) {
	for name, cfg := range map[string]*gorm.Config{
		"PrepareStmt":            {PrepareStmt: true},
		"SkipDefaultTransaction": {SkipDefaultTransaction: true},
	} {
		t.Run(name, func(t *testing.T) {
			inv := newInvalidator(e.rdb)
			db, _ := e.guardedPlugin(t, cfg, gormplugin.Invalidate(inv, cacheKeys))
			db.Save(&Counter{ID: 1})
			var held string
			observe(t, db, func(*gorm.DB) { held = e.holds(t, "counters:1") })
			e.rdb.Set(context.Background(), "cache:counters:1", "x", 0)
			c := Counter{ID: 1}
			if err := db.Model(&c).Update("n", 4).Error; err != nil {
				t.Fatal(err)
			}
			if held != "1" || c.Fence == 0 || exists(t, e.rdb, "cache:counters:1") {
				t.Fatalf("held %q, fence %d, cache left %v", held, c.Fence, exists(t, e.rdb, "cache:counters:1"))
			}
			err := db.Transaction(func(tx *gorm.DB) error {
				if err := tx.Session(&gorm.Session{PrepareStmt: true}).Model(&Counter{ID: 1}).Update("n", 5).Error; err != nil {
					return err
				}
				if !e.held(t, "counters:1") {
					return errors.New("lock not held to COMMIT")
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if e.held(t, "counters:1") {
				t.Fatal("lock left after commit")
			}
		})
	}
}

// Transaction called with a transaction takes the new rows' locks into it and
// runs fn in a SAVEPOINT; the locks are held until the outer COMMIT.
func TestNestedTransaction(t *testing.T) {
	forLockers(t, testNestedTransaction)
}

func testNestedTransaction(t *testing.T, e *env) {
	db := e.guarded(t)
	ctx := context.Background()
	if err := db.Create(&[]Counter{{ID: 1}, {ID: 2}, {ID: 3}}).Error; err != nil {
		t.Fatal(err)
	}
	other, err := e.l.Lock(ctx, "counters:1")
	if err != nil {
		t.Fatal(err)
	}
	defer other.Unlock(ctx)
	err = gormplugin.Transaction(ctx, db, func(tx *gorm.DB) error {
		if err := tx.Model(&Counter{ID: 2}).Update("n", 2).Error; err != nil {
			return err
		}
		if err := gormplugin.Transaction(ctx, tx, func(tx *gorm.DB) error {
			return tx.Model(&Counter{ID: 3}).Update("n", 3).Error
		}, &Counter{ID: 3}); err != nil {
			return err
		}
		if !e.held(t, "counters:3") {
			return errors.New("nested lock released before the outer COMMIT")
		}
		// counters:1 sorts before the locks held and is busy: not awaited.
		err := gormplugin.Transaction(ctx, tx, func(*gorm.DB) error { return nil }, &Counter{ID: 1})
		if !errors.Is(err, gormplugin.ErrLockOrder) {
			return fmt.Errorf("out-of-order nested Transaction: %v, want ErrLockOrder", err)
		}
		return nil
	}, &Counter{ID: 2})
	if err != nil {
		t.Fatal(err)
	}
	var cs []Counter
	db.Order("id").Find(&cs)
	if cs[1].N != 2 || cs[2].N != 3 {
		t.Fatalf("rows %+v", cs)
	}
	for _, n := range []string{"counters:2", "counters:3"} {
		if e.held(t, n) {
			t.Fatalf("%s held after COMMIT", n)
		}
	}
}
