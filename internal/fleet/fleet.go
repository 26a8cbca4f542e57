package fleet

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"gorm.io/gorm"

	"github.com/cacheguard/cacheguard/internal/faultproxy"
	"github.com/cacheguard/cacheguard/internal/pgtest"
	"github.com/cacheguard/cacheguard/internal/redistest"
)

// Config sizes a fleet. Zero fields take the defaults named.
type Config struct {
	Procs    int           // processes of the service (4)
	DB       string        // "sqlite" (a file; the default) or "postgres"
	Cluster  bool          // a 3-master Redis Cluster with one replica each instead of one server
	Lease    time.Duration // the services' lock lease (1s)
	EditWait time.Duration // an edit's wait budget for its lock (5s)
	CacheTTL time.Duration // cached repositories and lists (1m)
	Control  string        // a protection switched off (-control), for the negative controls
	Redlock  int           // lock servers for a Redlock (the service's -redlock), 0 for locks on the main Redis
	Repos    int           // rows in table repos (60)
}

func (c *Config) defaults() {
	if c.Procs == 0 {
		c.Procs = 4
	}
	if c.DB == "" {
		c.DB = "sqlite"
	}
	if c.Lease == 0 {
		c.Lease = time.Second
	}
	if c.EditWait == 0 {
		c.EditWait = 5 * time.Second
	}
	if c.CacheTTL == 0 {
		c.CacheTTL = time.Minute
	}
	if c.Repos == 0 {
		c.Repos = 60
	}
}

// Fleet is N processes of the example service sharing one Redis (a server
// behind a fault proxy, or a cluster), one database and one key prefix, and
// the driver's history of what it asked them and what they answered.
type Fleet struct {
	Cfg     Config
	Prefix  string
	Redis   *redistest.Server  // the single server (nil for a cluster)
	Proxy   *faultproxy.Proxy  // between the services and Redis (nil for a cluster)
	Cluster *redistest.Cluster // nil for a single server
	// LockServers are the Redlock's independent servers (Config.Redlock).
	LockServers []*redistest.Server
	DSN         string // the database as the services see it
	Rec         *Recorder

	t      testing.TB
	procs  []*Proc
	db     *gorm.DB              // the driver's own connection
	rdb    redis.UniversalClient // the driver's own client, not through the proxy
	client *http.Client
	ids    atomic.Int64 // for edit ids and hook tags
	fresh  atomic.Int64 // the last repository handed out by FreshRepo
	mu     sync.Mutex   // guards faults
	faults []faultEvent
}

// faultEvent is one fault the nemesis injected, for the history.
type faultEvent struct {
	what       string
	start, end time.Time
}

