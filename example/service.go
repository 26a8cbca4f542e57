package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/redis/go-redis/v9"
	"gorm.io/gorm"

	"github.com/cacheguard/cacheguard/cacheguard"
	"github.com/cacheguard/cacheguard/ginmw"
	"github.com/cacheguard/cacheguard/gormplugin"
	"github.com/cacheguard/cacheguard/locks"
)

// serviceConfig configures one instance of the service.
type serviceConfig struct {
	Redis redis.UniversalClient // this instance's own client
	// LockServers, when set, are independent redis-servers the repository
	// locks are taken on as a Redlock (a quorum of them) instead of on Redis.
	// A Redlock issues no fence tokens, so the GORM plugin runs without
	// fencing: a holder paused past its lease is not refused (documented).
	LockServers []redis.UniversalClient
	DB          string        // the database (a SQLite file or a postgres:// URL), shared by every instance
	Prefix      string        // of every Redis key and channel (locks and cache)
	Pool        int           // open database connections at most
	QueryCost   time.Duration // how long a repository query holds its connection (a stand-in for a heavy query)
	EditCost    time.Duration // time an edit spends between its read and its write
	EditWait    time.Duration // how long an edit waits for the repository's lock before 409
	Lease       time.Duration // of the repository locks (0: defaultLease)
	CacheTTL    time.Duration // how long cached repositories and lists stay fresh (0: defaultCacheTTL)
	NearCache   int           // values kept in the process too (cacheguard.NearCache); 0: off
	Meter       *meter        // where queries and edits are counted
	Log         io.Writer     // request log; nil for none
	// TestHooks are the end-to-end suite's fault hooks and negative
	// controls (testhooks.go, test-only); nil in a real deployment.
	TestHooks *testHooks
}

// defaultCacheTTL is how long a cached repository or list stays fresh.
const defaultCacheTTL = time.Minute

// meter counts what the demonstration reports. Instances share one, as they
// would share a metrics backend; nothing in the service reads it back.
type meter struct {
	queries   atomic.Int64 // SELECTs on table repos
	loads     atomic.Int64 // repositories and lists loaded for the cache (cacheguard.Get's loader, ginmw.Cache's handler)
	editing   atomic.Int64 // edits inside their critical section now
	maxEdit   atomic.Int64 // the most edits ever inside at once
	editsDone atomic.Int64 // edits committed

	// breakerOpened and breakerClosed are the unix ms of the instance's
	// Redis breaker's last opening and closing (0: none yet).
	breakerOpened, breakerClosed atomic.Int64
}

// edit counts an edit inside its critical section until the function it
// returns is called (a nil meter counts nothing).
func (m *meter) edit() (leave func()) {
	if m == nil {
		return func() {}
	}
	n := m.editing.Add(1)
	for {
		old := m.maxEdit.Load()
		if n <= old || m.maxEdit.CompareAndSwap(old, n) {
			return func() { m.editing.Add(-1) }
		}
	}
}

// breaker is the Observer of the instance's Redis breaker.
func (m *meter) breaker(_ context.Context, e locks.Event) {
	switch e.Kind {
	case locks.EventBreakerOpened:
		m.breakerOpened.Store(time.Now().UnixMilli())
	case locks.EventBreakerClosed:
		m.breakerClosed.Store(time.Now().UnixMilli())
	}
}

// service is one instance: its Redis client's lock client and cache guard,
// its own database pool with the gormplugin guard, and its Gin engine.
type service struct {
	cfg    serviceConfig
	db     *gorm.DB
	locks  *locks.Client  // the lock client on Redis; nil with LockServers
	rl     *locks.Redlock // the Redlock over LockServers, if any
	locker locks.Locker   // whichever of the two takes the repository locks
	guard  *cacheguard.Guard
	plugin *gormplugin.Plugin
	engine *gin.Engine
	// transaction runs a read-modify-write of rows: gormplugin.Transaction,
	// which holds the rows' locks from before BEGIN until after COMMIT.
	// (A plain GORM transaction under the test-only control no-plugin.)
	transaction func(ctx context.Context, db *gorm.DB, fn func(tx *gorm.DB) error, rows ...any) error
}

// repoKey is the cacheguard key of one repository.
func repoKey(id any) string { return fmt.Sprintf("repo:%v", id) }

