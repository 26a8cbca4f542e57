package cacheguard_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/singleflight"

	"github.com/cacheguard/cacheguard/cacheguard"
)

// BenchmarkGetHit measures the hit path; compare with BenchmarkRawGetJSON,
// a plain go-redis GET and JSON decode of the same value.
func BenchmarkGetHit(b *testing.B) { benchGetHit(b, &redis.Options{Addr: redisAddr}) }

// BenchmarkGetHitContextTimeout is BenchmarkGetHit with a client that bounds
// its socket calls by the context's deadline (ContextTimeoutEnabled), on which
// a Get reads on its own goroutine instead of handing the read over.
func BenchmarkGetHitContextTimeout(b *testing.B) {
	benchGetHit(b, &redis.Options{Addr: redisAddr, ContextTimeoutEnabled: true})
}

func benchGetHit(b *testing.B, opt *redis.Options) {
	ctx := context.Background()
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	cc := &commandCount{}
	rdb.AddHook(cc)
	defer func() { b.ReportMetric(float64(cc.n.Load())/float64(b.N), "requests/op") }()
	g := cacheguard.New(rdb, cacheguard.TTL(time.Hour), cacheguard.EarlyRefresh(0))
	defer g.Close()
	key := testKey(b)
	load := func(context.Context) (Repo, error) { return Repo{ID: 42, Name: "cacheguard"}, nil }
	if _, err := cacheguard.Get(ctx, g, key, load); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	defer reportCPU(b)()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := cacheguard.Get(ctx, g, key, load); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	if st := g.Stats(); st.Loads != 1 {
		b.Fatalf("loads = %d during a hit benchmark", st.Loads)
	}
}

func BenchmarkRawGetJSON(b *testing.B) {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer rdb.Close()
	key := testKey(b)
	raw, _ := json.Marshal(Repo{ID: 42, Name: "cacheguard"})
	if err := rdb.Set(ctx, key, raw, time.Hour).Err(); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	defer reportCPU(b)()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			bs, err := rdb.Get(ctx, key).Bytes()
			var r Repo
			if err == nil {
				err = json.Unmarshal(bs, &r)
			}
			if err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// reportCPU reports the benchmark process's CPU time and context switches
// (voluntary and not) per operation; CPU time is
// steadier than wall time on a machine shared with other work (the network
// round trip dominates wall time and is the same for both benchmarks).
func reportCPU(b *testing.B) func() {
	var start syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &start)
	return func() {
		var end syscall.Rusage
		syscall.Getrusage(syscall.RUSAGE_SELF, &end)
		cpu := time.Duration(end.Utime.Nano() + end.Stime.Nano() - start.Utime.Nano() - start.Stime.Nano())
		b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/op")
		b.ReportMetric(float64(end.Nvcsw+end.Nivcsw-start.Nvcsw-start.Nivcsw)/float64(b.N), "ctxsw/op")
	}
}

// BenchmarkGetHitKeys is the warm scenario of benchmarks/: 16 goroutines (on
// GOMAXPROCS 2) reading 1000 warm keys round-robin; compare with
// BenchmarkRawGetJSONKeys. Without ContextTimeoutEnabled each read is handed
// to a worker of the Guard's.
func BenchmarkGetHitKeys(b *testing.B) { benchGetHitKeys(b, &redis.Options{Addr: redisAddr}) }

// BenchmarkGetHitKeysContextTimeout is BenchmarkGetHitKeys on a client with
// ContextTimeoutEnabled, on which a Get reads on its own goroutine; compare
// with BenchmarkRawGetJSONKeysBounded.
func BenchmarkGetHitKeysContextTimeout(b *testing.B) {
	benchGetHitKeys(b, &redis.Options{Addr: redisAddr, ContextTimeoutEnabled: true})
}

// BenchmarkGetHitKeysTimeouts400ms is BenchmarkGetHitKeys on a client
// without ContextTimeoutEnabled whose ReadTimeout and WriteTimeout (400ms
// each) fit within the command timeout's bound, so a Get reads on its own
// goroutine; compare with BenchmarkRawGetJSONKeys.
func BenchmarkGetHitKeysTimeouts400ms(b *testing.B) {
	benchGetHitKeys(b, &redis.Options{Addr: redisAddr, ReadTimeout: 400 * time.Millisecond, WriteTimeout: 400 * time.Millisecond})
}

