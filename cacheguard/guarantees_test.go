package cacheguard_test

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/cacheguard"
	"github.com/cacheguard/cacheguard/internal/childproc"
	"github.com/cacheguard/cacheguard/internal/rcmd"
	"github.com/cacheguard/cacheguard/internal/redistest"
)

// The guarantee × path table (issue 31; the package documentation's
// Guarantees section lists it): each guarantee is checked on every path it
// applies to, against real redis-server processes, with the readers in other
// OS processes where the guarantee is one of the fleet's.

// path is a way of reading: Get or GetMany, with Tags or not, with a near
// cache or not, a policy, on one server or on a 3-master cluster.
type path struct {
	Name                                  string
	Many, Tagged, Near, Stale, Early, Cls bool
	TTL                                   time.Duration
	Lease                                 time.Duration    // zero: 300ms (a killed holder's takeover is quick)
	FailSafe                              [2]time.Duration // max age, back-off; zero: off
}

var paths = []path{
	{Name: "Get"},
	{Name: "GetMany", Many: true},
	{Name: "Get,tagged", Tagged: true},
	{Name: "GetMany,tagged", Many: true, Tagged: true},
	{Name: "Get,near", Near: true},
	{Name: "GetMany,near,tagged", Many: true, Near: true, Tagged: true},
	{Name: "Get,serve-stale", Stale: true},
	{Name: "Get,early-refresh", Early: true},
	{Name: "Get,cluster", Cls: true},
	{Name: "GetMany,near,tagged,cluster", Many: true, Near: true, Tagged: true, Cls: true},
}

const (
	childPath  = "CACHEGUARD_TEST_PATH"  // a path, as JSON
	childAddrs = "CACHEGUARD_TEST_ADDRS" // a cluster's addresses, comma-separated
)

// options are a path's Guard options.
func (p path) options() []cacheguard.Option {
	ttl := p.TTL
	if ttl == 0 {
		ttl = time.Minute
	}
	lease := p.Lease
	if lease == 0 {
		lease = 300 * time.Millisecond
	}
	opts := []cacheguard.Option{cacheguard.TTL(ttl), cacheguard.Jitter(0), cacheguard.EarlyRefresh(0), cacheguard.Lease(lease)}
	if p.Early {
		opts = append(opts, cacheguard.EarlyRefresh(1e9)) // every hit in the TTL's last quarter refreshes
	}
	if p.Stale {
		opts = append(opts, cacheguard.ServeStale(time.Minute))
	}
	if p.Near {
		opts = append(opts, cacheguard.NearCache(100, time.Minute))
	}
	if p.FailSafe[0] > 0 {
		opts = append(opts, cacheguard.FailSafe(p.FailSafe[0], p.FailSafe[1]))
	}
	return opts
}

// read reads key on p through g, loading with load.
func (p path) read(ctx context.Context, g *cacheguard.Guard, key string, load func(context.Context) (item, error)) (item, error) {
	var opts []cacheguard.CallOption
	if p.Tagged {
		opts = append(opts, cacheguard.Tags("t", "u"))
	}
	if !p.Many {
		return cacheguard.Get(ctx, g, key, load, opts...)
	}
	m, err := cacheguard.GetMany(ctx, g, []string{key}, func(ctx context.Context, keys []string) (map[string]item, error) {
		v, err := load(ctx)
		if err != nil {
			return nil, err
		}
		return map[string]item{key: v}, nil
	}, opts...)
	if err == nil && len(m) == 0 {
		err = cacheguard.ErrNotFound
	}
	return m[key], err
}

// invalidateTag is what InvalidateTags voids on a tagged path.
const invalidateTag = "u"

// world is where a test's processes meet: one server, or a cluster.
type world struct {
	addr    string   // the server
	cluster []string // or the cluster's addresses
}

// clients counts the clients made, so that every second one has
// ContextTimeoutEnabled: a Guard on it reads on its callers' goroutines, and
// its hits share round trips (see cacheguard's hits), where one without it
// hands its reads to a worker.
var clients atomic.Int64

func (w world) client() redis.UniversalClient {
	cte := clients.Add(1)%2 == 0
	if w.cluster != nil {
		return redis.NewClusterClient(&redis.ClusterOptions{Addrs: w.cluster, ContextTimeoutEnabled: cte})
	}
	return redis.NewClient(&redis.Options{Addr: w.addr, ContextTimeoutEnabled: cte})
}

