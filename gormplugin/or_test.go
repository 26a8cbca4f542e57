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
