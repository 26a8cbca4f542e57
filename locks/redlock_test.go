package locks_test

import (
	"context"
	"errors"
	"fmt"
	"math/bits"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/internal/redistest"
	"github.com/cacheguard/cacheguard/locks"
)

// redlockSet is a Redlock over n fresh servers, plus a separate admin client
// per server for inspecting and planting keys.
type redlockSet struct {
	r       *locks.Redlock
	servers []*redistest.Server
	admin   []*redis.Client
}

// rlNodeClient is how the tests connect to a Redlock node, as NewRedlock's doc
// recommends: context deadlines reach the socket, and no client-side retries
// (of commands, or of dials to a server that is down).
func rlNodeClient(s *redistest.Server) *redis.Client {
	return s.Client(func(o *redis.Options) {
		o.ContextTimeoutEnabled = true
		o.MaxRetries = -1
		o.DialerRetries = 1
	})
}

func newRedlockSet(t testing.TB, n int, serverOpts []redistest.Option, opts ...locks.Option) *redlockSet {
	t.Helper()
	servers := redistest.StartN(t, n, serverOpts...)
	return redlockOn(t, servers, opts...)
}

func redlockOn(t testing.TB, servers []*redistest.Server, opts ...locks.Option) *redlockSet {
	t.Helper()
	set := &redlockSet{servers: servers}
	clients := make([]redis.UniversalClient, len(servers))
	for i, s := range servers {
		c := rlNodeClient(s)
		c.Ping(context.Background()) // connect now: the first dial is not what tests time
		clients[i] = c
		set.admin = append(set.admin, s.Client())
	}
	// The default node timeout for a short lease is a few milliseconds, which
	// a loaded 2-core test machine under -race misses now and then; tests
	// that time the nodes set their own.
	opts = append([]locks.Option{locks.NodeTimeout(250 * time.Millisecond)}, opts...)
	r := locks.NewRedlock(clients, opts...)
	t.Cleanup(func() { r.Close() })
	set.r = r
	return set
}

func rlKey(name string) string { return "cg:rlock:{" + name + "}" }

// holdForeign makes node i hold name for another owner, as another client would.
func (s *redlockSet) holdForeign(t testing.TB, i int, name string) {
	t.Helper()
	ctx := context.Background()
	if err := s.admin[i].HSet(ctx, rlKey(name), "o", "someone-else", "x", 1).Err(); err != nil {
		t.Fatal(err)
	}
	s.admin[i].PExpire(ctx, rlKey(name), time.Minute)
}

// owners returns, per live node, the owner of name's key there ("" when none).
func (s *redlockSet) owners(t testing.TB, name string, nodes ...int) []string {
	t.Helper()
	out := make([]string, len(nodes))
	for j, i := range nodes {
		o, err := s.admin[i].HGet(context.Background(), rlKey(name), "o").Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			t.Fatalf("node %d: %v", i, err)
		}
		out[j] = o
	}
	return out
}

func (s *redlockSet) addrs(nodes ...int) []string {
	out := make([]string, len(nodes))
	for j, i := range nodes {
		out[j] = s.servers[i].Addr()
	}
	return out
}

func rlSortedAddrs(s *redlockSet, nodes ...int) []string { return rlSorted(s.addrs(nodes...)) }

func rlCountEmpty(xs []string) int {
	n := 0
	for _, x := range xs {
		if x == "" {
			n++
		}
	}
	return n
}

func rlSorted(xs []string) []string {
	xs = slices.Clone(xs)
	slices.Sort(xs)
	return xs
}

func rlFailedAddrs(e *locks.RedlockError) []string {
	var out []string
	for _, f := range e.Failed {
		out = append(out, f.Addr)
	}
	slices.Sort(out)
	return out
}