// guard returns a Guard on p in this process (a Guard with its own client
// behaves as another process), closed at cleanup.
func (w world) guard(t *testing.T, p path) (*cacheguard.Guard, redis.UniversalClient) {
	rdb := w.client()
	g := cacheguard.New(rdb, p.options()...)
	t.Cleanup(func() {
		g.Close()
		rdb.Close()
	})
	return g, rdb
}

// start starts a child process reading key on p (see childPath) and waits
// until it is ready.
func (w world) start(t *testing.T, p path, key string) *childproc.Proc {
	t.Helper()
	js, _ := json.Marshal(p)
	c := childproc.Start(t, childEnv, "path", childAddr+"="+w.addr, childAddrs+"="+strings.Join(w.cluster, ","),
		childKey+"="+key, childPath+"="+string(js))
	if line, err := c.Next(30 * time.Second); err != nil || line != "ready" {
		t.Fatalf("child: %q, %v", line, err)
	}
	return c
}

// loaderOf is the loader of the table's tests: it counts itself in Redis
// (loads across processes), takes delay (so that loads overlap), and reads
// the row's version.
func loaderOf(rdb redis.UniversalClient, key string, delay time.Duration) func(context.Context) (item, error) {
	return func(ctx context.Context) (item, error) {
		if err := rdb.Incr(context.WithoutCancel(ctx), loadsKey(key)).Err(); err != nil {
			return item{}, err
		}
		select {
		case <-time.After(delay):
		case <-ctx.Done():
			return item{}, ctx.Err()
		}
		return versionLoad(rdb, key)(ctx)
	}
}

// childOnPath is a process reading the key on its path; one answer line per
// command:
//
//	get        "got <version>" or "err <error>"
//	burst <n>  n reads at once: "burst ok" or "err <error>"
//	spin <ms>  4 goroutines reading without pause for ms: "spin ok"
//	heard      the near cache's messages about the key and about tags: "heard <n> <m>"
//	hold       a read whose first load holds the fill lease until the process is killed
func childOnPath(ctx context.Context, key string) error {
	var p path
	if err := json.Unmarshal([]byte(os.Getenv(childPath)), &p); err != nil {
		return err
	}
	w := world{addr: os.Getenv(childAddr)}
	if a := os.Getenv(childAddrs); a != "" {
		w.cluster = strings.Split(a, ",")
	}
	rdb := w.client()
	defer rdb.Close()
	g := cacheguard.New(rdb, p.options()...)
	defer g.Close()
	for deadline := time.Now().Add(10 * time.Second); p.Near && !cacheguard.NearTrusted(g); {
		if time.Now().After(deadline) {
			return fmt.Errorf("near cache not trusted within 10s")
		}
		time.Sleep(time.Millisecond)
	}
	load := loaderOf(rdb, key, 100*time.Millisecond)
	sc := bufio.NewScanner(os.Stdin)
	fmt.Println("ready")
	for sc.Scan() {
		cmd, arg, _ := strings.Cut(sc.Text(), " ")
		n, _ := strconv.Atoi(arg)
		switch cmd {
		case "get":
			v, err := p.read(ctx, g, key, load)
			if err != nil {
				fmt.Println("err", strings.ReplaceAll(err.Error(), "\n", " "))
				continue
			}
			fmt.Println("got", v.ID)
		case "burst":
			var wg sync.WaitGroup
			errs := make([]error, n)
			for i := range n {
				wg.Go(func() { _, errs[i] = p.read(ctx, g, key, load) })
			}
			wg.Wait()
			if err := errors.Join(errs...); err != nil {
				fmt.Println("err", strings.ReplaceAll(err.Error(), "\n", " "))
				continue
			}
			fmt.Println("burst ok")
		case "spin":
			stop := time.Now().Add(time.Duration(n) * time.Millisecond)
			var wg sync.WaitGroup
			for range 4 {
				wg.Go(func() {
					for time.Now().Before(stop) {
						p.read(ctx, g, key, load)
					}
				})
			}
			wg.Wait()
			fmt.Println("spin ok")
		case "heard":
			fmt.Println("heard", cacheguard.NearHeard(g, key), cacheguard.NearHeardTags(g))
		case "hold":
			var held atomic.Bool
			go p.read(ctx, g, key, func(ctx context.Context) (item, error) {
				if held.CompareAndSwap(false, true) {
					rdb.Set(ctx, loadingKey(key), "1", time.Minute)
					select {} // until the process is killed
				}
				// The read loads again once an invalidation voided the
				// first load's lease: that load runs.
				return load(ctx)
			})
		default:
			return fmt.Errorf("unknown command %q", sc.Text())
		}
	}
	return sc.Err()
}

