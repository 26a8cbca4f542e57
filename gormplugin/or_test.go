package gormplugin_test

import (
	"context"
	"database/sql"
	"errors"
	"sync/atomic"
	"testing"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"

	"github.com/cacheguard/cacheguard/gormplugin"
)

// An OR in SQL text that GORM writes without parentheses escapes the
// conditions ANDed with it (the model's key, the plugin's restriction): each
// such statement is refused with ErrUnnamedRows, wherever the text sits —
// a Where, a Not, named arguments, a clause.Expr bound into another — while
// another owner holds the rows the OR would reach. Found by an outside probe;
// TestGenWrites draws these shapes too.
func TestBareOrRefused(t *testing.T) {
	for _, tc := range []struct {
		name  string
		write func(db *gorm.DB) error
	}{
		{"Where named OR newline", func(db *gorm.DB) error {
			return db.Model(&Repo{ID: 1}).Where("name = @n OR\nname = @m", sql.Named("n", "b"), sql.Named("m", "zz")).Update("stars", 7).Error
		}},
		{"Not OR tab", func(db *gorm.DB) error {
			return db.Model(&Repo{ID: 1}).Not("name = ? OR\tname = ?", "a", "b").Update("stars", 7).Error
		}},
		{"Not named OR", func(db *gorm.DB) error {
			return db.Model(&Repo{ID: 1}).Not("name = @x OR name = @y", sql.Named("x", "a"), sql.Named("y", "b")).Update("stars", 7).Error
		}},
		{"Not named OR Delete", func(db *gorm.DB) error {
			return db.Not("name = @x OR name = @y", sql.Named("x", "a"), sql.Named("y", "b")).Delete(&Repo{ID: 1}).Error
		}},
		{"bound Expr OR", func(db *gorm.DB) error {
			return db.Model(&Repo{ID: 1}).Where("? AND 1 = 1", gorm.Expr("name = ? OR name = ?", "a", "b")).Update("stars", 7).Error
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, db, plain := seededRepos(t)
			holdOther(t, e, "repos:3", "repos:10")
			err := tc.write(db)
			if !errors.Is(err, gormplugin.ErrUnnamedRows) {
				t.Errorf("err %v, want ErrUnnamedRows", err)
			}
			var rows []Repo
			if err := plain.Order("id").Find(&rows).Error; err != nil {
				t.Fatal(err)
			}
			if len(rows) != 4 {
				t.Fatalf("%d rows left of 4: %+v", len(rows), rows)
			}
			for _, r := range rows {
				if r.Stars != 0 {
					t.Errorf("repos:%d written (stars %d)", r.ID, r.Stars)
				}
			}
		})
	}
}

// A restricted write whose WHERE holds an Or escaped its restriction: GORM
// moves a leading Or behind the conditions added after it ("id IN (locked)
// OR name = ?", Table("repos").Or, CI 12-05 20:12), and writes an Or's text
// bare inside the And group the plugin put it in ("name = ? OR name = ? AND
// id IN (locked)", Model(&Repo{}).Or, scale-5 TestGenWrites). A row another
// session inserted between the plugin's read of the rows and the write
// (TestGenWrites' interloper) was written without its lock, or the write
// failed on the fence column's NOT NULL. The user's WHERE now goes in
// parentheses whole before the restriction; an OR in text GORM leaves bare
// is refused.
func TestOrRestricted(t *testing.T) {
	ctx := context.Background()
	updated := map[uint]int{1: 42, 2: 42, 3: 0, 55: 0} // 55 came after the rows were read and locked
	for _, tc := range []struct {
		name  string
		write func(db *gorm.DB) error
		want  map[uint]int // stars by id; a deleted row is absent
	}{
		{"Table Or", func(db *gorm.DB) error {
			return db.Transaction(func(tx *gorm.DB) error {
				return tx.Table("repos").Or("name = ?", "a").Update("stars", 42).Error
			})
		}, updated},
		{"Model Or with OR text", func(db *gorm.DB) error {
			return db.Model(&Repo{}).Or("name = ? OR name = ?", "a", "a").UpdateColumns(map[string]any{"stars": 42}).Error
		}, updated},
		{"Model Or with OR text in Transaction", func(db *gorm.DB) error {
			return gormplugin.Transaction(ctx, db, func(tx *gorm.DB) error {
				return tx.Model(&Repo{}).Or("name = ? OR name = ?", "a", "a").UpdateColumns(map[string]any{"stars": 42}).Error
			})
		}, updated},
		{"Delete Or with OR text", func(db *gorm.DB) error {
			return db.Or("name = ? OR name = ?", "a", "a").Delete(&Repo{}).Error
		}, map[uint]int{3: 0, 55: 0}},
		{"Or added by a before-hook", func(db *gorm.DB) error { // after the plugin read the rows
			return db.Model(&OrHookedRepo{}).Where("name = ?", "a").Update("stars", 42).Error
		}, updated},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, onPostgres, byClient)
			plain := e.plain(t)
			if err := plain.AutoMigrate(&Repo{}); err != nil {
				t.Fatal(err)
			}
			if err := plain.Create(&[]Repo{{ID: 1, Name: "a"}, {ID: 2, Name: "a"}, {ID: 3, Name: "b"}}).Error; err != nil {
				t.Fatal(err)
			}
			db := e.guarded(t)
			var armed atomic.Bool
			interlope(t, db, func(tx *gorm.DB) {
				if armed.CompareAndSwap(true, false) {
					if err := plain.Exec("INSERT INTO repos (id, name, stars) VALUES (55, 'a', 0)").Error; err != nil {
						tx.AddError(err)
					}
				}
			})
			armed.Store(true)
			err := tc.write(db)
			if left := e.lockKeys(t); len(left) > 0 {
				t.Errorf("row locks left after the write returned: %v", left)
			}
			if err != nil {
				t.Fatal(err)
			}
			var rows []Repo
			if err := plain.Order("id").Find(&rows).Error; err != nil {
				t.Fatal(err)
			}
			for _, r := range rows {
				if stars, ok := tc.want[r.ID]; !ok || r.Stars != stars {
					t.Errorf("repos:%d has stars %d, want %d (present: %v)", r.ID, r.Stars, stars, ok)
				}
			}
			if len(rows) != len(tc.want) {
				t.Errorf("%d rows, want %d: %+v", len(rows), len(tc.want), rows)
			}
			err = db.Table("repos").Where("name = ? OR\tname = ?", "a", "b").Update("stars", 7).Error
			if !errors.Is(err, gormplugin.ErrUnnamedRows) {
				t.Errorf("a bare OR in a write without a model: err %v, want ErrUnnamedRows", err)
			}
		})
	}
}

// OrHookedRepo is a row of repos whose BeforeUpdate hook adds an Or
// condition to the statement, after the plugin read the rows its WHERE
// matched and locked them.
type OrHookedRepo struct {
	ID    uint
	Name  string
	Stars int
	Fence gormplugin.Fence `gorm:"not null;default:0"`
}

func (OrHookedRepo) TableName() string { return "repos" }

func (*OrHookedRepo) BeforeUpdate(tx *gorm.DB) error {
	tx.Statement.AddClause(clause.Where{Exprs: []clause.Expression{clause.Or(clause.Expr{SQL: "name = ?", Vars: []any{"zz"}})}})
	return nil
}
