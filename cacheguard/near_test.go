package cacheguard_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/cacheguard"
	"github.com/cacheguard/cacheguard/internal/childproc"
)

// childNear is a process of the service with a near cache: on "get" it reads
// the key through its Guard and answers "got <version> near" when the near
// cache served it (ReportTo says NearHit), "got <version> redis" otherwise.
func childNear(ctx context.Context, rdb *redis.Client, key string) error {
	g := cacheguard.New(rdb, cacheguard.EarlyRefresh(0), cacheguard.NearCache(100, time.Minute))
	defer g.Close()
	// Ready once the near cache is subscribed and trusted: before that it
	// keeps nothing, and the test's second read would come from Redis (seen
	// under a loaded make test).
	for deadline := time.Now().Add(10 * time.Second); !cacheguard.NearTrusted(g); {
		if time.Now().After(deadline) {
			return fmt.Errorf("near cache not trusted within 10s")
		}
		time.Sleep(time.Millisecond)
	}
	sc := bufio.NewScanner(os.Stdin)
	fmt.Println("ready")
	for sc.Scan() {
		if sc.Text() != "get" {
			return fmt.Errorf("unknown command %q", sc.Text())
		}
		var res cacheguard.Result
		v, err := cacheguard.Get(ctx, g, key, versionLoad(rdb, key), cacheguard.ReportTo(&res))
		if err != nil {
			return err
		}
		from := "redis"
		if res == cacheguard.NearHit {
			from = "near"
		}
		fmt.Println("got", v.ID, from)
	}
	return sc.Err()
}

