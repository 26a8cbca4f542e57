package gormplugin_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"

	"github.com/cacheguard/cacheguard/gormplugin"
	"github.com/cacheguard/cacheguard/locks"
)

// holdAs holds lock name under another owner (a request under ginmw.Lock in
// another process) until the test ends.
func (e *env) holdAs(t *testing.T, name string) {
	t.Helper()
	ctx := locks.WithOwner(context.Background(), locks.NewOwnerID())
	lk, err := e.l.TryLock(ctx, name)
	if err != nil {
		t.Fatalf("holding %s: %v", name, err)
	}
	t.Cleanup(func() { _ = lk.Unlock(context.Background()) })
}

// denyCase is one write form of issue 44: with another owner holding the
// rows it changes, it must be refused (or wait and fail on the lock) and
// change nothing, never change a held row.
type denyCase struct {
	name  string
	setup func(db *gorm.DB) error // plain GORM
	held  []string                // lock names another owner holds
	write func(ctx context.Context, db *gorm.DB) error
	want  error                                   // the error the write must match
	check func(t *testing.T, plain *gorm.DB) bool // the held rows are as set up
}

// unchanged reports whether the row of model with conds still has want in col.
func unchanged(plain *gorm.DB, model any, col string, want any, conds ...any) func(t *testing.T, _ *gorm.DB) bool {
	return func(t *testing.T, _ *gorm.DB) bool {
		var got any
		err := plain.Model(model).Select(col).Where(conds[0], conds[1:]...).Row().Scan(&got)
		if err != nil {
			t.Logf("reading %s: %v", col, err)
			return false
		}
		if b, ok := got.([]byte); ok {
			got = string(b)
		}
		ok := got == want || got == int64FromAny(want)
		if !ok {
			t.Logf("%s = %v, want %v", col, got, want)
		}
		return ok
	}
}

func int64FromAny(v any) any {
	if n, ok := v.(int); ok {
		return int64(n)
	}
	return v
}

// TestUnnamedRowsRefused: each write form of issue 44 items 2–8 changed a
// row another owner held (or silently wrote less than GORM); now each is
// named the way the database matches it and waits for the held lock, or is
// refused before the database with ErrUnnamedRows.
func TestUnnamedRowsRefused(t *testing.T) {
	forDBs(t, testUnnamedRowsRefused)
}

