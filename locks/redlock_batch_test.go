package locks_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/internal/rcmd"
	"github.com/cacheguard/cacheguard/internal/redistest"
	"github.com/cacheguard/cacheguard/locks"
)

// grantSpy counts the pipelined Redlock acquisitions of one key that its node
// granted (replied {1, 1} or {1, 2}).
type grantSpy struct {
	key     string
	granted atomic.Int32
}

func (s *grantSpy) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (s *grantSpy) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (s *grantSpy) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, c := range cmds {
			// evalsha|eval, sha|source, 2, key, tombstone, owner, acquisition, lease ms, tombstone life ms
			a := c.Args()
			cmd, ok := rcmd.AsCmd(c)
			if !ok || len(a) != 9 || a[3] != s.key {
				continue
			}
			if v, err := cmd.Int64Slice(); err == nil && len(v) == 2 && v[0] == 1 {
				s.granted.Add(1)
			}
		}
		return err
	}
}

// TestRedlockAbandonedNodeCallLateGrantJoinsHolding: when one node's direct
// slots are busy, an attempt's call to that node queues; if the node's time
// runs out first, the attempt goes on without it (the other nodes make the
// quorum) and the call is abandoned. When the queued call is sent after all
// and the node grants it while the lock is held, that grant is the holding's
// own: it stays (a renewal extends it and may count it; undoing it then would
// take a node from under the validity: TestRedlockLateGrantKept), and Unlock
// removes it with the others. (A late grant of a holding already being given
// back is undone: TestRedlockLateGrantKept.)
func TestRedlockAbandonedNodeCallLateGrantJoinsHolding(t *testing.T) {
	ctx := context.Background()
	const name = "rl:abandoned-node-call"
	key := rlKey(name)
	servers := redistest.StartN(t, 5)
	gate, spy := newGateHook(), &grantSpy{key: key}
	clients := make([]redis.UniversalClient, len(servers))
	admin := make([]*redis.Client, len(servers))
	for i, s := range servers {
		c := rlNodeClient(s)
		if err := c.Ping(ctx).Err(); err != nil { // dial now, before the gate
			t.Fatal(err)
		}
		if i == 0 {
			c.AddHook(gate)
			c.AddHook(spy)
		}
		clients[i] = c
		admin[i] = s.Client()
	}
	r := locks.NewRedlock(clients, locks.Lease(time.Minute))
	t.Cleanup(func() { r.Close() })
	// Cleanups run last-registered first: the gate opens before Close waits
	// for the calls it holds, also when the test stops early.
	var opened sync.Once
	open := func() { opened.Do(func() { close(gate.open) }) }
	t.Cleanup(open)

	// Two locks whose calls to node 0 are held in the gate: they take its
	// direct slots (their node timeout outlasts the test, so they still run
	// once the gate opens). Each TryLock returns at the quorum of the others.
	slots := []string{"rl:slot-1", "rl:slot-2"}
	var held []*locks.Lock
	for _, s := range slots {
		lk, err := r.TryLock(ctx, s, locks.NodeTimeout(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, lk)
	}
	for range slots {
		select {
		case <-gate.entered:
		case <-time.After(5 * time.Second):
			t.Fatal("calls to node 0 not held in the gate")
		}
	}

	// The attempt's call to node 0 queues behind the held ones; nodes 1-4
	// grant, so it succeeds without node 0, whose call is abandoned when its
	// node timeout ends.
	lk, err := r.TryLock(ctx, name, locks.NodeTimeout(2*time.Second)) // long enough for nodes 1–4 on a loaded machine
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "node 0's call queued and abandoned", func() bool {
		q, gaveUp, _ := r.NodeQueue(0)
		return q == 1 && gaveUp == 1
	})
	if n, err := admin[0].Exists(ctx, key).Result(); err != nil || n != 0 {
		t.Fatalf("node 0 has the key before its queued call was sent: %d, %v", n, err)
	}
	if spy.granted.Load() != 0 {
		t.Fatal("node 0 granted before the gate opened")
	}

	// Let node 0 work: the held calls finish, a sender pipelines the queue,
	// node 0 grants the abandoned acquisition; wait until nothing is left on
	// the wire or queued for node 0 (the clean-up included).
	open()
	eventually(t, 10*time.Second, "node 0 granted the abandoned call and went idle", func() bool {
		_, _, idle := r.NodeQueue(0)
		return spy.granted.Load() == 1 && idle
	})
	if o := rlOwners(t, admin, name); o[0] == "" || o[0] != o[1] {
		t.Fatalf("node 0 gave back the late grant of a lock still held; owners %q", o)
	}
	// The lock itself is still held on the quorum that granted it.
	for i := 1; i < len(admin); i++ {
		if o := rlOwners(t, admin, name)[i]; o == "" {
			t.Fatalf("node %d lost the lock", i)
		}
	}

	if err := lk.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	for _, h := range held {
		if err := h.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range append([]string{name}, slots...) {
		eventually(t, 5*time.Second, "no key left for "+n, func() bool {
			for _, o := range rlOwners(t, admin, n) {
				if o != "" {
					return false
				}
			}
			return true
		})
	}
}

// rlOwners returns the owner of name's key on each node ("" when none).
func rlOwners(t *testing.T, admin []*redis.Client, name string) []string {
	t.Helper()
	out := make([]string, len(admin))
	for i, c := range admin {
		o, err := c.HGet(context.Background(), rlKey(name), "o").Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			t.Fatalf("node %d: %v", i, err)
		}
		out[i] = o
	}
	return out
}