func TestNewRedlockRejects(t *testing.T) {
	servers := redistest.StartN(t, 2)
	a, b := servers[0].Client(), servers[1].Client()
	a2 := servers[0].Client(func(o *redis.Options) { o.DB = 1 }) // another database of the same server
	cases := map[string]struct {
		clients []redis.UniversalClient
		opts    []locks.Option
	}{
		"no clients":     {nil, nil},
		"nil client":     {[]redis.UniversalClient{a, nil}, nil},
		"same client":    {[]redis.UniversalClient{a, b, a}, nil},
		"same address":   {[]redis.UniversalClient{a, b, a2}, nil},
		"short lease":    {[]redis.UniversalClient{a, b}, []locks.Option{locks.Lease(time.Millisecond)}},
		"drift > lease":  {[]redis.UniversalClient{a, b}, []locks.Option{locks.Lease(time.Second), locks.Drift(2 * time.Second)}},
		"negative drift": {[]redis.UniversalClient{a, b}, []locks.Option{locks.Drift(-time.Second)}},
	}
	for name, c := range cases {
		func() {
			defer func() {
				if p, _ := recover().(string); !strings.HasPrefix(p, "locks: ") {
					t.Errorf("%s: panic %q, want a locks: message", name, p)
				}
			}()
			locks.NewRedlock(c.clients, c.opts...)
		}()
	}
	r := locks.NewRedlock([]redis.UniversalClient{a, b})
	defer r.Close()
	if r.Quorum() != 2 {
		t.Fatalf("quorum %d", r.Quorum())
	}
	for name, o := range map[string]locks.CallOption{"fair": locks.Fair(), "replicas": locks.Replicas(1, time.Second)} {
		if _, err := r.TryLock(context.Background(), "x", o); !errors.Is(err, locks.ErrInvalid) {
			t.Errorf("per-call %s on a Redlock: %v, want ErrInvalid", name, err)
		}
	}
	if _, err := r.TryLock(context.Background(), ""); !errors.Is(err, locks.ErrInvalid) {
		t.Fatalf("empty name: %v", err)
	}
}

func TestRedlockLockUnlock(t *testing.T) {
	ctx := context.Background()
	s := newRedlockSet(t, 5, nil, locks.Lease(2*time.Second))
	lk, err := s.r.TryLock(ctx, "rl:basic")
	if err != nil {
		t.Fatal(err)
	}
	if lk.Fence() != 0 {
		t.Fatalf("Redlock fence %d, want 0 (no tokens)", lk.Fence())
	}
	// The validity is the lease less the drift allowance (20ms + 2ms) and the time taken.
	if ttl := lk.TTL(); ttl <= 0 || ttl > 2*time.Second-22*time.Millisecond {
		t.Fatalf("TTL %v outside (0, lease − drift]", ttl)
	}
	all := []int{0, 1, 2, 3, 4}
	// TryLock returns at the quorum; the last grants land just after.
	eventually(t, 2*time.Second, "lock on every node", func() bool {
		return !slices.Contains(s.owners(t, "rl:basic", all...), "")
	})

	_, err = s.r.TryLock(ctx, "rl:basic")
	var re *locks.RedlockError
	if !errors.Is(err, locks.ErrNotObtained) || !errors.As(err, &re) {
		t.Fatalf("second TryLock: %v, want a RedlockError matching ErrNotObtained", err)
	}
	if !slices.Equal(rlSorted(re.Refused), rlSortedAddrs(s, all...)) || len(re.Granted) != 0 || len(re.Failed) != 0 {
		t.Fatalf("want every node refusing, got %v", re)
	}

	if err := lk.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := lk.Unlock(ctx); err != nil {
		t.Fatalf("second Unlock: %v", err)
	}
	for i, o := range s.owners(t, "rl:basic", all...) {
		if o != "" {
			t.Fatalf("key left on node %d after Unlock", i)
		}
	}
	lk2, err := s.r.TryLock(ctx, "rl:basic")
	if err != nil {
		t.Fatal(err)
	}
	lk2.Unlock(ctx)
}

// With 2 of 5 nodes down every acquisition still reaches the quorum of 3.
func TestRedlockTwoOfFiveKilled(t *testing.T) {
	ctx := context.Background()
	s := newRedlockSet(t, 5, nil, locks.Lease(2*time.Second))
	s.servers[1].Kill()
	s.servers[3].Kill()
	ok := 0
	for i := range 200 {
		lk, err := s.r.TryLock(ctx, fmt.Sprintf("rl:two-down:%d", i%7))
		if err != nil {
			t.Errorf("acquisition %d: %v", i, err)
			continue
		}
		ok++
		if err := lk.Unlock(ctx); err != nil {
			t.Errorf("release %d: %v", i, err)
		}
	}
	if ok != 200 {
		t.Fatalf("%d/200 acquisitions succeeded", ok)
	}
}

