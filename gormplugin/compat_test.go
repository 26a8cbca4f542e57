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

// The drop-in tests (issue 15 B): registering the plugin on an existing app
// must not change what GORM does, only guard it. Each class of write that
// GORM's own suite exercises has a test here; the models follow the suite's.

// Member owns pets (has many), an account (has one) and languages (many to
// many); it is soft-deleted.
type Member struct {
	ID        uint
	Name      string
	Age       int
	Pets      []Pet
	Wallet    Wallet
	Languages []Language `gorm:"many2many:member_languages"`
	DeletedAt gorm.DeletedAt
}

type Pet struct {
	ID       uint
	Name     string
	MemberID *uint
}

type Wallet struct {
	ID       uint
	Number   string
	MemberID *uint
}

type Language struct {
	Code string `gorm:"primaryKey"`
	Name string
}

func compatEnv(t *testing.T, e *env) *gorm.DB {
	t.Helper()
	if err := e.plain(t).AutoMigrate(&Member{}, &Pet{}, &Wallet{}, &Language{}); err != nil {
		t.Fatal(err)
	}
	return e.guarded(t)
}

// lockedDuring registers a callback on db that records, just before each
// Update or Delete is sent, which of names are locked; it returns the record.
func lockedDuring(t *testing.T, e *env, db *gorm.DB, names ...string) *[][]string {
	t.Helper()
	var seen [][]string
	observe(t, db, func(*gorm.DB) {
		var held []string
		for _, n := range names {
			if e.held(t, n) {
				held = append(held, n)
			}
		}
		seen = append(seen, held)
	})
	return &seen
}

// B.3: primary-key forms GORM users write name their rows, so the write
// locks exactly those rows (and a condition that is not a conjunction on the
// key does not pass for one).
func TestPrimaryKeyForms(t *testing.T) {
	forLockers(t, testPrimaryKeyForms)
}

func testPrimaryKeyForms(t *testing.T, e *env) {
	db := e.guarded(t)
	ctx := context.Background()
	if err := db.Create(&[]Repo{{ID: 1}, {ID: 2, Stars: 7}, {ID: 3}}).Error; err != nil {
		t.Fatal(err)
	}
	seen := lockedDuring(t, e, db, "repos:1", "repos:2", "repos:3")
	steps := []struct {
		name string
		run  func() error
		want []string
	}{
		{`Where("id = ?")`, func() error { return db.Model(&Repo{}).Where("id = ?", 1).Update("name", "a").Error }, []string{"repos:1"}},
		{`Where("repos.id = ?")`, func() error { return db.Model(&Repo{}).Where("repos.id = ?", 2).Update("name", "a").Error }, []string{"repos:2"}},
		{`Where("id IN ?")`, func() error { return db.Model(&Repo{}).Where("id IN ?", []int{1, 3}).Update("name", "b").Error }, []string{"repos:1", "repos:3"}},
		{`Where("id IN (?)")`, func() error { return db.Model(&Repo{}).Where("id IN (?)", []int{2, 3}).Update("name", "c").Error }, []string{"repos:2", "repos:3"}},
		{`Where("id", id)`, func() error { return db.Model(&Repo{}).Where("id", 3).Update("name", "d").Error }, []string{"repos:3"}},
		{`Where("id = ? AND name = ?")`, func() error {
			return db.Model(&Repo{}).Where("id = ? AND name = ?", 1, "b").Update("stars", 1).Error
		}, []string{"repos:1"}},
		{`inline Delete(&Repo{}, "id = ?")`, func() error { return db.Delete(&Repo{}, "id = ?", 404).Error }, nil},
		{`gorm.G[Repo].Where("id = ?").Update`, func() error {
			_, err := gorm.G[Repo](db).Where("id = ?", 2).Update(ctx, "name", "g")
			return err
		}, []string{"repos:2"}},
		{`gorm.G[Repo].Where("id IN ?").Updates`, func() error {
			_, err := gorm.G[Repo](db).Where("id IN ?", []uint{1, 2}).Updates(ctx, Repo{Name: "h"})
			return err
		}, []string{"repos:1", "repos:2"}},
		// Not a conjunction on the key: the rows it matches (1 and 2) are
		// locked, not only repos:1.
		{`Where("id = ? OR stars = ?")`, func() error {
			return db.Model(&Repo{}).Where("id = ? OR stars = ?", 1, 7).Update("name", "or").Error
		}, []string{"repos:1", "repos:2"}},
		{`Where("id = ?").Or("stars = ?")`, func() error {
			return db.Model(&Repo{}).Where("id = ?", 1).Or("stars = ?", 7).Update("name", "or2").Error
		}, []string{"repos:1", "repos:2"}},
	}
	for _, s := range steps {
		*seen = nil
		if err := s.run(); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if s.want == nil {
			continue
		}
		if len(*seen) != 1 || !slices.Equal((*seen)[0], s.want) {
			t.Fatalf("%s: locks held during the write %v, want %v", s.name, *seen, s.want)
		}
	}
	var rs []Repo
	db.Order("id").Find(&rs)
	if rs[0].Name != "or2" || rs[1].Name != "or2" || rs[2].Name != "d" {
		t.Fatalf("rows %+v", rs)
	}
}