// rlRetryHook re-sends its node's next Redlock acquisition of key (as
// go-redis retrying a call whose reply was lost), after running between.
type rlRetryHook struct {
	key     string
	armed   atomic.Bool
	between func()
}

func (h *rlRetryHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *rlRetryHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		return h.around([]redis.Cmder{cmd}, func() error { return next(ctx, cmd) })
	}
}
func (h *rlRetryHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		return h.around(cmds, func() error { return next(ctx, cmds) })
	}
}
func (h *rlRetryHook) around(cmds []redis.Cmder, send func() error) error {
	fire := false
	for _, c := range cmds {
		if key, ok := locks.IsRedlockAcquire(c); ok && key == h.key && h.armed.CompareAndSwap(true, false) {
			fire = true
		}
	}
	if !fire {
		return send()
	}
	_ = send()
	h.between()
	return send()
}

// TestRedlockRetriedReentryStaysReentry: a Redlock re-entry whose call is
// retried on every node after the owner's first Lock was Unlocked (its
// release reached the nodes between the call and its retry) is still the
// re-entry the first call's replies said: the nested Lock succeeds with the
// holding, instead of failing its scope with ErrLost (the hold count it read
// before was 1, a fresh grant's).
func TestRedlockRetriedReentryStaysReentry(t *testing.T) {
	const name = "rl:retried-reentry"
	key := rlKey(name)
	ctx := locks.WithOwner(context.Background(), locks.NewOwnerID())
	servers := redistest.StartN(t, 3)
	clients := make([]redis.UniversalClient, len(servers))
	hooks := make([]*rlRetryHook, len(servers))
	var outer *locks.Lock
	var sent sync.WaitGroup // every node's first call is in
	var unlock sync.Once
	unlocked := make(chan error, 1)
	sent.Add(len(servers))
	between := func() { // the first Lock's release reaches every node between the calls and their retries
		sent.Done()
		sent.Wait()
		unlock.Do(func() { unlocked <- outer.Unlock(ctx) })
	}
	for i, s := range servers {
		c := rlNodeClient(s)
		hooks[i] = &rlRetryHook{key: key, between: between}
		c.AddHook(hooks[i])
		clients[i] = c
	}
	r := locks.NewRedlock(clients, locks.NodeTimeout(2*time.Second), locks.Lease(5*time.Second))
	defer r.Close()
	var err error
	if outer, err = r.Lock(ctx, name); err != nil {
		t.Fatal(err)
	}
	redistest.Eventually(t, 5*time.Second, "the first Lock held on every node", func() bool {
		for _, s := range servers {
			if s.Client().HLen(context.Background(), key).Val() != 2 {
				return false
			}
		}
		return true
	})
	for _, h := range hooks {
		h.armed.Store(true)
	}
	inner, err := r.TryLock(ctx, name)
	if err != nil {
		t.Fatalf("re-entry whose retries came after the first Lock's Unlock: %v", err)
	}
	for i, h := range hooks {
		if h.armed.Load() {
			t.Fatalf("node %d never saw the re-entry's acquire: the hook no longer picks it, and the test tests nothing", i)
		}
	}
	if err := <-unlocked; err != nil {
		t.Errorf("the first Lock's Unlock: %v", err)
	}
	if err := inner.Unlock(context.Background()); err != nil {
		t.Fatal(err)
	}
	for i, s := range servers {
		if n := s.Client().Exists(context.Background(), key).Val(); n != 0 {
			t.Errorf("node %d keeps the lock after both Unlocks", i)
		}
	}
}

// rlHookedNodes starts three servers and returns a client of each, every
// command to node i passing through around(i).
func rlHookedNodes(t *testing.T, around func(i int) redistest.Intercept) []redis.UniversalClient {
	servers := redistest.StartN(t, 3)
	clients := make([]redis.UniversalClient, len(servers))
	for i, s := range servers {
		c := rlNodeClient(s)
		c.AddHook(around(i))
		clients[i] = c
	}
	return clients
}

// rlFailHook fails its node's next Redlock acquisition of key without
// sending it, as a node that did not answer in time (see around).
type rlFailHook struct {
	key   string
	armed atomic.Bool
}

func (h *rlFailHook) around(_ context.Context, cmds []redis.Cmder, send func() error) error {
	for _, c := range cmds {
		if key, ok := locks.IsRedlockAcquire(c); ok && key == h.key && h.armed.CompareAndSwap(true, false) {
			err := errors.New("rlFailHook: injected node failure")
			for _, c := range cmds {
				c.SetErr(err)
			}
			return err
		}
	}
	return send()
}

