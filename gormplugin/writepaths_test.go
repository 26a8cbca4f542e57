package gormplugin_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"

	"github.com/cacheguard/cacheguard/gormplugin"
	"github.com/cacheguard/cacheguard/locks"
)

// writePath is one way GORM can change an existing row of counters: it
// writes c (as read, with its fields changed) through tx.
type writePath struct {
	name  string
	write func(tx *gorm.DB, c *Counter) error
	gone  bool // the write deletes the row
}

// writePaths are every way GORM changes an existing row: each must take the
// row's lock, be fenced, and invalidate the row's cache keys after COMMIT.
var writePaths = []writePath{
	{name: "Update", write: func(tx *gorm.DB, c *Counter) error { return tx.Model(c).Update("n", c.N).Error }},
	{name: "Updates(map)", write: func(tx *gorm.DB, c *Counter) error {
		return tx.Model(c).Updates(map[string]any{"n": c.N}).Error
	}},
	{name: "Updates(struct)", write: func(tx *gorm.DB, c *Counter) error { return tx.Model(c).Updates(c).Error }},
	{name: "UpdateColumn", write: func(tx *gorm.DB, c *Counter) error { return tx.Model(c).UpdateColumn("n", c.N).Error }},
	{name: "UpdateColumns", write: func(tx *gorm.DB, c *Counter) error {
		return tx.Model(c).UpdateColumns(map[string]any{"n": c.N}).Error
	}},
	{name: "Save", write: func(tx *gorm.DB, c *Counter) error { return tx.Save(c).Error }},
	{name: "Save(slice)", write: func(tx *gorm.DB, c *Counter) error {
		s := []Counter{*c}
		err := tx.Save(&s).Error
		*c = s[0]
		return err
	}},
	{name: "Create OnConflict UpdateAll", write: func(tx *gorm.DB, c *Counter) error {
		return tx.Clauses(clause.OnConflict{UpdateAll: true}).Create(c).Error
	}},
	{name: "Create OnConflict DoUpdates", write: func(tx *gorm.DB, c *Counter) error {
		return tx.Clauses(clause.OnConflict{Columns: []clause.Column{{Name: "id"}}, DoUpdates: clause.AssignmentColumns([]string{"n"})}).Create(c).Error
	}},
	{name: "Delete", write: func(tx *gorm.DB, c *Counter) error { return tx.Delete(c).Error }, gone: true},
}

// observeWrites runs f just before each Create, Update and Delete statement
// is sent.
func observeWrites(t *testing.T, db *gorm.DB, f func(tx *gorm.DB)) {
	t.Helper()
	observe(t, db, f)
	if err := db.Callback().Create().Before("gorm:create").Register("test:observe", f); err != nil {
		t.Fatal(err)
	}
}

// Every way GORM changes an existing row holds the row's lock while its
// statement is sent, writes the fence, and invalidates the row's cache keys
// after COMMIT (issue 28: Save of a slice and upserts went around all three).
func TestEveryWritePathGuarded(t *testing.T) {
	forDBs(t, testEveryWritePathGuarded)
}

