package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
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
	Redis     redis.UniversalClient // this instance's own client
	DBPath    string                // the SQLite file, shared by every instance
	Prefix    string                // of every Redis key and channel (locks and cache)
	Pool      int                   // open database connections at most
	QueryCost time.Duration         // how long a repository query holds its connection (a stand-in for a heavy query)
	EditCost  time.Duration         // time an edit spends between its read and its write
	EditWait  time.Duration         // how long an edit waits for the repository's lock before 409
	Meter     *meter                // where queries and edits are counted
	Log       io.Writer             // request log; nil for none
}

// meter counts what the demonstration reports. Instances share one, as they
// would share a metrics backend; nothing in the service reads it back.
type meter struct {
	queries   atomic.Int64 // SELECTs on table repos
	editing   atomic.Int64 // edits inside their critical section now
	maxEdit   atomic.Int64 // the most edits ever inside at once
	editsDone atomic.Int64 // edits committed
}

func (m *meter) enterEdit() {
	n := m.editing.Add(1)
	for {
		old := m.maxEdit.Load()
		if n <= old || m.maxEdit.CompareAndSwap(old, n) {
			return
		}
	}
}

func (m *meter) leaveEdit() { m.editing.Add(-1) }

// service is one instance: its Redis client's lock client and cache guard,
// its own database pool with the gormplugin guard, and its Gin engine.
type service struct {
	cfg    serviceConfig
	db     *gorm.DB
	locks  *locks.Client
	guard  *cacheguard.Guard
	plugin *gormplugin.Plugin
	engine *gin.Engine
}

// listKey is the ginmw.Cache entry of GET /repos.
var listKey = ginmw.PathKey("/repos", nil)

// repoKey is the cacheguard key of one repository.
func repoKey(id any) string { return fmt.Sprintf("repo:%v", id) }

