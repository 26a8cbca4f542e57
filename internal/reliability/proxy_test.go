package reliability

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/internal/redistest"
	"github.com/cacheguard/cacheguard/locks"
)

// startProxy starts a fault proxy to s, closed at cleanup.
func startProxy(t *testing.T, s *redistest.Server) *Proxy {
	t.Helper()
	p, err := NewProxy(s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// TestReliabilityProxyFaults runs the concurrent workload with every lock
// client talking to Redis through the fault proxy, while a nemesis switches
// a fault on and off: added latency, a black hole (a partition: nothing
// passes, connections stay open), lost replies (commands run, callers never
// hear, go-redis retries them), and connection resets. Both histories stay
// linearizable: no two holders, fences increase, no stale write lands. The
// fault lasts longer than go-redis's retries (4 tries with 200ms timeouts),
// so calls in flight end with unknown outcomes.
func TestReliabilityProxyFaults(t *testing.T) {
	noLeaks(t)
	const lease = 400 * time.Millisecond
	for _, fault := range []Fault{Latency, BlackHole, DropReplies, Reset} {
		t.Run(fault.String(), func(t *testing.T) {
			srv, res := redistest.Start(t), redistest.Start(t)
			px := startProxy(t, srv)
			px.SetLatency(30 * time.Millisecond)
			w := faultWorkload(faultLocks(t, px.Addr()), res, "px", lease, scale(60, 25))
			cycles := scale(2, 1)
			f := verify(t, w.run(t, func(ctx context.Context) {
				for i := 0; i < cycles; i++ {
					for _, step := range []struct {
						f Fault
						d time.Duration
					}{{Pass, 200 * time.Millisecond}, {fault, 1200 * time.Millisecond}} { // the fault schedule
						px.Set(step.f)
						select {
						case <-ctx.Done():
							px.Set(Pass)
							return
						case <-time.After(step.d):
						}
					}
					px.Set(Pass)
					w.heal()
				}
			}), porcupine.Ok, porcupine.Ok)
			f.Scenario = "workload through the proxy, fault cycled 1.2s on / 200ms off: " + fault.String()
			if fault == Latency {
				f.Scenario += " (30ms per chunk)"
			}
			f.Report(t)
			if f.Violations != 0 {
				t.Errorf("%d violations", f.Violations)
			}
		})
	}
}

// TestReliabilityLostReply: the reply to an acquisition is lost (the
// command ran). go-redis used to send the request again (MaxRetries), which
// the acquire script had to treat as the same acquisition; a grant's
// request is now sent once (a copy stuck on the wire could otherwise run
// after the acquisition ended: TestGrantRequestNeverResentByGoRedis in
// locks), so the call fails with ErrUnavailable and gives back what its
// request took. Either way a lost reply never leaves a stranded hold,
// whether the acquisition is the first hold or a re-entry.
func TestReliabilityLostReply(t *testing.T) {
	noLeaks(t)
	srv := startAndProxy(t)
	ctx := locks.WithOwner(context.Background(), locks.NewOwnerID())
	holds := func(name string) int {
		n, err := srv.direct.HGet(context.Background(), "cg:lock:{"+name+"}", "n").Int()
		if err != nil {
			return 0
		}
		return n
	}
	fig := Figures{Scenario: "lost replies to acquire and re-entry (sent once, given back)", Recovery: -1}
	lost := func(want int) {
		t.Helper()
		dropped := srv.px.Dropped()
		srv.px.DropNext(1)
		_, err := srv.c.TryLock(ctx, "lost")
		fig.Attempted++
		if srv.px.Dropped() != dropped+1 {
			t.Fatalf("%d replies dropped, want %d", srv.px.Dropped(), dropped+1)
		}
		if !errors.Is(err, locks.ErrUnavailable) {
			t.Fatalf("TryLock with its reply lost: %v, want ErrUnavailable", err)
		}
		eventually(t, 5*time.Second, "the acquisition given back", func() bool { return holds("lost") == want })
	}

	// First hold: the reply is swallowed; the hold the request took is given back.
	lost(0)
	outer, err := srv.c.TryLock(ctx, "lost")
	fig.Attempted++
	if err != nil {
		t.Fatal(err)
	}
	fig.Succeeded++
	// Re-entry: the same; the outer hold stays.
	lost(1)
	if err := outer.Unlock(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n, _ := srv.direct.Exists(context.Background(), "cg:lock:{lost}").Result(); n != 0 {
		fig.Violations++
		t.Error("the lock is still there after the last Unlock: a hold was stranded")
	}
	fig.Report(t)
}

// TestReliabilityLostReleaseReply: the reply to a release is lost and
// go-redis retries it. The release script must treat the retry as the same
// release. For a re-entered lock a second run would take back a second hold:
// the inner Unlock would release the outer holder's lock too, and another
// client could take it while the outer critical section still runs. (It did,
// until each hold became its own field of the lock's hash: release.lua now
// gives back the hold it names, once.)
func TestReliabilityLostReleaseReply(t *testing.T) {
	noLeaks(t)
	srv := startAndProxy(t)
	bg := context.Background()
	fig := Figures{Scenario: "lost reply to a re-entered lock's inner Unlock (go-redis retries)", Recovery: -1}

	ctx := locks.WithOwner(bg, locks.NewOwnerID())
	outer, err := srv.c.TryLock(ctx, "relretry")
	if err != nil {
		t.Fatal(err)
	}
	inner, err := srv.c.TryLock(ctx, "relretry")
	if err != nil {
		t.Fatal(err)
	}
	fig.Attempted, fig.Succeeded = 2, 2
	srv.px.DropNext(1)
	innerErr := inner.Unlock(bg)
	if srv.px.Dropped() != 1 {
		t.Fatalf("%d replies dropped, want 1", srv.px.Dropped())
	}
	n, _ := srv.direct.HGet(bg, "cg:lock:{relretry}", "n").Int()
	// The outer hold must still exclude everybody else.
	other := locks.New(srv.direct)
	t.Cleanup(func() { other.Close() })
	lk, err := other.TryLock(bg, "relretry")
	fig.Attempted++
	switch {
	case err == nil:
		fig.Succeeded++
		fig.Violations++
		lk.Unlock(bg)
	case errors.Is(err, locks.ErrNotObtained):
		fig.Refused++
	default:
		t.Fatal(err)
	}
	outerErr := outer.Unlock(bg)

	// The last hold: a retried release finds the lock gone.
	single, err := srv.c.TryLock(bg, "relretry-last")
	if err != nil {
		t.Fatal(err)
	}
	fig.Attempted++
	fig.Succeeded++
	srv.px.DropNext(1)
	lastErr := single.Unlock(bg)
	if e, _ := srv.direct.Exists(bg, "cg:lock:{relretry-last}").Result(); e != 0 {
		fig.Violations++
		t.Error("the last hold's lock is still there after Unlock")
	}
	if lastErr != nil {
		t.Errorf("the retried release of the last hold said %v, want nil (it released the lock)", lastErr)
	}

	// The last hold, handed to a waiter: the retry finds the lock the
	// waiter's, handed on by this very hold.
	first, err := srv.c.TryLock(bg, "relretry-handoff")
	if err != nil {
		t.Fatal(err)
	}
	waiterC := locks.New(srv.direct)
	t.Cleanup(func() { waiterC.Close() })
	got := make(chan error, 1)
	done := make(chan struct{})
	go func() {
		lk, err := waiterC.Lock(bg, "relretry-handoff")
		got <- err
		if err == nil {
			<-done // hold it until the first holder's Unlock has returned
			lk.Unlock(bg)
		}
		got <- nil
	}()
	eventually(t, 5*time.Second, "waiter queued", func() bool {
		return srv.direct.ZCard(bg, "cg:q:{relretry-handoff}").Val() == 1
	})
	fig.Attempted += 2
	fig.Succeeded += 2
	srv.px.DropNext(1)
	handErr := first.Unlock(bg)
	if err := <-got; err != nil {
		t.Fatalf("the waiter: %v", err)
	}
	close(done)
	<-got
	if handErr != nil {
		t.Errorf("the retried release that handed the lock on said %v, want nil", handErr)
	}
	fig.Note = fmt.Sprintf("inner Unlock: %s (hold count left %d, want 1); outer Unlock: %s; last-hold Unlock with lost reply: %s; the same, handed to a waiter: %s",
		errText(innerErr), n, errText(outerErr), errText(lastErr), errText(handErr))
	fig.Report(t)
	if fig.Violations != 0 {
		t.Errorf("another client took the lock while the outer hold was still held: the retried release took back two holds (hold count %d, inner Unlock said %v)", n, innerErr)
	}
}

func errText(err error) string {
	if err == nil {
		return "nil"
	}
	return err.Error()
}

type proxied struct {
	px     *Proxy
	c      *locks.Client
	direct *redis.Client
}

// startAndProxy starts a server, a proxy to it, a locks.Client through the
// proxy and a direct client for inspection.
func startAndProxy(t *testing.T) proxied {
	t.Helper()
	s := redistest.Start(t)
	px := startProxy(t, s)
	rdb := faultClient(px.Addr())
	t.Cleanup(func() { rdb.Close() })
	// Open the pooled connection now: a reply lost during the connection's
	// handshake (HELLO) fails the dial instead of exercising a retry.
	if err := rdb.Ping(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	c := locks.New(rdb)
	t.Cleanup(func() { c.Close() })
	// Load the scripts: otherwise the reply lost would be EVALSHA's NOSCRIPT,
	// after which the script runs only once (as EVAL).
	lk, err := c.TryLock(context.Background(), "warm-up")
	if err != nil {
		t.Fatal(err)
	}
	if err := lk.Unlock(context.Background()); err != nil {
		t.Fatal(err)
	}
	return proxied{px: px, c: c, direct: s.Client()}
}

// TestReliabilityRenewalPartitioned: a holder that renews its lease in the
// background is cut off from Redis (black hole) while it holds the lock.
// Its renewals fail, its lease runs out on the server and another client
// takes the lock. By then the cut-off holder must no longer believe it holds
// the lock: its TTL is 0 (its local deadline, counted from before its last
// successful renewal was sent, cannot outlast the server's), Lost closes,
// and its late write is refused by the fenced resource.
func TestReliabilityRenewalPartitioned(t *testing.T) {
	noLeaks(t)
	const lease = 600 * time.Millisecond
	srv := startAndProxy(t)
	res := redistest.Start(t)
	r := newRecorder(t, Register{RDB: res.Client(), Key: "reg:renew"})
	bg := context.Background()

	call := r.lockH.Now()
	a, err := srv.c.TryLock(bg, "renew", locks.Lease(lease))
	ret := r.lockH.Now()
	if err != nil {
		t.Fatal(err)
	}
	r.fig.Attempted, r.fig.Succeeded = 1, 1
	if r.write(a, 1, "a") != Done {
		t.Fatal("write refused")
	}
	pc, pttl := r.pttl2(srv.direct, "renew")
	r.held(1, call, ret, a.Fence(), pc, pttl)
	srv.px.Set(BlackHole)
	cut := r.lockH.Now()
	other := locks.New(srv.direct)
	t.Cleanup(func() { other.Close() })
	b, got := r.lock(other, 2, "renew", lease)
	r.fig.Recovery = time.Duration(got - cut)
	if ttl := a.TTL(); ttl > 0 {
		r.fig.Violations++
		t.Errorf("the cut-off holder still believes it holds the lock for %v after another client was granted it", ttl)
	}
	select {
	case <-a.Lost():
	case <-time.After(5 * time.Second):
		r.fig.Violations++
		t.Error("the cut-off holder never saw Lost")
	}
	if r.write(b, 2, "b") != Done {
		t.Error("the new holder's write was refused")
	}
	if r.write(a, 1, "a-late") != Refused {
		t.Error("the cut-off holder's late write was applied")
	}
	srv.px.Set(Pass)
	r.unlock(a, 1)
	r.unlock(b, 2)
	f := r.verify(porcupine.Ok, porcupine.Ok)
	f.Scenario = "renewing holder black-holed from Redis (600ms lease)"
	f.Report(t)
}

// eventually waits for an observable event, bounded by d.
var eventually = redistest.Eventually