// askAll sends cmd to every child at once and returns their answers.
func askAll(t *testing.T, cmd string, cs ...*childproc.Proc) []string {
	t.Helper()
	for _, c := range cs {
		if _, err := fmt.Fprintln(c.Stdin, cmd); err != nil {
			t.Fatal(err)
		}
	}
	out := make([]string, len(cs))
	for i, c := range cs {
		line, err := c.Next(60 * time.Second)
		if err != nil || strings.HasPrefix(line, "err") {
			t.Fatalf("child %d, %s: %q, %v", i, cmd, line, err)
		}
		out[i] = line
	}
	return out
}

// guarantee is a row of the table: a check, and the paths it applies to.
type guarantee struct {
	name    string
	applies func(path) bool
	check   func(t *testing.T, w world, p path)
}

var guarantees = []guarantee{
	{"one load per expiry across processes", func(path) bool { return true }, oneLoadPerExpiry},
	{"read-your-writes after Invalidate", func(path) bool { return true }, readYourWrites(false)},
	{"read-your-writes after InvalidateTags", func(p path) bool { return p.Tagged }, readYourWrites(true)},
	{"near cache: not trusted while unsubscribed", func(p path) bool { return p.Near }, nearNotTrustedUnsubscribed},
	{"near cache: bounded", func(p path) bool { return p.Near }, nearBounded},
	{"fail-safe: never older than its max age", failSafePath, failSafeMaxAge},
	{"fail-safe: never from before an invalidation", failSafePath, failSafeNotBeforeInvalidation},
	{"every Redis command bounded by the command timeout", func(path) bool { return true }, commandsBounded},
}

// failSafePath reports whether p is one fail-safe is checked on: not with a
// stale window (it serves the older value on its own), nor early refresh or
// the near cache (which serve fresh values only).
func failSafePath(p path) bool { return !p.Early && !p.Near && !p.Stale }

// TestGuarantees runs the table.
func TestGuarantees(t *testing.T) {
	single := world{addr: redisAddr}
	cluster := world{cluster: redistest.StartCluster(t).Addrs()}
	for _, gu := range guarantees {
		t.Run(gu.name, func(t *testing.T) {
			for _, p := range paths {
				if !gu.applies(p) {
					continue
				}
				w := single
				if p.Cls {
					w = cluster
				}
				t.Run(p.Name, func(t *testing.T) { gu.check(t, w, p) })
			}
		})
	}
}

// oneLoadPerExpiry: two processes' bursts on a cold key cost one load; two
// processes reading without pause for five TTLs cost one load per expiry.
// The bursts run with a TTL of a minute and a fill lease of 10s: on a loaded
// host one process's burst may begin after a 300ms value expired, or a
// holder descheduled for 200ms may miss the renewal of a 300ms lease, and a
// second load is then right.
func oneLoadPerExpiry(t *testing.T, w world, p path) {
	ctx := context.Background()
	burst := p
	burst.TTL, burst.Lease = time.Minute, 10*time.Second
	p.TTL = 300 * time.Millisecond
	key, spinKey := testKey(t), testKey(t, "spin")
	_, rdb := w.guard(t, p)
	for _, k := range []string{key, spinKey} {
		if err := rdb.Set(ctx, dbKey(k), 1, time.Hour).Err(); err != nil {
			t.Fatal(err)
		}
	}
	a, b := w.start(t, burst, key), w.start(t, burst, key)
	askAll(t, "burst 16", a, b)
	if n, _ := rdb.Get(ctx, loadsKey(key)).Int(); n != 1 {
		t.Fatalf("a cold key read by 2 processes × 16: %d loads, want 1", n)
	}
	key = spinKey
	a, b = w.start(t, p, key), w.start(t, p, key)
	const spin = 1500 * time.Millisecond
	askAll(t, fmt.Sprint("spin ", spin.Milliseconds()), a, b)
	n, _ := rdb.Get(ctx, loadsKey(key)).Int()
	expiries := int(spin / p.TTL)
	if n < 2 || n-1 > expiries+1 {
		t.Fatalf("2 processes reading for %v with a TTL of %v: %d loads after the first, want one per expiry (%d, +1)", spin, p.TTL, n-1, expiries)
	}
}