// B.5: writes whose rows cannot be named up front (a condition on other
// columns, Table(...) without a model, AllowGlobalUpdate) are guarded, not
// refused: the rows they match are locked, so a writer holding one of those
// rows excludes them.
func TestUnnamedRowsGuarded(t *testing.T) {
	forLockers(t, testUnnamedRowsGuarded)
}

func testUnnamedRowsGuarded(t *testing.T, e *env) {
	db := e.guarded(t, gormplugin.LockOptions(locks.WaitBudget(300*time.Millisecond)))
	if err := db.Create(&[]Widget{{ID: 1, Size: 1}, {ID: 2, Size: 1}, {ID: 3, Size: 2}}).Error; err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	seen := lockedDuring(t, e, db, "widgets:1", "widgets:2", "widgets:3")
	colors := func() []string {
		var ws []Widget
		e.plain(t).Order("id").Find(&ws)
		var out []string
		for _, w := range ws {
			out = append(out, w.Color)
		}
		return out
	}

	if err := db.Model(&Widget{}).Where("size = ?", 1).Update("color", "red").Error; err != nil {
		t.Fatalf("Where(size).Update: %v", err)
	}
	if len(*seen) != 1 || !slices.Equal((*seen)[0], []string{"widgets:1", "widgets:2"}) {
		t.Fatalf("locks during Where(size).Update: %v, want widgets:1 and widgets:2", *seen)
	}
	if c := colors(); !slices.Equal(c, []string{"red", "red", ""}) {
		t.Fatalf("colors %v", c)
	}

	*seen = nil
	if err := db.Table("widgets").Where("size = ?", 2).Update("color", "blue").Error; err != nil {
		t.Fatalf("Table(widgets).Update: %v", err)
	}
	if len(*seen) != 1 || !slices.Equal((*seen)[0], []string{"widgets:3"}) {
		t.Fatalf("locks during Table(widgets).Update: %v, want widgets:3", *seen)
	}

	*seen = nil
	if err := db.Session(&gorm.Session{AllowGlobalUpdate: true}).Model(&Widget{}).Update("size", 5).Error; err != nil {
		t.Fatalf("AllowGlobalUpdate: %v", err)
	}
	if len(*seen) != 1 || len((*seen)[0]) != 3 {
		t.Fatalf("locks during a global update: %v, want all three rows", *seen)
	}

	// A writer holding widgets:2 excludes a write that matches it: the write
	// waits its budget and fails, changing nothing.
	other, err := e.l.Lock(ctx, "widgets:2")
	if err != nil {
		t.Fatal(err)
	}
	err = db.Model(&Widget{}).Where("size = ?", 5).Update("color", "green").Error
	if !errors.Is(err, gormplugin.ErrLock) || !errors.Is(err, locks.ErrBusy) {
		t.Fatalf("write matching a held row: %v, want ErrLock and locks.ErrBusy", err)
	}
	if c := colors(); slices.Contains(c, "green") {
		t.Fatalf("a refused write changed rows: %v", c)
	}
	if err := other.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := db.Where("size = ?", 5).Delete(&Widget{}).Error; err != nil {
		t.Fatalf("Where(size).Delete: %v", err)
	}
	if len(e.lockKeys(t)) != 0 {
		t.Fatalf("locks left: %v", e.lockKeys(t))
	}
}