func testUnnamedRowsRefused(t *testing.T, e *env) {
	plain := e.plain(t)
	if err := plain.AutoMigrate(&Badge{}); err != nil {
		t.Fatal(err)
	}
	db := e.guarded(t, gormplugin.LockOptions(locks.WaitBudget(300*time.Millisecond)))
	notFound := func(model any, conds ...any) func(t *testing.T, _ *gorm.DB) bool {
		return func(t *testing.T, _ *gorm.DB) bool {
			var n int64
			if err := plain.Model(model).Where(conds[0], conds[1:]...).Count(&n).Error; err != nil {
				t.Log(err)
				return false
			}
			if n != 1 {
				t.Logf("row %v: %d found, want 1", conds, n)
			}
			return n == 1
		}
	}
	cases := []denyCase{
		{
			name:  "2/composite key with a zero part: Update",
			setup: func(db *gorm.DB) error { return db.Create(&[]Pair{{A: 0, B: "x", V: 1}, {A: 1, B: "x", V: 1}}).Error },
			held:  []string{"pairs:1:x"},
			write: func(ctx context.Context, db *gorm.DB) error {
				return db.WithContext(ctx).Model(&Pair{A: 0, B: "x"}).Update("v", 7).Error
			},
			want:  gormplugin.ErrUnnamedRows,
			check: unchanged(plain, &Pair{}, "v", 1, "a = ? AND b = ?", 1, "x"),
		},
		{
			name:  "2/composite key with a zero part: Delete",
			setup: func(db *gorm.DB) error { return db.Create(&Pair{A: 0, B: "y", V: 1}).Error },
			held:  []string{"pairs:0:y"},
			write: func(ctx context.Context, db *gorm.DB) error {
				return db.WithContext(ctx).Delete(&Pair{A: 0, B: "y"}).Error
			},
			want:  gormplugin.ErrLock,
			check: notFound(&Pair{}, "a = ? AND b = ?", 0, "y"),
		},
		{
			name:  "3/Model(&Repo{}).Delete(&Repo{ID: 5})",
			setup: func(db *gorm.DB) error { return db.Create(&Repo{ID: 5, Name: "five"}).Error },
			held:  []string{"repos:5"},
			write: func(ctx context.Context, db *gorm.DB) error {
				return db.WithContext(ctx).Model(&Repo{}).Delete(&Repo{ID: 5}).Error
			},
			want:  gormplugin.ErrLock,
			check: notFound(&Repo{}, "id = ?", 5),
		},
		{
			name:  "4/upsert without a conflict target",
			setup: func(db *gorm.DB) error { return db.Create(&Badge{ID: 7, Code: "x", Label: "old"}).Error },
			held:  []string{"badges:7"},
			write: func(ctx context.Context, db *gorm.DB) error {
				return db.WithContext(ctx).Clauses(clause.OnConflict{DoUpdates: clause.AssignmentColumns([]string{"label"})}).
					Create(&Badge{Code: "x", Label: "new"}).Error
			},
			want:  gormplugin.ErrUnnamedRows,
			check: unchanged(plain, &Badge{}, "label", "old", "id = ?", 7),
		},
		{
			name:  "5/key spelled differently",
			setup: func(db *gorm.DB) error { return db.Create(&Repo{ID: 1, Name: "one"}).Error },
			held:  []string{"repos:1"},
			write: func(ctx context.Context, db *gorm.DB) error {
				return db.WithContext(ctx).Model(&Repo{}).Where("id = ?", "01").Update("name", "x").Error
			},
			want:  gormplugin.ErrLock,
			check: unchanged(plain, &Repo{}, "name", "one", "id = ?", 1),
		},
		{
			name:  "6/slice model with a zero element",
			setup: func(db *gorm.DB) error { return db.Create(&[]Repo{{ID: 70, Name: "s"}, {ID: 71, Name: "s"}}).Error },
			held:  []string{"repos:71"},
			write: func(ctx context.Context, db *gorm.DB) error {
				return db.WithContext(ctx).Model(&[]Repo{{ID: 70}, {}}).Where("name = ?", "s").Update("stars", 9).Error
			},
			want:  gormplugin.ErrUnnamedRows,
			check: unchanged(plain, &Repo{}, "stars", 0, "id = ?", 71),
		},
		{
			name:  "7/table alias",
			setup: func(db *gorm.DB) error { return db.Create(&Repo{ID: 3, Name: "three"}).Error },
			held:  []string{"repos:3"},
			write: func(ctx context.Context, db *gorm.DB) error {
				return db.WithContext(ctx).Model(&Repo{}).Table("repos AS r").Where("id = ?", 3).Update("name", "x").Error
			},
			want:  gormplugin.ErrLock,
			check: unchanged(plain, &Repo{}, "name", "three", "id = ?", 3),
		},
		{
			name:  "8/Or: refused, not written short",
			setup: func(db *gorm.DB) error { return db.Create(&[]Repo{{ID: 11, Name: "a"}, {ID: 12, Name: "a"}}).Error },
			write: func(ctx context.Context, db *gorm.DB) error {
				return db.WithContext(ctx).Model(&Repo{ID: 11}).Or("id = ?", 12).Update("name", "b").Error
			},
			want:  gormplugin.ErrUnnamedRows,
			check: unchanged(plain, &Repo{}, "name", "a", "id = ?", 12),
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if err := c.setup(plain); err != nil {
				t.Fatal(err)
			}
			for _, n := range c.held {
				e.holdAs(t, n)
			}
			err := c.write(context.Background(), db)
			if !errors.Is(err, c.want) {
				t.Errorf("write: %v, want %v", err, c.want)
			}
			if !c.check(t, plain) {
				t.Errorf("a held row was changed")
			}
		})
	}
}