// readYourWrites: a read that begins after an Invalidate (or, with tags, an
// InvalidateTags) returned — made by a third process — gets the new version
// in both reading processes; with a near cache, once the invalidation's
// message has reached the process (the near cache never serves what a
// delivered message voided).
func readYourWrites(tags bool) func(t *testing.T, w world, p path) {
	return func(t *testing.T, w world, p path) {
		ctx := context.Background()
		key := testKey(t)
		g, rdb := w.guard(t, path{})
		if err := rdb.Set(ctx, dbKey(key), 1, time.Hour).Err(); err != nil {
			t.Fatal(err)
		}
		a, b := w.start(t, p, key), w.start(t, p, key)
		for _, c := range []*childproc.Proc{a, b, a, b} { // the second read from the near cache, with one
			if got := ask(t, c, "get"); got != "got 1" {
				t.Fatalf("before: %q", got)
			}
		}
		heard := askAll(t, "heard", a, b)
		if err := rdb.Set(ctx, dbKey(key), 2, time.Hour).Err(); err != nil {
			t.Fatal(err)
		}
		if tags {
			if err := g.InvalidateTags(ctx, invalidateTag); err != nil {
				t.Fatal(err)
			}
		} else if err := g.Invalidate(ctx, key); err != nil {
			t.Fatal(err)
		}
		for i, c := range []*childproc.Proc{a, b} {
			if p.Near {
				eventually(t, 5*time.Second, "the message delivered", func() bool { return ask(t, c, "heard") != heard[i] })
			}
			if got := ask(t, c, "get"); got != "got 2" {
				t.Fatalf("process %d after the invalidation returned: %q, want got 2", i, got)
			}
		}
	}
}

// nearNotTrustedUnsubscribed: when the near cache's subscription is lost,
// a value changed in Redis meanwhile (here without any message, as one lost
// with the connection) is served from Redis, not from the near cache.
func nearNotTrustedUnsubscribed(t *testing.T, w world, p path) {
	ctx := context.Background()
	key := testKey(t)
	_, rdb := w.guard(t, path{})
	if err := rdb.Set(ctx, dbKey(key), 1, time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	a := w.start(t, p, key)
	for range 2 {
		if got := ask(t, a, "get"); got != "got 1" {
			t.Fatalf("before: %q", got)
		}
	}
	kill := func(c *redis.Client) error { return c.ClientKillByFilter(ctx, "TYPE", "pubsub").Err() }
	if cc, ok := rdb.(*redis.ClusterClient); ok {
		if err := cc.ForEachMaster(ctx, func(_ context.Context, m *redis.Client) error { return kill(m) }); err != nil {
			t.Fatal(err)
		}
	} else if err := kill(rdb.(*redis.Client)); err != nil {
		t.Fatal(err)
	}
	overwriteAny(t, rdb, key, 99)
	eventually(t, 5*time.Second, "the value in Redis served", func() bool { return ask(t, a, "get") == "got 99" })
}

// overwriteAny replaces the payload of every value of key in Redis with
// item{id}, sending no message.
func overwriteAny(t *testing.T, rdb redis.UniversalClient, key string, id int) {
	t.Helper()
	ctx := context.Background()
	vals, err := rdb.HGetAll(ctx, valueKey(key)).Result()
	if err != nil || len(vals) == 0 {
		t.Fatalf("values of %s: %v, %v", key, vals, err)
	}
	payload, _ := json.Marshal(item{ID: id, Name: "raw"})
	for field, b := range vals {
		head := envHead
		if b[3]&2 != 0 { // tags: count, hash, versions
			head += 9 + 8*int(b[envHead])
		}
		if err := rdb.HSet(ctx, valueKey(key), field, b[:head]+string(payload)).Err(); err != nil {
			t.Fatal(err)
		}
	}
}

// nearBounded: a near cache of 10 holds at most 10 values while keys come
// and go (new ones, expired ones read again), and keeps state only for tags
// its values carry, however many the fleet invalidates.
func nearBounded(t *testing.T, w world, p path) {
	ctx := context.Background()
	g, _ := w.guard(t, path{})
	rdb := w.client()
	defer rdb.Close()
	n := cacheguard.New(rdb, append(p.options(), cacheguard.NearCache(10, 30*time.Millisecond))...)
	defer n.Close()
	eventually(t, 10*time.Second, "near cache subscribed", func() bool { return cacheguard.NearTrusted(n) })
	c := &counter{}
	for round := range 5 {
		keys := make([]string, 10)
		for i := range keys {
			keys[i] = testKey(t, fmt.Sprint(round, i))
			if _, err := p.read(ctx, n, keys[i], c.load); err != nil {
				t.Fatal(err)
			}
		}
		start := time.Now()
		eventually(t, time.Second, "the near TTL over", func() bool { return time.Since(start) > 40*time.Millisecond })
		for _, k := range keys {
			if _, err := p.read(ctx, n, k, c.load); err != nil {
				t.Fatal(err)
			}
		}
	}
	if got := cacheguard.NearLen(n); got > 10 {
		t.Fatalf("%d values in a near cache of 10", got)
	}
	tags := make([]string, 200)
	for i := range tags {
		tags[i] = testKey(t, "tag", fmt.Sprint(i))
	}
	heard := cacheguard.NearHeardTags(n)
	if err := g.InvalidateTags(ctx, tags...); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "the tags' messages", func() bool { return cacheguard.NearHeardTags(n) >= heard+uint64(len(tags)) })
	want := 0
	if p.Tagged {
		want = 2 // "t" and "u", which its values carry
	}
	if got := cacheguard.NearTags(n); got > want {
		t.Fatalf("state kept for %d tags, want at most %d", got, want)
	}
}