// Tag has no primary key: no write can name one of its rows, so each guarded
// write of it takes the table's one lock, "tags:*".
type Tag struct {
	Name string
	Note string
}

// The rows of UPDATE ... FROM are those of the table written that join the
// others; a table without a primary key is locked as a whole.
func TestUnnamedRowsFromAndNoKey(t *testing.T) {
	forLockers(t, testUnnamedRowsFromAndNoKey)
}

func testUnnamedRowsFromAndNoKey(t *testing.T, e *env) {
	if err := e.plain(t).AutoMigrate(&Tag{}); err != nil {
		t.Fatal(err)
	}
	db := e.guarded(t)
	if err := db.Create(&[]Widget{{ID: 1}, {ID: 2}, {ID: 3}}).Error; err != nil {
		t.Fatal(err)
	}
	if err := db.Create(&[]Repo{{ID: 2, Name: "two"}, {ID: 3, Name: "three"}}).Error; err != nil {
		t.Fatal(err)
	}
	if err := db.Create(&[]Tag{{Name: "a"}, {Name: "b"}}).Error; err != nil {
		t.Fatal(err)
	}
	seen := lockedDuring(t, e, db, "widgets:1", "widgets:2", "widgets:3", "tags:*")
	err := db.Model(&Widget{}).Clauses(clause.From{Tables: []clause.Table{{Name: "repos"}}}).
		Where("repos.id = widgets.id AND repos.name = ?", "two").Update("color", gorm.Expr("repos.name")).Error
	if err != nil {
		t.Fatalf("UPDATE ... FROM: %v", err)
	}
	if len(*seen) != 1 || !slices.Equal((*seen)[0], []string{"widgets:2"}) {
		t.Fatalf("locks during UPDATE ... FROM: %v, want widgets:2", *seen)
	}
	var w Widget
	db.First(&w, 2)
	if w.Color != "two" {
		t.Fatalf("widget 2 %+v", w)
	}
	*seen = nil
	if err := db.Model(&Tag{}).Where("name = ?", "a").Update("note", "x").Error; err != nil {
		t.Fatalf("update of a table without a primary key: %v", err)
	}
	if err := db.Where("name = ?", "b").Delete(&Tag{}).Error; err != nil {
		t.Fatalf("delete from a table without a primary key: %v", err)
	}
	if len(*seen) != 2 || !slices.Equal((*seen)[0], []string{"tags:*"}) || !slices.Equal((*seen)[1], []string{"tags:*"}) {
		t.Fatalf("locks during writes of a table without a primary key: %v, want tags:* each time", *seen)
	}
	var tags []Tag
	db.Find(&tags)
	if len(tags) != 1 || tags[0].Note != "x" {
		t.Fatalf("tags %+v", tags)
	}
}

// B.6: GORM's own refusal of a global write is kept.
func TestMissingWhereKept(t *testing.T) {
	forDBs(t, testMissingWhereKept)
}

