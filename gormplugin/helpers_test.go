package gormplugin_test

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/redis/go-redis/v9"
	"gorm.io/driver/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/cacheguard/cacheguard/gormplugin"
	"github.com/cacheguard/cacheguard/internal/redistest"
	"github.com/cacheguard/cacheguard/locks"
)

// Counter is a fenced row.
type Counter struct {
	ID    uint
	N     int
	Fence gormplugin.Fence `gorm:"not null;default:0"`
}

// Repo is a fenced row whose table, repos, is the kind a ginmw route locks.
type Repo struct {
	ID    uint
	Name  string
	Stars int
	Fence gormplugin.Fence `gorm:"not null;default:0"`
}

// Widget has no fence column.
type Widget struct {
	ID    uint
	Color string
	Size  int
}

// Pair has a composite key and a tagged fence column.
type Pair struct {
	A     int    `gorm:"primaryKey;autoIncrement:false"`
	B     string `gorm:"primaryKey"`
	V     int
	Fence int64 `gormplugin:"fence" gorm:"not null;default:0"`
}

type env struct {
	srv  *redistest.Server
	rdb  *redis.Client
	l    *locks.Client
	path string // the SQLite file
}

func newEnv(t testing.TB) *env {
	t.Helper()
	srv := redistest.Start(t)
	rdb := srv.Client()
	l := locks.New(rdb)
	t.Cleanup(func() { l.Close() })
	e := &env{srv: srv, rdb: rdb, l: l, path: filepath.Join(t.TempDir(), "test.db")}
	db := e.open(t)
	if err := db.AutoMigrate(&Counter{}, &Repo{}, &Widget{}, &Pair{}); err != nil {
		t.Fatal(err)
	}
	return e
}

// open opens the SQLite file (WAL, busy timeout) and registers a plugin
// built from opts, or no plugin when opts is nil.
func (e *env) open(t testing.TB, opts ...gormplugin.Option) *gorm.DB {
	t.Helper()
	db := openFile(t, e.path)
	if opts != nil {
		p := gormplugin.New(e.l, opts...)
		t.Cleanup(func() { p.Close() })
		if err := db.Use(p); err != nil {
			t.Fatal(err)
		}
	}
	return db
}

func openFile(t testing.TB, path string) *gorm.DB {
	t.Helper()
	return openWith(t, path, &gorm.Config{})
}

func openWith(t testing.TB, path string, cfg *gorm.Config) *gorm.DB {
	t.Helper()
	dsn := fmt.Sprintf("file:%s?_journal_mode=WAL&_busy_timeout=5000", path)
	cfg.Logger = logger.Discard
	db, err := gorm.Open(sqlite.Open(dsn), cfg)
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

// guarded opens the file with the plugin and the given options.
func (e *env) guarded(t testing.TB, opts ...gormplugin.Option) *gorm.DB {
	t.Helper()
	if opts == nil {
		opts = []gormplugin.Option{}
	}
	return e.open(t, opts...)
}

// keyInvalidator deletes cache keys from Redis and counts its calls.
type keyInvalidator struct {
	rdb   redis.UniversalClient
	calls chan []string
}

func newInvalidator(rdb redis.UniversalClient) *keyInvalidator {
	return &keyInvalidator{rdb: rdb, calls: make(chan []string, 100)}
}

// Invalidate deletes keys, then reports the call on k.calls (if not full).
func (k *keyInvalidator) Invalidate(ctx context.Context, keys ...string) error {
	err := k.rdb.Del(ctx, keys...).Err()
	select {
	case k.calls <- keys:
	default:
	}
	return err
}

// cacheKeys maps a row to its one cache key, "cache:<table>:<pk>".
func cacheKeys(table string, pk any) []string {
	if pk == nil {
		return []string{"cache:" + table + ":*"}
	}
	if parts, ok := pk.([]any); ok {
		return []string{"cache:" + gormplugin.RowName(table, parts...)}
	}
	return []string{"cache:" + gormplugin.RowName(table, pk)}
}

func exists(t testing.TB, rdb redis.UniversalClient, key string) bool {
	t.Helper()
	n, err := rdb.Exists(context.Background(), key).Result()
	if err != nil {
		t.Fatal(err)
	}
	return n == 1
}

// eventually waits for an observable event, bounded by d.
var eventually = redistest.Eventually

func lockKey(name string) string { return "cg:lock:{" + name + "}" }

func holds(t testing.TB, rdb redis.UniversalClient, name string) string {
	t.Helper()
	v, err := rdb.HGet(context.Background(), lockKey(name), "n").Result()
	if err == redis.Nil {
		return ""
	}
	if err != nil {
		t.Fatal(err)
	}
	return v
}