// TestNearCacheInvalidatedAcrossProcesses: a value in another process's near
// cache is served from memory, and an Invalidate in this process reaches it
// within milliseconds: the next reads there return the new version (first
// from Redis, then from the near cache again).
func TestNearCacheInvalidatedAcrossProcesses(t *testing.T) {
	ctx := context.Background()
	rdb := shared(t)
	key := testKey(t)
	if err := rdb.Set(ctx, dbKey(key), 1, time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	b := startChild(t, "near", childKey+"="+key)
	if line, err := b.Next(30 * time.Second); err != nil || line != "ready" {
		t.Fatalf("child: %q, %v", line, err)
	}
	if got := ask(t, b, "get"); got != "got 1 redis" {
		t.Fatalf("first read: %q", got)
	}
	if got := ask(t, b, "get"); got != "got 1 near" {
		t.Fatalf("second read: %q, want it from the near cache", got)
	}
	a, _ := newGuard(t)
	if err := rdb.Incr(ctx, dbKey(key)).Err(); err != nil {
		t.Fatal(err)
	}
	if err := a.Invalidate(ctx, key); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	var got string
	eventually(t, 5*time.Second, "the invalidation to reach the other process's near cache", func() bool {
		got = ask(t, b, "get")
		return strings.HasPrefix(got, "got 2 ")
	})
	t.Logf("new version seen after %v", time.Since(start))
	eventually(t, 5*time.Second, "the new version near-cached", func() bool { return ask(t, b, "get") == "got 2 near" })

	// A fill in another process reaches it too: this one loads version 3
	// after the entry expires... here, after an invalidation that the child
	// hears, then a fill of this process's that it hears as well.
	if err := rdb.Incr(ctx, dbKey(key)).Err(); err != nil {
		t.Fatal(err)
	}
	if err := a.Invalidate(ctx, key); err != nil {
		t.Fatal(err)
	}
	if v, err := cacheguard.Get(ctx, a, key, versionLoad(rdb, key)); err != nil || v.ID != 3 {
		t.Fatalf("this process's fill: %v, %v", v, err)
	}
	eventually(t, 5*time.Second, "the other process to read version 3", func() bool { return strings.HasPrefix(ask(t, b, "get"), "got 3 ") })
}

// overwrite replaces the stored item of key with id in Redis without any
// message, as a message lost while a subscription was down would leave it.
func overwrite(t *testing.T, rdb *redis.Client, key string, id int) {
	t.Helper()
	ctx := context.Background()
	b, err := rdb.HGet(ctx, valueKey(key), itemField).Bytes()
	if err != nil {
		t.Fatal(err)
	}
	payload, _ := json.Marshal(item{ID: id, Name: "raw"})
	if err := rdb.HSet(ctx, valueKey(key), itemField, append(b[:envHead:envHead], payload...)).Err(); err != nil {
		t.Fatal(err)
	}
}

// TestNearCacheNotTrustedWithoutSubscription: when the near cache's
// subscription is lost (its connection killed), messages may have been lost,
// so the near cache is bypassed and then flushed: the value Redis holds is
// served, not the one remembered.
func TestNearCacheNotTrustedWithoutSubscription(t *testing.T) {
	ctx := context.Background()
	g, rdb := newGuard(t, cacheguard.EarlyRefresh(0), cacheguard.NearCache(100, time.Minute))
	eventually(t, 5*time.Second, "near cache subscribed", func() bool { return cacheguard.NearTrusted(g) })
	key := testKey(t)
	c := &counter{name: "v"}
	for range 2 {
		if _, err := cacheguard.Get(ctx, g, key, c.load); err != nil {
			t.Fatal(err)
		}
	}
	if st := g.Stats(); st.NearHits != 1 {
		t.Fatalf("stats %+v: want the second read from the near cache", st)
	}
	if err := rdb.ClientKillByFilter(ctx, "TYPE", "pubsub").Err(); err != nil {
		t.Fatal(err)
	}
	overwrite(t, rdb, key, 99) // as if its message were lost with the connection
	eventually(t, 5*time.Second, "the value in Redis served", func() bool {
		v, err := cacheguard.Get(ctx, g, key, c.load)
		return err == nil && v.ID == 99
	})
	// Once the subscription is back, the near cache fills again, with what
	// Redis holds.
	eventually(t, 5*time.Second, "near cache trusted again", func() bool {
		before := g.Stats().NearHits
		v, err := cacheguard.Get(ctx, g, key, c.load)
		return err == nil && v.ID == 99 && g.Stats().NearHits > before
	})
}

// TestNearCacheTTLIsASafetyNet: a change that no message announced (here, a
// raw overwrite) is seen once the near cache's own TTL ends.
func TestNearCacheTTLIsASafetyNet(t *testing.T) {
	ctx := context.Background()
	g, rdb := newGuard(t, cacheguard.EarlyRefresh(0), cacheguard.NearCache(100, 200*time.Millisecond))
	eventually(t, 5*time.Second, "near cache subscribed", func() bool { return cacheguard.NearTrusted(g) })
	key := testKey(t)
	c := &counter{name: "v"}
	for range 2 {
		if _, err := cacheguard.Get(ctx, g, key, c.load); err != nil {
			t.Fatal(err)
		}
	}
	overwrite(t, rdb, key, 42)
	start := time.Now()
	eventually(t, 5*time.Second, "the overwritten value", func() bool {
		v, err := cacheguard.Get(ctx, g, key, c.load)
		return err == nil && v.ID == 42
	})
	if took := time.Since(start); took < 100*time.Millisecond {
		t.Logf("seen after %v (the entry was older than its TTL already)", took)
	}
}

// TestNearCacheBounded: the near cache holds at most its number of entries.
func TestNearCacheBounded(t *testing.T) {
	ctx := context.Background()
	g, _ := newGuard(t, cacheguard.EarlyRefresh(0), cacheguard.NearCache(10, time.Minute))
	eventually(t, 5*time.Second, "near cache subscribed", func() bool { return cacheguard.NearTrusted(g) })
	keys := make([]string, 30)
	for i := range keys {
		keys[i] = testKey(t, fmt.Sprint(i))
		if _, err := cacheguard.Get(ctx, g, keys[i], (&counter{}).load); err != nil {
			t.Fatal(err)
		}
	}
	near := 0
	for i := 20; i < 30; i++ {
		before := g.Stats().NearHits
		if _, err := cacheguard.Get(ctx, g, keys[i], (&counter{}).load); err != nil {
			t.Fatal(err)
		}
		if g.Stats().NearHits > before {
			near++
		}
	}
	if near != 10 {
		t.Fatalf("%d of the 10 latest keys near-cached, want 10", near)
	}
	if n := cacheguard.NearLen(g); n != 10 {
		t.Fatalf("%d entries, want at most 10", n)
	}
}

// childWatcher reads the key from its near cache every 100µs and prints
// "saw <version> <unix ns>" the first time it reads each new version.
func childWatcher(ctx context.Context, rdb *redis.Client, key string) error {
	g := cacheguard.New(rdb, cacheguard.EarlyRefresh(0), cacheguard.NearCache(100, time.Minute))
	defer g.Close()
	fmt.Println("ready")
	last := 0
	for {
		v, err := cacheguard.Get(ctx, g, key, versionLoad(rdb, key))
		if err != nil {
			return err
		}
		if v.ID != last {
			last = v.ID
			fmt.Println("saw", v.ID, time.Now().UnixNano())
		}
		time.Sleep(100 * time.Microsecond)
	}
}

// BenchmarkNearInvalidationPropagation measures how long after an
// Invalidate returns every one of 4 other OS processes, each reading the key
// from its near cache every 100µs, first reads the new version (the
// propagation bound of the near cache's read-your-writes).
func BenchmarkNearInvalidationPropagation(b *testing.B) {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer rdb.Close()
	g := cacheguard.New(rdb)
	defer g.Close()
	key := testKey(b)
	if err := rdb.Set(ctx, dbKey(key), 1, time.Hour).Err(); err != nil {
		b.Fatal(err)
	}
	var procs []*childproc.Proc
	for range 4 {
		p := childproc.Start(b, childEnv, "watcher", childAddr+"="+redisAddr, childKey+"="+key)
		if line, err := p.Next(30 * time.Second); err != nil || line != "ready" {
			b.Fatalf("child: %q, %v", line, err)
		}
		procs = append(procs, p)
	}
	seen := func(p *childproc.Proc, version int) time.Time {
		for {
			line, err := p.Next(10 * time.Second)
			if err != nil {
				b.Fatal(err)
			}
			var v int
			var ns int64
			if _, err := fmt.Sscanf(line, "saw %d %d", &v, &ns); err == nil && v == version {
				return time.Unix(0, ns)
			}
		}
	}
	for _, p := range procs {
		seen(p, 1)
	}
	var lags []time.Duration
	version := 1
	b.ResetTimer()
	for b.Loop() {
		version++
		if err := rdb.Set(ctx, dbKey(key), version, time.Hour).Err(); err != nil {
			b.Fatal(err)
		}
		if err := g.Invalidate(ctx, key); err != nil {
			b.Fatal(err)
		}
		returned := time.Now()
		var last time.Duration
		for _, p := range procs {
			last = max(last, seen(p, version).Sub(returned))
		}
		lags = append(lags, last)
		time.Sleep(20 * time.Millisecond) // let the readers settle between rounds
	}
	b.StopTimer()
	slices.Sort(lags)
	pct := func(q float64) time.Duration { return lags[min(len(lags)-1, int(q*float64(len(lags))))] }
	b.ReportMetric(float64(pct(0.5).Microseconds()), "p50-µs")
	b.ReportMetric(float64(pct(0.99).Microseconds()), "p99-µs")
	b.ReportMetric(float64(lags[len(lags)-1].Microseconds()), "max-µs")
}

// holdStore holds the reply of the first script sent with a key's values
// hash as its first key (the store of a fill) once armed, the command having
// run on the server: stored is closed then, and the reply goes on when
// release is closed.
type holdStore struct {
	values  string
	once    sync.Once
	armed   atomic.Bool
	stored  chan struct{}
	release chan struct{}
}

func newHoldStore(key string) *holdStore {
	return &holdStore{values: valueKey(key), stored: make(chan struct{}), release: make(chan struct{})}
}

// arm holds the next store, once.
func (h *holdStore) arm() { h.once.Do(func() { h.armed.Store(true) }) }

func (h *holdStore) isStore(cmd redis.Cmder) bool {
	args := cmd.Args()
	name := cmd.Name()
	return (name == "evalsha" || name == "eval") && len(args) > 3 && args[3] == h.values
}

func (h *holdStore) hold() {
	if h.armed.CompareAndSwap(true, false) {
		close(h.stored)
		<-h.release
	}
}

func (h *holdStore) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *holdStore) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if h.isStore(cmd) {
			h.hold()
		}
		return err
	}
}
func (h *holdStore) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		if slices.ContainsFunc(cmds, h.isStore) {
			h.hold()
		}
		return err
	}
}