// With 3 of 5 nodes down no quorum exists: Lock gives up within its wait
// budget, names the dead nodes, and leaves nothing on the live ones.
func TestRedlockThreeOfFiveKilled(t *testing.T) {
	ctx := context.Background()
	// (A node timeout of 50ms was missed now and then by the live nodes of a
	// loaded 2-core machine under -race, which then counted as failed.)
	s := newRedlockSet(t, 5, nil, locks.Lease(2*time.Second), locks.NodeTimeout(150*time.Millisecond))
	for _, i := range []int{0, 2, 4} {
		s.servers[i].Kill()
	}
	const budget = 1500 * time.Millisecond
	start := time.Now()
	_, err := s.r.Lock(ctx, "rl:three-down", locks.WaitBudget(budget))
	took := time.Since(start)
	var re *locks.RedlockError
	if !errors.Is(err, locks.ErrNotObtained) || !errors.As(err, &re) {
		t.Fatalf("Lock: %v, want a RedlockError matching ErrNotObtained", err)
	}
	if took > budget {
		t.Errorf("Lock took %v, beyond its wait budget %v", took, budget)
	}
	if re.Attempts < 2 {
		t.Errorf("Lock made %d attempts in %v, want retries", re.Attempts, took)
	}
	if got, want := rlFailedAddrs(re), rlSortedAddrs(s, 0, 2, 4); !slices.Equal(got, want) {
		t.Errorf("failed nodes %v, want %v (error: %v)", got, want, err)
	}
	for _, f := range re.Failed {
		if f.Err == nil {
			t.Errorf("node %s failed without a cause", f.Addr)
		}
	}
	if !slices.Equal(rlSorted(re.Granted), rlSortedAddrs(s, 1, 3)) {
		t.Errorf("granted %v, want the live nodes", re.Granted)
	}
	for _, i := range []int{1, 3} {
		// Only the released acquisitions' tombstones (see redlock_release.lua) may be left.
		keys, err := s.admin[i].Keys(ctx, "*").Result()
		keys = slices.DeleteFunc(keys, func(k string) bool { return strings.Contains(k, "}:g:") })
		if err != nil || len(keys) != 0 {
			t.Errorf("live node %d holds keys %q (%v) after the failed Lock", i, keys, err)
		}
	}
}

// For each of the 32 subsets of nodes already held by someone else, TryLock
// succeeds exactly when at least 3 nodes are free, and a failed attempt
// leaves the free nodes empty and the held ones untouched.
func TestRedlockPreheldSubsets(t *testing.T) {
	ctx := context.Background()
	s := newRedlockSet(t, 5, nil, locks.Lease(2*time.Second))
	for mask := range 32 {
		name := fmt.Sprintf("rl:subset:%02d", mask)
		var held, free []int
		for i := range 5 {
			if mask&(1<<i) != 0 {
				held = append(held, i)
				s.holdForeign(t, i, name)
			} else {
				free = append(free, i)
			}
		}
		lk, err := s.r.TryLock(ctx, name)
		want := 5-bits.OnesCount(uint(mask)) >= 3
		if (err == nil) != want {
			t.Errorf("mask %05b (%d free): err %v, want success %v", mask, len(free), err, want)
			continue
		}
		if err == nil {
			if err := lk.Unlock(ctx); err != nil {
				t.Errorf("mask %05b: Unlock: %v", mask, err)
			}
		} else {
			var re *locks.RedlockError
			if !errors.As(err, &re) || !errors.Is(err, locks.ErrNotObtained) {
				t.Fatalf("mask %05b: %v", mask, err)
			}
			if !slices.Equal(rlSorted(re.Refused), rlSortedAddrs(s, held...)) || !slices.Equal(rlSorted(re.Granted), rlSortedAddrs(s, free...)) {
				t.Errorf("mask %05b: granted %v refused %v", mask, re.Granted, re.Refused)
			}
		}
		// A free node that answered after the quorum was reached has its late
		// grant undone by that node's call as it lands, which may be just
		// after Unlock (or the failed TryLock) returned.
		eventually(t, 2*time.Second, fmt.Sprintf("mask %05b: free nodes empty", mask), func() bool {
			return rlCountEmpty(s.owners(t, name, free...)) == len(free)
		})
		for j, o := range s.owners(t, name, held...) {
			if o != "someone-else" {
				t.Errorf("mask %05b: foreign hold on node %d became %q", mask, held[j], o)
			}
		}
	}
}

