package cacheguard_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/cacheguard"
	"github.com/cacheguard/cacheguard/internal/redistest"
)

// childTagged is a process with a near cache that reads the key as a list
// tagged "repos" ("get"), answering "got <version> near|redis".
func childTagged(ctx context.Context, rdb *redis.Client, key string) error {
	g := cacheguard.New(rdb, cacheguard.EarlyRefresh(0), cacheguard.NearCache(100, time.Minute))
	defer g.Close()
	sc := bufio.NewScanner(os.Stdin)
	fmt.Println("ready")
	for sc.Scan() {
		before := g.Stats().NearHits
		v, err := cacheguard.Get(ctx, g, key, versionLoad(rdb, key), cacheguard.Tags("repos", key))
		if err != nil {
			return err
		}
		from := "redis"
		if g.Stats().NearHits > before {
			from = "near"
		}
		fmt.Println("got", v.ID, from)
	}
	return sc.Err()
}

// TestInvalidateTagsAcrossProcesses: a list tagged "repos" in another process
// (near-cached there) is voided by InvalidateTags("repos") here: the other
// process's next reads return the new version, first from Redis, then from
// its near cache again. A value with other tags stays.
func TestInvalidateTagsAcrossProcesses(t *testing.T) {
	ctx := context.Background()
	rdb := shared(t)
	key := testKey(t)
	if err := rdb.Set(ctx, dbKey(key), 1, time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	b := startChild(t, "tagged", childKey+"="+key)
	if line, err := b.Next(30 * time.Second); err != nil || line != "ready" {
		t.Fatalf("child: %q, %v", line, err)
	}
	ask(t, b, "get")
	eventually(t, 5*time.Second, "the list near-cached", func() bool { return ask(t, b, "get") == "got 1 near" })

	a, _ := newGuard(t)
	other := testKey(t, "other")
	c := &counter{name: "other"}
	if _, err := cacheguard.Get(ctx, a, other, c.load, cacheguard.Tags("orgs")); err != nil {
		t.Fatal(err)
	}
	if err := rdb.Incr(ctx, dbKey(key)).Err(); err != nil {
		t.Fatal(err)
	}
	if err := a.InvalidateTags(ctx, "repos"); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "the other process to read version 2", func() bool { return strings.HasPrefix(ask(t, b, "get"), "got 2 ") })
	eventually(t, 5*time.Second, "version 2 near-cached", func() bool { return ask(t, b, "get") == "got 2 near" })
	var res cacheguard.Result
	if _, err := cacheguard.Get(ctx, a, other, c.load, cacheguard.Tags("orgs"), cacheguard.ReportTo(&res)); err != nil || res != cacheguard.Hit {
		t.Fatalf("a value tagged orgs after InvalidateTags(repos): %v, %v; want a hit", err, res)
	}
	// In this process: a Get that begins after InvalidateTags returned loads
	// again; one with other tags, or none, keeps its own entry.
	if err := a.InvalidateTags(ctx, "orgs"); err != nil {
		t.Fatal(err)
	}
	if v, err := cacheguard.Get(ctx, a, other, c.load, cacheguard.Tags("orgs"), cacheguard.ReportTo(&res)); err != nil || res != cacheguard.Miss || v.ID != 2 {
		t.Fatalf("after InvalidateTags(orgs): %v, %v, %v; want a new load", v, err, res)
	}
}

