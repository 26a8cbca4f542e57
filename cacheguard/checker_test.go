package cacheguard_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/cacheguard"
	"github.com/cacheguard/cacheguard/internal/childproc"
)

// The randomized read-your-writes checker: several OS processes, each with
// readers and a writer on a few keys. A write commits the next version of a
// key's row (INCR), invalidates the key, then acknowledges the version (the
// largest acknowledged so far is kept). A read notes, when it begins, the
// largest acknowledged version and the largest version a read of this
// process that already returned got from Redis (a Hit), then calls Get with a
// loader that reads the row (slowly, so that loads and invalidations
// overlap). It must return neither less than the acknowledged version (stale)
// nor less than that Hit (backwards: a stored value was loaded after every
// invalidation of its generation, and a later read must not return one loaded
// before them).
//
// A value served without being stored does not count for backwards: a load
// that an invalidation overtook (its store refused), or one run fail-open, may
// have read a write whose invalidation has not returned yet, newer than the
// cached value a later read is served (the package documentation,
// Consistency, states that window; a run found it in 1 of 25 5-second runs,
// a MISS serving 136 from a refused store and the next read hitting 135, with
// the write of 136 not yet invalidated).

// ackScript keeps the largest acknowledged version.
var ackScript = redis.NewScript(`
local cur = tonumber(redis.call('GET', KEYS[1]) or '0')
if tonumber(ARGV[1]) > cur then redis.call('SET', KEYS[1], ARGV[1], 'PX', 600000) end
return 1`)

func ackKey(key string) string { return "test:ack:" + key }

// checkerKeys are the keys of a checker run.
func checkerKeys(base string) []string {
	keys := make([]string, 3)
	for i := range keys {
		keys[i] = base + ":" + strconv.Itoa(i)
	}
	return keys
}

// checkResult counts a process's reads, writes and violations.
type checkResult struct {
	reads, writes, stale, backwards, errs int
	example                               string
}

