package gormplugin_test

import (
	"context"
	"testing"

	"gorm.io/gorm"
)

// benchUpdate updates one row of a fenced model repeatedly on db.
func benchUpdate(b *testing.B, db *gorm.DB) {
	if err := db.Create(&Counter{ID: 1}).Error; err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		if err := db.Model(&Counter{ID: 1}).Update("n", i).Error; err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkUpdateGuarded is a single-row Update through the plugin: row lock
// (one Redis round trip to take, one to release), fence condition and stamp,
// on a SQLite file in WAL mode.
func BenchmarkUpdateGuarded(b *testing.B) {
	e := newEnv(b, onSQLite, byClient)
	benchUpdate(b, e.guarded(b))
}

// BenchmarkUpdateUnguarded is the same Update on the same kind of file
// without the plugin.
func BenchmarkUpdateUnguarded(b *testing.B) {
	e := newEnv(b, onSQLite, byClient)
	benchUpdate(b, e.plain(b))
}

// BenchmarkRowLockBaseline is the Redis part of the guard alone: Lock and
// Unlock of one uncontended name, for reading the overhead above.
func BenchmarkRowLockBaseline(b *testing.B) {
	e := newEnv(b, onSQLite, byClient)
	ctx := context.Background()
	for b.Loop() {
		lk, err := e.c.Lock(ctx, "counters:1")
		if err != nil {
			b.Fatal(err)
		}
		if err := lk.Unlock(ctx); err != nil {
			b.Fatal(err)
		}
	}
}
