package locks_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/cacheguard/cacheguard/internal/faultproxy"
	"github.com/cacheguard/cacheguard/internal/redistest"
	"github.com/cacheguard/cacheguard/internal/testing/gen"
	"github.com/cacheguard/cacheguard/locks"
)

// TestMutualExclusionAcrossProcesses: 4 OS processes × 8 goroutines take one
// lock 20,000 times; a counter read and written non-atomically inside the
// critical section ends exact, and the fence tokens, in critical-section
// order, strictly increase.
func TestMutualExclusionAcrossProcesses(t *testing.T) {
	const procs, goroutines = 4, 8
	total := 20000
	if testing.Short() {
		total = 2000
	}
	perG := total / (procs * goroutines)
	s := redistest.Start(t)
	rdb := s.Client()
	ctx := context.Background()
	logPath := filepath.Join(t.TempDir(), "fences.log")
	if err := os.WriteFile(logPath, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	children := make([]*child, procs)
	for i := range children {
		children[i] = startChild(t, "mutex", "REDIS_ADDR="+s.Addr(), "NAME=mx", "COUNTER=mx:counter",
			"LOG="+logPath, "START=mx:start", "ID="+strconv.Itoa(i),
			"G="+strconv.Itoa(goroutines), "N="+strconv.Itoa(perG))
	}
	for i := range children {
		rdb.RPush(ctx, "mx:start:"+strconv.Itoa(i), "go")
	}
	for _, c := range children {
		c.expect(t, "done", 5*time.Minute)
	}
	want := procs * goroutines * perG
	if n, err := rdb.Get(ctx, "mx:counter").Int(); err != nil || n != want {
		t.Fatalf("counter = %d (%v), want %d: two holders overlapped", n, err, want)
	}
	f, err := os.Open(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	var last uint64
	lines := 0
	for sc.Scan() {
		v, err := strconv.ParseUint(sc.Text(), 10, 64)
		if err != nil {
			t.Fatalf("log line %d: %v", lines, err)
		}
		if v <= last {
			t.Fatalf("fence %d at line %d not above %d", v, lines, last)
		}
		last = v
		lines++
	}
	if lines != want {
		t.Fatalf("%d fences logged, want %d", lines, want)
	}
}

// TestHolderKilled: a holder killed with SIGKILL stops renewing; its lock is
// free again when the lease read at kill time runs out, not earlier.
func TestHolderKilled(t *testing.T) {
	s := redistest.Start(t)
	rdb := s.Client()
	ctx := context.Background()
	c := locks.New(rdb)
	t.Cleanup(func() { c.Close() })
	const lease = 2 * time.Second
	ch := startChild(t, "hold", "REDIS_ADDR="+s.Addr(), "NAME=killed", "LEASE="+lease.String())
	ch.expect(t, "held", 10*time.Second)

	pttl, err := rdb.PTTL(ctx, "cg:lock:{killed}").Result()
	if err != nil || pttl <= 0 {
		t.Fatalf("PTTL = %v, %v", pttl, err)
	}
	ch.Signal(syscall.SIGKILL)
	killed := time.Now()
	lk, err := c.Lock(ctx, "killed", locks.WaitBudget(3*lease))
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Unlock(ctx)
	took := time.Since(killed)
	slack := max(pttl/10, 100*time.Millisecond)
	if took < pttl-slack {
		t.Fatalf("acquired %v after the kill, before the %v lease ran out", took, pttl)
	}
	// The upper bound is generous on a shared machine; it shows that the
	// waiter is woken at the expiry, not by a slow poll.
	if took > pttl+max(slack, 500*time.Millisecond) {
		t.Fatalf("acquired %v after the kill, long after the %v lease ran out", took, pttl)
	}
}

// TestGrantOfAPausedProcess: a process is paused (SIGSTOP) while its
// TryLock's request is on the wire, and Redis grants it the lock (a 20 s
// lease) while it is stopped. Resumed past its command's bound, the process
// either reads the grant and holds the lock, or does not and gives it back
// (its clean-up, sent while the process lives); in neither case is the name
// left locked for nobody. The oracle is Redis's own state and expiry: with
// the lease longer than the other process's wait budget, a grant that was
// neither held nor given back fails that Lock. (Both outcomes occur: in 10
// runs, 4 held and 6 given back.)
func TestGrantOfAPausedProcess(t *testing.T) {
	s := redistest.Start(t)
	px, err := faultproxy.New(s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { px.Close() })
	rdb := s.Client()
	ctx := context.Background()
	c := locks.New(rdb)
	t.Cleanup(func() { c.Close() })
	const lease = 20 * time.Second
	ch := startChild(t, "attempt", "REDIS_ADDR="+px.Addr(), "NAME=stopped", "LEASE="+lease.String())
	ch.expect(t, "ready", 10*time.Second)

	holding := px.HoldNextRequest()
	if _, err := io.WriteString(ch.Stdin, "go\n"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-holding:
	case <-time.After(10 * time.Second):
		t.Fatal("the child's TryLock sent nothing")
	}
	ch.Signal(syscall.SIGSTOP)
	px.Release()
	redistest.Eventually(t, 5*time.Second, "Redis granted the stopped process the lock", func() bool {
		n, err := rdb.Exists(ctx, "cg:lock:{stopped}").Result()
		return err == nil && n == 1
	})
	time.Sleep(1500 * time.Millisecond) // the pause itself: past the command's bound (500ms, at most twice that)
	ch.Signal(syscall.SIGCONT)

	line, err := ch.Next(10 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	outcome, rest, _ := strings.Cut(line, " ")
	t.Logf("the resumed process: %s", line)
	switch outcome {
	case "not-held":
		// Given back: free long before the grant's lease runs out.
		lk, err := c.Lock(ctx, "stopped", locks.WaitBudget(lease/2))
		if err != nil {
			t.Fatalf("the resumed process did not hold the lock (%s), yet it stayed taken: %v", rest, err)
		}
		if err := lk.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	case "held":
		fence, _ := strconv.ParseUint(rest, 10, 64)
		if _, err := c.TryLock(ctx, "stopped"); !errors.Is(err, locks.ErrNotObtained) {
			t.Fatalf("TryLock while the resumed process holds the lock: %v, want ErrNotObtained", err)
		}
		ch.Stdin.Close()
		if got := ch.expect(t, "unlock", 10*time.Second); got != "nil" {
			t.Fatalf("the resumed process's Unlock = %s", got)
		}
		lk, err := c.Lock(ctx, "stopped", locks.WaitBudget(lease/2))
		if err != nil {
			t.Fatal(err)
		}
		if lk.Fence() <= fence {
			t.Errorf("fence %d after the resumed process's %d", lk.Fence(), fence)
		}
		if err := lk.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	default:
		t.Fatalf("the resumed process said %q", line)
	}
}

// TestHolderPaused: a holder paused (SIGSTOP) past its lease loses the lock to
// a new holder with a higher fence; resumed, it sees Lost and Unlock says
// ErrNotHeld, and the new holder's key is intact.
func TestHolderPaused(t *testing.T) {
	s := redistest.Start(t)
	rdb := s.Client()
	ctx := context.Background()
	c := locks.New(rdb)
	t.Cleanup(func() { c.Close() })
	ch := startChild(t, "hold", "REDIS_ADDR="+s.Addr(), "NAME=paused", "LEASE=300ms")
	oldFence, _ := strconv.ParseUint(ch.expect(t, "held", 10*time.Second), 10, 64)

	ch.Signal(syscall.SIGSTOP)
	lk, err := c.Lock(ctx, "paused", locks.WaitBudget(10*time.Second))
	ch.Signal(syscall.SIGCONT)
	if err != nil {
		t.Fatal(err)
	}
	if lk.Fence() <= oldFence {
		t.Fatalf("new fence %d not above the paused holder's %d", lk.Fence(), oldFence)
	}
	ch.expect(t, "lost", 10*time.Second)
	if got := ch.expect(t, "unlock", 5*time.Second); got != "ErrNotHeld" {
		t.Fatalf("paused holder's Unlock = %s, want ErrNotHeld", got)
	}
	if got := ch.expect(t, "unlock-again", 5*time.Second); got != "nil" {
		t.Fatalf("second Unlock = %s, want nil", got)
	}
	if err := lk.Extend(ctx, time.Second); err != nil {
		t.Fatalf("new holder's lock damaged: %v", err)
	}
	if err := lk.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestBreakerSurvivesProcessPause is a generator whose action is a whole
// process's pause: a child process cycles locks on G goroutines (drawn) on a
// client with a Breaker, with or without ContextTimeoutEnabled (drawn), and
// is SIGSTOPped 1–3 times for 0.3, 0.8, 1.5 or 2 s each (drawn). A process resuming from a
// stop finds its commands past their deadlines, Redis's answers unread in
// its sockets. The oracle does not trust the library: the Redis server was
// never stopped, so the child's breaker must never open, and its cycles
// must go on after every pause.
func TestBreakerSurvivesProcessPause(t *testing.T) {
	s := redistest.Start(t)
	var run int
	gen.Check(t, 3, func(rt *rapid.T) {
		// Drawn from sets (rapid favours small integers; the region that
		// matters is many commands in flight and pauses past Silence).
		g := rapid.SampledFrom([]int{8, 4, 1}).Draw(rt, "goroutines")
		cte := rapid.Bool().Draw(rt, "ContextTimeoutEnabled")
		run++ // names of its own: a killed child's locks outlive it
		ch := startChild(t, "busy", "REDIS_ADDR="+s.Addr(), fmt.Sprintf("G=%d", g), fmt.Sprintf("NAME=pause%d", run),
			"CTE="+map[bool]string{true: "1", false: "0"}[cte])
		defer ch.Kill() // a failed check's child stops at once (shrinking runs many)
		for l := ""; l != "ready"; {
			var err error
			if l, err = ch.Next(10 * time.Second); err != nil {
				rt.Fatalf("child not ready: %v", err)
			}
		}
		cycles := func() int {
			if _, err := io.WriteString(ch.Stdin, "report\n"); err != nil {
				rt.Fatal(err)
			}
			for {
				l, err := ch.Next(10 * time.Second)
				if err != nil {
					rt.Fatal(err)
				}
				if rest, ok := strings.CutPrefix(l, "opened"); ok {
					rt.Fatalf("the paused process's breaker opened, Redis answering throughout:%s", rest)
				}
				if rest, ok := strings.CutPrefix(l, "cycles "); ok {
					n, _ := strconv.Atoi(rest)
					return n
				}
			}
		}
		for range rapid.IntRange(1, 3).Draw(rt, "pauses") {
			pause := time.Duration(rapid.SampledFrom([]int{1500, 2000, 800, 300}).Draw(rt, "pause ms")) * time.Millisecond
			before := cycles()
			ch.Signal(syscall.SIGSTOP)
			<-time.After(pause) // the fault's length, not a wait for an event
			ch.Signal(syscall.SIGCONT)
			// Cycles succeed again (waited for, bounded), and no "opened"
			// came meanwhile.
			deadline := time.Now().Add(10 * time.Second)
			for n := cycles(); n < before+50; n = cycles() {
				if time.Now().After(deadline) {
					rt.Fatalf("%d lock cycles in 10s after a %v pause, want 50", n-before, pause)
				}
			}
		}
		ch.Stdin.Close()
		rest, err := ch.Wait()
		if err != nil {
			rt.Fatalf("child: %v %q", err, rest)
		}
		for _, l := range rest {
			if strings.HasPrefix(l, "opened") {
				rt.Fatalf("the paused process's breaker opened, Redis answering throughout: %s", l)
			}
		}
	})
}
