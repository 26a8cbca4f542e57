package gormplugin_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"gorm.io/gorm"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/gormplugin"
	"github.com/cacheguard/cacheguard/locks"
)

// redlock returns a one-node Redlock on the env's server, closed at cleanup.
func (e *env) redlock(t testing.TB) *locks.Redlock {
	rl := locks.NewRedlock([]redis.UniversalClient{e.rdb})
	t.Cleanup(func() { rl.Close() })
	return rl
}

// wrapped hides a Locker's type: the plugin sees a Locker it does not know.
type wrapped struct{ locks.Locker }

func TestRegistration(t *testing.T) {
	forDBs(t, testRegistration)
}

func testRegistration(t *testing.T, e *env) {
	db := e.plain(t)
	p := gormplugin.New(e.l)
	if p.Name() != "cacheguard:gormplugin" {
		t.Fatalf("Name() = %q", p.Name())
	}
	if err := db.Use(p); err != nil {
		t.Fatal(err)
	}
	if err := db.Use(gormplugin.New(e.l)); !errors.Is(err, gorm.ErrRegistered) {
		t.Fatalf("second Use: %v, want gorm.ErrRegistered", err)
	}
	if _, err := db.DB(); err != nil {
		t.Fatalf("db.DB() through the wrapped pool: %v", err)
	}
	if err := db.Transaction(func(tx *gorm.DB) error {
		_, err := tx.DB()
		return err
	}); err != nil {
		t.Fatalf("tx.DB() through the wrapped transaction: %v", err)
	}
}

func TestNewRefusesBadConfiguration(t *testing.T) {
	forDBs(t, testNewRefusesBadConfiguration)
}

func testNewRefusesBadConfiguration(t *testing.T, e *env) {
	cases := map[string]func(){
		"nil locker":        func() { gormplugin.New(nil) },
		"redlock fences":    func() { gormplugin.New(e.redlock(t)) },
		"nil invalidator":   func() { gormplugin.New(e.l, gormplugin.Invalidate(nil, cacheKeys)) },
		"bad unkeyed":       func() { gormplugin.New(e.l, gormplugin.Unkeyed(gormplugin.UnkeyedPolicy(9))) },
		"negative re-delay": func() { gormplugin.New(e.l, gormplugin.InvalidateAgain(-1)) },
	}
	for name, f := range cases {
		t.Run(name, func(t *testing.T) {
			defer func() {
				if msg := fmt.Sprint(recover()); !strings.HasPrefix(msg, "gormplugin: ") {
					t.Fatalf("New: panic %q, want a gormplugin: message", msg)
				}
			}()
			f()
		})
	}
	t.Run("redlock without fencing", func(t *testing.T) {
		db := e.plain(t)
		if err := db.Use(gormplugin.New(e.redlock(t), gormplugin.NoFencing())); err != nil {
			t.Fatal(err)
		}
		if err := db.Create(&Counter{ID: 1}).Error; err != nil {
			t.Fatal(err)
		}
		if err := db.Model(&Counter{ID: 1}).Update("n", 5).Error; err != nil {
			t.Fatal(err)
		}
		var c Counter
		db.First(&c, 1)
		if c.N != 5 || c.Fence != 0 {
			t.Fatalf("got %+v, want n=5 and no fence written", c)
		}
	})
	t.Run("a Locker issuing no fence tokens", func(t *testing.T) {
		db := e.plain(t)
		if err := db.Use(gormplugin.New(wrapped{e.redlock(t)})); err != nil {
			t.Fatal(err)
		}
		if err := db.Create(&Counter{ID: 2}).Error; err != nil {
			t.Fatal(err)
		}
		if err := db.Model(&Counter{ID: 2}).Update("n", 5).Error; !errors.Is(err, gormplugin.ErrInvalid) {
			t.Fatalf("fenced write under a lock without a token: %v, want ErrInvalid", err)
		}
		var c Counter
		db.First(&c, 2)
		if c.N != 0 {
			t.Fatalf("got %+v: the refused write landed", c)
		}
	})
}

func TestTransactionRefusesBadArguments(t *testing.T) {
	forDBs(t, testTransactionRefusesBadArguments)
}

func testTransactionRefusesBadArguments(t *testing.T, e *env) {
	ctx := context.Background()
	plain := e.plain(t)
	db := e.guarded(t)
	ok := func(*gorm.DB) error { return nil }
	for name, err := range map[string]error{
		"nil fn":             gormplugin.Transaction(ctx, db, nil),
		"nil db":             gormplugin.Transaction(ctx, nil, ok),
		"no plugin":          gormplugin.Transaction(ctx, plain, ok),
		"row without key":    gormplugin.Transaction(ctx, db, ok, &Counter{}),
		"row not a model":    gormplugin.Transaction(ctx, db, ok, 42),
		"model without a pk": gormplugin.Transaction(ctx, db, ok, &struct{ N int }{}),
	} {
		if !errors.Is(err, gormplugin.ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", name, err)
		}
	}
}

// With PrepareStmt, GORM's own types stay where GORM and its users look for
// them (issue 15 B.8): the database's pool is still a *gorm.PreparedStmtDB
// and a transaction's a *gorm.PreparedStmtTX, and the guard still holds row
// locks to COMMIT.
func TestPrepareStmtKeepsGormTypes(t *testing.T) {
	forDBs(t, testPrepareStmtKeepsGormTypes)
}

func testPrepareStmtKeepsGormTypes(t *testing.T, e *env) {
	db, _ := e.guardedPlugin(t, &gorm.Config{PrepareStmt: true})
	pdb, ok := db.ConnPool.(*gorm.PreparedStmtDB)
	if !ok {
		t.Fatalf("db.ConnPool is a %T, want *gorm.PreparedStmtDB", db.ConnPool)
	}
	if _, ok := db.Statement.ConnPool.(*gorm.PreparedStmtDB); !ok {
		t.Fatalf("db.Statement.ConnPool is a %T, want *gorm.PreparedStmtDB", db.Statement.ConnPool)
	}
	if err := db.Create(&Counter{ID: 1}).Error; err != nil {
		t.Fatal(err)
	}
	if err := db.Transaction(func(tx *gorm.DB) error {
		if _, ok := tx.Statement.ConnPool.(*gorm.PreparedStmtTX); !ok {
			return fmt.Errorf("tx.Statement.ConnPool is a %T, want *gorm.PreparedStmtTX", tx.Statement.ConnPool)
		}
		if err := tx.Model(&Counter{ID: 1}).Update("n", 1).Error; err != nil {
			return err
		}
		if !e.held(t, "counters:1") {
			return errors.New("row lock not held to COMMIT")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if e.held(t, "counters:1") {
		t.Fatal("row lock left after COMMIT")
	}
	if len(pdb.Stmts.Keys()) == 0 {
		t.Fatal("no statement was prepared")
	}
	if _, err := db.DB(); err != nil {
		t.Fatal(err)
	}
}