// TestRedlockNestedLockRetriesFailedNodes: a nested Lock whose attempt
// failing nodes kept from a quorum tries again within the wait budget, as
// any Lock does — a transient node failure must not fail a re-entry that a
// fresh Lock would have survived — while a nested TryLock makes its one
// attempt and reports ErrUnavailable. Each step begins once the one before
// has reached every node: the outer Lock returns once a quorum granted, and
// a nested attempt reaching the third node before the outer grant found no
// holding there to re-enter (a refusal, ErrBusy: no retry); an acquire of
// the TryLock still queued for a node took the Lock's injected failure
// there (9 of 40 runs failed so).
func TestRedlockNestedLockRetriesFailedNodes(t *testing.T) {
	const name = "rl:nested-retry"
	key := rlKey(name)
	owner := locks.NewOwnerID()
	ctx := locks.WithOwner(context.Background(), owner)
	hooks := []*rlFailHook{{key: key}, {key: key}, {key: key}}
	clients := rlHookedNodes(t, func(i int) redistest.Intercept { return hooks[i].around })
	r := locks.NewRedlock(clients, locks.Lease(5*time.Second), locks.WaitBudget(5*time.Second))
	defer r.Close()
	outer, err := r.Lock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range clients {
		redistest.Eventually(t, 5*time.Second, "the outer Lock's holding on every node", func() bool {
			return c.HGet(context.Background(), key, "o").Val() == owner
		})
	}
	arm := func() {
		hooks[0].armed.Store(true)
		hooks[1].armed.Store(true)
	}
	arm()
	if _, err := r.TryLock(ctx, name); !errors.Is(err, locks.ErrUnavailable) || errors.Is(err, locks.ErrLost) {
		t.Fatalf("nested TryLock with two nodes failing: %v, want ErrUnavailable (and not ErrLost)", err)
	}
	redistest.Eventually(t, 5*time.Second, "the TryLock's acquires sent to both failing nodes", func() bool {
		return !hooks[0].armed.Load() && !hooks[1].armed.Load()
	})
	arm()
	inner, err := r.Lock(ctx, name)
	if err != nil {
		t.Fatalf("nested Lock with two nodes failing once: %v, want the re-entry on a later attempt", err)
	}
	for i, h := range hooks[:2] {
		if h.armed.Load() {
			t.Fatalf("node %d never saw the re-entry's acquire: the hook no longer picks it, and the test tests nothing", i)
		}
	}
	if err := inner.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := r.TryLock(context.Background(), name); !errors.Is(err, locks.ErrBusy) {
		t.Fatalf("another owner after the inner Unlock: %v, want ErrBusy (the outer Lock still holds)", err)
	}
	if err := outer.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	for _, c := range clients {
		redistest.Eventually(t, 5*time.Second, "the lock gone after both Unlocks", func() bool {
			return c.Exists(context.Background(), key).Val() == 0
		})
	}
}

// rlBeforeHook runs before once, the first time one of its nodes is about
// to be sent a Redlock acquisition of key; every node's acquisition waits
// until it has run (see around).
type rlBeforeHook struct {
	key    string
	once   sync.Once
	before atomic.Pointer[func()]
}

func (h *rlBeforeHook) around(_ context.Context, cmds []redis.Cmder, send func() error) error {
	for _, c := range cmds {
		if key, ok := locks.IsRedlockAcquire(c); ok && key == h.key {
			if f := h.before.Load(); f != nil {
				h.once.Do(*f)
			}
		}
	}
	return send()
}

// TestRedlockNestedAttemptOutlivesItsHolding: a nested TryLock whose
// holding is Unlocked while its attempt is on the way (another goroutine
// of the owner) reaches nodes where nobody holds the name. It counted
// re-entries only, so it failed with nobody else holding the name; it must
// get the name, as a fresh TryLock would.
func TestRedlockNestedAttemptOutlivesItsHolding(t *testing.T) {
	const name = "rl:nested-outlives"
	key := rlKey(name)
	ctx := locks.WithOwner(context.Background(), locks.NewOwnerID())
	hook := &rlBeforeHook{key: key} // one for every node
	clients := rlHookedNodes(t, func(int) redistest.Intercept { return hook.around })
	r := locks.NewRedlock(clients, locks.Lease(5*time.Second))
	defer r.Close()
	outer, err := r.Lock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	unlocked := make(chan error, 1)
	unlock := func() { unlocked <- outer.Unlock(ctx) } // the owner's other goroutine, as the attempt leaves
	hook.before.Store(&unlock)
	inner, err := r.TryLock(ctx, name)
	select { // the hook may still run when a node's answer came too late for TryLock (CI 12-06)
	case uerr := <-unlocked:
		if uerr != nil {
			t.Fatalf("the outer Unlock: %v", uerr)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the outer Unlock never ran: the attempt sent nothing")
	}
	if err != nil {
		t.Fatalf("nested TryLock whose holding was Unlocked meanwhile, nobody else holding the name: %v, want the name", err)
	}
	if err := inner.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}
