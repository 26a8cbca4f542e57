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

// seededRepos is a SQLite database with the plugin (short wait budget) and
// plain access, seeded with repos 1 "a", 2 "a", 3 "b", 10 "b".
func seededRepos(t *testing.T, opts ...gormplugin.Option) (*env, *gorm.DB, *gorm.DB) {
	t.Helper()
	e := newEnv(t, onSQLite, byClient)
	opts = append([]gormplugin.Option{gormplugin.LockOptions(locks.WaitBudget(50 * time.Millisecond))}, opts...)
	db := e.guarded(t, opts...)
	plain := e.plain(t)
	if err := plain.Create(&[]Repo{{ID: 1, Name: "a"}, {ID: 2, Name: "a"}, {ID: 3, Name: "b"}, {ID: 10, Name: "b"}}).Error; err != nil {
		t.Fatal(err)
	}
	return e, db, plain
}

// holdOther takes the locks of names as another owner until the test ends.
func holdOther(t *testing.T, e *env, names ...string) {
	t.Helper()
	other := locks.WithOwner(context.Background(), locks.NewOwnerID())
	for _, n := range names {
		lk, err := e.c.TryLock(other, n)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = lk.Unlock(context.Background()) })
	}
}

func stars(t *testing.T, plain *gorm.DB, id uint) int {
	t.Helper()
	var r Repo
	if err := plain.First(&r, id).Error; err != nil {
		t.Fatal(err)
	}
	return r.Stars
}

// A table named with quotes or spaces (GORM then leaves Statement.Table
// empty and keeps the text as its table expression) is the table it names:
// its rows are read, locked and invalidated like Table("repos")'s. It ran
// unguarded before (found by an outside probe).
func TestQuotedTableGuarded(t *testing.T) {
	for _, table := range []string{"`repos`", " repos"} {
		t.Run(table, func(t *testing.T) {
			e := newEnv(t, onSQLite, byClient)
			inv := newInvalidator(e.rdb)
			db := e.guarded(t, gormplugin.Invalidate(inv, cacheKeys), gormplugin.LockOptions(locks.WaitBudget(50*time.Millisecond)))
			plain := e.plain(t)
			if err := plain.Create(&[]Repo{{ID: 1, Name: "a"}, {ID: 3, Name: "b"}}).Error; err != nil {
				t.Fatal(err)
			}
			holdOther(t, e, "repos:3")
			e.rdb.Set(context.Background(), "cache:repos:3", "cached", 0)
			err := db.Table(table).Where("name = ?", "b").Update("stars", 7).Error
			t.Logf("err: %v", err)
			if s := stars(t, plain, 3); s == 7 {
				t.Errorf("repos:3 written through Table(%q) while another owner held its lock", table)
				if exists(t, e.rdb, "cache:repos:3") {
					t.Errorf("and its cache key was not invalidated after COMMIT")
				}
			}
		})
	}
}

// A schema-qualified table's rows are read from that table, not from the
// one of the same name in the default schema: the write was silently
// narrowed to nothing before (found by an outside probe).
func TestSchemaQualifiedTableWritten(t *testing.T) {
	e, _, _ := seededRepos(t)
	db := e.guarded(t, gormplugin.LockOptions(locks.WaitBudget(50*time.Millisecond)))
	sqlDB, _ := db.DB()
	sqlDB.SetMaxOpenConns(1) // ATTACH is per connection
	other := e.dsn + ".other"
	if err := db.Exec("ATTACH DATABASE ? AS other", other).Error; err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{
		"CREATE TABLE other.repos (id INTEGER PRIMARY KEY, name TEXT, stars INTEGER NOT NULL DEFAULT 0, fence INTEGER NOT NULL DEFAULT 0)",
		"INSERT INTO other.repos (id, name) VALUES (5, 'x'), (6, 'y')",
	} {
		if err := db.Exec(s).Error; err != nil {
			t.Fatal(err)
		}
	}
	res := db.Table("other.repos").Where("name = ?", "x").Update("stars", 7)
	t.Logf("err: %v, rows: %d", res.Error, res.RowsAffected)
	var n int64
	db.Raw("SELECT stars FROM other.repos WHERE id = 5").Scan(&n)
	// Plain GORM writes the row.
	pl := e.plain(t)
	plDB, _ := pl.DB()
	plDB.SetMaxOpenConns(1)
	if err := pl.Exec("ATTACH DATABASE ? AS other", other).Error; err != nil {
		t.Fatal(err)
	}
	pres := pl.Table("other.repos").Where("name = ?", "x").Update("stars", 8)
	t.Logf("plain GORM: err %v, rows %d", pres.Error, pres.RowsAffected)
	if res.Error == nil && n != 7 {
		t.Fatalf("Table(\"other.repos\").Where(name = x).Update: nil error, yet other.repos:5 not written (stars %d): silently narrowed", n)
	}
}

// An upsert on the primary key whose inserted key is of another kind than
// the key's ("01" for an integer key, which the database matches as 1) is
// refused: its lock name ("repos:01") would not be the row's ("repos:1").
// It updated repos:1 while another owner held it before (outside probe).
func TestUpsertKeyOfAnotherKindRefused(t *testing.T) {
	e, db, plain := seededRepos(t)
	holdOther(t, e, "repos:1")
	err := db.Model(&Repo{}).Clauses(clause.OnConflict{Columns: []clause.Column{{Name: "id"}}, DoUpdates: clause.AssignmentColumns([]string{"stars"})}).
		Create(map[string]any{"id": "01", "name": "q", "stars": 7}).Error
	if !errors.Is(err, gormplugin.ErrUnnamedRows) {
		t.Errorf("err %v, want ErrUnnamedRows", err)
	}
	if s := stars(t, plain, 1); s == 7 {
		t.Fatalf("repos:1 updated by an upsert of id \"01\" while another owner held repos:1")
	}
}
