package gormplugin_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"

	"github.com/cacheguard/cacheguard/gormplugin"
	"github.com/cacheguard/cacheguard/locks"
)

// CiSlug is a row whose string key the database compares without case
// (SQLite's COLLATE NOCASE, PostgreSQL's citext or a nondeterministic
// collation; the default of MySQL's _ci collations): its table is made by
// hand, the model does not say so.
type CiSlug struct {
	Name  string `gorm:"primaryKey"`
	V     int
	Fence gormplugin.Fence `gorm:"not null;default:0"`
}

// CiPair is a row of a composite key, one part of it compared without case.
type CiPair struct {
	A     int    `gorm:"primaryKey;autoIncrement:false"`
	Name  string `gorm:"primaryKey"`
	V     int
	Fence gormplugin.Fence `gorm:"not null;default:0"`
}

// ciTables makes ci_slugs, with a key column compared without case, in each
// way e's database has: it returns the ways made.
func ciTables(t *testing.T, e *env, plain *gorm.DB) []string {
	t.Helper()
	const rest = ", v INTEGER NOT NULL DEFAULT 0, fence BIGINT NOT NULL DEFAULT 0)"
	if e.db == onSQLite {
		return []string{"CREATE TABLE ci_slugs (name TEXT COLLATE NOCASE PRIMARY KEY" + rest}
	}
	if err := plain.Exec("CREATE EXTENSION IF NOT EXISTS citext").Error; err != nil {
		t.Fatal(err)
	}
	ways := []string{"CREATE TABLE ci_slugs (name citext PRIMARY KEY" + rest}
	if plain.Exec("CREATE COLLATION IF NOT EXISTS ci (provider = icu, locale = 'und-u-ks-level2', deterministic = false)").Error == nil {
		ways = append(ways, `CREATE TABLE ci_slugs (name TEXT COLLATE ci PRIMARY KEY`+rest)
	} else {
		t.Log("no ICU collations on this server: the nondeterministic collation is not tried")
	}
	return ways
}

// A write whose key the database matches without case locks the row by its
// key as stored: Model(&CiSlug{Name: "ABC"}) writes the row stored as "abc",
// so it takes "ci_slugs:abc", the lock a read of the matched rows names it
// by, on every write path, Transaction's declared rows included. It took
// "ci_slugs:ABC" and wrote the row while another owner held "ci_slugs:abc"
// (found by an outside probe).
func TestCaseInsensitiveKeyLocksStoredSpelling(t *testing.T) {
	forDBs(t, func(t *testing.T, e *env) {
		for _, ddl := range ciTables(t, e, e.plain(t)) {
			// A connection per table: PostgreSQL's cached plans do not
			// survive its being made again.
			t.Run(strings.Fields(ddl)[4], func(t *testing.T) { testCaseInsensitiveKey(t, e, e.plain(t), ddl) })
		}
	})
}

