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
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/locks"
)

// The mutual-exclusion test re-executes the test binary as child processes,
// each running TestRedlockHelperProcess with these variables set.
const (
	childEnv      = "CG_REDLOCK_CHILD"   // "1" in a child
	childAddrsEnv = "CG_REDLOCK_ADDRS"   // the nodes, comma-separated
	childFileEnv  = "CG_REDLOCK_COUNTER" // the shared counter file
	childItersEnv = "CG_REDLOCK_ITERS"   // acquisitions per goroutine
)

const (
	mutexProcs      = 3
	mutexGoroutines = 8
	mutexIters      = 10
)

// 3 processes × 8 goroutines increment a counter kept in a file by a
// deliberately non-atomic read-modify-write under one Redlock: any overlap of
// two holders loses an increment (or reads a half-written file), so the final
// count is exact only if the lock excluded every time.
func TestRedlockMutualExclusionProcesses(t *testing.T) {
	if os.Getenv(childEnv) != "" {
		t.Skip("in a child process")
	}
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
	outs := make([][]byte, mutexProcs)
	errs := make([]error, mutexProcs)
	for p := range mutexProcs {
		cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestRedlockHelperProcess$", "-test.count=1")
		cmd.Env = append(os.Environ(), childEnv+"=1", childAddrsEnv+"="+strings.Join(addrs, ","),
			childFileEnv+"="+counter, childItersEnv+"="+strconv.Itoa(mutexIters))
		wg.Go(func() { outs[p], errs[p] = cmd.CombinedOutput() })
	}
	wg.Wait()
	for p := range mutexProcs {
		if errs[p] != nil {
			t.Errorf("child %d: %v\n%s", p, errs[p], outs[p])
		}
	}
	b, err := os.ReadFile(counter)
	if err != nil {
		t.Fatal(err)
	}
	want := mutexProcs * mutexGoroutines * mutexIters
	if got, _ := strconv.Atoi(string(b)); got != want {
		t.Fatalf("counter %q, want %d: two holders overlapped", b, want)
	}
}

// TestRedlockHelperProcess is the body of one child process of
// TestRedlockMutualExclusionProcesses; it does nothing in a normal run.
func TestRedlockHelperProcess(t *testing.T) {
	if os.Getenv(childEnv) != "1" {
		t.Skip("helper for TestRedlockMutualExclusionProcesses")
	}
	iters, _ := strconv.Atoi(os.Getenv(childItersEnv))
	file := os.Getenv(childFileEnv)
	var clients []redis.UniversalClient
	for _, a := range strings.Split(os.Getenv(childAddrsEnv), ",") {
		c := redis.NewClient(&redis.Options{Addr: a, ContextTimeoutEnabled: true, MaxRetries: -1})
		defer c.Close()
		clients = append(clients, c)
	}
	r, err := locks.NewRedlock(clients, locks.WithLease(2*time.Second), locks.WithWait(60*time.Second),
		locks.WithNodeTimeout(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()

	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make(chan error, mutexGoroutines*iters)
	for range mutexGoroutines {
		wg.Go(func() {
			for range iters {
				if err := incrementUnder(ctx, r, file); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// incrementUnder adds one to the number in file, non-atomically, holding the lock.
func incrementUnder(ctx context.Context, r *locks.Redlock, file string) error {
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
			err = os.WriteFile(file, []byte(strconv.Itoa(n+1)), 0o600)
		}
	}
	if lk.TTL() <= 0 {
		err = fmt.Errorf("lock validity ended inside the critical section (err %v)", err)
	}
	if uerr := lk.Unlock(ctx); err == nil {
		err = uerr
	}
	return err
}