// newService wires one instance. Close releases what it made (not cfg.Redis).
func newService(cfg serviceConfig) (*service, error) {
	s := &service{cfg: cfg}
	s.locks = locks.New(cfg.Redis, locks.WithPrefix(cfg.Prefix))
	s.guard = cacheguard.New(cfg.Redis, cacheguard.Prefix(cfg.Prefix))
	db, err := openDB(cfg.DBPath, cfg.Pool)
	if err != nil {
		s.Close()
		return nil, err
	}
	s.db = db
	// A committed write to a repository drops its cached copy and the cached
	// list, after COMMIT and before the row's lock is released.
	inv := gormplugin.InvalidatorFunc(func(ctx context.Context, keys ...string) error {
		return errors.Join(s.guard.Invalidate(ctx, keys...), ginmw.Invalidate(ctx, s.guard, listKey))
	})
	// (pk is never nil here: writes whose rows cannot be named are refused,
	// the plugin's default.)
	s.plugin = gormplugin.New(s.locks, gormplugin.Invalidate(inv, func(_ string, pk any) []string {
		return []string{repoKey(pk)}
	}))
	if err := db.Use(s.plugin); err != nil {
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

	// The list is a whole response cached by ginmw.Cache; a settings commit
	// drops it (see newService).
	r.GET("/repos", ginmw.Cache(s.guard, 30*time.Second), s.listRepos)
	// One repository through cacheguard.Get: one load per expiry across every
	// instance sharing the Redis.
	r.GET("/repos/:id", s.getRepo)
	// The same read as plain cache-aside, for comparison: every request that
	// misses loads.
	r.GET("/naive/repos/:id", s.getRepoNaive)
	// Edits hold the repository's lock, "repos:<id>", for the whole handler;
	// the GORM transaction inside locks the same row name, so it re-enters
	// the request's lock, stamps the fence column and invalidates after COMMIT.
	settings := ginmw.Resource("repos", ginmw.Param("id"))
	r.PUT("/repos/:id/settings", ginmw.Lock(s.locks, settings, ginmw.Wait(s.cfg.EditWait)), s.updateSettings)
	r.GET("/stats", s.stats)
	return r
}

// Close stops the instance's background work and closes its database pool.
func (s *service) Close() error {
	var errs []error
	if s.plugin != nil {
		errs = append(errs, s.plugin.Close())
	}
	if s.db != nil {
		if sqlDB, err := s.db.DB(); err == nil {
			errs = append(errs, sqlDB.Close())
		}
	}
	errs = append(errs, s.guard.Close(), s.locks.Close())
	return errors.Join(errs...)
}

func (s *service) listRepos(c *gin.Context) {
	var repos []Repo
	if err := s.db.WithContext(c.Request.Context()).Order("id").Find(&repos).Error; err != nil {
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
		func(ctx context.Context) (Repo, error) { return s.loadRepo(ctx, id) },
		cacheguard.TTL(time.Minute), cacheguard.ReportTo(&res))
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
// connections for QueryCost, as an expensive query would.
func (s *service) loadRepo(ctx context.Context, id uint) (Repo, error) {
	var repo Repo
	err := s.db.WithContext(ctx).Connection(func(conn *gorm.DB) error {
		if err := conn.First(&repo, id).Error; err != nil {
			return err
		}
		return pause(ctx, s.cfg.QueryCost)
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
	id, ok := repoID(c)
	if !ok {
		return
	}
	var e edit
	if err := c.ShouldBindJSON(&e); err != nil {
		c.AbortWithStatusJSON(http.StatusBadRequest, gin.H{"error": err.Error()})
		return
	}
	if m := s.cfg.Meter; m != nil {
		m.enterEdit()
		defer m.leaveEdit()
	}
	ctx := c.Request.Context()
	var repo Repo
	err := gormplugin.Transaction(ctx, s.db, func(tx *gorm.DB) error {
		if err := tx.First(&repo, id).Error; err != nil {
			return err
		}
		if err := pause(ctx, s.cfg.EditCost); err != nil {
			return err
		}
		if e.DefaultBranch != nil {
			repo.Settings.DefaultBranch = *e.DefaultBranch
		}
		if e.Visibility != nil {
			repo.Settings.Visibility = *e.Visibility
		}
		repo.Settings.Edits = append(repo.Settings.Edits, e.ID)
		repo.Version++
		return tx.Model(&repo).Select("settings", "version").Updates(&repo).Error
	}, &Repo{ID: id})
	switch {
	case err == nil, errors.Is(err, gormplugin.ErrInvalidate):
		// ErrInvalidate: committed, but a cached copy may be served until it expires.
		if err != nil {
			c.Error(err) //nolint:errcheck // recorded for the request log
		}
		if m := s.cfg.Meter; m != nil {
			m.editsDone.Add(1)
		}
		c.JSON(http.StatusOK, repo)
	case errors.Is(err, gorm.ErrRecordNotFound):
		c.AbortWithStatusJSON(http.StatusNotFound, gin.H{"error": "no such repository"})
	case errors.Is(err, gormplugin.ErrStaleWrite), errors.Is(context.Cause(ctx), ginmw.ErrLockLost):
		// The lock was lost before the write: nothing was written.
		c.AbortWithStatusJSON(http.StatusConflict, gin.H{"error": "lock lost before the write; retry"})
	default:
		c.AbortWithStatusJSON(http.StatusInternalServerError, gin.H{"error": err.Error()})
	}
}

// stats reports this instance's cache counters and the shared meter.
func (s *service) stats(c *gin.Context) {
	out := gin.H{"cache": s.guard.Stats()}
	if m := s.cfg.Meter; m != nil {
		out["repo_queries"] = m.queries.Load()
		out["edits_committed"] = m.editsDone.Load()
	}
	c.JSON(http.StatusOK, out)
}

// repoID parses the :id parameter, answering 400 when it is not a positive integer.
func repoID(c *gin.Context) (uint, bool) {
	id, err := strconv.ParseUint(c.Param("id"), 10, 32)
	if err != nil || id == 0 {
		c.AbortWithStatusJSON(http.StatusBadRequest, gin.H{"error": "id must be a positive integer"})
		return 0, false
	}
	return uint(id), true
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