// newService wires one instance. Close releases what it made (not cfg.Redis).
func newService(cfg serviceConfig) (*service, error) {
	if cfg.Lease <= 0 {
		cfg.Lease = defaultLease
	}
	if cfg.CacheTTL <= 0 {
		cfg.CacheTTL = defaultCacheTTL
	}
	s := &service{cfg: cfg, transaction: gormplugin.Transaction}
	if len(cfg.LockServers) > 0 {
		s.rl = locks.NewRedlock(cfg.LockServers, locks.Prefix(cfg.Prefix), locks.Lease(cfg.Lease))
		s.locker = s.rl
	} else {
		s.locks = locks.New(cfg.Redis, locks.Prefix(cfg.Prefix), locks.Lease(cfg.Lease))
		s.locker = s.locks
	}
	guardOpts := []cacheguard.Option{cacheguard.Prefix(cfg.Prefix)}
	if cfg.NearCache > 0 {
		// Hot repositories and lists are served from memory; every edit's
		// invalidation reaches the other instances' copies within about a
		// millisecond, and the TTL bounds a copy whose message was lost.
		guardOpts = append(guardOpts, cacheguard.NearCache(cfg.NearCache, cfg.CacheTTL))
	}
	s.guard = cacheguard.New(cfg.Redis, guardOpts...)
	db, err := openDB(cfg.DB, cfg.Pool)
	if err != nil {
		s.Close()
		return nil, err
	}
	s.db = db
	// A committed write to a repository drops its cached copy and the cached
	// list, after COMMIT and before the row's lock is released.
	inv := gormplugin.InvalidatorFunc(func(ctx context.Context, keys ...string) error {
		return errors.Join(s.guard.Invalidate(ctx, keys...), s.guard.InvalidateTags(ctx, "repos"))
	})
	// (pk is never nil here: writes whose rows cannot be named are refused,
	// the plugin's default.)
	invalidate := gormplugin.Invalidate(inv, func(_ string, pk any) []string {
		return []string{repoKey(pk)}
	})
	// [invalidate]; a test-only negative control may drop or add options,
	// or the plugin itself (testhooks.go).
	opts, guarded := cfg.TestHooks.pluginOptions(invalidate)
	// An edit whose invalidation failed (Redis unreachable after the
	// COMMIT) says so in its answer: the plugin retries it in the
	// background, and until then the old copy may be served (staleNotice).
	opts = append(opts, gormplugin.Observer(func(ctx context.Context, e gormplugin.Event) {
		if e.Kind == gormplugin.EventInvalidateFailed {
			if f, ok := ctx.Value(staleKey{}).(*atomic.Bool); ok {
				f.Store(true)
			}
		}
	}))
	if s.rl != nil {
		opts = append(opts, gormplugin.NoFencing())
	}
	if guarded {
		s.plugin = gormplugin.New(s.locker, opts...)
		if err := db.Use(s.plugin); err != nil {
			s.Close()
			return nil, err
		}
	} else {
		s.transaction = unguardedTransaction
	}
	if err := cfg.TestHooks.registerGORM(db); err != nil { // test-only steps
		s.Close()
		return nil, err
	}
	if cfg.Meter != nil {
		err := db.Callback().Query().After("gorm:query").Register("example:count", func(tx *gorm.DB) {
			if tx.Statement.Table == "repos" {
				cfg.Meter.queries.Add(1)
			}
		})
		if err != nil {
			s.Close()
			return nil, err
		}
	}
	s.engine = s.routes()
	return s, nil
}

func (s *service) routes() *gin.Engine {
	r := gin.New()
	if s.cfg.Log != nil {
		r.Use(gin.LoggerWithWriter(s.cfg.Log))
	}
	r.Use(gin.Recovery())
	s.cfg.TestHooks.routes(r) // test-only; nothing in a real deployment

	// The list is a whole response cached by ginmw.Cache, tagged "repos": a
	// commit to any repository drops it (see newService), and so would
	// ginmw.InvalidateAfter on a route keyed by Resource("repos", ...).
	r.GET("/repos", ginmw.Cache(s.guard, s.cfg.CacheTTL, ginmw.CacheTags("repos")), s.listRepos)
	// One repository through cacheguard.Get: one load per expiry across every
	// instance sharing the Redis.
	r.GET("/repos/:id", s.getRepo)
	// The same read as plain cache-aside, for comparison: every request that
	// misses loads.
	r.GET("/naive/repos/:id", s.getRepoNaive)
	// Edits hold the repository's lock, "repos:<id>", for the whole handler;
	// the GORM transaction inside locks the same row name, so it re-enters
	// the request's lock, stamps the fence column and invalidates after COMMIT.
	// The id is canonical before the lock is taken ("01" is "1"), and an id
	// that names no row is refused without touching Redis.
	repo := ginmw.Resource("repos", ginmw.Check(ginmw.Int(ginmw.Param("id")), positiveID))
	edits := r.Group("/repos/:id", staleNotice, ginmw.Lock(s.locker, repo, ginmw.LockOptions(locks.WaitBudget(s.cfg.EditWait))))
	edits.Use(s.cfg.TestHooks.underLock()...) // test-only; nothing in a real deployment
	edits.PUT("/settings", s.updateSettings)
	// The same settings edit written as many handlers are: First, change
	// the struct, Save it, with no gormplugin.Transaction.
	edits.PATCH("/settings", s.saveSettings)
	// Renames hold the same lock, and write with plain GORM calls.
	edits.PATCH("", s.renameRepo)
	r.GET("/stats", s.stats)
	r.GET("/metrics", s.metrics)
	return r
}

