package locks_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/internal/redistest"
	"github.com/cacheguard/cacheguard/locks"
)

func waitCalls(t *testing.T, s *redistest.Server) int {
	t.Helper()
	info, err := s.Info(context.Background(), "commandstats")
	if err != nil {
		t.Fatal(err)
	}
	v, ok := info["cmdstat_wait"]
	if !ok {
		return 0
	}
	calls, _, _ := strings.Cut(strings.TrimPrefix(v, "calls="), ",")
	n, _ := strconv.Atoi(calls)
	return n
}

// TestReplicaAcknowledgement: Replicas sends WAIT on the connection that
// wrote the lock; too few acknowledgements release the lock and fail; without
// the option no WAIT is sent.
func TestReplicaAcknowledgement(t *testing.T) {
	ctx := context.Background()
	ss := redistest.StartN(t, 2)
	master, replica := ss[0], ss[1]
	if _, err := replica.Do(ctx, "REPLICAOF", "127.0.0.1", master.Port()); err != nil {
		t.Fatal(err)
	}
	eventually(t, 15*time.Second, "replica linked", func() bool {
		info, _ := replica.Info(ctx, "replication")
		return info["master_link_status"] == "up"
	})
	rdb := master.Client()
	c := locks.New(rdb)
	defer c.Close()

	lk, err := c.TryLock(ctx, "acked")
	if err != nil {
		t.Fatal(err)
	}
	lk.Unlock(ctx)
	if n := waitCalls(t, master); n != 0 {
		t.Fatalf("WAIT sent %d times without Replicas", n)
	}

	lk, err = c.TryLock(ctx, "acked", locks.Replicas(1, time.Second))
	if err != nil {
		t.Fatalf("with a live replica: %v", err)
	}
	lk.Unlock(ctx)
	if n := waitCalls(t, master); n != 1 {
		t.Fatalf("cmdstat_wait calls = %d, want 1", n)
	}

	replica.Pause()
	defer replica.Resume()
	_, err = c.TryLock(ctx, "acked", locks.Replicas(1, 200*time.Millisecond))
	var re *locks.ReplicaError
	if !errors.Is(err, locks.ErrNotObtained) || !errors.As(err, &re) || re.Got != 0 || re.Want != 1 {
		t.Fatalf("with the replica paused: %v, want ErrNotObtained with a ReplicaError 0/1", err)
	}
	if rdb.Exists(ctx, "cg:lock:{acked}").Val() != 0 {
		t.Fatal("a lock refused for want of replicas was left behind")
	}
}

// Replicas holds on every grant path. On a server without replicas a
// lock handed to a queued Lock(Replicas(1)) fails with a ReplicaError
// and is handed on (it used to be returned without any WAIT), and a nested
// acquisition that re-enters fails likewise while the outer hold stays.
func TestReplicasOnEveryGrantPath(t *testing.T) {
	ctx := context.Background()
	for _, mode := range []string{"default", "fair"} {
		t.Run("hand-off/"+mode, func(t *testing.T) {
			c, rdb, s := newClient(t)
			var opts []locks.Option
			if mode == "fair" {
				opts = append(opts, locks.Fair())
			}
			b := locks.New(s.Client(), opts...)
			defer b.Close()
			held, err := c.TryLock(ctx, "ho")
			if err != nil {
				t.Fatal(err)
			}
			got := make(chan error, 1)
			go func() {
				lk, err := b.Lock(ctx, "ho", locks.Replicas(1, 100*time.Millisecond), locks.WaitBudget(10*time.Second))
				if lk != nil {
					err = errors.Join(errors.New("got a lock"), err)
				}
				got <- err
			}()
			eventually(t, 5*time.Second, "waiter queued", func() bool { return rdb.ZCard(ctx, "cg:q:{ho}").Val() == 1 })
			before := waitCalls(t, s)
			if err := held.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			err = waitErr(t, got, 5*time.Second, "queued Lock")
			var re *locks.ReplicaError
			if !errors.As(err, &re) || !errors.Is(err, locks.ErrNotObtained) || !errors.Is(err, locks.ErrUnavailable) || errors.Is(err, locks.ErrBusy) {
				t.Fatalf("lock handed to a waiter with Replicas(1) and no replica: %v, want a ReplicaError", err)
			}
			if waitCalls(t, s) == before {
				t.Fatal("no WAIT sent for the hand-off")
			}
			eventually(t, time.Second, "the refused hand-off released", func() bool { return rdb.Exists(ctx, "cg:lock:{ho}").Val() == 0 })
		})
	}
	t.Run("re-entry", func(t *testing.T) {
		c, rdb, _ := newClient(t)
		octx := locks.WithOwner(ctx, "req")
		outer, err := c.TryLock(octx, "re")
		if err != nil {
			t.Fatal(err)
		}
		_, err = c.TryLock(octx, "re", locks.Replicas(1, 100*time.Millisecond))
		var re *locks.ReplicaError
		if !errors.As(err, &re) {
			t.Fatalf("nested acquisition with Replicas(1) and no replica: %v, want a ReplicaError", err)
		}
		if n := rdb.HGet(ctx, "cg:lock:{re}", "n").Val(); n != "1" {
			t.Fatalf("hold count %q after the refused re-entry, want the outer's 1", n)
		}
		if err := outer.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	})
}

// TestCloseWaitsForAbandonedWaitUpToItsTimeout: a Lock with Replicas whose
// context ends during its WAIT returns at its deadline; its WAIT goes on, on
// a goroutine of the client's, and its grant is given back after it. Close
// waits for that (as its doc says: up to the WAIT timeout plus two
// CommandTimeouts), never longer, and the name is free when Close returns.
// The probe that found Close taking 3.7 s after a Replicas(1, 3s) Lock had
// returned measured this bound; before, Close's doc claimed two
// CommandTimeouts at most.
func TestCloseWaitsForAbandonedWaitUpToItsTimeout(t *testing.T) {
	ctx := context.Background()
	s := redistest.Start(t)
	rdb := s.Client(func(o *redis.Options) { o.ContextTimeoutEnabled = true })
	c := locks.New(rdb, locks.Logger(nil))
	const wait = time.Second
	cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	lk, err := c.Lock(cctx, "abandoned-wait", locks.Replicas(1, wait))
	if err == nil {
		lk.Unlock(ctx)
		t.Fatal("granted without a replica")
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Lock under a 300ms context: %v, want its deadline", err)
	}
	if took := time.Since(start); took > wait {
		t.Fatalf("Lock returned after %v, past its context (300ms)", took)
	}
	closeStart := time.Now()
	c.Close()
	// The bound: the WAIT timeout plus two CommandTimeouts (500ms), counted
	// from the attempt's send, and a second's margin for a loaded host.
	if took, bound := time.Since(closeStart), wait+2*500*time.Millisecond+time.Second; took > bound {
		t.Errorf("Close took %v, over the WAIT timeout plus two CommandTimeouts (%v with margin)", took, bound)
	}
	if c.Held() != 0 {
		t.Errorf("Held() = %d after Close", c.Held())
	}
	if n := rdb.Exists(ctx, "cg:lock:{abandoned-wait}").Val(); n != 0 {
		t.Errorf("the abandoned grant was not given back by the time Close returned (pttl %v)", rdb.PTTL(ctx, "cg:lock:{abandoned-wait}").Val())
	}
	other := locks.New(s.Client(), locks.Logger(nil))
	defer other.Close()
	theirs, err := other.TryLock(ctx, "abandoned-wait")
	if err != nil {
		t.Fatalf("another client after Close: %v", err)
	}
	if err := theirs.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}
