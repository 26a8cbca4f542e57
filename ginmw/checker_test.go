package ginmw_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/cacheguard"
	"github.com/cacheguard/cacheguard/ginmw"
	"github.com/cacheguard/cacheguard/internal/childproc"
)

// The randomized read-your-writes checker through ginmw.Cache: several OS
// processes, each with readers (GET /repos/<id> through its own engine) and a
// writer on a few rows. A write commits the next version of a row, invalidates
// "repos:<id>" and acknowledges the version. The handler reads the
// acknowledged version, then the row, and answers both: "<row> <ack>". A GET
// must answer neither less than the version acknowledged when it began nor,
// within its process, less than the acknowledged version read by the load
// of any response a GET of its process already returned: that load began
// after the invalidation of that version, and cacheguard guarantees that a
// later Get of the process returns no value loaded before an invalidation
// the other's followed. (The row a load read may be newer than that: a write
// committed but not yet invalidated. A response of that version is not
// required to outlast the cache's older value of the same epoch, and a load
// whose lease an invalidation voided serves such a row without storing it.)

var ackScript = redis.NewScript(`
local cur = tonumber(redis.call('GET', KEYS[1]) or '0')
if tonumber(ARGV[1]) > cur then redis.call('SET', KEYS[1], ARGV[1], 'PX', 600000) end
return 1`)

func ackKey(id string) string { return "test:ack:" + id }

func checkerIDs(base string) []string {
	return []string{base + "a", base + "b", base + "c"}
}

