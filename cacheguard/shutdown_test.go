package cacheguard_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/cacheguard"
)

// childCloser is a process that is shut down while it holds a fill lease. Its
// Get loads the key (counting the load, then marking loadingKey) and waits
// for "release" on stdin; the other commands shut its Guard:
//
//	close      Close now: "closed" once it returned
//	shutdown   Shutdown with a 30s grace period, in the background
//	release    let the load finish: "got <id>" or "failed <error>" once the Get returned
//	get        a new Get: "get <error>" (ErrClosed once shutting down)
//
// After Shutdown returned it prints "shutdown <error or nil>".
func childCloser(ctx context.Context, rdb *redis.Client, key string) error {
	// A lease far longer than any wait: without a hand-over, waiters elsewhere
	// would wait for it to expire and run out of budget.
	g := cacheguard.New(rdb, cacheguard.Lease(time.Minute), cacheguard.EarlyRefresh(0))
	defer g.Close()
	release := make(chan struct{})
	var once sync.Once
	got := make(chan string, 1)
	go func() {
		v, err := cacheguard.Get(ctx, g, key, func(ctx context.Context) (item, error) {
			n, err := rdb.Incr(context.WithoutCancel(ctx), loadsKey(key)).Result()
			if err != nil {
				return item{}, err
			}
			rdb.Set(context.WithoutCancel(ctx), loadingKey(key), "1", time.Minute)
			select {
			case <-release:
				return item{ID: int(n), Name: "closer"}, nil
			case <-ctx.Done():
				return item{}, ctx.Err()
			}
		}, cacheguard.WaitBudget(time.Minute), cacheguard.LoadTimeout(time.Minute))
		if err != nil {
			got <- "failed " + err.Error()
		} else {
			got <- fmt.Sprint("got ", v.ID)
		}
	}()
	var shut sync.WaitGroup
	defer shut.Wait()
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		switch sc.Text() {
		case "close":
			g.Close()
			fmt.Println("closed")
		case "shutdown":
			shut.Go(func() {
				sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
				defer cancel()
				fmt.Println("shutdown", g.Shutdown(sctx))
			})
			// The next command must find the Guard closing: wait until a Get
			// of another key says so (Shutdown runs on its own goroutine).
			for deadline := time.Now().Add(10 * time.Second); ; {
				_, err := cacheguard.Get(ctx, g, key+":probe", (&counter{}).load)
				if errors.Is(err, cacheguard.ErrClosed) {
					break
				}
				if time.Now().After(deadline) {
					return fmt.Errorf("the Guard was not closing 10s after Shutdown began: %v", err)
				}
			}
		case "release":
			once.Do(func() { close(release) })
			fmt.Println(<-got)
		case "get":
			_, err := cacheguard.Get(ctx, g, key+":other", (&counter{}).load)
			fmt.Println("get", err)
		default:
			return fmt.Errorf("unknown command %q", sc.Text())
		}
	}
	return sc.Err()
}

// waitersElsewhere starts n Gets of key in a Guard of this process (another
// process than the closer's) and returns a function that waits for them and
// returns their values and errors, once they all wait for the closer's fill.
func waitersElsewhere(t *testing.T, key string, n int) func() ([]item, []error) {
	t.Helper()
	g, rg := newGuard(t, cacheguard.EarlyRefresh(0))
	waiting := watchWaiting(rg)
	vals, errs := make([]item, n), make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			vals[i], errs[i] = cacheguard.Get(context.Background(), g, key, dbLoad(rg, key), cacheguard.WaitBudget(20*time.Second))
		})
	}
	select {
	case <-waiting:
	case <-time.After(30 * time.Second):
		t.Fatal("the waiters never waited for the closer's fill")
	}
	return func() ([]item, []error) { wg.Wait(); return vals, errs }
}