// A stalled (SIGSTOP) node costs an attempt at most the per-node timeout:
// nothing when the others make a quorum, the timeout when it is needed.
func TestRedlockPausedNode(t *testing.T) {
	ctx := context.Background()
	const nodeTimeout = 500 * time.Millisecond
	s := newRedlockSet(t, 5, nil, locks.Lease(5*time.Second), locks.NodeTimeout(nodeTimeout))
	s.servers[0].Pause()
	t.Cleanup(s.servers[0].Resume)

	start := time.Now()
	lk, err := s.r.TryLock(ctx, "rl:paused:quorum")
	if took := time.Since(start); err != nil || took >= nodeTimeout {
		t.Fatalf("TryLock with 4 live nodes: %v after %v, want success within %v", err, took, nodeTimeout)
	}
	if err := lk.Unlock(ctx); err != nil {
		t.Fatal(err)
	}

	// Nodes 1 and 2 are held elsewhere: the quorum needs the paused node.
	s.holdForeign(t, 1, "rl:paused:needed")
	s.holdForeign(t, 2, "rl:paused:needed")
	start = time.Now()
	_, err = s.r.TryLock(ctx, "rl:paused:needed")
	took := time.Since(start)
	var re *locks.RedlockError
	if !errors.As(err, &re) {
		t.Fatalf("TryLock: %v, want a RedlockError", err)
	}
	if took < nodeTimeout || took >= 2*nodeTimeout {
		t.Errorf("attempt took %v, want between the node timeout %v and twice it", took, nodeTimeout)
	}
	if len(re.Failed) != 1 || re.Failed[0].Addr != s.servers[0].Addr() || !errors.Is(re.Failed[0].Err, locks.ErrNodeTimeout) {
		t.Errorf("want the paused node failed by timeout, got %v", err)
	}
	if o := s.owners(t, "rl:paused:needed", 3, 4); o[0] != "" || o[1] != "" {
		t.Errorf("keys left on the granting nodes: %q", o)
	}
}

// A quorum that arrives after the lease (here: a node stalled for longer than
// it) is refused: the first grants may already have expired.
func TestRedlockLeaseShorterThanQuorumTime(t *testing.T) {
	ctx := context.Background()
	const lease = 100 * time.Millisecond
	s := newRedlockSet(t, 5, nil, locks.Lease(lease), locks.NodeTimeout(5*time.Second))
	s.servers[3].Kill()
	s.servers[4].Kill()
	s.servers[2].Pause()
	resume := time.AfterFunc(2*lease, s.servers[2].Resume) // node 2 answers after the lease
	t.Cleanup(func() { resume.Stop(); s.servers[2].Resume() })

	lk, err := s.r.TryLock(ctx, "rl:too-slow")
	if err == nil {
		lk.Unlock(ctx)
		t.Fatal("granted a lock whose quorum came after its lease")
	}
	var re *locks.RedlockError
	if !errors.Is(err, locks.ErrNoValidity) || !errors.Is(err, locks.ErrNotObtained) || !errors.As(err, &re) {
		t.Fatalf("TryLock: %v, want ErrNoValidity and ErrNotObtained", err)
	}
	if len(re.Granted) != 3 {
		t.Errorf("granted by %v, want the 3 live nodes", re.Granted)
	}
	if o := s.owners(t, "rl:too-slow", 0, 1, 2); slices.ContainsFunc(o, func(x string) bool { return x != "" }) {
		t.Errorf("keys left after the refused attempt: %q", o)
	}
}