func testEveryWritePathGuarded(t *testing.T, e *env) {
	inv := newInvalidator(e.rdb)
	db := e.guarded(t, gormplugin.Invalidate(inv, cacheKeys))
	plain := e.plain(t)
	var held []string
	observeWrites(t, db, func(tx *gorm.DB) {
		if name, ok := tx.Statement.Context.Value(rowKey{}).(string); ok {
			held = append(held, e.holds(t, name))
		}
	})
	for i, p := range writePaths {
		t.Run(p.name, func(t *testing.T) {
			id := uint(100 + i)
			name := gormplugin.RowName("counters", id)
			if err := plain.Create(&Counter{ID: id, N: 1}).Error; err != nil {
				t.Fatal(err)
			}
			var c Counter
			if err := db.First(&c, id).Error; err != nil {
				t.Fatal(err)
			}
			drain(inv)
			held = nil
			c.N = 2
			ctx := context.WithValue(context.Background(), rowKey{}, name)
			if err := p.write(db.WithContext(ctx), &c); err != nil {
				t.Fatalf("write: %v", err)
			}
			if len(held) == 0 || slices.Contains(held, "") {
				t.Errorf("lock %s during the statements: %q, want held", name, held)
			}
			if !invalidated(inv, "cache:"+name) {
				t.Errorf("cache key of %s not invalidated after COMMIT", name)
			}
			var got Counter
			err := plain.First(&got, id).Error
			switch {
			case p.gone:
				if !errors.Is(err, gorm.ErrRecordNotFound) {
					t.Fatalf("row after Delete: %+v, %v", got, err)
				}
			case err != nil:
				t.Fatal(err)
			case got.N != 2 || got.Fence == 0 || got.Fence != c.Fence:
				t.Errorf("row %+v, struct fence %d: want n=2 and the token written in both", got, c.Fence)
			}
			if keys := e.lockKeys(t); len(keys) != 0 {
				t.Fatalf("locks left: %v", keys)
			}
		})
	}
}

type rowKey struct{}

func drain(inv *keyInvalidator) {
	for {
		select {
		case <-inv.calls:
		default:
			return
		}
	}
}

// invalidated reports whether key was among the invalidations made so far.
func invalidated(inv *keyInvalidator, key string) bool {
	for {
		select {
		case keys := <-inv.calls:
			if slices.Contains(keys, key) {
				return true
			}
		default:
			return false
		}
	}
}

// Every way GORM changes an existing row refuses a writer whose lock scope
// was lost (its lease ran out while its process was stopped, unnoticed) after
// another writer committed the row: ErrStaleWrite, and the newer row stays.
// Save of a slice and upserts overwrote it, moving the fence backwards.
func TestEveryWritePathRefusesStale(t *testing.T) {
	forDBs(t, testEveryWritePathRefusesStale)
}

func testEveryWritePathRefusesStale(t *testing.T, e *env) {
	db := e.guarded(t)
	plain := e.plain(t)
	for i, p := range writePaths {
		t.Run(p.name, func(t *testing.T) {
			id := uint(200 + i)
			name := gormplugin.RowName("counters", id)
			if err := plain.Create(&Counter{ID: id, N: 1}).Error; err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			actx := locks.WithOwner(ctx, locks.NewOwnerID()) // request A, as ginmw.Lock
			a, err := e.l.Lock(actx, name, locks.Lease(time.Minute))
			if err != nil {
				t.Fatal(err)
			}
			defer a.Unlock(context.Background())
			var c Counter
			if err := db.WithContext(actx).First(&c, id).Error; err != nil {
				t.Fatal(err)
			}
			// A's lease runs out while its process is stopped; B writes.
			if err := e.rdb.Del(ctx, e.lockKey(name)).Err(); err != nil {
				t.Fatal(err)
			}
			if err := db.Model(&Counter{ID: id}).Update("n", 50).Error; err != nil {
				t.Fatalf("B: %v", err)
			}
			var b Counter
			plain.First(&b, id)

			c.N = 99
			if err := p.write(db.WithContext(actx), &c); !errors.Is(err, gormplugin.ErrStaleWrite) {
				t.Fatalf("A's late write: %v, want ErrStaleWrite", err)
			}
			var got Counter
			if err := plain.First(&got, id).Error; err != nil || got != b {
				t.Fatalf("row %+v (%v) after A's refused write, want B's %+v", got, err, b)
			}
		})
	}
}

// The fence is the row's version for a struct written back whole: a Save of
// a struct read before another writer committed the row is refused, also
// when the row had never been written under a fence (fence 0) when it was
// read. A holder stopped after its UPDATE and before its COMMIT still holds
// the database's row lock, so the next request's read (outside
// gormplugin.Transaction) returns the row as it was; its Save then waits for
// that COMMIT and must not overwrite it (issue 28 item 1: both answered 200,
// one edit lost).
func TestSaveOfStaleReadRefused(t *testing.T) {
	forDBs(t, testSaveOfStaleReadRefused)
}

