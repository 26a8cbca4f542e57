package locks_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/internal/redistest"
	"github.com/cacheguard/cacheguard/locks"
)

// errRLPartitioned is what client A's dialer returns for the nodes it is cut off from.
var errRLPartitioned = errors.New("test: partitioned from this node")

// rlRestartPair returns two Redlock clients on the same 5 servers: A, cut off
// (network partition) from nodes 3 and 4, so its locks are held on exactly
// nodes 0-2, and B, which reaches every node. Both have their connections made
// (dialling is not what these tests time).
func rlRestartPair(t *testing.T, serverOpts []redistest.Option, opts ...locks.Option) (a, b *locks.Redlock, servers []*redistest.Server) {
	t.Helper()
	servers = redistest.StartN(t, 5, serverOpts...)
	b = redlockOn(t, servers, opts...).r
	clients := make([]redis.UniversalClient, 5)
	for i, srv := range servers {
		if i < 3 {
			clients[i] = rlNodeClient(srv)
			continue
		}
		clients[i] = srv.Client(func(o *redis.Options) {
			o.MaxRetries, o.DialerRetries = -1, 1
			o.Dialer = func(context.Context, string, string) (net.Conn, error) { return nil, errRLPartitioned }
			// go-redis opens a dial circuit breaker after PoolSize dial
			// errors, with a probing goroutine that outlives Close by up to
			// a second; keep it closed for the test's few hundred dials.
			o.PoolSize = 100000
		})
	}
	a = locks.NewRedlock(clients, opts...)
	t.Cleanup(func() { a.Close() })
	for _, r := range []*locks.Redlock{a, b} {
		lk, err := r.Lock(context.Background(), "rl:restart:warm-up")
		if err != nil {
			t.Fatal(err)
		}
		lk.Unlock(context.Background())
	}
	return a, b, servers
}

// rlRestartRun plays the scenario of the Redlock restart rule once: A takes
// name (on nodes 0-2), node 2 crashes and comes back through restart, and B
// tries the lock (once; with waitB > 0, retrying for that long); check, if
// not nil, runs between the restart and B's try. It reports B's error, and
// whether B obtained the lock while A's validity had not ended: a double grant.
func rlRestartRun(t *testing.T, a, b *locks.Redlock, restarted *redistest.Server, name string, restart func(*redistest.Server), check func(name string), waitB time.Duration) (double bool, errB error) {
	t.Helper()
	ctx := context.Background()
	la, err := a.Lock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	defer la.Unlock(ctx)

	restart(restarted)
	if check != nil {
		check(name)
	}

	lb, err := b.Lock(ctx, name, locks.WaitBudget(waitB))
	if err != nil {
		return false, err
	}
	double = la.TTL() > 0
	lb.Unlock(ctx)
	return double, nil
}

func rlRestartNow(t *testing.T) func(*redistest.Server) {
	return func(srv *redistest.Server) {
		if err := srv.Restart(); err != nil {
			t.Fatal(err)
		}
	}
}

// Control: a node restarted empty right away forgets A's grant, and B builds
// a quorum with it while A still holds the lock. This is the failure the
// restart rule (documented on Redlock) exists to prevent.
func TestRedlockRestartEmptyDoubleGrant(t *testing.T) {
	t.Parallel() // waits on processes and timers more than on the CPU
	a, b, servers := rlRestartPair(t, nil, locks.Lease(10*time.Second), locks.NodeTimeout(200*time.Millisecond))
	if double, err := rlRestartRun(t, a, b, servers[2], "rl:restart:empty", rlRestartNow(t), nil, 2*time.Second); !double {
		t.Fatalf("no double grant after an immediate empty restart (B: %v): the control did not reproduce", err)
	}
}

// With appendfsync always the restarted node still has A's grant: no double grant.
func TestRedlockRestartAppendFsyncAlways(t *testing.T) {
	t.Parallel() // waits on processes and timers more than on the CPU
	a, b, servers := rlRestartPair(t, []redistest.Option{redistest.AppendFsyncAlways()},
		locks.Lease(10*time.Second), locks.NodeTimeout(200*time.Millisecond))
	node2 := servers[2].Client()
	kept := func(name string) { // the restarted node still has A's grant
		if o, err := node2.HGet(context.Background(), rlKey(name), "o").Result(); err != nil || o == "" {
			t.Errorf("%s: restarted node lost the grant (%q, %v)", name, o, err)
		}
	}
	doubles := 0
	for run := range 50 {
		double, err := rlRestartRun(t, a, b, servers[2], fmt.Sprintf("rl:restart:aof:%d", run), rlRestartNow(t), kept, 0)
		if double {
			doubles++
		}
		if err == nil {
			t.Errorf("run %d: B got the lock", run)
		}
	}
	if doubles != 0 {
		t.Fatalf("%d double grants in 50 runs", doubles)
	}
}

// A node kept down for at least the lease comes back after every grant it
// took part in has expired: no double grant.
func TestRedlockRestartDelayed(t *testing.T) {
	t.Parallel() // waits on processes and timers more than on the CPU
	const lease = 100 * time.Millisecond
	// A fixed lease: A sends nothing to node 2 while it is down, so go-redis's
	// dial circuit breaker (open after repeated dial errors, probed once a
	// second) does not keep A off the returned node and slow every run.
	a, b, servers := rlRestartPair(t, nil, locks.Lease(lease), locks.NodeTimeout(50*time.Millisecond), locks.NoRenewal())
	delayed := func(srv *redistest.Server) {
		srv.Kill()
		<-time.After(lease) // the rule under test: down for at least the lease
		if err := srv.Restart(); err != nil {
			t.Fatal(err)
		}
	}
	doubles := 0
	for run := range 50 {
		double, err := rlRestartRun(t, a, b, servers[2], fmt.Sprintf("rl:restart:delayed:%d", run), delayed, nil, 2*time.Second)
		if double {
			doubles++
		}
		if err != nil { // A's grants have all expired: B should get the lock
			t.Errorf("run %d: B: %v", run, err)
		}
	}
	if doubles != 0 {
		t.Fatalf("%d double grants in 50 runs", doubles)
	}
}
