package gormplugin_test

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"gorm.io/driver/postgres"
	"gorm.io/driver/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/cacheguard/cacheguard/gormplugin"
	"github.com/cacheguard/cacheguard/internal/pgtest"
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

// The databases and Lockers the tests run on.
const (
	onSQLite   = "sqlite"
	onPostgres = "postgres"
	byClient   = "client"
	byRedlock  = "redlock"
)

// env is one test's Redis server, Locker and database.
type env struct {
	db     string // onSQLite or onPostgres
	locker string // byClient or byRedlock
	srv    *redistest.Server
	rdb    *redis.Client
	l      locks.Locker  // the plugin's Locker; tests lock rows as other writers with it too
	c      *locks.Client // l, when it is a Client (fencing needs one); nil for a Redlock
	dsn    string        // the PostgreSQL DSN, or the SQLite file's path
}

// forDBs runs fn on a SQLite file and on a PostgreSQL database, with a
// locks.Client: the tests of fencing, which needs monotonic tokens.
func forDBs(t *testing.T, fn func(t *testing.T, e *env)) {
	t.Helper()
	for _, db := range []string{onSQLite, onPostgres} {
		t.Run(db, func(t *testing.T) { fn(t, newEnv(t, db, byClient)) })
	}
}

// forLockers runs fn on both databases with a locks.Client and with a
// locks.Redlock (one node; the plugin gets NoFencing for it): the tests of
// locking, whose outcome must not depend on the Locker.
func forLockers(t *testing.T, fn func(t *testing.T, e *env)) {
	t.Helper()
	for _, db := range []string{onSQLite, onPostgres} {
		for _, lk := range []string{byClient, byRedlock} {
			t.Run(db+"/"+lk, func(t *testing.T) { fn(t, newEnv(t, db, lk)) })
		}
	}
}

func newEnv(t testing.TB, db, locker string) *env {
	t.Helper()
	srv := redistest.Start(t)
	e := &env{db: db, locker: locker, srv: srv, rdb: srv.Client()}
	e.l = e.newLocker(t, e.rdb)
	if db == onPostgres {
		e.dsn = pgtest.DSN(t)
	} else {
		e.dsn = filepath.Join(t.TempDir(), "test.db")
	}
	if err := e.plain(t).AutoMigrate(&Counter{}, &Repo{}, &Widget{}, &Pair{}); err != nil {
		t.Fatal(err)
	}
	return e
}

// newLocker returns a Locker of the env's kind on rdb, closed at cleanup.
func (e *env) newLocker(t testing.TB, rdb redis.UniversalClient) locks.Locker {
	t.Helper()
	if e.locker == byRedlock {
		rl := locks.NewRedlock([]redis.UniversalClient{rdb})
		t.Cleanup(func() { rl.Close() })
		return rl
	}
	c := locks.New(rdb)
	t.Cleanup(func() { c.Close() })
	if e.c == nil {
		e.c = c
	}
	return c
}

// dialector opens the env's database.
func (e *env) dialector() gorm.Dialector {
	if e.db == onPostgres {
		return postgres.Open(e.dsn)
	}
	return sqlite.Open(fmt.Sprintf("file:%s?_journal_mode=WAL&_busy_timeout=5000", e.dsn))
}

// openWith opens the database with cfg, without the plugin.
func (e *env) openWith(t testing.TB, cfg *gorm.Config) *gorm.DB {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = logger.Discard
	}
	db, err := gorm.Open(e.dialector(), cfg)
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

// plain opens the database without the plugin.
func (e *env) plain(t testing.TB) *gorm.DB { return e.openWith(t, &gorm.Config{}) }

// guarded opens the database with a plugin on the env's Locker built from
// opts (with NoFencing added for a Redlock).
func (e *env) guarded(t testing.TB, opts ...gormplugin.Option) *gorm.DB {
	t.Helper()
	db, _ := e.guardedPlugin(t, &gorm.Config{}, opts...)
	return db
}

// guardedPlugin is guarded with a GORM configuration, returning the plugin too.
func (e *env) guardedPlugin(t testing.TB, cfg *gorm.Config, opts ...gormplugin.Option) (*gorm.DB, *gormplugin.Plugin) {
	t.Helper()
	db := e.openWith(t, cfg)
	p := e.plugin(t, opts...)
	if err := db.Use(p); err != nil {
		t.Fatal(err)
	}
	return db, p
}

// plugin returns a plugin on the env's Locker, closed at cleanup.
func (e *env) plugin(t testing.TB, opts ...gormplugin.Option) *gormplugin.Plugin {
	t.Helper()
	if e.locker == byRedlock {
		opts = append(opts, gormplugin.NoFencing())
	}
	// A lock acquisition under -race on a loaded machine can take longer
	// than the default 500ms; the tests of that bound set their own.
	opts = append([]gormplugin.Option{gormplugin.UnavailableAfter(5 * time.Second)}, opts...)
	p := gormplugin.New(e.l, opts...)
	t.Cleanup(func() { p.Close() })
	return p
}

// lockKey is the Redis key of lock name.
func (e *env) lockKey(name string) string {
	if e.locker == byRedlock {
		return "cg:rlock:{" + name + "}"
	}
	return "cg:lock:{" + name + "}"
}

// held reports whether lock name is held by anyone.
func (e *env) held(t testing.TB, name string) bool {
	t.Helper()
	return exists(t, e.rdb, e.lockKey(name))
}

// holds returns the hold count of lock name, or "" when it is free.
func (e *env) holds(t testing.TB, name string) string {
	t.Helper()
	ctx := context.Background()
	if e.locker == byRedlock {
		n, err := e.rdb.HLen(ctx, e.lockKey(name)).Result()
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			return ""
		}
		return strconv.FormatInt(n-1, 10)
	}
	v, err := e.rdb.HGet(ctx, e.lockKey(name), "n").Result()
	if err == redis.Nil {
		return ""
	}
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// lockKeys lists the keys of the locks held.
func (e *env) lockKeys(t testing.TB) []string {
	t.Helper()
	pattern := "cg:lock:*"
	if e.locker == byRedlock {
		pattern = "cg:rlock:*"
	}
	keys, err := e.rdb.Keys(context.Background(), pattern).Result()
	if err != nil {
		t.Fatal(err)
	}
	return keys
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

// interlope registers fn to run on db's UPDATEs and DELETEs after the
// plugin has read and locked their rows and restricted them, just before
// GORM builds and sends them: where a test inserts a row another session
// would (an interloper), which the write must leave alone.
func interlope(t testing.TB, db *gorm.DB, fn func(tx *gorm.DB)) {
	for _, err := range []error{
		db.Callback().Update().After("gormplugin:fence").Before("gorm:update").Register("test:interloper", fn),
		db.Callback().Delete().After("gormplugin:fence").Before("gorm:delete").Register("test:interloper", fn),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
}
