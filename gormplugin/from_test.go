package gormplugin_test

import (
	"errors"
	"testing"
	"time"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"

	"github.com/cacheguard/cacheguard/gormplugin"
	"github.com/cacheguard/cacheguard/locks"
)

// An UPDATE ... FROM another fenced table runs as in plain GORM, fenced and
// restricted to the rows locked: the conditions the plugin adds name their
// columns with the statement's table (or its alias). Its fence condition was
// unqualified, and both databases refused the statement ("ambiguous column
// name: fence"; found by an outside probe).
func TestUpdateFromFencedTable(t *testing.T) {
	forDBs(t, testUpdateFromFencedTable)
}

func testUpdateFromFencedTable(t *testing.T, e *env) {
	db := e.guarded(t, gormplugin.LockOptions(locks.WaitBudget(50*time.Millisecond)))
	plain := e.plain(t)
	if err := plain.Create(&[]Repo{{ID: 1, Name: "a"}, {ID: 2, Name: "a"}, {ID: 3, Name: "b"}, {ID: 10, Name: "b"}}).Error; err != nil {
		t.Fatal(err)
	}
	if err := plain.Create(&[]Counter{{ID: 1, N: 1, Fence: 9}, {ID: 2, N: 5, Fence: 9}, {ID: 3, N: 5, Fence: 9}}).Error; err != nil {
		t.Fatal(err)
	}
	from := clause.From{Tables: []clause.Table{{Name: "counters"}}}
	for _, w := range []struct {
		name  string
		write func(db *gorm.DB, stars int) *gorm.DB
		rows  []uint
	}{
		{"keyless, two rows", func(db *gorm.DB, stars int) *gorm.DB {
			return db.Model(&Repo{}).Clauses(from).Where("counters.id = repos.id AND counters.n = ?", 5).Update("stars", stars)
		}, []uint{2, 3}},
		{"aliased", func(db *gorm.DB, stars int) *gorm.DB {
			return db.Model(&Repo{}).Table("repos AS r").Clauses(from).Where("counters.id = r.id AND counters.n = ?", 5).Update("stars", stars)
		}, []uint{2, 3}},
		{"table", func(db *gorm.DB, stars int) *gorm.DB {
			return db.Table("repos").Clauses(from).Where("counters.id = repos.id AND counters.n = ?", 5).Update("stars", stars)
		}, []uint{2, 3}},
	} {
		t.Run(w.name, func(t *testing.T) {
			before := map[uint]Repo{}
			for _, id := range w.rows {
				var r Repo
				if err := plain.First(&r, id).Error; err != nil {
					t.Fatal(err)
				}
				before[id] = r
			}
			n := before[w.rows[0]].Stars + 1
			if res := w.write(db, n); res.Error != nil || res.RowsAffected != int64(len(w.rows)) {
				t.Fatalf("guarded UPDATE ... FROM counters: %v, %d rows; want %d rows written, as plain GORM does", res.Error, res.RowsAffected, len(w.rows))
			}
			for _, id := range w.rows {
				var r Repo
				if err := plain.First(&r, id).Error; err != nil {
					t.Fatal(err)
				}
				if r.Stars != n || w.name != "table" && r.Fence <= before[id].Fence {
					t.Errorf("repos:%d after the write: %+v, want stars %d and a fence above %d", id, r, n, before[id].Fence)
				}
			}
			if s := stars(t, plain, 1); s != 0 {
				t.Errorf("repos:1 written (stars %d): not matched", s)
			}
			// Another owner's lock of one of its rows refuses it whole.
			holdOther(t, e, gormplugin.RowName("repos", w.rows[len(w.rows)-1]))
			if err := w.write(db, n+1).Error; !errors.Is(err, gormplugin.ErrLock) {
				t.Fatalf("UPDATE ... FROM while another owner holds a row: %v, want ErrLock", err)
			}
			if s := stars(t, plain, w.rows[0]); s != n {
				t.Errorf("repos:%d written (stars %d) by a refused statement", w.rows[0], s)
			}
		})
	}
}