func testMissingWhereKept(t *testing.T, e *env) {
	db := compatEnv(t, e)
	if err := db.Create(&[]Member{{Name: "a"}, {Name: "b"}}).Error; err != nil {
		t.Fatal(err)
	}
	for name, err := range map[string]error{
		"Update":                  db.Model(&Member{}).Update("age", 1).Error,
		"Updates":                 db.Model(&Member{}).Updates(map[string]any{"age": 2}).Error,
		"Delete (soft)":           db.Delete(&Member{}).Error,
		"Unscoped Delete":         db.Unscoped().Delete(&Member{}).Error,
		"Table(...).Update":       db.Table("members").Update("age", 3).Error,
		"Where(\"\") Delete":      db.Where("").Delete(&Widget{}).Error,
		"generics Update (G[T])":  func() error { _, err := gorm.G[Member](db).Update(context.Background(), "age", 4); return err }(),
		"Model(zero key).Updates": db.Model(&Member{}).Updates(Member{Age: 5}).Error,
	} {
		if !errors.Is(err, gorm.ErrMissingWhereClause) {
			t.Errorf("%s: %v, want gorm.ErrMissingWhereClause", name, err)
		}
	}
	var n int64
	e.plain(t).Model(&Member{}).Where("age <> 0").Count(&n)
	if n != 0 {
		t.Fatalf("%d rows changed by refused global writes", n)
	}
}

// B.4 and B.7: GORM's association API writes by foreign key. Its writes are
// guarded (the rows they change are locked) and never refused, and every
// operation ends as it does without the plugin.
func TestAssociationsAsGorm(t *testing.T) {
	forLockers(t, testAssociationsAsGorm)
}