// TestTagInvalidationDuringLoad: a load that began before InvalidateTags is
// not served to a call that began after it returned, even when that call
// finds the load still running in its process (tags do not move the key's
// generation, so it may join that flight: its outcome is then refused and
// loaded again). The value that load stores is stale for every later read.
func TestTagInvalidationDuringLoad(t *testing.T) {
	ctx := context.Background()
	g, rdb := newGuard(t, cacheguard.EarlyRefresh(0))
	key := testKey(t)
	if err := rdb.Set(ctx, dbKey(key), 1, time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	read := versionLoad(rdb, key)
	var stalled atomic.Bool
	entered, release := make(chan struct{}), make(chan struct{})
	load := func(ctx context.Context) (item, error) {
		v, err := read(ctx)
		if stalled.CompareAndSwap(false, true) {
			close(entered)
			<-release
		}
		return v, err
	}
	first := make(chan item, 1)
	go func() {
		v, _ := cacheguard.Get(ctx, g, key, load, cacheguard.Tags("repos"))
		first <- v
	}()
	<-entered // read version 1, stalled
	if err := rdb.Incr(ctx, dbKey(key)).Err(); err != nil {
		t.Fatal(err)
	}
	if err := g.InvalidateTags(ctx, "repos"); err != nil {
		t.Fatal(err)
	}
	misses := g.Stats().Misses
	second := make(chan item, 1)
	go func() {
		v, _ := cacheguard.Get(ctx, g, key, load, cacheguard.Tags("repos"))
		second <- v
	}()
	eventually(t, 10*time.Second, "the second Get to miss", func() bool { return g.Stats().Misses > misses })
	close(release)
	if v := <-first; v.ID != 1 {
		t.Fatalf("first Get: %v", v)
	}
	if v := <-second; v.ID != 2 {
		t.Fatalf("a Get that began after InvalidateTags returned: version %d, want 2", v.ID)
	}
	var res cacheguard.Result
	if v, err := cacheguard.Get(ctx, g, key, load, cacheguard.Tags("repos"), cacheguard.ReportTo(&res)); err != nil || v.ID != 2 {
		t.Fatalf("later read: %v, %v, %v; want version 2", v, err, res)
	}
}

// On a Redis Cluster each tag's version is in its own slot: InvalidateTags
// and tagged reads span slots without CROSSSLOT.
func TestClusterTags(t *testing.T) {
	ctx := context.Background()
	cl := redistest.StartCluster(t)
	g := cacheguard.New(cl.Client())
	defer g.Close()
	tags := []string{"repos", "orgs", "users:7", "a}b"}
	keys := []string{testKey(t, "1"), testKey(t, "2"), testKey(t, "3")}
	for _, k := range keys {
		if _, err := cacheguard.Get(ctx, g, k, (&counter{name: "v1"}).load, cacheguard.Tags(tags...)); err != nil {
			t.Fatal(err)
		}
	}
	if err := g.InvalidateTags(ctx, "users:7"); err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		var res cacheguard.Result
		if v, err := cacheguard.Get(ctx, g, k, (&counter{name: "v2"}).load, cacheguard.Tags(tags...), cacheguard.ReportTo(&res)); err != nil || v.Name != "v2" || res != cacheguard.Miss {
			t.Fatalf("%s after InvalidateTags: %v, %v, %v", k, v, err, res)
		}
		if v, err := cacheguard.Get(ctx, g, k, (&counter{name: "v3"}).load, cacheguard.Tags(tags...), cacheguard.ReportTo(&res)); err != nil || v.Name != "v2" || res != cacheguard.Hit {
			t.Fatalf("%s: %v, %v, %v; want a hit", k, v, err, res)
		}
	}
	if st := g.Stats(); st.RedisErrors != 0 || st.FailOpenLoads != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// TestTagsHoldOnEveryPath (issue 31, item 3): after InvalidateTags("repos")
// returned, no path serves a value loaded under Tags("repos") before it —
// neither a tagged Get nor an untagged one, nor GetMany with or without the
// tags (GetMany takes Tags as Get does).
func TestTagsHoldOnEveryPath(t *testing.T) {
	ctx := context.Background()
	g, rdb := newGuard(t, cacheguard.EarlyRefresh(0))
	b, _ := newGuard(t) // another process
	tags := cacheguard.Tags("repos")
	type path func(key string, load func(context.Context) (item, error)) (item, error)
	many := func(opts ...cacheguard.CallOption) path {
		return func(key string, load func(context.Context) (item, error)) (item, error) {
			m, err := cacheguard.GetMany(ctx, g, []string{key}, func(ctx context.Context, keys []string) (map[string]item, error) {
				v, err := load(ctx)
				return map[string]item{key: v}, err
			}, opts...)
			return m[key], err
		}
	}
	paths := map[string]path{
		"Get, tagged": func(key string, load func(context.Context) (item, error)) (item, error) {
			return cacheguard.Get(ctx, g, key, load, tags)
		},
		"Get, untagged": func(key string, load func(context.Context) (item, error)) (item, error) {
			return cacheguard.Get(ctx, g, key, load)
		},
		"GetMany, tagged":   many(tags),
		"GetMany, untagged": many(),
	}
	for name, get := range paths {
		for fillerName, fill := range map[string]path{"Get": paths["Get, tagged"], "GetMany": paths["GetMany, tagged"]} {
			key := testKey(t)
			if err := rdb.Set(ctx, dbKey(key), 1, time.Hour).Err(); err != nil {
				t.Fatal(err)
			}
			load := versionLoad(rdb, key)
			if v, err := fill(key, load); err != nil || v.ID != 1 {
				t.Fatalf("tagged %s: %v, %v", fillerName, v, err)
			}
			if err := rdb.Incr(ctx, dbKey(key)).Err(); err != nil {
				t.Fatal(err)
			}
			if err := b.InvalidateTags(ctx, "repos"); err != nil {
				t.Fatal(err)
			}
			if v, err := get(key, load); err != nil || v.ID != 2 {
				t.Errorf("%s after InvalidateTags (the value loaded by a tagged %s before it): %v, %v; want version 2", name, fillerName, v, err)
			}
		}
	}
}
