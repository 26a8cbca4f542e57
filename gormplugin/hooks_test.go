package gormplugin_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"

	"github.com/cacheguard/cacheguard/gormplugin"
	"github.com/cacheguard/cacheguard/locks"
)

// KeyedByHook gets its key from a hook: derived from its title when it has
// none (BeforeCreate), and normalized to lower case (BeforeSave,
// BeforeDelete), as users
// write natural and hashed keys.
type KeyedByHook struct {
	Name  string `gorm:"primaryKey"`
	Title string
	V     int
	Fence gormplugin.Fence `gorm:"not null;default:0"`
}

func (k *KeyedByHook) BeforeCreate(*gorm.DB) error {
	if k.Name == "" {
		k.Name = "k-" + k.Title
	}
	return nil
}

func (k *KeyedByHook) BeforeSave(*gorm.DB) error {
	k.Name = strings.ToLower(k.Name)
	return nil
}

func (k *KeyedByHook) BeforeDelete(tx *gorm.DB) error { return k.BeforeSave(tx) }

// HookedBadge's code is normalized by a hook, and is an upsert's conflict target.
type HookedBadge struct {
	ID    uint
	Code  string `gorm:"uniqueIndex"`
	Label string
	Fence gormplugin.Fence `gorm:"not null;default:0"`
}

func (b *HookedBadge) BeforeSave(*gorm.DB) error {
	b.Code = strings.ToLower(b.Code)
	return nil
}

// A write whose key (or an upsert's conflict value) a before-hook sets or
// changes is guarded by the key the hook left, which is the row GORM
// writes: refused while another owner holds that row's lock, written when
// it is free. The plugin named the rows before the hooks ran: an upsert of
// KeyedByHook{Title: "x"} locked "keyed_by_hooks:" (the empty key),
// restricted its DO UPDATE to name = ” and returned nil having written
// nothing, where plain GORM updates keyed_by_hooks:k-x (found by an outside
// probe); an Update of Model(&KeyedByHook{Name: "K-X"}) did the same.
func TestKeySetByHookGuarded(t *testing.T) {
	forDBs(t, testKeySetByHookGuarded)
}

func testKeySetByHookGuarded(t *testing.T, e *env) {
	plain := e.plain(t)
	if err := plain.AutoMigrate(&KeyedByHook{}, &HookedBadge{}); err != nil {
		t.Fatal(err)
	}
	db := e.guarded(t, gormplugin.LockOptions(locks.WaitBudget(50*time.Millisecond)))
	const name = "keyed_by_hooks:k-x"
	for _, w := range []struct {
		verb  string
		write func(db *gorm.DB, v int) *gorm.DB
		row   string
	}{
		{"upsert, key set in BeforeCreate", func(db *gorm.DB, v int) *gorm.DB {
			return db.Clauses(clause.OnConflict{Columns: []clause.Column{{Name: "name"}}, DoUpdates: clause.AssignmentColumns([]string{"v"})}).
				Create(&KeyedByHook{Title: "x", V: v})
		}, name},
		{"upsert UpdateAll, key changed in BeforeSave", func(db *gorm.DB, v int) *gorm.DB {
			return db.Clauses(clause.OnConflict{UpdateAll: true}).Create(&KeyedByHook{Name: "K-X", Title: "x", V: v})
		}, name},
		{"Update, key changed in BeforeSave", func(db *gorm.DB, v int) *gorm.DB {
			return db.Model(&KeyedByHook{Name: "K-X"}).Update("v", v)
		}, name},
		{"Delete, key changed in BeforeSave", func(db *gorm.DB, v int) *gorm.DB {
			return db.Where("v = ?", v-1).Delete(&KeyedByHook{Name: "K-X"})
		}, name},
		{"upsert on another key, its value changed in BeforeSave", func(db *gorm.DB, v int) *gorm.DB {
			return db.Clauses(clause.OnConflict{Columns: []clause.Column{{Name: "code"}}, DoUpdates: clause.AssignmentColumns([]string{"label"})}).
				Create(&HookedBadge{Code: "C-X", Label: "v"})
		}, "hooked_badges:1"},
	} {
		t.Run(w.verb, func(t *testing.T) {
			for _, s := range []string{"DELETE FROM keyed_by_hooks", "DELETE FROM hooked_badges"} {
				if err := plain.Exec(s).Error; err != nil {
					t.Fatal(err)
				}
			}
			if err := plain.Create(&KeyedByHook{Name: "k-x", Title: "x", V: 1}).Error; err != nil {
				t.Fatal(err)
			}
			if err := plain.Create(&HookedBadge{ID: 1, Code: "c-x", Label: "l"}).Error; err != nil {
				t.Fatal(err)
			}
			written := func() bool {
				var k KeyedByHook
				err := plain.First(&k, "name = ?", "k-x").Error
				var b HookedBadge
				if err := plain.First(&b, 1).Error; err != nil {
					t.Fatal(err)
				}
				return errors.Is(err, gorm.ErrRecordNotFound) || k.V == 2 || b.Label == "v"
			}
			func() {
				other := holdOtherUntil(t, e, w.row)
				defer other()
				res := w.write(db, 2)
				if !errors.Is(res.Error, gormplugin.ErrLock) {
					t.Errorf("while another owner holds %s: err %v (%d rows), want ErrLock", w.row, res.Error, res.RowsAffected)
				}
				if written() {
					t.Fatalf("%s written while another owner held its lock", w.row)
				}
			}()
			seen := lockedDuring(t, e, db, w.row)
			if err := db.Callback().Create().Before("gorm:create").Register("test:observe", func(*gorm.DB) {
				*seen = append(*seen, []string{map[bool]string{true: w.row}[e.held(t, w.row)]})
			}); err != nil {
				t.Fatal(err)
			}
			defer func() {
				_ = db.Callback().Update().Remove("test:observe")
				_ = db.Callback().Delete().Remove("test:observe")
				_ = db.Callback().Create().Remove("test:observe")
			}()
			res := w.write(db, 2)
			if res.Error != nil || res.RowsAffected != 1 || !written() {
				t.Fatalf("with %s free: err %v, %d rows, written %v; want the row written, as plain GORM does", w.row, res.Error, res.RowsAffected, written())
			}
			if len(*seen) != 1 || (*seen)[0][0] != w.row {
				t.Errorf("locks held as the statement was sent: %q, want %s", *seen, w.row)
			}
		})
	}
}

// holdOtherUntil takes the lock of name as another owner, until the
// returned function is called.
func holdOtherUntil(t *testing.T, e *env, name string) func() {
	t.Helper()
	other := locks.WithOwner(t.Context(), locks.NewOwnerID())
	lk, err := e.c.TryLock(other, name)
	if err != nil {
		t.Fatal(err)
	}
	return func() { _ = lk.Unlock(t.Context()) }
}
