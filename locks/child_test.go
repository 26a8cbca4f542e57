package locks_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/internal/childproc"
	"github.com/cacheguard/cacheguard/locks"
)

// The test binary re-executes itself as child processes (real OS processes
// with their own clients) selected by childEnv; they talk to the parent with
// one line per event on stdout.
const childEnv = "LOCKS_TEST_CHILD"

// child is a child process started by startChild.
type child struct{ *childproc.Proc }

// startChild starts this test binary in role with the given environment.
func startChild(t *testing.T, role string, env ...string) *child {
	t.Helper()
	return &child{childproc.Start(t, childEnv, role, env...)}
}

// expect waits (bounded) for the next line with the given prefix and returns its rest.
func (c *child) expect(t *testing.T, prefix string, within time.Duration) string {
	t.Helper()
	deadline := time.After(within)
	for {
		select {
		case l, ok := <-c.Lines:
			if !ok {
				t.Fatalf("child exited while waiting for %q", prefix)
			}
			if rest, found := strings.CutPrefix(l, prefix); found {
				return strings.TrimSpace(rest)
			}
			if strings.HasPrefix(l, "error") {
				t.Fatalf("child: %s", l)
			}
		case <-deadline:
			t.Fatalf("no %q from child within %v", prefix, within)
		}
	}
}

func env(name string) string { return os.Getenv(name) }

func envInt(name string) int {
	n, _ := strconv.Atoi(os.Getenv(name))
	return n
}

// childRoles are the roles for childproc.Main.
func childRoles() map[string]func() error {
	return map[string]func() error{"mutex": withClient(childMutex), "hold": withClient(childHold), "busy": childBusy, "attempt": childAttempt}
}

// withClient gives role a client of the server at REDIS_ADDR.
func withClient(role func(*redis.Client) error) func() error {
	return func() error {
		rdb := redis.NewClient(&redis.Options{Addr: env("REDIS_ADDR")})
		defer rdb.Close()
		return role(rdb)
	}
}

// childMutex runs goroutines that each take the lock N times and, inside the
// critical section, increment a counter with a non-atomic GET then SET and
// append the fence token to a shared log.
func childMutex(rdb *redis.Client) error {
	ctx := context.Background()
	c := locks.New(rdb)
	defer c.Close()
	log, err := os.OpenFile(env("LOG"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return err
	}
	defer log.Close()
	name, counter := env("NAME"), env("COUNTER")
	// Start together: wait for the parent's go.
	if err := rdb.BLPop(ctx, 30*time.Second, env("START")+":"+env("ID")).Err(); err != nil {
		return fmt.Errorf("start barrier: %w", err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, envInt("G"))
	for range envInt("G") {
		wg.Go(func() {
			for range envInt("N") {
				lk, err := c.Lock(ctx, name, locks.WaitBudget(time.Minute))
				if err != nil {
					errs <- err
					return
				}
				n, err := rdb.Get(ctx, counter).Int()
				if err != nil && !errors.Is(err, redis.Nil) {
					errs <- err
					return
				}
				if err := rdb.Set(ctx, counter, n+1, 0).Err(); err != nil {
					errs <- err
					return
				}
				if _, err := fmt.Fprintf(log, "%d\n", lk.Fence()); err != nil {
					errs <- err
					return
				}
				if err := lk.Unlock(ctx); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return err
	}
	fmt.Println("done")
	return nil
}

// childHold takes the lock, reports it, then reports when it is lost and what
// Unlock said, or unlocks when its stdin closes.
func childHold(rdb *redis.Client) error {
	ctx := context.Background()
	lease, _ := time.ParseDuration(env("LEASE"))
	c := locks.New(rdb, locks.Lease(lease))
	defer c.Close()
	lk, err := c.TryLock(ctx, env("NAME"))
	if err != nil {
		return err
	}
	fmt.Println("held", lk.Fence())
	stdin := make(chan struct{})
	go func() { io.Copy(io.Discard, os.Stdin); close(stdin) }()
	select {
	case <-lk.Lost():
		fmt.Println("lost")
	case <-stdin:
	}
	fmt.Println("unlock", errName(lk.Unlock(ctx)))
	fmt.Println("unlock-again", errName(lk.Unlock(ctx)))
	return nil
}

// childBusy runs lock cycles on G goroutines, on a client with a Breaker
// (and ContextTimeoutEnabled unless CTE=0), on names NAME:<goroutine>, so that commands are always in flight;
// it reports "ready" once cycles succeed, each breaker event as it comes
// ("opened <cause>", "closed"), and on each line read from stdin "cycles N"
// (cycles that succeeded so far); it stops when stdin closes.
func childBusy() error {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: env("REDIS_ADDR"), ContextTimeoutEnabled: env("CTE") != "0"})
	defer rdb.Close()
	rdb.AddHook(&locks.Breaker{Observer: func(_ context.Context, e locks.Event) {
		switch e.Kind {
		case locks.EventBreakerOpened:
			fmt.Println("opened", e.Err)
		case locks.EventBreakerClosed:
			fmt.Println("closed")
		}
	}})
	c := locks.New(rdb)
	defer c.Close()
	var cycles atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for g := range envInt("G") {
		wg.Go(func() {
			name := fmt.Sprintf("%s:%d", env("NAME"), g)
			for {
				select {
				case <-stop:
					return
				default:
				}
				if lk, err := c.TryLock(ctx, name); err == nil && lk.Unlock(ctx) == nil {
					if cycles.Add(1) == 100 {
						fmt.Println("ready")
					}
				}
			}
		})
	}
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		fmt.Println("cycles", cycles.Load())
	}
	close(stop)
	wg.Wait()
	return nil
}

func errName(err error) string {
	switch {
	case err == nil:
		return "nil"
	case errors.Is(err, locks.ErrNotHeld):
		return "ErrNotHeld"
	}
	return err.Error()
}

var _ = testing.Short

// childAttempt makes one TryLock of NAME (lease LEASE) on a client with
// ContextTimeoutEnabled, at REDIS_ADDR (a proxy), when a line comes on
// stdin, after one cycle on another name (so that the connection is open and
// the scripts are loaded: the TryLock's script call is the next request on
// the wire). It reports "ready", then "held <fence>" or "not-held <error>",
// and stays up until stdin closes (a clean-up of a failed attempt is sent in
// the background: Close would drop it, see Shutdown); then, when held, it
// unlocks and reports "unlock <error>".
func childAttempt() error {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: env("REDIS_ADDR"), ContextTimeoutEnabled: true})
	defer rdb.Close()
	lease, _ := time.ParseDuration(env("LEASE"))
	c := locks.New(rdb, locks.Lease(lease))
	defer c.Close()
	warm, err := c.TryLock(ctx, env("NAME")+":warm")
	if err != nil {
		return err
	}
	if err := warm.Unlock(ctx); err != nil {
		return err
	}
	fmt.Println("ready")
	in := bufio.NewScanner(os.Stdin)
	if !in.Scan() {
		return errors.New("stdin closed before the attempt")
	}
	lk, err := c.TryLock(ctx, env("NAME"))
	if err != nil {
		fmt.Println("not-held", errName(err))
	} else {
		fmt.Println("held", lk.Fence())
	}
	for in.Scan() {
	}
	if lk != nil {
		fmt.Println("unlock", errName(lk.Unlock(ctx)))
	}
	return nil
}