// runChecker runs readers and one writer on keys for d, reading through get,
// writing with invalidate.
func runChecker(ctx context.Context, rdb redis.UniversalClient, keys []string, readers int, d time.Duration,
	get func(ctx context.Context, key string) (int64, cacheguard.Result, error), invalidate func(ctx context.Context, key string) error) checkResult {
	var mu sync.Mutex
	var res checkResult
	served := map[string]int64{} // per key: the largest version a returned read got from Redis
	stop := time.Now().Add(d)
	var wg sync.WaitGroup
	wg.Go(func() {
		for time.Now().Before(stop) {
			key := keys[rand.IntN(len(keys))]
			v, err := rdb.Incr(ctx, dbKey(key)).Result()
			if err == nil {
				err = invalidate(ctx, key)
			}
			if err == nil {
				err = ackScript.Run(ctx, rdb, []string{ackKey(key)}, v).Err()
			}
			mu.Lock()
			if err != nil {
				res.errs++
				res.example = "write: " + err.Error()
			} else {
				res.writes++
			}
			mu.Unlock()
			time.Sleep(time.Duration(rand.IntN(3000)) * time.Microsecond) // paces the writes; nothing waits on it
		}
	})
	for range readers {
		wg.Go(func() {
			for time.Now().Before(stop) {
				key := keys[rand.IntN(len(keys))]
				acked, err := rdb.Get(ctx, ackKey(key)).Int64()
				if err != nil && err != redis.Nil {
					mu.Lock()
					res.errs++
					mu.Unlock()
					continue
				}
				mu.Lock()
				before := served[key]
				mu.Unlock()
				got, how, err := get(ctx, key)
				mu.Lock()
				switch {
				case err != nil:
					res.errs++
					res.example = "read: " + err.Error()
				case got < acked:
					res.stale++
					res.example = fmt.Sprintf("%s: read %d after version %d was acknowledged", key, got, acked)
				case got < before:
					res.backwards++
					res.example = fmt.Sprintf("%s: read %d (%v) after this process hit %d", key, got, how, before)
				}
				if err == nil {
					res.reads++
				}
				if err == nil && how == cacheguard.Hit {
					served[key] = max(served[key], got)
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return res
}

// slowVersionLoad reads the row's version and takes up to 2ms more, so that
// loads overlap writes.
func slowVersionLoad(rdb redis.UniversalClient, key string) func(context.Context) (item, error) {
	read := versionLoad(rdb, key)
	return func(ctx context.Context) (item, error) {
		v, err := read(ctx)
		select {
		case <-time.After(time.Duration(rand.IntN(2000)) * time.Microsecond):
		case <-ctx.Done():
		}
		return v, err
	}
}

// childChecker is one process of the checker: it waits on the barrier, runs
// for CACHEGUARD_TEST_N milliseconds and prints its counts.
func childChecker(ctx context.Context, rdb *redis.Client, base string) error {
	ms, _ := strconv.Atoi(os.Getenv(childN))
	g := cacheguard.New(rdb, cacheguard.EarlyRefresh(0))
	defer g.Close()
	if err := rdb.Incr(ctx, readyKey(base)).Err(); err != nil {
		return err
	}
	if err := rdb.BLPop(ctx, 30*time.Second, barrierKey(base)).Err(); err != nil {
		return fmt.Errorf("barrier: %w", err)
	}
	r := runChecker(ctx, rdb, checkerKeys(base), 4, time.Duration(ms)*time.Millisecond,
		func(ctx context.Context, key string) (int64, cacheguard.Result, error) {
			var how cacheguard.Result
			v, err := cacheguard.Get(ctx, g, key, slowVersionLoad(rdb, key), cacheguard.ReportTo(&how))
			return int64(v.ID), how, err
		},
		func(ctx context.Context, key string) error { return g.Invalidate(ctx, key) })
	st := g.Stats()
	fmt.Printf("reads=%d writes=%d stale=%d backwards=%d errors=%d example=%q failopen=%d redis_errors=%d wait_timeouts=%d\n",
		r.reads, r.writes, r.stale, r.backwards, r.errs, r.example, st.FailOpenLoads, st.RedisErrors, st.WaitTimeouts)
	return nil
}

// TestReadYourWritesChecker runs the checker in 3 processes for 1.5s.
func TestReadYourWritesChecker(t *testing.T) {
	const procs = 3
	ctx := context.Background()
	rdb := shared(t)
	base := testKey(t)
	for _, key := range checkerKeys(base) {
		if err := rdb.Set(ctx, dbKey(key), 0, time.Hour).Err(); err != nil {
			t.Fatal(err)
		}
	}
	children := make([]*childproc.Proc, procs)
	for i := range children {
		children[i] = startChild(t, "checker", childKey+"="+base, childN+"=1500")
	}
	eventually(t, 30*time.Second, "children ready", func() bool {
		n, _ := rdb.Get(ctx, readyKey(base)).Int()
		return n == procs
	})
	tokens := make([]any, procs)
	for i := range tokens {
		tokens[i] = "go"
	}
	if err := rdb.RPush(ctx, barrierKey(base), tokens...).Err(); err != nil {
		t.Fatal(err)
	}
	var reads, writes int
	for i, c := range children {
		out, err := c.Wait()
		if err != nil || len(out) != 1 {
			t.Fatalf("child %d: %v\n%s", i, err, strings.Join(out, "\n"))
		}
		t.Logf("child %d: %s", i, out[0])
		var r checkResult
		var ex string
		var failOpen, redisErrs, timeouts int
		fmt.Sscanf(out[0], "reads=%d writes=%d stale=%d backwards=%d errors=%d example=%q failopen=%d redis_errors=%d wait_timeouts=%d",
			&r.reads, &r.writes, &r.stale, &r.backwards, &r.errs, &ex, &failOpen, &redisErrs, &timeouts)
		if r.stale+r.errs+r.backwards > 0 {
			t.Errorf("child %d: %d stale reads, %d backwards, %d errors (%s); fail-open loads %d, Redis errors %d, wait timeouts %d",
				i, r.stale, r.backwards, r.errs, ex, failOpen, redisErrs, timeouts)
		}
		reads += r.reads
		writes += r.writes
	}
	if reads == 0 || writes == 0 {
		t.Fatalf("%d reads, %d writes: the checker did not run", reads, writes)
	}
}