// TestNearCacheHearsInvalidationDuringStore (issue 31, item 2): an
// invalidation that another process makes after this process's fill stored
// its value, and whose message reaches this process while the store's reply
// is still on its way, is not missed: the next read does not get the old
// value from the near cache. Get and GetMany.
func TestNearCacheHearsInvalidationDuringStore(t *testing.T) {
	for _, many := range []bool{false, true} {
		t.Run(map[bool]string{false: "Get", true: "GetMany"}[many], func(t *testing.T) {
			ctx := context.Background()
			key := testKey(t)
			rdb := shared(t)
			if err := rdb.Set(ctx, dbKey(key), 1, time.Hour).Err(); err != nil {
				t.Fatal(err)
			}
			q := startChild(t, "writer", childKey+"="+key)
			if line, err := q.Next(30 * time.Second); err != nil || line != "ready" {
				t.Fatalf("child: %q, %v", line, err)
			}
			hook := newHoldStore(key)
			p, prdb := newGuard(t, cacheguard.EarlyRefresh(0), cacheguard.NearCache(100, time.Minute))
			prdb.AddHook(hook)
			eventually(t, 5*time.Second, "near cache subscribed", func() bool { return cacheguard.NearTrusted(p) })
			read := versionLoad(rdb, key)
			load := func(ctx context.Context) (item, error) {
				v, err := read(ctx)
				hook.arm()
				return v, err
			}
			get := func() (item, error) {
				if !many {
					return cacheguard.Get(ctx, p, key, load)
				}
				m, err := cacheguard.GetMany(ctx, p, []string{key}, func(ctx context.Context, keys []string) (map[string]item, error) {
					v, err := load(ctx)
					return map[string]item{key: v}, err
				})
				return m[key], err
			}
			first := make(chan item, 1)
			go func() {
				v, _ := get()
				first <- v
			}()
			<-hook.stored
			heard := cacheguard.NearHeard(p, key)
			if got := ask(t, q, "write"); got != "ok 2" {
				t.Fatalf("writer: %q", got)
			}
			eventually(t, 5*time.Second, "the invalidation's message heard", func() bool { return cacheguard.NearHeard(p, key) > heard })
			close(hook.release)
			if v := <-first; v.ID != 1 {
				t.Fatalf("the fill's own call: %v", v)
			}
			before := p.Stats().NearHits
			v, err := get()
			if err != nil || v.ID != 2 {
				t.Fatalf("a read after the invalidation was heard: %v, %v (near hits %d); want version 2", v, err, p.Stats().NearHits-before)
			}
		})
	}
}

