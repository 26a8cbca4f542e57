package reliability

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"gorm.io/driver/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/cacheguard/cacheguard/gormplugin"
	"github.com/cacheguard/cacheguard/locks"
)

// TestReliabilityBadInputGORM: the GORM plugin's configuration and call
// errors are gormplugin.ErrInvalid, reported before anything is sent to
// Redis (or the database).
func TestReliabilityBadInputGORM(t *testing.T) {
	noLeaks(t)
	w := newWatched(t)
	bg := context.Background()
	open := func() *gorm.DB {
		db, err := gorm.Open(sqlite.Open("file:"+filepath.Join(t.TempDir(), "db.sqlite")), &gorm.Config{Logger: logger.Discard})
		if err != nil {
			t.Fatal(err)
		}
		sqlDB, err := db.DB()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { sqlDB.Close() })
		return db
	}
	c := locks.New(w.rdb)
	t.Cleanup(func() { c.Close() })
	rl, err := locks.NewRedlock([]redis.UniversalClient{w.rdb})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rl.Close() })
	fig := Figures{Scenario: "bad input: GORM plugin configuration and Transaction", Recovery: -1}
	check := func(what string, err error) {
		t.Helper()
		fig.Attempted++
		if !errors.Is(err, gormplugin.ErrInvalid) {
			fig.Violations++
			t.Errorf("%s: %v, want gormplugin.ErrInvalid", what, err)
			return
		}
		fig.Refused++
	}
	w.silent(t, "gormplugin", func() {
		check("db.Use(New(nil))", open().Use(gormplugin.New(nil)))
		check("db.Use(New(Redlock)) without NoFencing", open().Use(gormplugin.New(rl)))
		check("InvalidateAgain(-1)", open().Use(gormplugin.New(c, gormplugin.InvalidateAgain(-1))))
		check("UnavailableAfter(0)", open().Use(gormplugin.New(c, gormplugin.UnavailableAfter(0))))
		check("MaxMatchedRows(0)", open().Use(gormplugin.New(c, gormplugin.MaxMatchedRows(0))))
		check("RetryInvalidation(0, 1s)", open().Use(gormplugin.New(c, gormplugin.RetryInvalidation(0, time.Second))))
		check("RetryInvalidation(3, 0)", open().Use(gormplugin.New(c, gormplugin.RetryInvalidation(3, 0))))
		check("Observer(nil)", open().Use(gormplugin.New(c, gormplugin.Observer(nil))))
		fn := func(*gorm.DB) error { return nil }
		db := open()
		if err := db.Use(gormplugin.New(c)); err != nil {
			t.Fatal(err)
		}
		var nilCtx context.Context
		check("Transaction(nil ctx)", gormplugin.Transaction(nilCtx, db, fn))
		check("Transaction(nil db)", gormplugin.Transaction(bg, nil, fn))
		check("Transaction(nil fn)", gormplugin.Transaction(bg, db, nil))
		check("Transaction without the plugin", gormplugin.Transaction(bg, open(), fn))
	})
	fig.Note = "each refused with gormplugin.ErrInvalid and nothing sent"
	fig.Report(t)
}