// A struct read before another writer's commit is refused inside
// Transaction as outside it (issue 44 item 1): the transaction's claim
// stamps the row with the transaction's token, which must not vouch for
// the struct's version.
func TestTransactionStaleStructRefused(t *testing.T) {
	forDBs(t, testTransactionStaleStructRefused)
}

func testTransactionStaleStructRefused(t *testing.T, e *env) {
	ctx := context.Background()
	db := e.guarded(t)
	if err := db.Create(&Repo{ID: 1, Name: "a"}).Error; err != nil {
		t.Fatal(err)
	}
	var s Repo
	if err := db.First(&s, 1).Error; err != nil {
		t.Fatal(err)
	}
	if err := db.Model(&Repo{ID: 1}).Update("stars", 5).Error; err != nil { // another writer commits
		t.Fatal(err)
	}
	outside := s
	outside.Name = "x"
	if err := db.Save(&outside).Error; !errors.Is(err, gormplugin.ErrStaleWrite) {
		t.Fatalf("Save outside Transaction: %v, want ErrStaleWrite", err)
	}
	err := gormplugin.Transaction(ctx, db, func(tx *gorm.DB) error {
		s.Name = "x"
		return tx.Save(&s).Error
	}, &Repo{ID: 1})
	if !errors.Is(err, gormplugin.ErrStaleWrite) {
		t.Errorf("Save inside Transaction: %v, want ErrStaleWrite", err)
	}
	var got Repo
	if err := e.plain(t).First(&got, 1).Error; err != nil {
		t.Fatal(err)
	}
	if got.Stars != 5 || got.Name != "a" {
		t.Errorf("row %+v: the other writer's update was lost", got)
	}
	// A struct read inside the transaction, and one read before it with the
	// row's current version, are written.
	err = gormplugin.Transaction(ctx, db, func(tx *gorm.DB) error {
		var fresh Repo
		if err := tx.First(&fresh, 1).Error; err != nil {
			return err
		}
		fresh.Name = "fresh"
		return tx.Save(&fresh).Error
	}, &Repo{ID: 1})
	if err != nil {
		t.Fatalf("Save of a struct read inside Transaction: %v", err)
	}
	var cur Repo
	if err := db.First(&cur, 1).Error; err != nil {
		t.Fatal(err)
	}
	err = gormplugin.Transaction(ctx, db, func(tx *gorm.DB) error {
		cur.Name = "current"
		return tx.Save(&cur).Error
	}, &Repo{ID: 1})
	if err != nil {
		t.Fatalf("Save of a current struct inside Transaction: %v", err)
	}
	// A row first stamped by a write of the transaction: the stamp does not
	// vouch for a struct read before another writer's commit either.
	var stale Repo
	if err := db.First(&stale, 1).Error; err != nil {
		t.Fatal(err)
	}
	if err := db.Model(&Repo{ID: 1}).Update("stars", 6).Error; err != nil { // another writer commits
		t.Fatal(err)
	}
	err = db.Transaction(func(tx *gorm.DB) error {
		if err := tx.Model(&Repo{ID: 1}).Update("name", "first").Error; err != nil {
			return err
		}
		stale.Name = "stale"
		return tx.Save(&stale).Error
	})
	if !errors.Is(err, gormplugin.ErrStaleWrite) {
		t.Errorf("Save of a stale struct after a write in db.Transaction: %v, want ErrStaleWrite", err)
	}
}