func testSaveOfStaleReadRefused(t *testing.T, e *env) {
	db := e.guarded(t)
	plain := e.plain(t)
	for i, p := range writePaths {
		if p.gone || p.name == "Update" || p.name == "Updates(map)" || p.name == "UpdateColumn" || p.name == "UpdateColumns" {
			continue // not a write of the struct read
		}
		for _, fence := range []gormplugin.Fence{0, 7} {
			if fence == 0 && p.name == "Create OnConflict DoUpdates" {
				continue // the columns assigned may not be the struct's: a zero fence is no version
			}
			t.Run(p.name+"/fence "+map[bool]string{true: "0", false: "set"}[fence == 0], func(t *testing.T) {
				id := uint(300 + 2*i + int(fence%2))
				if err := plain.Create(&Counter{ID: id, N: 1, Fence: fence}).Error; err != nil {
					t.Fatal(err)
				}
				var a, b Counter
				db.First(&a, id)
				db.First(&b, id)
				b.N = 2
				if err := p.write(db, &b); err != nil {
					t.Fatalf("B: %v", err)
				}
				a.N = 3
				err := p.write(db, &a)
				var stale *gormplugin.StaleWriteError
				if !errors.As(err, &stale) {
					t.Fatalf("Save of a struct read before B's commit: %v, want ErrStaleWrite", err)
				}
				var got Counter
				plain.First(&got, id)
				if got.N != 2 || got.Fence != b.Fence {
					t.Fatalf("row %+v, want B's n=2 fence %d", got, b.Fence)
				}
				if a.Fence != fence {
					t.Fatalf("refused struct's fence %d, want the %d it was read with", a.Fence, fence)
				}
			})
		}
	}
}

// Save of a row that is missing falls back to an insert. That insert is
// guarded like the UPDATE: it holds the row's lock and is fenced, so it
// cannot overwrite a row another writer inserted meanwhile, and a Save of a
// struct read before the row was deleted does not bring the row back.
func TestSaveFallbackGuarded(t *testing.T) {
	forDBs(t, testSaveFallbackGuarded)
}