func testCaseInsensitiveKey(t *testing.T, e *env, plain *gorm.DB, ddl string) {
	for _, s := range []string{"DROP TABLE IF EXISTS ci_slugs", ddl} {
		if err := plain.Exec(s).Error; err != nil {
			t.Fatal(err)
		}
	}
	inv := newInvalidator(e.rdb)
	db := e.guarded(t, gormplugin.Invalidate(inv, cacheKeys), gormplugin.LockOptions(locks.WaitBudget(50*time.Millisecond)))
	const row = "ci_slugs:abc"
	seen := lockedDuring(t, e, db, row)
	for _, w := range []struct {
		verb  string
		write func(db *gorm.DB) error
		gone  bool
	}{
		{"Update", func(db *gorm.DB) error { return db.Model(&CiSlug{Name: "ABC"}).Update("v", 7).Error }, false},
		{"Updates of a slice", func(db *gorm.DB) error {
			return db.Model(&[]CiSlug{{Name: "ABC"}, {Name: "Zz"}}).Update("v", 7).Error
		}, false},
		{"Save", func(db *gorm.DB) error {
			var s CiSlug
			if err := db.First(&s, "name = ?", "abc").Error; err != nil {
				return err
			}
			s.Name, s.V = "ABC", 7
			return db.Save(&s).Error
		}, false},
		{"upsert", func(db *gorm.DB) error {
			return db.Clauses(clause.OnConflict{Columns: []clause.Column{{Name: "name"}}, DoUpdates: clause.AssignmentColumns([]string{"v"})}).
				Create(&CiSlug{Name: "ABC", V: 7}).Error
		}, false},
		{"upsert of a map", func(db *gorm.DB) error {
			return db.Model(&CiSlug{}).Clauses(clause.OnConflict{Columns: []clause.Column{{Name: "name"}}, DoUpdates: clause.AssignmentColumns([]string{"v"})}).
				Create(map[string]any{"name": "aBc", "v": 7}).Error
		}, false},
		{"Transaction", func(db *gorm.DB) error {
			return gormplugin.Transaction(context.Background(), db, func(tx *gorm.DB) error {
				return tx.Exec("UPDATE ci_slugs SET v = 7 WHERE name = 'abc'").Error
			}, &CiSlug{Name: "ABC"})
		}, false},
		{"Delete", func(db *gorm.DB) error { return db.Delete(&CiSlug{Name: "ABC"}).Error }, true},
	} {
		t.Run(w.verb, func(t *testing.T) {
			for _, s := range []string{"DELETE FROM ci_slugs", "INSERT INTO ci_slugs (name, v) VALUES ('abc', 1), ('zz', 1)"} {
				if err := plain.Exec(s).Error; err != nil {
					t.Fatal(err)
				}
			}
			written := func() bool {
				var s CiSlug
				err := plain.First(&s, "name = ?", "abc").Error
				if err != nil && !errors.Is(err, gorm.ErrRecordNotFound) {
					t.Fatal(err)
				}
				return err != nil || s.V == 7
			}
			func() {
				release := holdOtherUntil(t, e, row)
				defer release()
				if err := w.write(db); !errors.Is(err, gormplugin.ErrLock) {
					t.Errorf("while another owner holds %s: %v, want ErrLock", row, err)
				}
				if written() {
					t.Fatalf("row abc written while another owner held %s", row)
				}
			}()
			drain(inv)
			*seen = nil
			if err := w.write(db); err != nil {
				t.Fatalf("with %s free: %v", row, err)
			}
			if !written() {
				t.Fatalf("row abc not written")
			}
			for _, held := range *seen {
				if len(held) != 1 {
					t.Errorf("%s not held as a statement was sent", row)
				}
			}
			if !invalidated(inv, "cache:"+row) {
				t.Errorf("cache key of %s not invalidated after COMMIT", row)
			}
			if keys := e.lockKeys(t); len(keys) != 0 {
				t.Fatalf("locks left: %v", keys)
			}
		})
	}

	// name = excluded.name rewrites the stored "abc" to the value's "ABC":
	// the row moves, and that name is locked too (found by TestGenWrites).
	t.Run("respelled by excluded", func(t *testing.T) {
		for _, s := range []string{"DELETE FROM ci_slugs", "INSERT INTO ci_slugs (name, v) VALUES ('abc', 1)"} {
			if err := plain.Exec(s).Error; err != nil {
				t.Fatal(err)
			}
		}
		release := holdOtherUntil(t, e, "ci_slugs:ABC")
		defer release()
		err := db.Clauses(clause.OnConflict{Columns: []clause.Column{{Name: "name"}}, DoUpdates: clause.AssignmentColumns([]string{"v", "name"})}).
			Create(&CiSlug{Name: "ABC", V: 7}).Error
		if !errors.Is(err, gormplugin.ErrLock) && !errors.Is(err, gormplugin.ErrLockOrder) {
			t.Errorf("while another owner holds ci_slugs:ABC: %v, want ErrLock or ErrLockOrder", err)
		}
		var s CiSlug
		if err := plain.First(&s, "name = ?", "abc").Error; err != nil || s.Name != "abc" || s.V != 1 {
			t.Fatalf("row %+v (%v): rewritten while another owner held ci_slugs:ABC", s, err)
		}
	})

	// A key no row has is inserted as spelled, under that name (its DO
	// UPDATE is restricted to the rows found: none).
	t.Run("new key", func(t *testing.T) {
		var held []bool
		if err := db.Callback().Create().Before("gorm:create").Register("test:held", func(*gorm.DB) {
			held = append(held, e.held(t, "ci_slugs:New"))
		}); err != nil {
			t.Fatal(err)
		}
		if err := db.Clauses(clause.OnConflict{Columns: []clause.Column{{Name: "name"}}, DoUpdates: clause.AssignmentColumns([]string{"v"})}).
			Create(&CiSlug{Name: "New", V: 3}).Error; err != nil {
			t.Fatal(err)
		}
		var s CiSlug
		if err := plain.First(&s, "name = ?", "new").Error; err != nil || s.Name != "New" || s.V != 3 || s.Fence == 0 {
			t.Fatalf("row inserted: %+v, %v; want New, v 3, fenced", s, err)
		}
		if len(held) != 1 || !held[0] {
			t.Errorf("ci_slugs:New held as the upsert was sent: %v, want held", held)
		}
	})
}