// Close stops the instance's background work and closes its database pool.
func (s *service) Close() error {
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // no grace: drop what is still running
	return s.Shutdown(ctx)
}

// Shutdown is the service's part of a graceful shutdown, after the HTTP
// server's Shutdown has waited for the requests in flight: the plugin flushes
// the invalidations of committed writes, the cache guard lets running loads
// finish (or hands their fill leases to another process), the lock client
// releases what is still held, each within ctx; then the database pool closes.
func (s *service) Shutdown(ctx context.Context) error {
	var errs []error
	if s.plugin != nil {
		errs = append(errs, s.plugin.Shutdown(ctx))
	}
	if s.guard != nil {
		errs = append(errs, s.guard.Shutdown(ctx))
	}
	if s.rl != nil {
		errs = append(errs, s.rl.Shutdown(ctx))
	}
	if s.locks != nil {
		errs = append(errs, s.locks.Shutdown(ctx))
	}
	if s.db != nil {
		if sqlDB, err := s.db.DB(); err == nil {
			errs = append(errs, sqlDB.Close())
		}
	}
	return errors.Join(errs...)
}

// listRepos runs when GET /repos is not cached: ginmw.Cache stores its answer.
func (s *service) listRepos(c *gin.Context) {
	ctx := c.Request.Context()
	if m := s.cfg.Meter; m != nil {
		m.loads.Add(1)
	}
	var repos []Repo
	if err := s.db.WithContext(ctx).Order("id").Find(&repos).Error; err != nil {
		c.AbortWithStatusJSON(http.StatusInternalServerError, gin.H{"error": err.Error()})
		return
	}
	c.JSON(http.StatusOK, repos)
}

func (s *service) getRepo(c *gin.Context) {
	id, ok := repoID(c)
	if !ok {
		return
	}
	var res cacheguard.Result
	repo, err := cacheguard.Get(c.Request.Context(), s.guard, repoKey(id),
		func(ctx context.Context) (Repo, error) {
			if m := s.cfg.Meter; m != nil {
				m.loads.Add(1)
			}
			return s.loadRepo(ctx, id)
		},
		cacheguard.TTL(s.cfg.CacheTTL), cacheguard.ReportTo(&res))
	if res != 0 {
		c.Header("X-Cache", res.String())
	}
	switch {
	case errors.Is(err, cacheguard.ErrNotFound):
		c.AbortWithStatusJSON(http.StatusNotFound, gin.H{"error": "no such repository"})
	case err != nil:
		c.AbortWithStatusJSON(http.StatusServiceUnavailable, gin.H{"error": err.Error()})
	default:
		c.JSON(http.StatusOK, repo)
	}
}

// getRepoNaive is cache-aside without a guard: GET, and on a miss load and SET.
func (s *service) getRepoNaive(c *gin.Context) {
	id, ok := repoID(c)
	if !ok {
		return
	}
	ctx := c.Request.Context()
	key := s.cfg.Prefix + "naive:" + repoKey(id)
	b, err := s.cfg.Redis.Get(ctx, key).Bytes()
	if err == nil {
		c.Header("X-Cache", "HIT")
		c.Data(http.StatusOK, "application/json; charset=utf-8", b)
		return
	}
	if !errors.Is(err, redis.Nil) {
		c.AbortWithStatusJSON(http.StatusServiceUnavailable, gin.H{"error": err.Error()})
		return
	}
	repo, err := s.loadRepo(ctx, id)
	switch {
	case errors.Is(err, cacheguard.ErrNotFound):
		c.AbortWithStatusJSON(http.StatusNotFound, gin.H{"error": "no such repository"})
		return
	case err != nil:
		c.AbortWithStatusJSON(http.StatusInternalServerError, gin.H{"error": err.Error()})
		return
	}
	b, _ = json.Marshal(repo)
	s.cfg.Redis.Set(ctx, key, b, time.Minute)
	c.Header("X-Cache", "MISS")
	c.Data(http.StatusOK, "application/json; charset=utf-8", b)
}

