package reliability

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
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
	rl := locks.NewRedlock([]redis.UniversalClient{w.rdb})
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
	// New panics on programmer error (a "gormplugin:" message), before any call.
	checkPanic := func(what string, f func()) {
		t.Helper()
		fig.Attempted++
		defer func() {
			t.Helper()
			msg := fmt.Sprint(recover())
			if !strings.HasPrefix(msg, "gormplugin:") {
				fig.Violations++
				t.Errorf("%s: panic %q, want a gormplugin: message", what, msg)
				return
			}
			fig.Refused++
		}()
		f()
	}
	w.silent(t, "gormplugin", func() {
		checkPanic("New(nil)", func() { gormplugin.New(nil) })
		checkPanic("New(Redlock) without NoFencing", func() { gormplugin.New(rl) })
		checkPanic("InvalidateAgain(-1)", func() { gormplugin.New(c, gormplugin.InvalidateAgain(-1)) })
		checkPanic("UnavailableAfter(0)", func() { gormplugin.New(c, gormplugin.UnavailableAfter(0)) })
		checkPanic("MaxMatchedRows(0)", func() { gormplugin.New(c, gormplugin.MaxMatchedRows(0)) })
		checkPanic("RetryInvalidation(0, 1s)", func() { gormplugin.New(c, gormplugin.RetryInvalidation(0, time.Second)) })
		checkPanic("RetryInvalidation(3, 0)", func() { gormplugin.New(c, gormplugin.RetryInvalidation(3, 0)) })
		checkPanic("Observer(nil)", func() { gormplugin.New(c, gormplugin.Observer(nil)) })
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
	fig.Note = "New panicked with a gormplugin: message, calls refused with gormplugin.ErrInvalid, nothing sent"
	fig.Report(t)
}