// A key of an integer kind, and a string key whose column compares byte
// for byte, are named as given without reading the row (their catalogue is
// read once per table): only a key the database may match otherwise costs
// a read. Their restriction is the plain IN (no byte-for-byte form).
func TestBinaryKeyNotRead(t *testing.T) {
	forDBs(t, func(t *testing.T, e *env) {
		plain := e.plain(t)
		if err := plain.AutoMigrate(&Slug{}); err != nil {
			t.Fatal(err)
		}
		if err := plain.Create(&Slug{Name: "a"}).Error; err != nil {
			t.Fatal(err)
		}
		if err := plain.Create(&Repo{ID: 1, Name: "a"}).Error; err != nil {
			t.Fatal(err)
		}
		db := e.guarded(t)
		var reads []string
		if err := db.Callback().Row().Register("test:reads", func(tx *gorm.DB) {
			reads = append(reads, tx.Statement.SQL.String())
		}); err != nil {
			t.Fatal(err)
		}
		if err := db.Model(&Slug{Name: "a"}).Update("v", 1).Error; err != nil { // reads the catalogue
			t.Fatal(err)
		}
		var sent []string
		if err := db.Callback().Update().After("gorm:update").Register("test:sent", func(tx *gorm.DB) {
			sent = append(sent, tx.Statement.SQL.String())
		}); err != nil {
			t.Fatal(err)
		}
		reads = nil
		for range 2 {
			if err := db.Model(&Slug{Name: "a"}).Update("v", 2).Error; err != nil {
				t.Fatal(err)
			}
			if err := db.Model(&Repo{ID: 1}).Update("stars", 2).Error; err != nil {
				t.Fatal(err)
			}
		}
		if len(reads) != 0 {
			t.Errorf("keyed writes of a binary string key and an integer key read %q; want none", reads)
		}
		for _, s := range sent {
			if strings.Contains(s, "COLLATE") {
				t.Errorf("sent %s; want no byte-for-byte form on byte-compared keys", s)
			}
		}
	})
}

// A statement locked as ci_slugs:abc writes only the row stored as "abc",
// not a row stored as "ABC" that the column's own comparison matches: its
// restriction (an upsert's DO UPDATE WHERE) and the claim of a row declared
// to Transaction compare the key byte for byte too. The race it closes: a
// writer reads the spelling "abc", then (before it takes its lock) another
// deletes "abc" and a third inserts "ABC" under ci_slugs:ABC; the first
// then wrote "ABC" under ci_slugs:abc, the fence no help (tokens of two
// names are unrelated). Here the row is replaced once the lock is held, just
// before the statement is sent.
func TestRestrictionMatchesStoredSpelling(t *testing.T) {
	forDBs(t, func(t *testing.T, e *env) {
		for _, ddl := range ciTables(t, e, e.plain(t)) {
			t.Run(strings.Fields(ddl)[4], func(t *testing.T) { testRestrictionMatchesStoredSpelling(t, e, e.plain(t), ddl) })
		}
	})
}