// loadRepo reads one repository. The query holds one of the pool's
// connections for QueryCost before its row arrives, as an expensive query
// would.
func (s *service) loadRepo(ctx context.Context, id uint) (Repo, error) {
	var repo Repo
	err := s.db.WithContext(ctx).Connection(func(conn *gorm.DB) error {
		if err := pause(ctx, s.cfg.QueryCost); err != nil {
			return err
		}
		return conn.First(&repo, id).Error
	})
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return Repo{}, fmt.Errorf("repository %d: %w", id, cacheguard.ErrNotFound)
	}
	return repo, err
}

// updateSettings runs under ginmw.Lock, which holds the repository for the
// request. gormplugin.Transaction takes the row's lock "repos:<id>" under the
// request's owner (the write inside re-enters it), so the read, the work and
// the write are one critical section; the write stamps the fence column, and
// the commit invalidates the cached copies.
func (s *service) updateSettings(c *gin.Context) {
	ctx := c.Request.Context()
	id, e, ok := editRequest[edit](c)
	if !ok {
		return
	}
	defer s.cfg.Meter.edit()()
	var repo Repo
	err := s.transaction(ctx, s.db, func(tx *gorm.DB) error {
		if err := tx.First(&repo, id).Error; err != nil {
			return err
		}
		if err := pause(ctx, s.cfg.EditCost); err != nil {
			return err
		}
		e.apply(&repo)
		return tx.Model(&repo).Select("settings", "version").Updates(&repo).Error
	}, &Repo{ID: id})
	s.answerEdit(c, repo, err)
}

// apply applies the edit to the repository read, and counts it.
func (e edit) apply(repo *Repo) {
	if e.DefaultBranch != nil {
		repo.Settings.DefaultBranch = *e.DefaultBranch
	}
	if e.Visibility != nil {
		repo.Settings.Visibility = *e.Visibility
	}
	repo.Settings.Edits = append(repo.Settings.Edits, e.ID)
	repo.Version++
}

// saveSettings is the settings edit of updateSettings written as many
// handlers are: under ginmw.Lock it reads the row with First, changes the
// struct and writes it back with Save, without gormplugin.Transaction. The
// Save re-enters the request's lock ("repos:<id>") and is fenced with its
// token; the fence the row was read with is the struct's version, so a Save
// of a read taken before another writer committed (a holder stopped after
// its UPDATE, whose COMMIT landed after this read) is refused with
// gormplugin.ErrStaleWrite (409) instead of overwriting that commit.
func (s *service) saveSettings(c *gin.Context) {
	ctx := c.Request.Context()
	id, e, ok := editRequest[edit](c)
	if !ok {
		return
	}
	defer s.cfg.Meter.edit()()
	db := s.db.WithContext(ctx)
	var repo Repo
	err := db.First(&repo, id).Error
	if err == nil {
		if err = pause(ctx, s.cfg.EditCost); err == nil {
			e.apply(&repo)
			err = db.Save(&repo).Error
		}
	}
	s.answerEdit(c, repo, err)
}

// rename is the body of PATCH /repos/:id.
type rename struct {
	ID   string `json:"edit" binding:"required,max=64"`
	Name string `json:"name" binding:"required,max=100"`
}

// renameRepo runs under ginmw.Lock like updateSettings, but reads and writes
// the row with plain GORM calls, as most handlers are written: the write
// re-enters the request's lock (same owner, "repos:<id>") and is fenced with
// its token, and the read is exact because the request's lock spans it.
func (s *service) renameRepo(c *gin.Context) {
	ctx := c.Request.Context()
	id, r, ok := editRequest[rename](c)
	if !ok {
		return
	}
	db := s.db.WithContext(ctx)
	var repo Repo
	err := db.First(&repo, id).Error
	if err == nil {
		repo.Name = r.Name
		repo.Settings.Edits = append(repo.Settings.Edits, r.ID)
		repo.Version++
		err = db.Model(&repo).Select("name", "settings", "version").Updates(&repo).Error
	}
	s.answerEdit(c, repo, err)
}