// TestNearCacheBoundedUnderChurn (issue 31, item 4): NearCache(10, 30ms)
// holds at most 10 entries while keys come and go — 10 rounds of 10 new
// keys, each round read again after the near TTL (expired entries are
// replaced) — and keeps no state for tags that none of its entries carries,
// however many tags the fleet invalidates.
func TestNearCacheBoundedUnderChurn(t *testing.T) {
	ctx := context.Background()
	g, _ := newGuard(t, cacheguard.EarlyRefresh(0), cacheguard.NearCache(10, 30*time.Millisecond))
	eventually(t, 5*time.Second, "near cache subscribed", func() bool { return cacheguard.NearTrusted(g) })
	for round := range 10 {
		keys := make([]string, 10)
		for i := range keys {
			keys[i] = testKey(t, fmt.Sprint(round, i))
			if _, err := cacheguard.Get(ctx, g, keys[i], (&counter{}).load); err != nil {
				t.Fatal(err)
			}
		}
		start := time.Now()
		eventually(t, time.Second, "the near TTL over", func() bool { return time.Since(start) > 40*time.Millisecond })
		for _, k := range keys {
			if _, err := cacheguard.Get(ctx, g, k, (&counter{}).load); err != nil {
				t.Fatal(err)
			}
		}
	}
	if n := cacheguard.NearLen(g); n > 10 {
		t.Errorf("%d entries in a near cache of 10", n)
	}
	// Another process invalidates 1000 tags that nothing here carries.
	b, _ := newGuard(t)
	last := testKey(t, "last")
	heard := cacheguard.NearHeard(g, last)
	tags := make([]string, 1000)
	for i := range tags {
		tags[i] = testKey(t, "tag", fmt.Sprint(i))
	}
	if err := b.InvalidateTags(ctx, tags...); err != nil {
		t.Fatal(err)
	}
	if err := b.Invalidate(ctx, last); err != nil { // heard after the tags' messages
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "the messages heard", func() bool { return cacheguard.NearHeard(g, last) > heard })
	if n := cacheguard.NearTags(g); n > 0 {
		t.Errorf("state kept for %d tags that no entry carries", n)
	}
}

// TestNearCacheReportsInvalidations: a key another Guard invalidates is
// reported as dropped, to the observer (EventNearInvalidated, with the key)
// and in Stats.
func TestNearCacheReportsInvalidations(t *testing.T) {
	ctx := context.Background()
	rdb := shared(t)
	key := testKey(t)
	heard := make(chan string, 10)
	b := cacheguard.New(rdb, cacheguard.NearCache(100, time.Minute), cacheguard.Observer(func(_ context.Context, e cacheguard.Event) {
		if e.Kind == cacheguard.EventNearInvalidated {
			heard <- e.Key
		}
	}))
	defer b.Close()
	eventually(t, 10*time.Second, "the near cache trusted", func() bool { return cacheguard.NearTrusted(b) })
	a, _ := newGuard(t)
	if err := a.Invalidate(ctx, key); err != nil {
		t.Fatal(err)
	}
	select {
	case k := <-heard:
		if k != key {
			t.Fatalf("EventNearInvalidated for %q, want %q", k, key)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no EventNearInvalidated within 10s")
	}
	if n := b.Stats().NearInvalidations; n != 1 {
		t.Fatalf("Stats().NearInvalidations = %d, want 1", n)
	}
}