// Start starts Redis, the database and cfg.Procs processes of the service,
// all stopped in t.Cleanup.
func Start(t testing.TB, cfg Config) *Fleet {
	t.Helper()
	cfg.defaults()
	bin := Binary(t)
	f := &Fleet{Cfg: cfg, t: t, Rec: newRecorder()}
	b := make([]byte, 4)
	rand.Read(b) //nolint:errcheck // never fails
	f.Prefix = "fleet:" + hex.EncodeToString(b) + ":"
	f.fresh.Store(seeded + 10) // 1-13 are for the scenarios that name their repositories

	redisArgs := []string{}
	if cfg.Cluster {
		f.Cluster = redistest.StartCluster(t, redistest.WithReplicas(), redistest.WithNodeOptions(redistest.AppendFsyncAlways()))
		f.rdb = f.Cluster.Client()
		redisArgs = append(redisArgs, "-redis", f.Cluster.Addrs()[0], "-cluster")
	} else {
		// Persistence on, as in production: a restarted server keeps its
		// locks and fence counters (without it a restart is a documented
		// loss of every lock; see the reliability suite's controls).
		f.Redis = redistest.Start(t, redistest.AppendFsyncAlways())
		p, err := faultproxy.New(f.Redis.Addr())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close() })
		f.Proxy = p
		f.rdb = f.Redis.Client()
		redisArgs = append(redisArgs, "-redis", p.Addr())
	}

	switch cfg.DB {
	case "sqlite":
		f.DSN = filepath.Join(t.TempDir(), "repos.db")
	case "postgres":
		f.DSN = pgURL(pgtest.DSN(t))
	default:
		t.Fatalf("fleet: unknown database %q", cfg.DB)
	}

	args := append(redisArgs, "-db", f.DSN, "-prefix", f.Prefix, "-listen", "127.0.0.1:0",
		"-lease", cfg.Lease.String(), "-edit-wait", cfg.EditWait.String(), "-cache-ttl", cfg.CacheTTL.String(),
		"-quiet", "-hooks")
	if cfg.Control != "" {
		args = append(args, "-control", cfg.Control)
	}
	if cfg.Redlock > 0 {
		// Independent lock servers, persistent as the Redlock restart rule
		// asks (a server restarted empty at once could grant a held lock
		// again: a documented limit, reproduced by the reliability suite).
		f.LockServers = redistest.StartN(t, cfg.Redlock, redistest.AppendFsyncAlways())
		addrs := make([]string, len(f.LockServers))
		for i, s := range f.LockServers {
			addrs[i] = s.Addr()
		}
		args = append(args, "-redlock", strings.Join(addrs, ","))
	}
	args = append([]string{"serve"}, args...)
	for i := range cfg.Procs {
		f.procs = append(f.procs, &Proc{Index: i, bin: bin, args: args})
	}
	f.client = &http.Client{
		Transport: &http.Transport{MaxIdleConnsPerHost: 32, DisableCompression: true},
		Timeout:   45 * time.Second,
	}
	t.Cleanup(func() {
		var wg sync.WaitGroup
		for _, p := range f.procs {
			wg.Go(p.Kill)
		}
		wg.Wait()
		f.client.CloseIdleConnections()
		if f.db != nil {
			if sqlDB, err := f.db.DB(); err == nil {
				sqlDB.Close()
			}
		}
	})

	// The first process creates the schema; then the driver adds rows and
	// the others start together.
	if err := f.procs[0].start(startWithin); err != nil {
		t.Fatal(err)
	}
	db, err := openDriverDB(f.DSN)
	if err != nil {
		t.Fatal(err)
	}
	f.db = db
	if err := addRepos(db, cfg.Repos); err != nil {
		t.Fatal(err)
	}
	errs := make([]error, len(f.procs))
	var wg sync.WaitGroup
	for i, p := range f.procs[1:] {
		wg.Go(func() { errs[i+1] = p.start(startWithin) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	return f
}

// startWithin bounds a process's start (a loaded machine, a cold database).
const startWithin = 30 * time.Second

// Procs is the number of processes.
func (f *Fleet) Procs() int { return len(f.procs) }

// Proc returns process i.
func (f *Fleet) Proc(i int) *Proc { return f.procs[i] }

// Restart starts a new process in slot i (whose process must be down).
func (f *Fleet) Restart(i int) error { return f.procs[i].start(startWithin) }

// FreshRepo returns a repository no scenario has touched yet.
func (f *Fleet) FreshRepo() uint {
	id := f.fresh.Add(1)
	if int(id) > f.Cfg.Repos {
		f.t.Fatalf("fleet: more than %d repositories asked for (Config.Repos)", f.Cfg.Repos)
	}
	return uint(id)
}

// NewID returns a unique name for an edit or a hook tag.
func (f *Fleet) NewID(kind string) string { return kind + strconv.FormatInt(f.ids.Add(1), 10) }

// Rows reads every row of table repos straight from the database.
func (f *Fleet) Rows(ctx context.Context) (map[uint]repoRow, error) {
	var rows []repoRow
	if err := f.db.WithContext(ctx).Find(&rows).Error; err != nil {
		return nil, err
	}
	out := make(map[uint]repoRow, len(rows))
	for _, r := range rows {
		out[r.ID] = r
	}
	return out, nil
}

// CacheLoads sums the cache loads every running process reports (GET /stats).
func (f *Fleet) CacheLoads(ctx context.Context, only ...int) (int64, error) {
	var total int64
	for i, p := range f.procs {
		if len(only) > 0 && !slices.Contains(only, i) {
			continue
		}
		u := p.URL()
		if u == "" {
			continue
		}
		var s struct {
			Loads int64 `json:"cache_loads"`
		}
		if err := f.getJSON(ctx, u+"/stats", &s); err != nil {
			return 0, err
		}
		total += s.Loads
	}
	return total, nil
}

func (f *Fleet) getJSON(ctx context.Context, url string, v any) error {
	req, err := http.NewRequestWithContext(ctx, "GET", url, nil)
	if err != nil {
		return err
	}
	resp, err := f.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}

// release lets the request parked with tag on process p go on (a hold without a stop).
func (f *Fleet) release(ctx context.Context, p *Proc, tag string) error {
	u := p.URL()
	if u == "" {
		return errDown
	}
	req, err := http.NewRequestWithContext(ctx, "POST", u+"/_hooks/release?tag="+tag, nil)
	if err != nil {
		return err
	}
	resp, err := f.client.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	return nil
}

// fault records a fault in the history; call the returned func when it ends.
func (f *Fleet) fault(what string) func() {
	start := time.Now()
	return func() {
		f.mu.Lock()
		f.faults = append(f.faults, faultEvent{what: what, start: start, end: time.Now()})
		f.mu.Unlock()
	}
}

// Keys returns the Redis keys under the fleet's prefix that match pattern
// (a SCAN pattern after the prefix), on every master of a cluster.
func (f *Fleet) Keys(ctx context.Context, pattern string) ([]string, error) {
	var out []string
	var mu sync.Mutex
	scan := func(ctx context.Context, c redis.Cmdable) error {
		iter := c.Scan(ctx, 0, f.Prefix+pattern, 1000).Iterator()
		for iter.Next(ctx) {
			mu.Lock()
			out = append(out, iter.Val())
			mu.Unlock()
		}
		return iter.Err()
	}
	if cc, ok := f.rdb.(*redis.ClusterClient); ok {
		err := cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return scan(ctx, c) })
		return out, err
	}
	return out, scan(ctx, f.rdb)
}
