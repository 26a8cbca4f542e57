package reliability

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/internal/redistest"
	"github.com/cacheguard/cacheguard/locks"
)

// TestReliabilityLostScopePaused: a lost lock scope is never re-acquired
// behind the caller's back. A process holds "repos:1" under an owner (as a
// ginmw request does) and is SIGSTOPped past its lease; another process takes
// the lock (a newer fence) and releases it. Resumed, the first process makes
// a nested acquisition of "repos:1" under the same owner (as gormplugin does
// inside that request): it must fail with ErrLost and take nothing —
// whether the process noticed the loss first (its renewer) or the nested
// attempt finds the holding gone — so the write it would make with what it
// read under the lost scope cannot land under a newer fence. Once the scope's
// Lock is Unlocked, the owner locks the name afresh with a newer fence.
// Violations count nested acquisitions granted after the loss and fences
// out of order.
func TestReliabilityLostScopePaused(t *testing.T) {
	noLeaks(t)
	const lease, rounds = 300 * time.Millisecond, 3
	srv := redistest.Start(t)
	rdb := srv.Client()
	c := locks.New(srv.Client())
	t.Cleanup(func() { c.Close() })
	p := startChild(t, "scoped", "LOCK_ADDR="+srv.Addr(), "NAME=repos:1", "LEASE="+lease.String())
	fig := Figures{Scenario: "nested acquisition under the owner of a scope lost while its process was SIGSTOPped past the lease"}
	var last uint64
	fence := func(who, line string) uint64 {
		t.Helper()
		f, err := strconv.ParseUint(strings.TrimPrefix(line, "granted "), 10, 64)
		if !strings.HasPrefix(line, "granted ") || err != nil {
			t.Fatalf("%s: %q, want granted <fence>", who, line)
		}
		if f <= last {
			fig.Violations++
			t.Errorf("%s: fence %d not above %d", who, f, last)
		}
		last = f
		return f
	}
	for round := range rounds {
		fig.Attempted++
		fence("outer", p.do(t, "outer", 5*time.Second))
		p.Signal(syscall.SIGSTOP)
		start := time.Now()
		lk, err := c.Lock(context.Background(), "repos:1", locks.WaitBudget(10*time.Second))
		if err != nil {
			p.Signal(syscall.SIGCONT)
			t.Fatalf("round %d: the next holder: %v", round, err)
		}
		fig.Recovery = max(fig.Recovery, time.Since(start))
		if lk.Fence() <= last {
			fig.Violations++
			t.Errorf("round %d: next holder's fence %d not above %d", round, lk.Fence(), last)
		}
		last = lk.Fence()
		if err := lk.Unlock(context.Background()); err != nil {
			t.Fatal(err)
		}
		p.Signal(syscall.SIGCONT)
		switch got := p.do(t, "nested", 5*time.Second); {
		case got == "lost":
			fig.Refused++
		default:
			fig.Violations++
			t.Errorf("round %d: nested acquisition after the loss: %s, want lost", round, got)
		}
		if n := rdb.Exists(context.Background(), "cg:lock:{repos:1}").Val(); n != 0 {
			fig.Violations++
			t.Errorf("round %d: the failed nested acquisition left the lock taken", round)
		}
		if got := p.do(t, "release", 5*time.Second); got != "notheld" {
			t.Errorf("round %d: the lost scope's Unlock: %s, want notheld", round, got)
		}
		fig.Attempted++
		fence("afresh after the Unlock", p.do(t, "outer", 5*time.Second))
		if got := p.do(t, "release", 5*time.Second); got != "released" {
			t.Errorf("round %d: %s, want released", round, got)
		}
		fig.Succeeded++
	}
	fig.Note = fmt.Sprintf("%d rounds; refused = nested acquisitions refused with ErrLost", rounds)
	fig.Report(t)
}

// childScoped serves commands on the lock NAME under one owner:
// outer (TryLock), nested (TryLock again under the owner), release (of the
// outer). Replies: granted <fence>, lost, refused, unknown <err>; released,
// notheld.
func childScoped() error {
	ctx := locks.WithOwner(context.Background(), "request-1")
	lease, err := time.ParseDuration(os.Getenv("LEASE"))
	if err != nil {
		return err
	}
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv("LOCK_ADDR")})
	defer rdb.Close()
	c := locks.New(rdb, locks.Lease(lease))
	defer c.Close()
	name := os.Getenv("NAME")
	var outer *locks.Lock
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		switch cmd := sc.Text(); cmd {
		case "outer", "nested":
			lk, err := c.TryLock(ctx, name)
			switch {
			case err == nil:
				if cmd == "outer" {
					outer = lk
				}
				fmt.Println("granted", lk.Fence())
			case errors.Is(err, locks.ErrLost):
				fmt.Println("lost")
			case errors.Is(err, locks.ErrBusy):
				fmt.Println("refused")
			default:
				fmt.Println("unknown", err)
			}
		case "release":
			switch err := outer.Unlock(ctx); {
			case err == nil:
				fmt.Println("released")
			case errors.Is(err, locks.ErrNotHeld):
				fmt.Println("notheld")
			default:
				fmt.Println("unknown", err)
			}
		default:
			fmt.Println("error unknown command", cmd)
		}
	}
	return nil
}
