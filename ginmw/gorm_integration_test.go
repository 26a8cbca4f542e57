package ginmw_test

import (
	"net/http"
	"path/filepath"
	"testing"

	"github.com/gin-gonic/gin"
	"github.com/redis/go-redis/v9"
	"gorm.io/driver/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/cacheguard/cacheguard/ginmw"
	"github.com/cacheguard/cacheguard/gormplugin"
)

type Repo struct {
	ID       uint
	Settings string
	Fence    gormplugin.Fence
}

// TestLockReentersThroughGORM: a handler under ginmw.Lock on repos:<id> that
// writes the row through gormplugin re-enters the request's lock (the same
// name, one Redis key, hold count 2 during the write) instead of waiting for
// itself, and the row's fence column gets the request's token.
func TestLockReentersThroughGORM(t *testing.T) {
	l, rdb, _ := newLocker(t)
	db, err := gorm.Open(sqlite.Open("file:"+filepath.Join(t.TempDir(), "repos.db")+"?_journal_mode=WAL&_busy_timeout=5000"),
		&gorm.Config{Logger: logger.Discard})
	if err != nil {
		t.Fatal(err)
	}
	plugin := gormplugin.New(l)
	if err := db.Use(plugin); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		plugin.Close()
		if sqlDB, err := db.DB(); err == nil {
			sqlDB.Close()
		}
	})
	if err := db.AutoMigrate(&Repo{}); err != nil {
		t.Fatal(err)
	}
	if err := db.Create(&Repo{ID: 42, Settings: "old"}).Error; err != nil {
		t.Fatal(err)
	}

	var holds string
	var keys []string
	hook := &onUpdate{rdb: rdb, seen: func(h string, k []string) { holds, keys = h, k }}
	if err := db.Callback().Update().Before("gorm:update").Register("test:observe", hook.observe); err != nil {
		t.Fatal(err)
	}

	r := newEngine()
	var writeErr error
	var fence uint64
	r.PUT("/repos/:id/settings", ginmw.Lock(l, ginmw.Resource("repos", ginmw.Param("id"))), func(c *gin.Context) {
		fence, _ = ginmw.Fence(c)
		writeErr = db.WithContext(c.Request.Context()).Model(&Repo{ID: 42}).Update("settings", "new").Error
		c.Status(http.StatusNoContent)
	})
	w := serve(r, http.MethodPut, "/repos/42/settings")
	if writeErr != nil {
		t.Fatalf("guarded write inside the locked request: %v", writeErr)
	}
	if w.Code != http.StatusNoContent {
		t.Fatalf("status %d", w.Code)
	}
	if holds != "2" || len(keys) != 1 || keys[0] != "cg:lock:{repos:42}" {
		t.Fatalf("during the write: hold count %q, lock keys %v; want 2 and only cg:lock:{repos:42}", holds, keys)
	}
	var got Repo
	db.First(&got, 42)
	if got.Settings != "new" || uint64(got.Fence) != fence || fence == 0 {
		t.Fatalf("row %+v, request fence %d", got, fence)
	}
	if n, _ := rdb.Exists(t.Context(), "cg:lock:{repos:42}").Result(); n != 0 {
		t.Fatal("lock left after the request")
	}
}

type onUpdate struct {
	rdb  *redis.Client
	seen func(holds string, keys []string)
}

func (o *onUpdate) observe(db *gorm.DB) {
	ctx := db.Statement.Context
	h, _ := o.rdb.HGet(ctx, "cg:lock:{repos:42}", "n").Result()
	k, _ := o.rdb.Keys(ctx, "cg:lock:*").Result()
	o.seen(h, k)
}