// BenchmarkGetHitKeysRequestContext is BenchmarkGetHitKeysContextTimeout
// under a context that can be cancelled, as a request's is (and the
// benchmarks/ harness's).
func BenchmarkGetHitKeysRequestContext(b *testing.B) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	b.Run("ContextTimeoutEnabled", func(b *testing.B) {
		benchGetHitKeysCtx(ctx, b, &redis.Options{Addr: redisAddr, ContextTimeoutEnabled: true})
	})
	b.Run("Timeouts400ms", func(b *testing.B) {
		benchGetHitKeysCtx(ctx, b, &redis.Options{Addr: redisAddr, ReadTimeout: 400 * time.Millisecond, WriteTimeout: 400 * time.Millisecond})
	})
}

// BenchmarkGetHitKeysMsgPack is BenchmarkGetHitKeysContextTimeout with the
// MsgPack codec.
func BenchmarkGetHitKeysMsgPack(b *testing.B) {
	benchGetHitKeysCtx(context.Background(), b, &redis.Options{Addr: redisAddr, ContextTimeoutEnabled: true},
		cacheguard.Encoding(cacheguard.MsgPack{}))
}

func benchGetHitKeys(b *testing.B, opt *redis.Options) {
	benchGetHitKeysCtx(context.Background(), b, opt)
}

func benchGetHitKeysCtx(ctx context.Context, b *testing.B, opt *redis.Options, opts ...cacheguard.Option) {
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	g := cacheguard.New(rdb, append([]cacheguard.Option{cacheguard.TTL(time.Hour), cacheguard.EarlyRefresh(0)}, opts...)...)
	defer g.Close()
	keys := make([]string, 1000)
	load := func(context.Context) (Repo, error) { return Repo{ID: 42, Name: "cacheguard"}, nil }
	for i := range keys {
		keys[i] = testKey(b, strconv.Itoa(i))
		if _, err := cacheguard.Get(ctx, g, keys[i], load); err != nil {
			b.Fatal(err)
		}
	}
	var next atomic.Uint64
	b.ReportAllocs()
	defer reportCPU(b)()
	b.SetParallelism(8)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := cacheguard.Get(ctx, g, keys[next.Add(1)%1000], load); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

func BenchmarkRawGetJSONKeys(b *testing.B) { benchRawGetJSONKeys(b, false) }

// BenchmarkRawGetJSONKeysBounded is BenchmarkRawGetJSONKeys with each GET
// bounded as a Get bounds its read: under a context whose deadline is the
// command timeout away (5 s), on a client with ContextTimeoutEnabled. The
// context's timer, made and stopped on every read, is most of what a hit
// costs beyond an unbounded GET.
func BenchmarkRawGetJSONKeysBounded(b *testing.B) { benchRawGetJSONKeys(b, true) }

func benchRawGetJSONKeys(b *testing.B, bounded bool) {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr, ContextTimeoutEnabled: bounded})
	defer rdb.Close()
	keys := make([]string, 1000)
	raw, _ := json.Marshal(Repo{ID: 42, Name: "cacheguard"})
	for i := range keys {
		keys[i] = testKey(b, strconv.Itoa(i))
		if err := rdb.Set(ctx, keys[i], raw, time.Hour).Err(); err != nil {
			b.Fatal(err)
		}
	}
	var next atomic.Uint64
	b.ReportAllocs()
	defer reportCPU(b)()
	b.SetParallelism(8)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			rctx, cancel := ctx, context.CancelFunc(func() {})
			if bounded {
				rctx, cancel = context.WithTimeout(ctx, 5*time.Second)
			}
			bs, err := rdb.Get(rctx, keys[next.Add(1)%1000]).Bytes()
			cancel()
			var r Repo
			if err == nil {
				err = json.Unmarshal(bs, &r)
			}
			if err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// commandCount is a go-redis hook that counts commands.
type commandCount struct{ n atomic.Int64 }

func (h *commandCount) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *commandCount) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.n.Add(int64(len(cmds)))
		return next(ctx, cmds)
	}
}
func (h *commandCount) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { h.n.Add(1); return next(ctx, cmd) }
}