func testSaveFallbackGuarded(t *testing.T, e *env) {
	db := e.guarded(t)
	plain := e.plain(t)
	t.Run("resurrect", func(t *testing.T) {
		if err := plain.Create(&Counter{ID: 1, N: 1}).Error; err != nil {
			t.Fatal(err)
		}
		var a Counter
		db.First(&a, 1)
		if err := db.Model(&a).Update("n", 2).Error; err != nil {
			t.Fatal(err)
		}
		if err := db.Delete(&Counter{ID: 1}).Error; err != nil {
			t.Fatal(err)
		}
		a.N = 3
		if err := db.Save(&a).Error; !errors.Is(err, gormplugin.ErrStaleWrite) {
			t.Fatalf("Save of a row deleted since its read: %v, want ErrStaleWrite", err)
		}
		if err := plain.First(&Counter{}, 1).Error; !errors.Is(err, gorm.ErrRecordNotFound) {
			t.Fatalf("the deleted row came back: %v", err)
		}
	})
	t.Run("race", func(t *testing.T) {
		// A's Save finds row 2 missing; between its UPDATE and its insert,
		// B inserts row 2 through the plugin.
		type pauseAt struct{}
		at, resume := make(chan struct{}), make(chan struct{})
		if err := db.Callback().Create().Before("gorm:create").Register("test:pause-insert", func(tx *gorm.DB) {
			if tx.Statement.Context.Value(pauseAt{}) != nil {
				close(at)
				<-resume
			}
		}); err != nil {
			t.Fatal(err)
		}
		var held string
		if err := db.Callback().Create().Before("gorm:create").After("test:pause-insert").Register("test:held", func(tx *gorm.DB) {
			if tx.Statement.Context.Value(pauseAt{}) != nil {
				held = e.holds(t, "counters:2")
			}
		}); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() {
			done <- db.WithContext(context.WithValue(context.Background(), pauseAt{}, true)).Save(&Counter{ID: 2, N: 1}).Error
		}()
		var bErr error
		select {
		case <-at:
			// The row lock, if A holds one, makes B wait: B runs until A
			// is resumed.
			bDone := make(chan error, 1)
			go func() { bDone <- db.Save(&Counter{ID: 2, N: 5}).Error }()
			if !e.held(t, "counters:2") {
				// A inserts without the lock: B goes through now.
				bErr = <-bDone
				close(resume)
			} else {
				close(resume)
				bErr = <-bDone
			}
		case err := <-done:
			t.Fatalf("A ended before its insert: %v", err)
		}
		aErr := <-done
		if held == "" {
			t.Errorf("A's insert was sent without the row's lock")
		}
		var got Counter
		plain.First(&got, 2)
		t.Logf("A: %v; B: %v; row %+v", aErr, bErr, got)
		if bErr != nil && !errors.Is(bErr, gormplugin.ErrStaleWrite) {
			t.Fatalf("B: %v", bErr)
		}
		if aErr != nil && !errors.Is(aErr, gormplugin.ErrStaleWrite) {
			t.Fatalf("A: %v", aErr)
		}
		if (aErr == nil) == (bErr == nil) && aErr != nil {
			t.Fatal("both refused")
		}
	})
}

// A Create of a new row invalidates its cache key after COMMIT (a cached
// "not found" must not outlive the insert), with a key set by the caller or
// by the database.
func TestCreateInvalidates(t *testing.T) {
	forDBs(t, testCreateInvalidates)
}

func testCreateInvalidates(t *testing.T, e *env) {
	inv := newInvalidator(e.rdb)
	db := e.guarded(t, gormplugin.Invalidate(inv, cacheKeys))
	// Explicit keys far apart, as the database hands out the largest key so
	// far plus one: no case collides with another (a map's random order made
	// "map" insert id 33 after the database had handed it out).
	for _, c := range []struct {
		name   string
		create func() (uint, error)
	}{
		{"key set", func() (uint, error) { return 3100, db.Create(&Counter{ID: 3100}).Error }},
		{"key from the database", func() (uint, error) {
			c := Counter{N: 1}
			err := db.Create(&c).Error
			return c.ID, err
		}},
		{"slice", func() (uint, error) {
			cs := []Counter{{N: 1}, {N: 2}}
			err := db.Create(&cs).Error
			return cs[1].ID, err
		}},
		{"OnConflict DoNothing", func() (uint, error) {
			return 3200, db.Clauses(clause.OnConflict{DoNothing: true}).Create(&Counter{ID: 3200}).Error
		}},
		{"map", func() (uint, error) {
			return 3300, db.Model(&Counter{}).Create(map[string]any{"id": 3300, "n": 1}).Error
		}},
		{"in a transaction", func() (uint, error) {
			return 3400, db.Transaction(func(tx *gorm.DB) error { return tx.Create(&Counter{ID: 3400}).Error })
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			drain(inv)
			id, err := c.create()
			if err != nil {
				t.Fatal(err)
			}
			if key := "cache:" + gormplugin.RowName("counters", id); !invalidated(inv, key) {
				t.Fatalf("%s not invalidated after the insert", key)
			}
		})
	}
}

// SavePoint and RollbackTo: a write rolled back to a savepoint leaves the
// struct with the fence it had before, so the same holder's next write is
// not refused as stale (issue 28 item 3).
func TestRollbackToSavepointRestoresFence(t *testing.T) {
	forDBs(t, testRollbackToSavepointRestoresFence)
}

