package locks_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/locks"
)

// The mutual-exclusion test re-executes the test binary as child processes,
// each running TestRedlockHelperProcess with these variables set.
const (
	rlChildEnv      = "CG_REDLOCK_CHILD"   // "1" in a child
	rlChildAddrsEnv = "CG_REDLOCK_ADDRS"   // the nodes, comma-separated
	rlChildFileEnv  = "CG_REDLOCK_COUNTER" // the shared counter file
	rlChildItersEnv = "CG_REDLOCK_ITERS"   // acquisitions per goroutine
)

const (
	rlMutexProcs      = 3
	rlMutexGoroutines = 8
	rlMutexIters      = 10
)

// 3 processes × 8 goroutines increment a counter kept in a file by a
// deliberately non-atomic read-modify-write under one Redlock: any overlap of
// two holders loses an increment (or reads a half-written file), so the final
// count is exact only if the lock excluded every time.
func TestRedlockMutualExclusionProcesses(t *testing.T) {
	if os.Getenv(rlChildEnv) != "" {
		t.Skip("in a child process")
	}
	t.Parallel()
	s := newRedlockSet(t, 5, nil)
	counter := filepath.Join(t.TempDir(), "counter")
	if err := os.WriteFile(counter, []byte("0"), 0o600); err != nil {
		t.Fatal(err)
	}
	addrs := make([]string, len(s.servers))
	for i, srv := range s.servers {
		addrs[i] = srv.Addr()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 80*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	outs := make([][]byte, rlMutexProcs)
	errs := make([]error, rlMutexProcs)
	done := 0 // increments the children report having made
	for p := range rlMutexProcs {
		cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestRedlockHelperProcess$", "-test.count=1")
		cmd.Env = append(os.Environ(), rlChildEnv+"=1", rlChildAddrsEnv+"="+strings.Join(addrs, ","),
			rlChildFileEnv+"="+counter, rlChildItersEnv+"="+strconv.Itoa(rlMutexIters))
		wg.Go(func() { outs[p], errs[p] = cmd.CombinedOutput() })
	}
	wg.Wait()
	for p := range rlMutexProcs {
		if errs[p] != nil {
			t.Errorf("child %d: %v\n%s", p, errs[p], outs[p])
		}
		_, n, _ := strings.Cut(string(outs[p]), rlIncrementsMark)
		n, _, _ = strings.Cut(n, "\n")
		k, err := strconv.Atoi(n)
		if err != nil {
			t.Fatalf("child %d reported no count:\n%s", p, outs[p])
		}
		done += k
	}
	if want := rlMutexProcs * rlMutexGoroutines * rlMutexIters; done != want {
		t.Errorf("children made %d increments, want %d", done, want)
	}
	b, err := os.ReadFile(counter)
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := strconv.Atoi(string(b)); got != done {
		t.Fatalf("counter %q after %d increments: two holders overlapped", b, done)
	}
}

// TestRedlockHelperProcess is the body of one child process of
// TestRedlockMutualExclusionProcesses; it does nothing in a normal run.
func TestRedlockHelperProcess(t *testing.T) {
	if os.Getenv(rlChildEnv) != "1" {
		t.Skip("helper for TestRedlockMutualExclusionProcesses")
	}
	iters, _ := strconv.Atoi(os.Getenv(rlChildItersEnv))
	file := os.Getenv(rlChildFileEnv)
	var clients []redis.UniversalClient
	for _, a := range strings.Split(os.Getenv(rlChildAddrsEnv), ",") {
		c := redis.NewClient(&redis.Options{Addr: a, ContextTimeoutEnabled: true, MaxRetries: -1})
		defer c.Close()
		clients = append(clients, c)
	}
	r := locks.NewRedlock(clients, locks.Lease(2*time.Second), locks.WaitBudget(60*time.Second))
	defer r.Close()

	ctx := context.Background()
	var wg sync.WaitGroup
	var done atomic.Int64
	errs := make(chan error, rlMutexGoroutines*iters)
	for range rlMutexGoroutines {
		wg.Go(func() {
			for range iters {
				if err := rlIncrementUnder(ctx, r, file, &done); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	fmt.Printf("%s%d\n", rlIncrementsMark, done.Load())
	for err := range errs {
		t.Error(err)
	}
}

// rlIncrementsMark precedes, in a child's output, the number of increments it made.
const rlIncrementsMark = "redlock-child-increments="

// rlIncrementUnder adds one to the number in file, non-atomically, holding the
// lock, and counts the write in done. A failed Unlock (its outcome unknown
// after node timeouts, on a loaded machine) is logged, not fatal: the lock
// then ends with its lease.
func rlIncrementUnder(ctx context.Context, r *locks.Redlock, file string, done *atomic.Int64) error {
	lk, err := r.Lock(ctx, "rl:mutex:counter")
	if err != nil {
		return err
	}
	b, err := os.ReadFile(file)
	if err == nil {
		var n int
		if n, err = strconv.Atoi(string(b)); err != nil {
			err = fmt.Errorf("counter file read %q: another holder is writing it", b)
		} else {
			runtime.Gosched() // widen the window a second holder would fall into
			if err = os.WriteFile(file, []byte(strconv.Itoa(n+1)), 0o600); err == nil {
				done.Add(1)
			}
		}
	}
	if lk.TTL() <= 0 {
		err = fmt.Errorf("lock validity ended inside the critical section (err %v)", err)
	}
	if uerr := lk.Unlock(ctx); uerr != nil {
		fmt.Fprintln(os.Stderr, "unlock:", uerr)
	}
	return err
}