// BenchmarkGetNearHit is a warm hit served from the near cache, 16 goroutines
// (on GOMAXPROCS 2) over 1 and 1000 keys; compare with BenchmarkRawGetJSONKeys.
func BenchmarkGetNearHit(b *testing.B) {
	for _, n := range []int{1, 1000} {
		b.Run(strconv.Itoa(n), func(b *testing.B) {
			ctx := context.Background()
			rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
			defer rdb.Close()
			g := cacheguard.New(rdb, cacheguard.TTL(time.Hour), cacheguard.EarlyRefresh(0), cacheguard.NearCache(10000, time.Hour))
			defer g.Close()
			for !cacheguard.NearTrusted(g) {
				time.Sleep(time.Millisecond)
			}
			keys := make([]string, n)
			load := func(context.Context) (Repo, error) { return Repo{ID: 42, Name: "cacheguard"}, nil }
			for i := range keys {
				keys[i] = testKey(b, strconv.Itoa(i))
				if _, err := cacheguard.Get(ctx, g, keys[i], load); err != nil {
					b.Fatal(err)
				}
			}
			var next atomic.Uint64
			b.ReportAllocs()
			b.SetParallelism(8)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				i := next.Add(1) * 7919
				for pb.Next() {
					i++
					if _, err := cacheguard.Get(ctx, g, keys[i%uint64(n)], load); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.StopTimer()
			// On a starved host the near cache's proof of its subscription
			// can come late, and reads go to Redis until it does: the share
			// says how much of the figure is near hits.
			share := float64(g.Stats().NearHits) / float64(b.N)
			b.ReportMetric(share, "near-hits/read")
			if share < 0.9 {
				b.Fatalf("%.2f near hits per read: the figure is not the near cache's", share)
			}
		})
	}
}

// BenchmarkGetMany100 reads 100 warm keys with one GetMany; compare with
// BenchmarkGet100Sequential, the same keys with 100 Gets in a row.
func BenchmarkGetMany100(b *testing.B) { benchMany(b, true) }

// BenchmarkGet100Sequential: see BenchmarkGetMany100.
func BenchmarkGet100Sequential(b *testing.B) { benchMany(b, false) }

func benchMany(b *testing.B, batch bool) {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer rdb.Close()
	g := cacheguard.New(rdb, cacheguard.TTL(time.Hour), cacheguard.EarlyRefresh(0))
	defer g.Close()
	keys := make([]string, 100)
	for i := range keys {
		keys[i] = testKey(b, strconv.Itoa(i))
	}
	loadMany := func(_ context.Context, ks []string) (map[string]Repo, error) {
		m := map[string]Repo{}
		for _, k := range ks {
			m[k] = Repo{ID: 42, Name: "cacheguard"}
		}
		return m, nil
	}
	if _, err := cacheguard.GetMany(ctx, g, keys, loadMany); err != nil {
		b.Fatal(err)
	}
	load := func(context.Context) (Repo, error) { return Repo{ID: 42, Name: "cacheguard"}, nil }
	b.ReportAllocs()
	defer reportCPU(b)()
	b.ResetTimer()
	for b.Loop() {
		if batch {
			if m, err := cacheguard.GetMany(ctx, g, keys, loadMany); err != nil || len(m) != 100 {
				b.Fatal(len(m), err)
			}
			continue
		}
		for _, k := range keys {
			if _, err := cacheguard.Get(ctx, g, k, load); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.StopTimer()
	if st := g.Stats(); st.Loads != 1 {
		b.Fatalf("%d loads", st.Loads)
	}
}

// BenchmarkColdMiss is one cold Get after another on one goroutine, each of
// a key nobody asked for before, with a loader that returns at once: the
// cold path's own cost (a read, the get-or-lease script, the store), with
// its context switches and CPU per Get (see reportCPU).
func BenchmarkColdMiss(b *testing.B) {
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr, ContextTimeoutEnabled: true})
	defer rdb.Close()
	g := cacheguard.New(rdb, cacheguard.TTL(time.Hour), cacheguard.EarlyRefresh(0))
	defer g.Close()
	prefix := testKey(b)
	load := func(context.Context) (Repo, error) { return Repo{ID: 42, Name: "cacheguard"}, nil }
	b.ReportAllocs()
	defer reportCPU(b)()
	for i := 0; b.Loop(); i++ {
		if _, err := cacheguard.Get(context.Background(), g, prefix+strconv.Itoa(i), load); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkColdBurst is the cold-key stampede within one process: 128
// goroutines, started before the burst as a server's connection goroutines
// are, ask for one cold key at once; one loads it (in 5 ms), the others wait
// for it. cpu-ns/op is the process's CPU per burst; compare with
// BenchmarkColdBurstSingleflight, which coordinates nothing across
// processes.
func BenchmarkColdBurst(b *testing.B) {
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr, ContextTimeoutEnabled: true})
	defer rdb.Close()
	g := cacheguard.New(rdb, cacheguard.TTL(time.Hour), cacheguard.EarlyRefresh(0))
	defer g.Close()
	load := func(context.Context) (Repo, error) { return burstLoad(), nil }
	prefix := testKey(b)
	burst(b, func(ctx context.Context, i int) error {
		_, err := cacheguard.Get(ctx, g, prefix+strconv.Itoa(i), load)
		return err
	})
}

// BenchmarkColdBurstSingleflight is BenchmarkColdBurst with a
// golang.org/x/sync/singleflight group and no Redis.
func BenchmarkColdBurstSingleflight(b *testing.B) {
	var sf singleflight.Group
	burst(b, func(ctx context.Context, i int) error {
		_, err, _ := sf.Do(strconv.Itoa(i), func() (any, error) { return burstLoad(), nil })
		return err
	})
}

// burstLoad is the load of a burst: 5 ms, so that every call of the burst
// arrives while it runs.
func burstLoad() Repo {
	time.Sleep(5 * time.Millisecond)
	return Repo{ID: 42, Name: "cacheguard"}
}

// burst runs b.N bursts of 128 concurrent calls of get(ctx, burst number)
// on goroutines that live across bursts.
func burst(b *testing.B, get func(ctx context.Context, i int) error) {
	followBurst(b, func(int) {}, get, func(int) {})
}

// warmRecord is the value of the warm scenario of benchmarks/ (systems.Repo):
// about 300 bytes as JSON.
type warmRecord struct {
	ID          int64    `json:"id" msgpack:"id"`
	Owner       string   `json:"owner" msgpack:"owner"`
	Name        string   `json:"name" msgpack:"name"`
	Description string   `json:"description" msgpack:"description"`
	Stars       int      `json:"stars" msgpack:"stars"`
	Forks       int      `json:"forks" msgpack:"forks"`
	Topics      []string `json:"topics" msgpack:"topics"`
	UpdatedAt   int64    `json:"updated_at" msgpack:"updated_at"`
}

// BenchmarkCodecUnmarshal decodes the warm scenario's record and the Repo
// of these benchmarks with each Codec, as a hit does.
func BenchmarkCodecUnmarshal(b *testing.B) {
	rec := warmRecord{ID: 42, Owner: "cacheguard", Name: "cacheguard",
		Description: "Redis locks and a cache-stampede guard that stay correct under crashes, pauses and failover.",
		Stars:       4242, Forks: 137, Topics: []string{"redis", "cache", "lock", "go", "stampede"}, UpdatedAt: 1_700_000_000}
	for _, cd := range []cacheguard.Codec{cacheguard.JSON{}, cacheguard.MsgPack{}} {
		name := strings.TrimPrefix(fmt.Sprintf("%T", cd), "cacheguard.")
		b.Run(name+"/record", func(b *testing.B) { benchUnmarshal[warmRecord](b, cd, rec) })
		b.Run(name+"/Repo", func(b *testing.B) { benchUnmarshal[Repo](b, cd, Repo{ID: 42, Name: "cacheguard"}) })
	}
}

func benchUnmarshal[T any](b *testing.B, cd cacheguard.Codec, v T) {
	data, err := cd.Marshal(v)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		var out T
		if err := cd.Unmarshal(data, &out); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(len(data)), "bytes")
}