// Every row a committed write inserted or re-keyed has its keys invalidated
// (issue 44 items 9 and 10): an Exec INSERT of a row declared to
// Transaction, and an Updates that moves a row to a new key (old and new).
func TestInsertedAndRekeyedRowsInvalidated(t *testing.T) {
	forDBs(t, testInsertedAndRekeyedRowsInvalidated)
}

func testInsertedAndRekeyedRowsInvalidated(t *testing.T, e *env) {
	ctx := context.Background()
	inv := newInvalidator(e.rdb)
	db := e.guarded(t, gormplugin.Invalidate(inv, cacheKeys))
	t.Run("9/Transaction Exec INSERT of a declared row", func(t *testing.T) {
		drain(inv)
		err := gormplugin.Transaction(ctx, db, func(tx *gorm.DB) error {
			return tx.Exec("INSERT INTO repos (id, name, stars, fence) VALUES (?, ?, 0, 0)", 40, "new").Error
		}, &Repo{ID: 40})
		if err != nil {
			t.Fatal(err)
		}
		if !invalidated(inv, "cache:repos:40") {
			t.Errorf("the inserted row's key was not invalidated after COMMIT")
		}
	})
	t.Run("10/Updates re-keys a row", func(t *testing.T) {
		if err := db.Create(&Repo{ID: 50, Name: "old"}).Error; err != nil {
			t.Fatal(err)
		}
		drain(inv)
		if err := db.Model(&Repo{ID: 50}).Updates(map[string]any{"id": 51}).Error; err != nil {
			t.Fatal(err)
		}
		var got []string
		for {
			select {
			case keys := <-inv.calls:
				got = append(got, keys...)
				continue
			default:
			}
			break
		}
		for _, k := range []string{"cache:repos:50", "cache:repos:51"} {
			found := false
			for _, g := range got {
				found = found || g == k
			}
			if !found {
				t.Errorf("key %s not invalidated (got %v)", k, got)
			}
		}
	})
}

// TestGenWritesFindings replays what TestGenWrites found on f89a0c4 (issue
// 44 items 2 and 8 in other forms): Updates of a struct through a model
// whose composite key has a zero part changed a held row; an Or on a model
// without a key, with Not, deleted 0 rows where GORM deletes 3.
func TestGenWritesFindings(t *testing.T) {
	forDBs(t, testGenWritesFindings)
}

func testGenWritesFindings(t *testing.T, e *env) {
	plain := e.plain(t)
	if err := plain.AutoMigrate(&Badge{}); err != nil {
		t.Fatal(err)
	}
	db := e.guarded(t, gormplugin.LockOptions(locks.WaitBudget(300*time.Millisecond)))
	if err := plain.Create(&[]Pair{{A: 0, B: "x", V: 1}, {A: 1, B: "x", V: 1}}).Error; err != nil {
		t.Fatal(err)
	}
	e.holdAs(t, "pairs:0:x")
	err := db.Model(&Pair{A: 0, B: "x"}).Updates(&Pair{A: 0, B: "", V: 5}).Error
	if !errors.Is(err, gormplugin.ErrUnnamedRows) {
		t.Errorf("Updates through Model(&Pair{A: 0, B: \"x\"}): %v, want ErrUnnamedRows", err)
	}
	if !unchanged(plain, &Pair{}, "v", 1, "a = ? AND b = ?", 0, "x")(t, plain) {
		t.Errorf("the held row was changed")
	}

	if err := plain.Create(&[]Badge{{ID: 1, Code: "a"}, {ID: 2, Code: "b"}, {ID: 3, Code: "c"}}).Error; err != nil {
		t.Fatal(err)
	}
	res := db.Model(&Badge{}).Or("id = ?", 1).Not("code = ?", "a").Delete(&Badge{})
	if res.Error != nil || res.RowsAffected != 3 {
		t.Errorf("Or and Not on a model without a key: %d rows deleted, %v; plain GORM deletes 3", res.RowsAffected, res.Error)
	}
}
