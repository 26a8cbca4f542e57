package gormplugin_test

import (
	"database/sql"
	"errors"
	"testing"

	"gorm.io/gorm"

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

// A write without a model (Table("repos")) whose WHERE is one Or condition
// was restricted with "id IN (locked) OR name = ?": GORM moves a leading Or
// behind the conditions added after it, so the plugin's restriction became
// an alternative, and a row inserted by another session between the
// plugin's read of the rows and the write was written without its lock
// (TestGenWrites' interloper, CI 12-05 20:12). The Or now goes in one group
// first, as for a model's write; an OR in text GORM leaves bare is refused.
func TestTableOrRestricted(t *testing.T) {
	e := newEnv(t, onPostgres, byClient)
	plain := e.plain(t)
	if err := plain.AutoMigrate(&Repo{}); err != nil {
		t.Fatal(err)
	}
	if err := plain.Create(&[]Repo{{ID: 1, Name: "a"}, {ID: 2, Name: "a"}, {ID: 3, Name: "b"}}).Error; err != nil {
		t.Fatal(err)
	}
	db := e.guarded(t)
	interloper := false
	err := db.Callback().Update().After("gormplugin:fence").Before("gorm:update").Register("test:interloper", func(tx *gorm.DB) {
		if interloper {
			interloper = false
			if err := plain.Exec("INSERT INTO repos (id, name, stars) VALUES (55, 'a', 0)").Error; err != nil {
				tx.AddError(err)
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	interloper = true
	if err := db.Transaction(func(tx *gorm.DB) error {
		return tx.Table("repos").Or("name = ?", "a").Update("stars", 42).Error
	}); err != nil {
		t.Fatal(err)
	}
	var rows []Repo
	if err := plain.Order("id").Find(&rows).Error; err != nil {
		t.Fatal(err)
	}
	want := map[uint]int{1: 42, 2: 42, 3: 0, 55: 0} // 55 came after the rows were read and locked
	for _, r := range rows {
		if r.Stars != want[r.ID] {
			t.Errorf("repos:%d has stars %d, want %d", r.ID, r.Stars, want[r.ID])
		}
	}
	if len(rows) != len(want) {
		t.Errorf("%d rows, want %d: %+v", len(rows), len(want), rows)
	}
	err = db.Table("repos").Where("name = ? OR\tname = ?", "a", "b").Update("stars", 7).Error
	if !errors.Is(err, gormplugin.ErrUnnamedRows) {
		t.Errorf("a bare OR in a write without a model: err %v, want ErrUnnamedRows", err)
	}
}
