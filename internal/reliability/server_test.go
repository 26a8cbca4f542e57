package reliability

import (
	"context"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/internal/redistest"
	"github.com/cacheguard/cacheguard/locks"
)

// faultClient returns a client for s with short timeouts that honour the
// context, so that a call to a dead or paused server ends as an unknown
// outcome instead of stalling for go-redis's 3 s default.
func faultClient(addr string) *redis.Client {
	return redis.NewClient(&redis.Options{Addr: addr, DialTimeout: 200 * time.Millisecond,
		ReadTimeout: 200 * time.Millisecond, WriteTimeout: 200 * time.Millisecond,
		ContextTimeoutEnabled: true, PoolSize: 8})
}

// faultLocks returns a locks.Client on a faultClient of addr, both closed at
// cleanup.
func faultLocks(t *testing.T, addr string) *locks.Client {
	rdb := faultClient(addr)
	t.Cleanup(func() { rdb.Close() })
	c := locks.New(rdb)
	t.Cleanup(func() { c.Close() })
	return c
}

// faultWorkload is the workload the fault scenarios run: 3 clients taking
// the lock name on c and writing the register reg:name on res, 2 of them
// straggling, a second per call.
func faultWorkload(c *locks.Client, res *redistest.Server, name string, lease time.Duration, ops int) *workload {
	w := &workload{mu: libMutex{c: c, name: name, lease: lease}, reg: Register{RDB: res.Client(), Key: "reg:" + name},
		lease: lease, clients: 3, ops: ops, straggles: 2, opTimeout: time.Second}
	w.init()
	return w
}

// TestReliabilityServerRestart: a holder holds a lock with a fixed lease when
// redis-server is SIGKILLed and restarted. With appendfsync always the lock
// survives: another client is refused until the holder releases, and the
// holder's writes still land. Without persistence (the control) the restart
// forgets the lock: another client is granted it while the first still
// holds — the documented limitation of a single server without persistence.
// The fence still increases across the restart (it falls back to the
// server's clock), so the fenced resource refuses the first holder's later
// write and no stale write is applied.
func TestReliabilityServerRestart(t *testing.T) {
	noLeaks(t)
	for _, persist := range []bool{true, false} {
		name := "appendfsync-always"
		if !persist {
			name = "control/no-persistence"
		}
		t.Run(name, func(t *testing.T) {
			var opts []redistest.Option
			if persist {
				opts = append(opts, redistest.AppendFsyncAlways())
			}
			srv, res := redistest.Start(t, opts...), redistest.Start(t)
			c := faultLocks(t, srv.Addr())
			r := newRecorder(t, Register{RDB: res.Client(), Key: "reg:restart"})
			const lease = 3 * time.Second
			holder, _ := r.lock(c, 1, "restart", lease)
			if r.write(holder, 1, "before") != Done {
				t.Fatal("write refused")
			}
			if err := srv.Restart(); err != nil {
				t.Fatal(err)
			}
			healed := r.lockH.Now()
			// The other client tries until it gets an answer (the first
			// calls may meet connections broken by the restart).
			var other *locks.Lock
			for try := 0; ; try++ {
				call := r.lockH.Now()
				lk, err := c.TryLock(context.Background(), "restart", locks.Lease(lease), locks.NoRenewal())
				ret := r.lockH.Now()
				h, err := classify(lk, err)
				in := LockInput{Op: Acquire, Client: 2, Lease: lease, Call: call, Return: ret}
				r.fig.Attempted++
				if err == errRefused {
					r.fig.Refused++
					r.lockH.Add(2, call, ret, in, LockOutput{Outcome: Refused})
					r.fig.Recovery = time.Duration(ret - healed)
					break
				}
				if err == nil {
					r.fig.Succeeded++
					other = h.(*locks.Lock)
					r.lockH.Add(2, call, ret, in, LockOutput{Outcome: Granted, Fence: other.Fence()})
					r.fig.Recovery = time.Duration(ret - healed)
					break
				}
				r.fig.Unknown++
				in.Return = Never
				r.lockH.Add(2, call, Never, in, LockOutput{Outcome: Unknown})
				if try > 50 {
					t.Fatalf("no answer after the restart: %v", err)
				}
			}
			if other != nil {
				if other.Fence() <= holder.Fence() {
					t.Errorf("fence %d after the restart, not above %d", other.Fence(), holder.Fence())
				}
				if r.write(other, 2, "other") != Done {
					t.Error("the second holder's write was refused")
				}
			}
			late := r.write(holder, 1, "after")
			r.unlock(holder, 1)
			if other != nil {
				r.unlock(other, 2)
			}
			if persist {
				if other != nil {
					t.Error("the lock was granted again after a restart with appendfsync always")
				}
				if late != Done {
					t.Error("the holder's write after the restart was refused")
				}
				f := r.verify(porcupine.Ok, porcupine.Ok)
				f.Scenario = "redis-server SIGKILLed and restarted under a held lock, appendfsync always"
				f.Report(t)
				return
			}
			if other == nil {
				t.Fatal("control: the lock survived a restart without persistence")
			}
			if late != Refused {
				t.Errorf("the first holder's write after the second holder's: %v, want refused", late)
			}
			f := r.verify(porcupine.Illegal, porcupine.Illegal)
			f.Scenario = "control: redis-server restarted without persistence under a held lock"
			f.Expect = ">0: a restart without persistence forgets the lock; fencing still refuses the stale write (0 stale writes applied)"
			f.Report(t)
			if n := staleApplied(r.regH.Ops()); n != 0 {
				t.Errorf("%d stale writes applied", n)
			}
		})
	}
}

// TestReliabilityServerFaults runs the concurrent workload while a nemesis
// repeatedly kills and restarts redis-server (appendfsync always) or pauses
// it (SIGSTOP) past the clients' timeouts. Calls in flight end as unknown
// outcomes; both histories stay linearizable.
func TestReliabilityServerFaults(t *testing.T) {
	noLeaks(t)
	const lease = 400 * time.Millisecond
	cases := []struct {
		name  string
		fault func(s *redistest.Server)
	}{
		{"kill-restart-aof", func(s *redistest.Server) {
			if err := s.Restart(); err != nil {
				t.Error(err)
			}
		}},
		{"pause", func(s *redistest.Server) {
			s.Pause()
			time.Sleep(1200 * time.Millisecond) // the fault's length: longer than go-redis's retries (4 × 200ms + backoff)
			s.Resume()
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			srv, res := redistest.Start(t, redistest.AppendFsyncAlways()), redistest.Start(t)
			w := faultWorkload(faultLocks(t, srv.Addr()), res, "sf", lease, scale(80, 30))
			faults := scale(3, 2)
			f := verify(t, w.run(t, func(ctx context.Context) {
				for i := 0; i < faults; i++ {
					select {
					case <-ctx.Done():
						return
					case <-time.After(250 * time.Millisecond): // the fault schedule
					}
					tc.fault(srv)
					w.heal()
				}
			}), porcupine.Ok, porcupine.Ok)
			f.Scenario = "workload while redis-server is " + map[string]string{
				"kill-restart-aof": "SIGKILLed and restarted (appendfsync always)",
				"pause":            "paused 1.2s (SIGSTOP), past the retries",
			}[tc.name]
			f.Report(t)
			if f.Violations != 0 {
				t.Errorf("%d violations", f.Violations)
			}
		})
	}
}