// rlWaitClosed waits for ch to close, for at most d.
func rlWaitClosed(t *testing.T, ch <-chan struct{}, d time.Duration, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(d):
		t.Fatalf("%s: not closed within %v", what, d)
	}
}

// Renewal needs a quorum: the lock survives one failure, and Lost closes once
// a quorum can no longer be renewed (nodes down, or keys gone).
func TestRedlockLostWhenQuorumGone(t *testing.T) {
	ctx := context.Background()
	const lease = 600 * time.Millisecond
	// Lost closes at the first renewal that finds the quorum gone, a third
	// of the validity later; the bound only keeps a broken renewal from
	// hanging the test. It was three leases (1.8s), and a full -race run on
	// a loaded 2-core machine once missed it.
	const lostWithin = 10 * time.Second

	t.Run("nodes down", func(t *testing.T) {
		s := newRedlockSet(t, 5, nil, locks.Lease(lease))
		lk, err := s.r.Lock(ctx, "rl:lost:down")
		if err != nil {
			t.Fatal(err)
		}
		s.servers[0].Kill()
		s.servers[1].Kill()
		// Two renewals later (at a third of the validity each) it is still held.
		select {
		case <-lk.Lost():
			t.Fatal("lost with 3 of 5 nodes alive")
		case <-time.After(lease):
		}
		s.servers[2].Kill()
		rlWaitClosed(t, lk.Lost(), lostWithin, "Lost")
		rlWaitClosed(t, lk.Context().Done(), time.Second, "Context")
		if lk.TTL() != 0 {
			t.Fatalf("TTL %v after loss", lk.TTL())
		}
		if err := lk.Unlock(ctx); !errors.Is(err, locks.ErrNotHeld) {
			t.Fatalf("Unlock after loss: %v, want ErrNotHeld", err)
		}
	})
	t.Run("keys gone", func(t *testing.T) {
		s := newRedlockSet(t, 5, nil, locks.Lease(lease))
		lk, err := s.r.Lock(ctx, "rl:lost:keys")
		if err != nil {
			t.Fatal(err)
		}
		// An attempt returns once a quorum granted it; the other nodes'
		// grants may still be on their way, and one landing after the DEL
		// below would restore the quorum. Wait for all five first.
		eventually(t, 5*time.Second, "the lock on every node", func() bool {
			for _, a := range s.admin {
				if a.Exists(ctx, rlKey("rl:lost:keys")).Val() != 1 {
					return false
				}
			}
			return true
		})
		for _, i := range []int{2, 3, 4} {
			s.admin[i].Del(ctx, rlKey("rl:lost:keys"))
		}
		rlWaitClosed(t, lk.Lost(), lostWithin, "Lost")
	})
}