// BenchmarkFollowBurst is the cold-key stampede as a process that does not
// load sees it: another process (a second Guard on its own client) holds the
// fill lease; 128 goroutines ask for the key, wait for the other's load, and
// are served its push. cpu-ns/op is the process's CPU per burst (both Guards:
// the loader's fill is one script); compare with
// BenchmarkFollowBurstSingleflight, where the 128 wait for a load in their
// own process.
func BenchmarkFollowBurst(b *testing.B) {
	opts := &redis.Options{Addr: redisAddr, ContextTimeoutEnabled: true}
	ra, rb := redis.NewClient(opts), redis.NewClient(opts)
	defer ra.Close()
	defer rb.Close()
	ga := cacheguard.New(ra, cacheguard.TTL(time.Hour), cacheguard.EarlyRefresh(0))
	defer ga.Close()
	gb := cacheguard.New(rb, cacheguard.TTL(time.Hour), cacheguard.EarlyRefresh(0))
	defer gb.Close()
	prefix := testKey(b)
	ctx := context.Background()
	var loading chan struct{}
	var release chan struct{}
	loadA := func(context.Context) (Repo, error) {
		close(loading)
		<-release
		return Repo{ID: 42, Name: "cacheguard"}, nil
	}
	loadB := func(context.Context) (Repo, error) { return Repo{}, fmt.Errorf("the follower loaded") }
	var filled sync.WaitGroup
	followBurst(b, func(i int) { // before the burst: the other process takes the lease
		loading, release = make(chan struct{}), make(chan struct{})
		filled.Go(func() {
			if _, err := cacheguard.Get(ctx, ga, prefix+strconv.Itoa(i), loadA); err != nil {
				b.Error(err)
			}
		})
		<-loading
	}, func(ctx context.Context, i int) error {
		_, err := cacheguard.Get(ctx, gb, prefix+strconv.Itoa(i), loadB)
		return err
	}, func(i int) { // every call waits: the other process's load ends
		err := waitFollowing(rb, gb, prefix+strconv.Itoa(i), uint64(128*(i+1)))
		close(release) // whatever happened: Close waits for the load
		if err != nil {
			b.Fatal(err)
		}
	})
	filled.Wait()
}