func testRollbackToSavepointRestoresFence(t *testing.T, e *env) {
	db := e.guarded(t)
	if err := e.plain(t).Create(&Counter{ID: 1, N: 1}).Error; err != nil {
		t.Fatal(err)
	}
	var c Counter
	db.First(&c, 1)
	boom := errors.New("boom")
	for name, run := range map[string]func(tx *gorm.DB) error{
		"SavePoint/RollbackTo": func(tx *gorm.DB) error {
			tx.SavePoint("sp1")
			if err := tx.Model(&c).Update("n", 5).Error; err != nil {
				return err
			}
			return tx.RollbackTo("sp1").Error
		},
		"nested Transaction": func(tx *gorm.DB) error {
			err := tx.Transaction(func(tx2 *gorm.DB) error {
				if err := tx2.Model(&c).Update("n", 5).Error; err != nil {
					return err
				}
				return boom
			})
			if !errors.Is(err, boom) {
				return err
			}
			return nil
		},
	} {
		t.Run(name, func(t *testing.T) {
			before := c.Fence
			err := db.Transaction(func(tx *gorm.DB) error {
				if err := run(tx); err != nil {
					return err
				}
				if c.Fence != before {
					t.Errorf("struct fence %d after the rollback to the savepoint, want %d", c.Fence, before)
				}
				return tx.Model(&c).Update("n", c.N+1).Error
			})
			if err != nil {
				t.Fatalf("the next write of the same holder: %v", err)
			}
			var got Counter
			e.plain(t).First(&got, 1)
			if got != c || got.Fence == before {
				t.Fatalf("row %+v, struct %+v: want the same, with a new fence", got, c)
			}
		})
	}
}

// Raw and Exec are not guarded; inside Transaction, the rows declared are
// locked, claimed, and invalidated after COMMIT, also a row without a fence
// column that only Exec changes.
func TestExecInTransactionInvalidated(t *testing.T) {
	forDBs(t, testExecInTransactionInvalidated)
}

func testExecInTransactionInvalidated(t *testing.T, e *env) {
	inv := newInvalidator(e.rdb)
	db := e.guarded(t, gormplugin.Invalidate(inv, cacheKeys))
	plain := e.plain(t)
	if err := plain.Create(&Widget{ID: 1}).Error; err != nil {
		t.Fatal(err)
	}
	if err := plain.Create(&Counter{ID: 1}).Error; err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	err := gormplugin.Transaction(ctx, db, func(tx *gorm.DB) error {
		if !e.held(t, "widgets:1") || !e.held(t, "counters:1") {
			t.Error("declared rows not locked")
		}
		if err := tx.Exec("UPDATE widgets SET size = 3 WHERE id = 1").Error; err != nil {
			return err
		}
		return tx.Exec("UPDATE counters SET n = 3 WHERE id = 1").Error
	}, &Widget{ID: 1}, &Counter{ID: 1})
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for {
		select {
		case k := <-inv.calls:
			keys = append(keys, k...)
			continue
		default:
		}
		break
	}
	for _, want := range []string{"cache:widgets:1", "cache:counters:1"} {
		if !slices.Contains(keys, want) {
			t.Errorf("invalidated %v, want %s", keys, want)
		}
	}
}

// Badge has a unique key besides its primary key, and a fence.
type Badge struct {
	ID    uint
	Code  string `gorm:"uniqueIndex:idx_badges_code"`
	Label string
	Fence gormplugin.Fence `gorm:"not null;default:0"`
}

// Shelf has many items; Item has a fence.
type Shelf struct {
	ID    uint
	Items []Item
}

type Item struct {
	ID      uint
	ShelfID *uint
	Name    string
	Fence   gormplugin.Fence `gorm:"not null;default:0"`
}