// Background renewal keeps the lock on every node well past its lease.
func TestRedlockRenewal(t *testing.T) {
	ctx := context.Background()
	const lease = 500 * time.Millisecond
	s := newRedlockSet(t, 5, nil, locks.Lease(lease))
	lk, err := s.r.Lock(ctx, "rl:renew")
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-lk.Lost():
		t.Fatal("lost while renewed")
	case <-time.After(3 * lease):
	}
	// Renewal only extends: a node whose key lapsed (say, one slow answer too
	// many) is not taken again, so a quorum is what is guaranteed.
	if o := s.owners(t, "rl:renew", 0, 1, 2, 3, 4); 5-rlCountEmpty(o) < s.r.Quorum() {
		t.Fatalf("lock on fewer than a quorum of nodes after renewals: %q", o)
	}
	if err := lk.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestRedlockExtend(t *testing.T) {
	ctx := context.Background()
	s := newRedlockSet(t, 5, nil, locks.Lease(time.Second), locks.NoRenewal())
	lk, err := s.r.Lock(ctx, "rl:extend")
	if err != nil {
		t.Fatal(err)
	}
	if err := lk.Extend(ctx, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if ttl := lk.TTL(); ttl < 4*time.Second || ttl > 5*time.Second {
		t.Fatalf("TTL after Extend(5s): %v", ttl)
	}
	// A quorum confirmed before Extend returned, and the keys outlive the
	// validity by the drift allowance (5s×1% + 2ms).
	extended := 0
	for i := range 5 {
		if s.admin[i].PTTL(ctx, rlKey("rl:extend")).Val() > 5*time.Second {
			extended++
		}
	}
	if extended < s.r.Quorum() {
		t.Fatalf("%d nodes extended past 5s, want a quorum", extended)
	}
	// One node losing the key leaves a quorum; three make Extend fail for good.
	s.admin[0].Del(ctx, rlKey("rl:extend"))
	if err := lk.Extend(ctx, 5*time.Second); err != nil {
		t.Fatalf("Extend with 4 of 5: %v", err)
	}
	s.admin[1].Del(ctx, rlKey("rl:extend"))
	s.admin[2].Del(ctx, rlKey("rl:extend"))
	if err := lk.Extend(ctx, 5*time.Second); !errors.Is(err, locks.ErrNotHeld) {
		t.Fatalf("Extend with 2 of 5: %v, want ErrNotHeld", err)
	}
	rlWaitClosed(t, lk.Lost(), time.Second, "Lost")
}

func TestRedlockReentry(t *testing.T) {
	ctx := locks.WithOwner(context.Background(), locks.NewOwnerID())
	s := newRedlockSet(t, 3, nil, locks.Lease(2*time.Second))
	outer, err := s.r.Lock(ctx, "rl:reenter")
	if err != nil {
		t.Fatal(err)
	}
	inner, err := s.r.TryLock(ctx, "rl:reenter")
	if err != nil {
		t.Fatalf("re-entry: %v", err)
	}
	other := context.Background()
	if _, err := s.r.TryLock(other, "rl:reenter"); !errors.Is(err, locks.ErrNotObtained) {
		t.Fatalf("another owner got a re-entered lock: %v", err)
	}
	if err := inner.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := s.r.TryLock(other, "rl:reenter"); !errors.Is(err, locks.ErrNotObtained) {
		t.Fatalf("another owner got the lock after the inner release: %v", err)
	}
	if err := outer.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	lk, err := s.r.TryLock(other, "rl:reenter")
	if err != nil {
		t.Fatalf("after both releases: %v", err)
	}
	lk.Unlock(other)
}

// Lock waits (retrying) while the lock is held, and keeps the caller's
// context error when the context ends the wait.
func TestRedlockLockWaitsAndContext(t *testing.T) {
	s := newRedlockSet(t, 3, nil, locks.Lease(2*time.Second))
	bg := context.Background()
	lk, err := s.r.TryLock(bg, "rl:ctx")
	if err != nil {
		t.Fatal(err)
	}
	done, stop := context.WithCancel(bg)
	stop()
	if _, err := s.r.Lock(done, "rl:ctx-ended"); !errors.Is(err, context.Canceled) || !errors.Is(err, locks.ErrNotObtained) {
		t.Fatalf("Lock with an ended context: %v", err)
	}
	ctx, cancel := context.WithTimeout(bg, 300*time.Millisecond)
	defer cancel()
	_, err = s.r.Lock(ctx, "rl:ctx")
	var re *locks.RedlockError
	if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, locks.ErrNotObtained) || !errors.As(err, &re) {
		t.Fatalf("Lock: %v, want ErrNotObtained joined with the context's error", err)
	}

	// A waiter gets the lock soon after the holder releases it.
	got := make(chan error, 1)
	go func() {
		lk2, err := s.r.Lock(bg, "rl:ctx")
		if err == nil {
			err = lk2.Unlock(bg)
		}
		got <- err
	}()
	if err := lk.Unlock(bg); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("waiter: %v", err)
	}
}

func TestRedlockClose(t *testing.T) {
	ctx := context.Background()
	s := newRedlockSet(t, 3, nil, locks.Lease(2*time.Second))
	lk, err := s.r.TryLock(ctx, "rl:close")
	if err != nil {
		t.Fatal(err)
	}
	s.r.Close()
	rlWaitClosed(t, lk.Lost(), time.Second, "Lost after Close")
	if _, err := s.r.TryLock(ctx, "rl:close2"); !errors.Is(err, locks.ErrClosed) {
		t.Fatalf("TryLock after Close: %v", err)
	}
	if err := s.r.Close(); err != nil {
		t.Fatal(err)
	}
}