// failSafeMaxAge: while the database fails, the older value stands in — in
// this process and another — only until its max age past its TTL; then the
// calls fail.
func failSafeMaxAge(t *testing.T, w world, p path) {
	ctx := context.Background()
	const maxAge = 500 * time.Millisecond
	p.TTL, p.FailSafe = 50*time.Millisecond, [2]time.Duration{maxAge, 100 * time.Millisecond}
	key := testKey(t)
	a, rdb := w.guard(t, p)
	b, _ := w.guard(t, p)
	if err := rdb.Set(ctx, dbKey(key), 1, time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	var down atomic.Bool
	load := func(ctx context.Context) (item, error) {
		if down.Load() {
			return item{}, errors.New("db down")
		}
		return versionLoad(rdb, key)(ctx)
	}
	if _, err := p.read(ctx, a, key, load); err != nil {
		t.Fatal(err)
	}
	vals, err := rdb.HGetAll(ctx, valueKey(key)).Result()
	if err != nil || len(vals) != 1 {
		t.Fatalf("values: %d, %v", len(vals), err)
	}
	var freshUntil time.Time
	for _, b := range vals {
		freshUntil = time.UnixMilli(int64(binary.BigEndian.Uint64([]byte(b[4:12]))))
	}
	down.Store(true)
	served := 0
	for i := 0; ; i++ {
		g := []*cacheguard.Guard{a, b}[i%2]
		start := time.Now()
		v, err := p.read(ctx, g, key, load)
		if err != nil {
			break
		}
		if v.ID != 1 {
			t.Fatalf("%v, want the older value", v)
		}
		if late := start.Sub(freshUntil.Add(maxAge)); late >= 0 {
			t.Fatalf("the older value served %v past its max age", late)
		}
		served++
	}
	if served == 0 || time.Until(freshUntil.Add(maxAge)) > 0 {
		t.Fatalf("fail-safe served %d times, calls failing %v before the max age ended", served, time.Until(freshUntil.Add(maxAge)))
	}
}

// failSafeNotBeforeInvalidation is issue 31's item 1 on every path: process
// A reads V0 (expired, within the max age) and waits for the fill of process
// B; the row is written and the key invalidated; A takes the lease over and
// its load fails. Process C, whose read begins after Invalidate returned,
// gets the new version, never V0.
func failSafeNotBeforeInvalidation(t *testing.T, w world, p path) {
	ctx := context.Background()
	p.TTL, p.FailSafe = 50*time.Millisecond, [2]time.Duration{time.Minute, 5 * time.Second}
	key := testKey(t)
	v0, rdb := w.guard(t, p)
	if err := rdb.Set(ctx, dbKey(key), 1, time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	c := w.start(t, p, key)
	if _, err := p.read(ctx, v0, key, versionLoad(rdb, key)); err != nil {
		t.Fatal(err)
	}
	loaded := time.Now()
	eventually(t, time.Second, "V0 expired", func() bool { return time.Since(loaded) > 2*p.TTL })
	b := w.start(t, p, key)
	if _, err := fmt.Fprintln(b.Stdin, "hold"); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "B holding the lease, loading", func() bool { return rdb.Exists(ctx, loadingKey(key)).Val() == 1 })
	a, ra := w.guard(t, p)
	waiting := watchWaiting(ra)
	done := make(chan error, 1)
	go func() {
		_, err := p.read(ctx, a, key, func(context.Context) (item, error) { return item{}, errors.New("db down") })
		done <- err
	}()
	select {
	case <-waiting:
	case <-time.After(30 * time.Second):
		t.Fatal("A never waited for B's fill")
	}
	if err := rdb.Set(ctx, dbKey(key), 2, time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	if err := v0.Invalidate(ctx, key); err != nil {
		t.Fatal(err)
	}
	<-done
	if got := ask(t, c, "get"); got != "got 2" {
		t.Fatalf("a read that began after Invalidate returned: %q, want got 2", got)
	}
}

// boundedHook records every command and pipeline a client sends whose
// context lets it run longer than within (no deadline, or a later one).
type boundedHook struct {
	within time.Duration
	mu     sync.Mutex // guards seen, loose
	seen   map[string]int
	loose  []string
}

func (h *boundedHook) check(ctx context.Context, cmds ...redis.Cmder) {
	dl, ok := ctx.Deadline()
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, c := range cmds {
		switch name := c.Name(); name {
		case "cluster", "hello", "client", "command", "ping": // the client's own
		default:
			h.seen[name]++
			if !ok || time.Until(dl) > h.within {
				h.loose = append(h.loose, fmt.Sprintf("%s (deadline %v away, %v)", name, time.Until(dl).Round(time.Millisecond), ok))
			}
		}
	}
}

func (h *boundedHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *boundedHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.check(ctx, cmd)
		return next(ctx, cmd)
	}
}
func (h *boundedHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.check(ctx, cmds...)
		return next(ctx, cmds)
	}
}