// An upsert whose conflict target is another unique key cannot name the row
// it may update from its values' primary key: with LockMatched (the
// default) the plugin reads the rows the target's values match, locks and
// fences them, and restricts the DO UPDATE to them; Refuse refuses it;
// PassThrough sends it without locks.
func TestUpsertOnOtherKey(t *testing.T) {
	forDBs(t, testUpsertOnOtherKey)
}

func testUpsertOnOtherKey(t *testing.T, e *env) {
	plain := e.plain(t)
	if err := plain.AutoMigrate(&Badge{}); err != nil {
		t.Fatal(err)
	}
	upsert := func(db *gorm.DB, label string) error {
		return db.Clauses(clause.OnConflict{Columns: []clause.Column{{Name: "code"}}, DoUpdates: clause.AssignmentColumns([]string{"label"})}).
			Create(&Badge{Code: "x", Label: label}).Error
	}
	if err := plain.Create(&Badge{ID: 7, Code: "x", Label: "a"}).Error; err != nil {
		t.Fatal(err)
	}
	t.Run("LockMatched", func(t *testing.T) {
		inv := newInvalidator(e.rdb)
		db := e.guarded(t, gormplugin.Invalidate(inv, cacheKeys))
		var held []string
		observeWrites(t, db, func(tx *gorm.DB) { held = append(held, e.holds(t, "badges:7")) })
		if err := upsert(db, "b"); err != nil {
			t.Fatal(err)
		}
		var got Badge
		plain.First(&got, 7)
		if got.Label != "b" || got.Fence == 0 || !slices.Equal(held, []string{"1"}) {
			t.Fatalf("row %+v, lock badges:7 during the upsert %q: want label b, a fence, held", got, held)
		}
		if !invalidated(inv, "cache:badges:7") {
			t.Fatal("cache:badges:7 not invalidated")
		}
		// A stale holder of badges:7 (its lease ran out while stopped) is refused.
		ctx := locks.WithOwner(context.Background(), locks.NewOwnerID())
		a, err := e.l.Lock(ctx, "badges:7", locks.Lease(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		defer a.Unlock(context.Background())
		e.rdb.Del(ctx, e.lockKey("badges:7"))
		if err := upsert(db, "c"); err != nil {
			t.Fatal(err)
		}
		if err := upsert(db.WithContext(ctx), "stale"); !errors.Is(err, gormplugin.ErrStaleWrite) {
			t.Fatalf("stale upsert: %v, want ErrStaleWrite", err)
		}
		plain.First(&got, 7)
		if got.Label != "c" {
			t.Fatalf("row %+v, want label c", got)
		}
	})
	t.Run("OnConstraint", func(t *testing.T) {
		if e.db != onPostgres {
			t.Skip("ON CONFLICT ON CONSTRAINT is PostgreSQL's")
		}
		if err := plain.Exec("ALTER TABLE badges ADD CONSTRAINT badges_code_key UNIQUE (code)").Error; err != nil {
			t.Fatal(err)
		}
		db := e.guarded(t)
		var held []string
		observeWrites(t, db, func(tx *gorm.DB) { held = append(held, e.holds(t, "badges:7")) })
		err := db.Clauses(clause.OnConflict{OnConstraint: "badges_code_key", DoUpdates: clause.AssignmentColumns([]string{"label"})}).
			Create(&Badge{Code: "x", Label: "on constraint"}).Error
		var got Badge
		plain.First(&got, 7)
		if err != nil || got.Label != "on constraint" || !slices.Equal(held, []string{"1"}) {
			t.Fatalf("upsert on a constraint: %v, row %+v, lock badges:7 during it %q: want nil, the new label, held", err, got, held)
		}
	})
	t.Run("Refuse", func(t *testing.T) {
		db := e.guarded(t, gormplugin.Unkeyed(gormplugin.Refuse))
		if err := upsert(db, "d"); !errors.Is(err, gormplugin.ErrUnkeyed) {
			t.Fatalf("upsert under Refuse: %v, want ErrUnkeyed", err)
		}
	})
	t.Run("PassThrough", func(t *testing.T) {
		db := e.guarded(t, gormplugin.Unkeyed(gormplugin.PassThrough))
		var held []string
		observeWrites(t, db, func(tx *gorm.DB) { held = append(held, e.holds(t, "badges:7")) })
		if err := upsert(db, "e"); err != nil || !slices.Equal(held, []string{""}) {
			t.Fatalf("upsert under PassThrough: %v, lock during it %q: want nil and no lock", err, held)
		}
	})
}

// GORM's association API writes the associated rows with an upsert that
// assigns their foreign key (DoUpdates): the item's row is locked while it
// is written, and Append of an item that carries the (set) fence it was read
// with, read before another writer committed it, is refused.
func TestAssociationUpsertGuarded(t *testing.T) {
	forDBs(t, testAssociationUpsertGuarded)
}

func testAssociationUpsertGuarded(t *testing.T, e *env) {
	plain := e.plain(t)
	if err := plain.AutoMigrate(&Shelf{}, &Item{}); err != nil {
		t.Fatal(err)
	}
	db := e.guarded(t)
	if err := plain.Create(&Shelf{ID: 1}).Error; err != nil {
		t.Fatal(err)
	}
	if err := plain.Create(&Item{ID: 5, Name: "i", Fence: 3}).Error; err != nil {
		t.Fatal(err)
	}
	var held []string
	observeWrites(t, db, func(tx *gorm.DB) {
		if tx.Statement.Table == "items" {
			held = append(held, e.holds(t, "items:5"))
		}
	})
	var a, b Item
	db.First(&a, 5)
	if err := db.Model(&Item{ID: 5}).Update("name", "moved").Error; err != nil {
		t.Fatal(err)
	}
	db.First(&b, 5)
	if err := db.Model(&Shelf{ID: 1}).Association("Items").Append(&b); err != nil {
		t.Fatalf("Append of a fresh item: %v", err)
	}
	if len(held) == 0 || slices.Contains(held, "") {
		t.Fatalf("lock items:5 during the association's writes: %q", held)
	}
	if err := db.Model(&Shelf{ID: 1}).Association("Items").Append(&a); !errors.Is(err, gormplugin.ErrStaleWrite) {
		t.Fatalf("Append of an item read before another writer committed: %v, want ErrStaleWrite", err)
	}
}

// Note has no primary key.
type Note struct {
	Text string
}

// An insert after an upsert on the same database is an insert: it takes no
// lock, also on a table without a primary key.
func TestInsertAfterUpsert(t *testing.T) {
	forDBs(t, func(t *testing.T, e *env) {
		if err := e.plain(t).AutoMigrate(&Note{}); err != nil {
			t.Fatal(err)
		}
		db := e.guarded(t, gormplugin.Invalidate(newInvalidator(e.rdb), cacheKeys))
		if err := db.Clauses(clause.OnConflict{UpdateAll: true}).Create(&Counter{ID: 1}).Error; err != nil {
			t.Fatal(err)
		}
		for i := range 2 {
			if err := db.Create(&Note{Text: "n"}).Error; err != nil {
				t.Fatalf("insert #%d after an upsert: %v", i+1, err)
			}
		}
	})
}

// An update or upsert that assigns the primary key moves a row: it is
// written under its old name and its new one, so both are locked (a new
// name another owner holds makes it wait, then fail with ErrLock) and both
// invalidated; a new key the plugin cannot name is refused.
func TestMoveLocksTheNewKey(t *testing.T) {
	forDBs(t, testMoveLocksTheNewKey)
}

func testMoveLocksTheNewKey(t *testing.T, e *env) {
	plain := e.plain(t)
	if err := plain.AutoMigrate(&Repo{}, &Badge{}); err != nil {
		t.Fatal(err)
	}
	if err := plain.Create(&Repo{ID: 1, Name: "a"}).Error; err != nil {
		t.Fatal(err)
	}
	if err := plain.Create(&Badge{ID: 1, Code: "x", Label: "a"}).Error; err != nil {
		t.Fatal(err)
	}
	inv := newInvalidator(e.rdb)
	db := e.guarded(t, gormplugin.Invalidate(inv, cacheKeys), gormplugin.LockOptions(locks.WaitBudget(20*time.Millisecond)))
	other := locks.WithOwner(context.Background(), locks.NewOwnerID())
	lk, err := e.l.Lock(other, "repos:7")
	if err != nil {
		t.Fatal(err)
	}
	moves := map[string]func() error{
		"Updates(struct)": func() error { return db.Model(&Repo{ID: 1}).Updates(&Repo{ID: 7, Name: "moved"}).Error },
		"Table.Update":    func() error { return db.Table("repos").Where("id = ?", 1).Update("id", 7).Error },
		"Transaction": func() error {
			return gormplugin.Transaction(context.Background(), db, func(tx *gorm.DB) error {
				return tx.Model(&Repo{ID: 1}).Update("id", 7).Error
			}, &Repo{ID: 1})
		},
	}
	for name, move := range moves {
		if err := move(); !errors.Is(err, gormplugin.ErrLock) || !errors.Is(err, locks.ErrBusy) {
			t.Fatalf("%s to a key another owner holds: %v, want ErrLock and locks.ErrBusy", name, err)
		}
	}
	for name, move := range map[string]func() error{
		"Update(expression)": func() error { return db.Model(&Repo{ID: 1}).Update("id", gorm.Expr("id + 100")).Error },
		"upsert DoUpdates id": func() error {
			return db.Clauses(clause.OnConflict{Columns: []clause.Column{{Name: "code"}}, DoUpdates: clause.AssignmentColumns([]string{"id", "label"})}).
				Create(&Badge{ID: 9, Code: "x", Label: "b"}).Error
		},
	} {
		if err := move(); !errors.Is(err, gormplugin.ErrUnnamedRows) {
			t.Fatalf("%s: %v, want ErrUnnamedRows", name, err)
		}
	}
	// GORM's association upserts set the key to itself on a conflict over
	// it: no move, nothing refused.
	if err := db.Clauses(clause.OnConflict{Columns: []clause.Column{{Name: "id"}}, DoUpdates: clause.AssignmentColumns([]string{"id", "label"})}).
		Create(&Badge{ID: 1, Code: "x", Label: "a"}).Error; err != nil {
		t.Fatalf("upsert setting its conflict key to itself: %v", err)
	}
	var n int64
	plain.Model(&Repo{}).Where("id = ? AND name = ?", 1, "a").Count(&n)
	var b Badge
	plain.First(&b, 1)
	if n != 1 || b.Label != "a" {
		t.Fatalf("refused moves changed rows: repos:1 present %d, badge %+v", n, b)
	}
	if err := lk.Unlock(context.Background()); err != nil {
		t.Fatal(err)
	}
	var held []string
	observeBuilt(db, func(tx *gorm.DB) { held = append(held, e.holds(t, "repos:1")+e.holds(t, "repos:7")) })
	if err := db.Model(&Repo{ID: 1}).Updates(&Repo{ID: 7, Name: "moved"}).Error; err != nil {
		t.Fatal(err)
	}
	var got Repo
	if err := plain.First(&got, 7).Error; err != nil || got.Name != "moved" || !slices.Equal(held, []string{"11"}) {
		t.Fatalf("move: %v, row %+v, locks repos:1 and repos:7 during it %q: want the row at 7, both held", err, got, held)
	}
	if !invalidated(inv, "cache:repos:7") {
		t.Fatal("cache:repos:7 not invalidated")
	}
	if n := e.rdb.Exists(context.Background(), e.lockKey("repos:7")).Val(); n != 0 {
		t.Fatal("repos:7 still locked after the move")
	}
}