// BenchmarkFollowBurstSingleflight is BenchmarkFollowBurst with a
// golang.org/x/sync/singleflight group and no Redis: the 128 wait for a load
// of their own process.
func BenchmarkFollowBurstSingleflight(b *testing.B) {
	var sf singleflight.Group
	var release chan struct{}
	var waiting atomic.Int64
	followBurst(b, func(int) { release = make(chan struct{}) }, func(_ context.Context, i int) error {
		waiting.Add(1)
		_, err, _ := sf.Do(strconv.Itoa(i), func() (any, error) { <-release; return Repo{ID: 42, Name: "cacheguard"}, nil })
		return err
	}, func(i int) {
		for waiting.Load() < int64(128*(i+1)) {
			time.Sleep(50 * time.Microsecond)
		}
		close(release)
	})
}

// waitFollowing waits until g's calls have all found key missing (misses in
// all) and g's flight of key has subscribed to its wake-up channel. (The
// polling's round trips count in the benchmark's CPU: a few per burst.)
func waitFollowing(rdb *redis.Client, g *cacheguard.Guard, key string, misses uint64) error {
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(200 * time.Microsecond) {
		if time.Now().After(deadline) {
			return fmt.Errorf("the calls for %s did not all wait (%+v)", key, g.Stats())
		}
		if g.Stats().Misses < misses {
			continue
		}
		chs, err := rdb.PubSubChannels(context.Background(), "*fw:*").Result()
		if err != nil {
			return err
		}
		if slices.ContainsFunc(chs, func(c string) bool { return strings.Contains(c, key) }) {
			return nil
		}
	}
}

// followBurst runs b.N bursts of 128 concurrent calls of get(ctx, burst
// number) on goroutines that live across bursts, calling before(i) ahead of
// each burst and during(i) once its calls have been started.
func followBurst(b *testing.B, before func(i int), get func(ctx context.Context, i int) error, during func(i int)) {
	const n = 128
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	starts := make([]chan int, n)
	var done sync.WaitGroup
	var failed atomic.Int64
	var stopped sync.WaitGroup
	for w := range starts {
		starts[w] = make(chan int)
		stopped.Go(func() {
			for i := range starts[w] {
				// A context per call, as a server's requests have: no
				// channel shared by the callers but the ones the library
				// makes.
				cctx, ccancel := context.WithCancel(ctx)
				if err := get(cctx, i); err != nil {
					failed.Add(1)
				}
				ccancel()
				done.Done()
			}
		})
	}
	defer func() {
		for _, c := range starts {
			close(c)
		}
		stopped.Wait()
	}()
	b.ReportAllocs()
	defer reportCPU(b)()
	b.ResetTimer()
	for i := range b.N {
		before(i)
		done.Add(n)
		for _, c := range starts {
			c <- i
		}
		during(i)
		done.Wait()
	}
	b.StopTimer()
	if f := failed.Load(); f > 0 {
		b.Fatalf("%d calls failed", f)
	}
}