// commandsBounded: every command the Guard sends — reads of hits and misses,
// the get-or-lease script, the store, the lease's renewals during a slow load,
// Invalidate, InvalidateTags — carries a deadline within rcmd.Patience
// command timeouts and rcmd.Slack (the bound while Redis answers, and how much
// later a deadline commands share may be; once it is quiet, the
// command timeout itself: internal/rcmd's tests), so that a stalled Redis
// fails it, and a breaker counts it, within that time, whatever the caller's
// context and budget.
func commandsBounded(t *testing.T, w world, p path) {
	ctx := context.Background()
	const timeout = 2 * time.Second // Patience (2) times it is apart from every other bound (budget and load timeout 10s)
	rdb := w.client()
	t.Cleanup(func() { rdb.Close() })
	h := &boundedHook{within: rcmd.Patience*timeout + rcmd.Slack(timeout), seen: map[string]int{}}
	rdb.AddHook(h)
	g := cacheguard.New(rdb, append(p.options(), cacheguard.CommandTimeout(timeout))...)
	t.Cleanup(func() { g.Close() })
	key := testKey(t)
	slow := func(ctx context.Context) (item, error) {
		select {
		case <-time.After(400 * time.Millisecond): // more than a third of the 300ms lease: renewed
		case <-ctx.Done():
			return item{}, ctx.Err()
		}
		return item{ID: 1}, nil
	}
	for i := range 2 { // a miss, then a hit
		if _, err := p.read(ctx, g, key, slow); err != nil {
			t.Fatalf("read %d: %v", i, err)
		}
	}
	if err := g.Invalidate(ctx, key); err != nil {
		t.Fatal(err)
	}
	if p.Tagged {
		if err := g.InvalidateTags(ctx, invalidateTag); err != nil {
			t.Fatal(err)
		}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.loose) > 0 {
		t.Fatalf("%d commands not bounded by Patience command timeouts (%v): %v (seen %v)", len(h.loose), h.within, h.loose, h.seen)
	}
	t.Logf("commands seen: %v", h.seen)
}
