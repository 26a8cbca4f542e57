package cacheguard_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/cacheguard"
	"github.com/cacheguard/cacheguard/internal/childproc"
)

// Multi-process tests re-execute the test binary: TestMain sees childEnv and
// calls runChild instead of running tests. Each child has its own Guard and
// Redis client; the parameters travel in environment variables.
const (
	childEnv  = "CACHEGUARD_TEST_CHILD" // the role
	childAddr = "CACHEGUARD_TEST_ADDR"  // the Redis address
	childKey  = "CACHEGUARD_TEST_KEY"   // the cache key; the other keys derive from it
	childN    = "CACHEGUARD_TEST_N"     // concurrent requests per child (stampede), run time in ms (checker)
)

// Redis keys a child and its parent coordinate with.
func readyKey(key string) string   { return "test:ready:" + key }   // INCR by each child when set up
func barrierKey(key string) string { return "test:barrier:" + key } // BLPOP by each child to start together
func loadsKey(key string) string   { return "test:loads:" + key }   // INCR by every load in any process
func loadingKey(key string) string { return "test:loading:" + key } // SET by a holder as its load starts

// startChild starts the test binary as a child process with role and env.
func startChild(t *testing.T, role string, env ...string) *childproc.Proc {
	t.Helper()
	return childproc.Start(t, childEnv, role, append([]string{childAddr + "=" + redisAddr}, env...)...)
}

// childRoles are the roles for childproc.Main.
func childRoles() map[string]func() error {
	return map[string]func() error{
		"stampede": withClient(childStampede),
		"holder":   withClient(childHolder),
		"reloader": withClient(childReloader),
		"writer":   withClient(childWriter),
		"checker":  withClient(childChecker),
		"closer":   withClient(childCloser),
		"near":     withClient(childNear),
		"tagged":   withClient(childTagged),
		"watcher":  withClient(childWatcher),
		"path":     func() error { return childOnPath(context.Background(), os.Getenv(childKey)) },
	}
}

// withClient gives role a client of the parent's server and the cache key.
func withClient(role func(context.Context, *redis.Client, string) error) func() error {
	return func() error {
		rdb := redis.NewClient(&redis.Options{Addr: os.Getenv(childAddr)})
		defer rdb.Close()
		return role(context.Background(), rdb, os.Getenv(childKey))
	}
}

// dbLoad stands for a 50ms database query and counts itself in Redis, so the
// parent can count loads across processes.
func dbLoad(rdb *redis.Client, key string) func(context.Context) (item, error) {
	return func(ctx context.Context) (item, error) {
		n, err := rdb.Incr(context.WithoutCancel(ctx), loadsKey(key)).Result()
		if err != nil {
			return item{}, err
		}
		select {
		case <-time.After(50 * time.Millisecond):
		case <-ctx.Done():
			return item{}, ctx.Err()
		}
		return item{ID: int(n), Name: "db"}, nil
	}
}

// childStampede waits on the barrier, then sends n concurrent Gets for one key.
func childStampede(ctx context.Context, rdb *redis.Client, key string) error {
	n, _ := strconv.Atoi(os.Getenv(childN))
	g := cacheguard.New(rdb, cacheguard.EarlyRefresh(0))
	defer g.Close()
	if err := rdb.Incr(ctx, readyKey(key)).Err(); err != nil {
		return err
	}
	if err := rdb.BLPop(ctx, 30*time.Second, barrierKey(key)).Err(); err != nil {
		return fmt.Errorf("barrier: %w", err)
	}
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			v, err := cacheguard.Get(ctx, g, key, dbLoad(rdb, key))
			if err == nil && v != (item{1, "db"}) {
				err = fmt.Errorf("got %v, want the first load's value", v)
			}
			errs[i] = err
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	st := g.Stats()
	fmt.Printf("loads=%d local=%d remote=%d\n", st.Loads, st.CoalescedLocal, st.CoalescedRemote)
	return nil
}

// childHolder takes the fill lease and loads forever (until killed).
func childHolder(ctx context.Context, rdb *redis.Client, key string) error {
	loading := func() error { return rdb.Set(ctx, loadingKey(key), "1", time.Minute).Err() }
	opts := []cacheguard.Option{cacheguard.Lease(150 * time.Millisecond), cacheguard.EarlyRefresh(0)}
	encoding := os.Getenv(childN) == "encode"
	if encoding {
		opts = append(opts, cacheguard.Encoding(hangingCodec{marshalling: loading}))
	}
	g := cacheguard.New(rdb, opts...)
	defer g.Close()
	_, err := cacheguard.Get(ctx, g, key, func(ctx context.Context) (item, error) {
		if encoding {
			return item{1, "killed while encoding"}, nil
		}
		if err := loading(); err != nil {
			return item{}, err
		}
		select {} // the process is killed mid-load
	}, cacheguard.WaitBudget(time.Minute), cacheguard.LoadTimeout(time.Minute))
	return err
}

// hangingCodec says it is encoding a value and never returns: the process is
// killed mid-encode.
type hangingCodec struct {
	cacheguard.JSON
	marshalling func() error
}

func (c hangingCodec) Marshal(any) ([]byte, error) {
	if err := c.marshalling(); err != nil {
		return nil, err
	}
	select {}
}

// childReloader waits on the barrier, then Gets key with a TTL of childN ms:
// the value it finds has expired, so it reloads it with a loader that never
// returns, and stays up until killed.
func childReloader(ctx context.Context, rdb *redis.Client, key string) error {
	ms, _ := strconv.Atoi(os.Getenv(childN))
	g := cacheguard.New(rdb, cacheguard.TTL(time.Duration(ms)*time.Millisecond), cacheguard.Jitter(0),
		cacheguard.Lease(150*time.Millisecond))
	defer g.Close()
	if err := rdb.Incr(ctx, readyKey(key)).Err(); err != nil {
		return err
	}
	if err := rdb.BLPop(ctx, 30*time.Second, barrierKey(key)).Err(); err != nil {
		return fmt.Errorf("barrier: %w", err)
	}
	_, err := cacheguard.Get(ctx, g, key, func(ctx context.Context) (item, error) {
		if err := rdb.Set(ctx, loadingKey(key), "1", time.Minute).Err(); err != nil {
			return item{}, err
		}
		select {} // the process is killed mid-load
	}, cacheguard.WaitBudget(time.Minute), cacheguard.LoadTimeout(time.Minute))
	if err != nil {
		return err
	}
	select {} // served the older value: the reload runs on, until the process is killed
}