// TestCloseHandsFillOver: a process closes its Guard while it holds a fill
// lease that processes elsewhere wait for. They get a value and no error: one
// of them takes the fill over at once (its lease is handed over, not left to
// expire), so the key costs one extra load at most.
func TestCloseHandsFillOver(t *testing.T) {
	ctx := context.Background()
	rdb := shared(t)
	key := testKey(t)
	closer := startChild(t, "closer", childKey+"="+key)
	eventually(t, 30*time.Second, "the closer to load", func() bool { return rdb.Exists(ctx, loadingKey(key)).Val() == 1 })
	wait := waitersElsewhere(t, key, 20)

	if got := ask(t, closer, "close"); got != "closed" {
		t.Fatalf("closer: %q", got)
	}
	vals, errs := wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("waiters in another process failed because the closer closed: %v", err)
	}
	for i, v := range vals {
		if v != vals[0] || v.Name != "db" {
			t.Fatalf("waiter %d got %v, waiter 0 %v: want one load's value", i, v, vals[0])
		}
	}
	if got := ask(t, closer, "release"); !strings.Contains(got, "guard closed") {
		t.Fatalf("the closer's own Get: %q, want ErrClosed", got)
	}
	if n, _ := rdb.Get(ctx, loadsKey(key)).Int(); n != 2 {
		t.Fatalf("loads = %d, want 2 (the closer's, and one taken over)", n)
	}
}

// TestShutdownFinishesFill: a process shuts its Guard down gracefully while
// it holds a fill lease: new calls fail with ErrClosed at once, the load in
// flight finishes within the grace period, is stored and pushed, and the
// waiters of the other process get its value — one load, no error.
func TestShutdownFinishesFill(t *testing.T) {
	ctx := context.Background()
	rdb := shared(t)
	key := testKey(t)
	closer := startChild(t, "closer", childKey+"="+key)
	eventually(t, 30*time.Second, "the closer to load", func() bool { return rdb.Exists(ctx, loadingKey(key)).Val() == 1 })
	wait := waitersElsewhere(t, key, 20)

	if _, err := fmt.Fprintln(closer.Stdin, "shutdown"); err != nil {
		t.Fatal(err)
	}
	if got := ask(t, closer, "get"); got != "get "+cacheguard.ErrClosed.Error() {
		t.Fatalf("a Get during Shutdown: %q, want ErrClosed", got)
	}
	// The Get's value and Shutdown's return come in either order: Shutdown
	// returns once the load's flight ended, the Get a moment later.
	first := ask(t, closer, "release")
	second, err := closer.Next(30 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if got := []string{first, second}; !slices.Contains(got, "got 1") || !slices.Contains(got, "shutdown <nil>") {
		t.Fatalf("closer: %q; want its Get's value (got 1) and Shutdown's nil", got)
	}
	vals, errs := wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("waiters in another process: %v", err)
	}
	for i, v := range vals {
		if v != (item{1, "closer"}) {
			t.Fatalf("waiter %d got %v, want the closer's value", i, v)
		}
	}
	if n, _ := rdb.Get(ctx, loadsKey(key)).Int(); n != 1 {
		t.Fatalf("loads = %d, want 1", n)
	}
}

// A loader that fails with ErrClosed (its process is closing) hands the fill
// over too: the waiter of the other Guard takes it over with no error.
func TestLoaderErrClosedHandsFillOver(t *testing.T) {
	errA, errB := failWhileWaiting(t, fmt.Errorf("db pool: %w", cacheguard.ErrClosed),
		func(context.Context) (item, error) { return item{ID: 2, Name: "taken over"}, nil })
	if !errors.Is(errA, cacheguard.ErrClosed) {
		t.Fatalf("holder: %v, want ErrClosed", errA)
	}
	if errB != nil {
		t.Fatalf("waiter: %v, want its own load's value", errB)
	}
}

// TestCloseDuringUnleasedLoadIsErrClosed: a load run without the fill lease
// (Redis unreachable: the call fails open) that Close cancels fails its
// caller with ErrClosed, as a leased load's caller does — not with the
// context error its loader returned.
func TestCloseDuringUnleasedLoadIsErrClosed(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1}) // nothing listens: every command fails at once
	defer rdb.Close()
	g := cacheguard.New(rdb)
	started := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		_, err := cacheguard.Get(context.Background(), g, testKey(t), func(ctx context.Context) (Repo, error) {
			close(started)
			<-ctx.Done() // a load that ends when its context does
			return Repo{}, ctx.Err()
		})
		done <- err
	}()
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("the fail-open load did not start")
	}
	_ = g.Close()
	select {
	case err := <-done:
		if !errors.Is(err, cacheguard.ErrClosed) {
			t.Fatalf("Get: %v, want ErrClosed: its load was cancelled by Close", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Get did not return after Close")
	}
}