func testRestrictionMatchesStoredSpelling(t *testing.T, e *env, plain *gorm.DB, ddl string) {
	// ci_pairs: (a, name), name as ci_slugs has it.
	pairs := strings.Replace(strings.Replace(ddl, "ci_slugs (name", "ci_pairs (a INTEGER, name", 1), " PRIMARY KEY", "", 1)
	pairs = strings.TrimSuffix(pairs, ")") + ", PRIMARY KEY (a, name))"
	for _, s := range []string{"DROP TABLE IF EXISTS ci_slugs", ddl, "DROP TABLE IF EXISTS ci_pairs", pairs} {
		if err := plain.Exec(s).Error; err != nil {
			t.Fatal(err)
		}
	}
	db := e.guarded(t, gormplugin.Unkeyed(gormplugin.LockMatched))
	const row = "ci_slugs:abc"
	// respell, when set, replaces the row "abc" by "ABC" once, as the
	// statement holds its lock and before it is sent.
	var respell func(*gorm.DB)
	replace := func(t *testing.T, lock string, sqls ...string) func(*gorm.DB) {
		return func(*gorm.DB) {
			respell = nil
			if !e.held(t, lock) {
				t.Fatalf("%s not held as the row is respelled", lock)
			}
			for _, s := range sqls {
				if err := plain.Exec(s).Error; err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	hook := func(tx *gorm.DB) {
		if respell != nil {
			respell(tx)
		}
	}
	if err := db.Callback().Update().After("gormplugin:lock").Before("gorm:begin_transaction").Register("test:respell", hook); err != nil {
		t.Fatal(err)
	}
	if err := db.Callback().Delete().After("gormplugin:lock").Before("gorm:begin_transaction").Register("test:respell", hook); err != nil {
		t.Fatal(err)
	}
	if err := db.Callback().Create().After("gormplugin:lock").Before("gorm:begin_transaction").Register("test:respell", hook); err != nil {
		t.Fatal(err)
	}
	if err := db.Callback().Raw().Before("gorm:raw").Register("test:respell", hook); err != nil { // Transaction's claim
		t.Fatal(err)
	}
	upsert := clause.OnConflict{Columns: []clause.Column{{Name: "name"}}, DoUpdates: clause.AssignmentColumns([]string{"v"})}
	for _, w := range []struct {
		verb  string
		write func(db *gorm.DB) error
	}{
		{"Update", func(db *gorm.DB) error { return db.Model(&CiSlug{Name: "abc"}).Update("v", 7).Error }},
		{"Update respelled", func(db *gorm.DB) error { return db.Model(&CiSlug{Name: "ABC"}).Update("v", 7).Error }},
		{"Updates of a slice", func(db *gorm.DB) error {
			return db.Model(&[]CiSlug{{Name: "abc"}, {Name: "zz"}}).Update("v", 7).Error
		}},
		{"Update matched", func(db *gorm.DB) error { return db.Model(&CiSlug{}).Where("v = ?", 1).Update("v", 7).Error }},
		{"upsert", func(db *gorm.DB) error { return db.Clauses(upsert).Create(&CiSlug{Name: "abc", V: 7}).Error }},
		{"Delete", func(db *gorm.DB) error { return db.Delete(&CiSlug{Name: "abc"}).Error }},
		{"Delete matched", func(db *gorm.DB) error { return db.Where("v = ?", 1).Delete(&CiSlug{}).Error }},
		{"Transaction", func(db *gorm.DB) error {
			return gormplugin.Transaction(context.Background(), db, func(*gorm.DB) error { return nil }, &CiSlug{Name: "abc"})
		}},
	} {
		t.Run(w.verb, func(t *testing.T) {
			for _, s := range []string{"DELETE FROM ci_slugs", "INSERT INTO ci_slugs (name, v) VALUES ('abc', 1), ('zz', 2)"} {
				if err := plain.Exec(s).Error; err != nil {
					t.Fatal(err)
				}
			}
			respell = replace(t, row, "DELETE FROM ci_slugs WHERE name = 'abc'", "INSERT INTO ci_slugs (name, v) VALUES ('ABC', 1)")
			err := w.write(db)
			if respell != nil {
				respell = nil
				t.Fatal("the row was not respelled")
			}
			if err != nil {
				t.Errorf("write: %v, want nil (the row it locked is gone)", err)
			}
			var s CiSlug
			if err := plain.Where("name = ?", "ABC").Take(&s).Error; err != nil {
				t.Fatalf("row ABC: %v (deleted under %s)", err, row)
			}
			if s.Name != "ABC" || s.V != 1 || s.Fence != 0 {
				t.Errorf("row %+v written under %s; want ABC, v 1, fence 0", s, row)
			}
			if keys := e.lockKeys(t); len(keys) != 0 {
				t.Fatalf("locks left: %v", keys)
			}
		})
	}

	// A composite key: the tuple compares its string part byte for byte.
	t.Run("composite key", func(t *testing.T) {
		if err := plain.Exec("INSERT INTO ci_pairs (a, name, v) VALUES (1, 'abc', 1), (2, 'abc', 2)").Error; err != nil {
			t.Fatal(err)
		}
		respell = replace(t, "ci_pairs:1:abc", "DELETE FROM ci_pairs WHERE a = 1", "INSERT INTO ci_pairs (a, name, v) VALUES (1, 'ABC', 1)")
		err := db.Model(&[]CiPair{{A: 1, Name: "abc"}, {A: 2, Name: "ABC"}}).Update("v", 7).Error
		if respell != nil {
			respell = nil
			t.Fatal("the row was not respelled")
		}
		if err != nil {
			t.Errorf("write: %v, want nil", err)
		}
		var got []CiPair
		if err := plain.Order("a").Find(&got).Error; err != nil {
			t.Fatal(err)
		}
		if len(got) != 2 || got[0].Name != "ABC" || got[0].V != 1 || got[1].Name != "abc" || got[1].V != 7 {
			t.Errorf("rows %+v; want (1, ABC) not written under ci_pairs:1:abc, (2, abc) written", got)
		}
	})
}