// childChecker is one process of the checker: it waits for "go" on stdin,
// runs for the given milliseconds and prints its counts.
func childChecker() error {
	ctx := context.Background()
	base := os.Getenv(childKey)
	ms, _ := strconv.Atoi(os.Getenv(childN))
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv(childAddr)})
	defer rdb.Close()
	g := cacheguard.New(rdb)
	defer g.Close()
	gin.SetMode(gin.TestMode)
	r := gin.New()
	r.GET("/repos/:id", ginmw.Cache(g, time.Minute, ginmw.CacheKey(ginmw.Resource("repos", ginmw.Param("id")))), func(c *gin.Context) {
		a, err := rdb.Get(c.Request.Context(), ackKey(c.Param("id"))).Int64()
		if err == redis.Nil {
			a, err = 0, nil
		}
		var v string
		if err == nil {
			v, err = rdb.Get(c.Request.Context(), dbKey(c.Param("id"))).Result()
		}
		if err != nil {
			c.String(http.StatusInternalServerError, err.Error())
			return
		}
		time.Sleep(time.Duration(rand.IntN(2000)) * time.Microsecond) // a query's cost: loads overlap writes
		c.String(http.StatusOK, v+" "+strconv.FormatInt(a, 10))
	})
	fmt.Println("ready")
	if line, err := readLine(); err != nil || line != "go" {
		return fmt.Errorf("start: %q, %v", line, err)
	}

	ids := checkerIDs(base)
	var mu sync.Mutex
	var reads, writes, stale, backwards, errs int
	var example string
	served := map[string]int64{}     // the largest acknowledged version a returned response's load read
	servedHow := map[string]string{} // how that response was served, for the report
	stop := time.Now().Add(time.Duration(ms) * time.Millisecond)
	var wg sync.WaitGroup
	wg.Go(func() {
		for time.Now().Before(stop) {
			id := ids[rand.IntN(len(ids))]
			v, err := rdb.Incr(ctx, dbKey(id)).Result()
			if err == nil {
				err = g.Invalidate(ctx, "repos:"+id)
			}
			if err == nil {
				err = ackScript.Run(ctx, rdb, []string{ackKey(id)}, v).Err()
			}
			mu.Lock()
			if err != nil {
				errs++
				example = err.Error()
			}
			writes++
			mu.Unlock()
			time.Sleep(time.Duration(rand.IntN(3000)) * time.Microsecond) // paces the writes; nothing waits on it
		}
	})
	for range 4 {
		wg.Go(func() {
			for time.Now().Before(stop) {
				id := ids[rand.IntN(len(ids))]
				acked, _ := rdb.Get(ctx, ackKey(id)).Int64()
				mu.Lock()
				before := served[id]
				mu.Unlock()
				w := serve(r, http.MethodGet, "/repos/"+id)
				var got, loadAck int64
				_, err := fmt.Sscanf(w.Body.String(), "%d %d", &got, &loadAck)
				mu.Lock()
				switch {
				case w.Code != http.StatusOK || err != nil:
					errs++
					example = fmt.Sprintf("GET: %d %q", w.Code, w.Body)
				case got < acked:
					stale++
					example = fmt.Sprintf("%s: read %d (X-Cache %s) after version %d was acknowledged", id, got, w.Header().Get("X-Cache"), acked)
				case got < before:
					backwards++
					example = fmt.Sprintf("%s: read %d (X-Cache %s) after this process served a load that began once %d was acknowledged (%s)",
						id, got, w.Header().Get("X-Cache"), before, servedHow[id])
				}
				if err == nil {
					reads++
					if loadAck > served[id] {
						served[id] = loadAck
						servedHow[id] = w.Header().Get("X-Cache")
					}
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	st := g.Stats()
	fmt.Printf("reads=%d writes=%d stale=%d backwards=%d errors=%d example=%q failopen=%d redis_errors=%d wait_timeouts=%d\n",
		reads, writes, stale, backwards, errs, example, st.FailOpenLoads, st.RedisErrors, st.WaitTimeouts)
	return nil
}

// TestCacheReadYourWritesChecker runs the checker in 3 processes for 1.5s.
func TestCacheReadYourWritesChecker(t *testing.T) {
	const procs = 3
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	t.Cleanup(func() { rdb.Close() })
	base := strconv.FormatInt(time.Now().UnixNano(), 36)
	for _, id := range checkerIDs(base) {
		if err := rdb.Set(ctx, dbKey(id), 0, time.Hour).Err(); err != nil {
			t.Fatal(err)
		}
	}
	children := make([]*childproc.Proc, procs)
	for i := range children {
		children[i] = childproc.Start(t, childEnv, "checker", childAddr+"="+redisAddr, childKey+"="+base, childN+"=1500")
		if line, err := children[i].Next(30 * time.Second); err != nil || line != "ready" {
			t.Fatalf("child %d: %q, %v", i, line, err)
		}
	}
	for _, c := range children {
		fmt.Fprintln(c.Stdin, "go")
	}
	var reads, writes int
	for i, c := range children {
		out, err := c.Wait()
		if err != nil || len(out) != 1 {
			t.Fatalf("child %d: %v\n%s", i, err, strings.Join(out, "\n"))
		}
		t.Logf("child %d: %s", i, out[0])
		var r, w, stale, back, errs, failOpen, redisErrs, timeouts int
		var ex string
		fmt.Sscanf(out[0], "reads=%d writes=%d stale=%d backwards=%d errors=%d example=%q failopen=%d redis_errors=%d wait_timeouts=%d",
			&r, &w, &stale, &back, &errs, &ex, &failOpen, &redisErrs, &timeouts)
		// Reads never go back past an invalidation a returned response's
		// load followed (see childChecker). A load that Redis errors kept
		// out of the cache (fail-open, a store that failed) is outside what
		// the checker can see of it: on a machine loaded enough for Redis
		// calls to time out, such a run is reported, not failed, for going
		// backwards; stale reads are never allowed.
		unclaimed := failOpen+redisErrs+timeouts > 0
		if stale+errs > 0 || back > 0 && !unclaimed {
			t.Errorf("child %d: %d stale reads, %d backwards, %d errors (%s)", i, stale, back, errs, ex)
		} else if back > 0 {
			t.Logf("child %d: %d backwards after %d Redis errors (not claimed): %s", i, back, redisErrs, ex)
		}
		reads += r
		writes += w
	}
	if reads == 0 || writes == 0 {
		t.Fatalf("%d reads, %d writes: the checker did not run", reads, writes)
	}
}