// staleKey marks an edit's context: set when the invalidation after its
// COMMIT failed (see newService).
type staleKey struct{}

// staleNotice gives the request a mark that answerEdit reads.
func staleNotice(c *gin.Context) {
	c.Request = c.Request.WithContext(context.WithValue(c.Request.Context(), staleKey{}, new(atomic.Bool)))
	c.Next()
}

// headerStale is set on an edit answered 200 whose cached copies could not
// be dropped after its COMMIT: reads may return the old value until the
// plugin's background retry succeeds or the copies expire.
const headerStale = "X-Cache-Invalidation"

// answerEdit answers an edit with the row as written, or with the status
// its error calls for.
func (s *service) answerEdit(c *gin.Context, repo Repo, err error) {
	ctx := c.Request.Context()
	switch {
	case err == nil, errors.Is(err, gormplugin.ErrInvalidate):
		// ErrInvalidate: committed, but a cached copy may be served until it expires.
		if err != nil {
			c.Error(err) //nolint:errcheck // recorded for the request log
		}
		if f, ok := ctx.Value(staleKey{}).(*atomic.Bool); ok && f.Load() || err != nil {
			c.Header(headerStale, "pending")
		}
		if m := s.cfg.Meter; m != nil {
			m.editsDone.Add(1)
		}
		c.JSON(http.StatusOK, repo)
	case errors.Is(err, gorm.ErrRecordNotFound):
		c.AbortWithStatusJSON(http.StatusNotFound, gin.H{"error": "no such repository"})
	case errors.Is(err, gormplugin.ErrStaleWrite), errors.Is(err, locks.ErrNotHeld), errors.Is(context.Cause(ctx), locks.ErrLost):
		// The lock was lost before the write: nothing was written.
		c.AbortWithStatusJSON(http.StatusConflict, gin.H{"error": "lock lost before the write; retry"})
	case errors.Is(err, gormplugin.ErrLock), errors.Is(err, locks.ErrBusy):
		c.AbortWithStatusJSON(http.StatusConflict, gin.H{"error": "the repository is being edited; retry"})
	case errors.Is(err, locks.ErrUnavailable):
		c.Header("Retry-After", "1")
		c.AbortWithStatusJSON(http.StatusServiceUnavailable, gin.H{"error": "lock service unavailable; retry"})
	default:
		c.AbortWithStatusJSON(http.StatusInternalServerError, gin.H{"error": err.Error()})
	}
}

// stats reports this instance's cache counters and the shared meter.
func (s *service) stats(c *gin.Context) {
	out := gin.H{"cache": s.guard.Stats()}
	if m := s.cfg.Meter; m != nil {
		out["repo_queries"] = m.queries.Load()
		out["cache_loads"] = m.loads.Load()
		out["edits_committed"] = m.editsDone.Load()
		out["breaker_opened_ms"] = m.breakerOpened.Load()
		out["breaker_closed_ms"] = m.breakerClosed.Load()
	}
	c.JSON(http.StatusOK, out)
}

// repoID parses the :id parameter, answering 400 when it is not a positive integer.
// positiveID refuses ids that no repository has (they are positive).
func positiveID(id string) (string, error) {
	if id == "0" || strings.HasPrefix(id, "-") {
		return "", fmt.Errorf("no repository %s: %w", id, ginmw.ErrNotFound)
	}
	return id, nil
}

func repoID(c *gin.Context) (uint, bool) {
	id, err := strconv.ParseUint(c.Param("id"), 10, 32)
	if err != nil || id == 0 {
		c.AbortWithStatusJSON(http.StatusBadRequest, gin.H{"error": "id must be a positive integer"})
		return 0, false
	}
	return uint(id), true
}

// editRequest reads an edit's repository id and its JSON body, or answers
// 400 and reports false.
func editRequest[B any](c *gin.Context) (id uint, body B, ok bool) {
	if id, ok = repoID(c); !ok {
		return 0, body, false
	}
	if err := c.ShouldBindJSON(&body); err != nil {
		c.AbortWithStatusJSON(http.StatusBadRequest, gin.H{"error": err.Error()})
		return 0, body, false
	}
	return id, body, true
}

// pause waits for d or until ctx ends.
func pause(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}
