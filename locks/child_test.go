package locks_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/locks"
)

// The test binary re-executes itself as child processes (real OS processes
// with their own clients) selected by childEnv; they talk to the parent with
// one line per event on stdout.
const childEnv = "LOCKS_TEST_CHILD"

type child struct {
	cmd   *exec.Cmd
	lines chan string
	stdin io.WriteCloser
}

// startChild starts this test binary in role with the given environment.
func startChild(t *testing.T, role string, env ...string) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), append([]string{childEnv + "=" + role}, env...)...)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &child{cmd: cmd, lines: make(chan string, 64), stdin: in}
	go func() {
		defer close(c.lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			c.lines <- sc.Text()
		}
	}()
	t.Cleanup(func() {
		in.Close()
		cmd.Process.Kill()
		cmd.Wait()
	})
	return c
}

// expect waits (bounded) for the next line with the given prefix and returns its rest.
func (c *child) expect(t *testing.T, prefix string, within time.Duration) string {
	t.Helper()
	deadline := time.After(within)
	for {
		select {
		case l, ok := <-c.lines:
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

func runChild(role string) int {
	rdb := redis.NewClient(&redis.Options{Addr: env("REDIS_ADDR")})
	defer rdb.Close()
	var err error
	switch role {
	case "mutex":
		err = childMutex(rdb)
	case "hold":
		err = childHold(rdb)
	default:
		err = fmt.Errorf("unknown role %q", role)
	}
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	return 0
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
				lk, err := c.Lock(ctx, name, locks.WithWait(time.Minute))
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
	c := locks.New(rdb, locks.WithLease(lease))
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