func testAssociationsAsGorm(t *testing.T, e *env) {
	guarded := compatEnv(t, e)
	plain := e.plain(t)
	ctx := context.Background()
	type counts struct{ pets, accounts, languages int }
	ops := []struct {
		name string
		run  func(db *gorm.DB, m *Member) error
		want counts
	}{
		{"has many Append", func(db *gorm.DB, m *Member) error {
			return db.Model(m).Association("Pets").Append(&Pet{Name: "p3"})
		}, counts{3, 1, 2}},
		{"has many Replace", func(db *gorm.DB, m *Member) error {
			return db.Model(m).Association("Pets").Replace(&Pet{Name: "only"})
		}, counts{1, 1, 2}},
		{"has many Delete", func(db *gorm.DB, m *Member) error {
			return db.Model(m).Association("Pets").Delete(&m.Pets[0])
		}, counts{1, 1, 2}},
		{"has many Clear", func(db *gorm.DB, m *Member) error {
			return db.Model(m).Association("Pets").Clear()
		}, counts{0, 1, 2}},
		{"has many Unscoped Replace", func(db *gorm.DB, m *Member) error {
			return db.Model(m).Association("Pets").Unscoped().Replace(&Pet{Name: "only"})
		}, counts{1, 1, 2}},
		{"has one Append (a Replace)", func(db *gorm.DB, m *Member) error {
			return db.Model(m).Association("Wallet").Append(&Wallet{Number: "new"})
		}, counts{2, 1, 2}},
		{"has one Clear", func(db *gorm.DB, m *Member) error {
			return db.Model(m).Association("Wallet").Clear()
		}, counts{2, 0, 2}},
		{"many2many Replace", func(db *gorm.DB, m *Member) error {
			return db.Model(m).Association("Languages").Replace(&Language{Code: "fr", Name: "French"})
		}, counts{2, 1, 1}},
		{"many2many Delete", func(db *gorm.DB, m *Member) error {
			return db.Model(m).Association("Languages").Delete(&Language{Code: "en"})
		}, counts{2, 1, 1}},
		{"many2many Clear", func(db *gorm.DB, m *Member) error {
			return db.Model(m).Association("Languages").Clear()
		}, counts{2, 1, 0}},
		{"Select(Associations).Delete", func(db *gorm.DB, m *Member) error {
			return db.Select(clause.Associations).Delete(m).Error
		}, counts{0, 0, 0}},
		{"generics Set(Association unlink).Update", func(db *gorm.DB, m *Member) error {
			_, err := gorm.G[Member](db).Where("id = ?", m.ID).Set(clause.Association{Association: "Pets", Type: clause.OpUnlink}).Update(ctx)
			return err
		}, counts{0, 1, 2}},
		{"generics Set(Association update).Update", func(db *gorm.DB, m *Member) error {
			_, err := gorm.G[Member](db).Where("name = ?", m.Name).Set(clause.Association{
				Association: "Pets", Type: clause.OpUpdate, Set: []clause.Assignment{{Column: clause.Column{Name: "name"}, Value: "renamed"}},
			}).Update(ctx)
			return err
		}, counts{2, 1, 2}},
	}
	for i, op := range ops {
		t.Run(op.name, func(t *testing.T) {
			for _, db := range []*gorm.DB{plain, guarded} {
				m := Member{
					Name:      "m" + op.name + map[bool]string{true: "g", false: "p"}[db == guarded],
					Pets:      []Pet{{Name: "p1"}, {Name: "p2"}},
					Wallet:    Wallet{Number: "a1"},
					Languages: []Language{{Code: "en" + string(rune('a'+i)), Name: "English"}, {Code: "de" + string(rune('a'+i)), Name: "German"}},
				}
				if op.name == "many2many Delete" {
					m.Languages[0].Code = "en"
				}
				if err := plain.Create(&m).Error; err != nil {
					t.Fatal(err)
				}
				if err := op.run(db, &m); err != nil {
					t.Fatalf("plugin=%v: %v", db == guarded, err)
				}
				var got counts
				got.pets = int(plain.Model(&m).Association("Pets").Count())
				var n int64
				plain.Model(&Wallet{}).Where("member_id = ?", m.ID).Count(&n)
				got.accounts = int(n)
				got.languages = int(plain.Model(&m).Association("Languages").Count())
				if got != op.want {
					t.Fatalf("plugin=%v: pets, accounts, languages = %+v, want %+v (GORM's)", db == guarded, got, op.want)
				}
				plain.Exec("DELETE FROM member_languages")
			}
			if keys := e.lockKeys(t); len(keys) != 0 {
				t.Fatalf("locks left: %v", keys)
			}
		})
	}
}

// A policy that refuses writes refuses a statement when it comes; GORM's
// association operations are several statements, so run them in a
// transaction to have all or nothing: the refusal rolls back the whole
// operation.
func TestRefusedAssociationRollsBackInTransaction(t *testing.T) {
	forDBs(t, testRefusedAssociationRollsBackInTransaction)
}

func testRefusedAssociationRollsBackInTransaction(t *testing.T, e *env) {
	if err := e.plain(t).AutoMigrate(&Member{}, &Pet{}, &Wallet{}, &Language{}); err != nil {
		t.Fatal(err)
	}
	db := e.guarded(t, gormplugin.Unkeyed(gormplugin.Refuse))
	m := Member{Name: "r", Pets: []Pet{{Name: "p1"}, {Name: "p2"}}}
	if err := db.Create(&m).Error; err != nil {
		t.Fatal(err)
	}
	err := db.Transaction(func(tx *gorm.DB) error {
		return tx.Model(&m).Association("Pets").Replace(&Pet{Name: "p3"})
	})
	if !errors.Is(err, gormplugin.ErrUnkeyed) {
		t.Fatalf("Replace under Refuse: %v, want ErrUnkeyed", err)
	}
	var pets []Pet
	e.plain(t).Where("member_id = ?", m.ID).Order("id").Find(&pets)
	if len(pets) != 2 || pets[0].Name != "p1" || pets[1].Name != "p2" {
		t.Fatalf("pets %+v after a refused Replace in a transaction, want p1 and p2 only", pets)
	}
}
