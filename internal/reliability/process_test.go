package reliability

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/internal/redistest"
	"github.com/cacheguard/cacheguard/locks"
)

// recorder drives child holders and the test's own client through one lock
// and one register, recording both histories.
type recorder struct {
	t           *testing.T
	lockH, regH *History
	reg         Register
	fig         Figures
}

func newRecorder(t *testing.T, reg Register) *recorder {
	return &recorder{t: t, lockH: NewHistory(), regH: NewHistory(), reg: reg, fig: Figures{Recovery: -1}}
}

// childAcquire asks p to take the lock; the acquisition is recorded later by
// held, once the lease's lower bound is known.
func (r *recorder) childAcquire(p *proc) (call, ret int64, fence uint64) {
	r.t.Helper()
	call = r.lockH.Now()
	reply := p.do(r.t, "acquire", 10*time.Second)
	ret = r.lockH.Now()
	f, ok := strings.CutPrefix(reply, "granted ")
	if !ok {
		r.t.Fatalf("child acquire: %s", reply)
	}
	fence, _ = strconv.ParseUint(f, 10, 64)
	r.fig.Attempted++
	r.fig.Succeeded++
	return call, ret, fence
}

// held records a granted acquisition (of a child, or of a renewing holder)
// whose lease was still
// pttl long when PTTL was called at pttlCall: the server cannot expire it
// before pttlCall+pttl, whatever renewals did before.
func (r *recorder) held(client int, call, ret int64, fence uint64, pttlCall int64, pttl time.Duration) {
	lease := time.Duration(pttlCall + int64(pttl) - call)
	r.lockH.Add(client, call, ret, LockInput{Op: Acquire, Client: client, Lease: lease, Call: call, Return: ret},
		LockOutput{Outcome: Granted, Fence: fence})
}

// pttl reads the lock's remaining lease and when the call was made.
func (r *recorder) pttl(s *redistest.Server, name string) (int64, time.Duration) {
	r.t.Helper()
	return r.pttl2(s.Client(), name)
}

// pttl2 is pttl with a given client.
func (r *recorder) pttl2(rdb *redis.Client, name string) (int64, time.Duration) {
	r.t.Helper()
	call := r.lockH.Now()
	d, err := rdb.PTTL(context.Background(), "cg:lock:{"+name+"}").Result()
	if err != nil || d <= 0 {
		r.t.Fatalf("PTTL = %v, %v", d, err)
	}
	return call, d
}

// childWrite asks p to write value with its fence; the child reports the TTL
// it believed it had just before writing.
func (r *recorder) childWrite(p *proc, client int, fence uint64, value string) Outcome {
	r.t.Helper()
	call := r.regH.Now()
	reply := p.do(r.t, "write "+value, 10*time.Second)
	ret := r.regH.Now()
	kind, ttlText, _ := strings.Cut(reply, " ")
	ttl, _ := strconv.ParseInt(ttlText, 10, 64)
	in := RegisterInput{Op: Write, Client: client, Fence: fence, Value: value, Valid: ret < call+ttl}
	switch kind {
	case "done":
		r.regH.Add(client, call, ret, in, RegisterOutput{Outcome: Done})
		return Done
	case "refused":
		r.regH.Add(client, call, ret, in, RegisterOutput{Outcome: Refused})
		return Refused
	}
	in.Valid = false
	r.regH.Add(client, call, Never, in, RegisterOutput{Outcome: Unknown})
	return Unknown
}

// childRelease asks p to release and records the outcome.
func (r *recorder) childRelease(p *proc, client int) string {
	r.t.Helper()
	call := r.lockH.Now()
	reply := p.do(r.t, "release", 10*time.Second)
	ret := r.lockH.Now()
	in := LockInput{Op: Release, Client: client, Call: call, Return: ret}
	switch reply {
	case "released":
		r.lockH.Add(client, call, ret, in, LockOutput{Outcome: Released})
	case "notheld":
		r.lockH.Add(client, call, ret, in, LockOutput{Outcome: NotHeld})
	default:
		in.Return = Never
		r.lockH.Add(client, call, Never, in, LockOutput{Outcome: Unknown})
	}
	return reply
}

// lock takes the lock with the test's own client (waiting), records it, and
// returns the lock and its return time.
func (r *recorder) lock(c *locks.Client, client int, name string, lease time.Duration) (*locks.Lock, int64) {
	r.t.Helper()
	call := r.lockH.Now()
	lk, err := c.Lock(context.Background(), name, locks.Lease(lease), locks.NoRenewal(), locks.WaitBudget(30*time.Second))
	ret := r.lockH.Now()
	r.fig.Attempted++
	if err != nil {
		r.t.Fatalf("Lock: %v", err)
	}
	r.fig.Succeeded++
	r.lockH.Add(client, call, ret, LockInput{Op: Acquire, Client: client, Lease: lease, Call: call, Return: ret},
		LockOutput{Outcome: Granted, Fence: lk.Fence()})
	return lk, ret
}

// write writes value with lk's fence from the test's own client.
func (r *recorder) write(lk *locks.Lock, client int, value string) Outcome {
	r.t.Helper()
	ctx := context.Background()
	call := r.regH.Now()
	validUntil := call + int64(lk.TTL())
	ok, err := r.reg.Write(ctx, lk.Fence(), value)
	ret := r.regH.Now()
	in := RegisterInput{Op: Write, Client: client, Fence: lk.Fence(), Value: value, Valid: ret < validUntil}
	switch {
	case err != nil:
		r.t.Fatalf("write: %v", err)
	case ok:
		r.regH.Add(client, call, ret, in, RegisterOutput{Outcome: Done})
		return Done
	}
	r.regH.Add(client, call, ret, in, RegisterOutput{Outcome: Refused})
	return Refused
}

// unlock releases lk and records the outcome.
func (r *recorder) unlock(lk *locks.Lock, client int) {
	r.t.Helper()
	call := r.lockH.Now()
	err := lk.Unlock(context.Background())
	ret := r.lockH.Now()
	out := LockOutput{Outcome: Released}
	if err != nil {
		out.Outcome = NotHeld
	}
	r.lockH.Add(client, call, ret, LockInput{Op: Release, Client: client, Call: call, Return: ret}, out)
}

// verify checks both histories and completes the figures.
func (r *recorder) verify(wantLock, wantReg porcupine.CheckResult) Figures {
	r.t.Helper()
	res := result{lockOps: r.lockH.Ops(), regOps: r.regH.Ops(), fig: r.fig}
	res.fig.Violations += fenceInversions(res.lockOps) + staleApplied(res.regOps)
	return verify(r.t, res, wantLock, wantReg)
}

// TestReliabilityHolderKilled: a holder process (renewing its lease) is
// SIGKILLed while it holds the lock; the next holder gets the lock only
// after the lease the killed holder had at the kill ran out, with a higher
// fence, and its writes land. Repeated with fresh processes.
func TestReliabilityHolderKilled(t *testing.T) {
	noLeaks(t)
	const lease = 500 * time.Millisecond
	srv, res := redistest.Start(t), redistest.Start(t)
	c := locks.New(srv.Client())
	t.Cleanup(func() { c.Close() })
	r := newRecorder(t, Register{RDB: res.Client(), Key: "reg:killed"})
	var worst time.Duration
	for round := range scale(3, 2) {
		child := 1 + round
		p := startHolder(t, srv.Addr(), res.Addr(), "reg:killed", "killed", lease, false)
		call, ret, fence := r.childAcquire(p)
		if r.childWrite(p, child, fence, fmt.Sprintf("child%d", round)) != Done {
			t.Fatal("the holder's write was refused")
		}
		pc, pttl := r.pttl(srv, "killed")
		r.held(child, call, ret, fence, pc, pttl)
		p.Kill()
		killed := r.lockH.Now()
		lk, got := r.lock(c, 0, "killed", lease)
		worst = max(worst, time.Duration(got-killed))
		if lk.Fence() <= fence {
			t.Errorf("fence %d after the killed holder's %d", lk.Fence(), fence)
		}
		if r.write(lk, 0, fmt.Sprintf("next%d", round)) != Done {
			t.Error("the next holder's write was refused")
		}
		r.unlock(lk, 0)
	}
	f := r.verify(porcupine.Ok, porcupine.Ok)
	f.Scenario = "holder SIGKILLed while holding (renewing, 500ms lease)"
	f.Recovery = worst
	f.Report(t)
}

// TestReliabilityHolderPaused: a holder process is SIGSTOPped past its
// lease; the lock goes to the next holder, whose write lands. Resumed, the
// paused holder writes with its old token: the fenced register refuses it,
// its lock reports Lost and its Unlock says ErrNotHeld. The control runs the
// same steps against a register that ignores tokens and must show the stale
// write applied — the limitation that fencing exists for (see Lock.Fence).
func TestReliabilityHolderPaused(t *testing.T) {
	noLeaks(t)
	for _, unfenced := range []bool{false, true} {
		name := "fenced"
		if unfenced {
			name = "control/unfenced-resource"
		}
		t.Run(name, func(t *testing.T) {
			const lease = 500 * time.Millisecond
			srv, res := redistest.Start(t), redistest.Start(t)
			c := locks.New(srv.Client())
			t.Cleanup(func() { c.Close() })
			reg := Register{RDB: res.Client(), Key: "reg:paused", Unfenced: unfenced}
			r := newRecorder(t, reg)
			p := startHolder(t, srv.Addr(), res.Addr(), reg.Key, "paused", lease, unfenced)
			call, ret, fence := r.childAcquire(p)
			if r.childWrite(p, 1, fence, "before-pause") != Done {
				t.Fatal("the holder's write was refused")
			}
			pc, pttl := r.pttl(srv, "paused")
			r.held(1, call, ret, fence, pc, pttl)
			p.Signal(syscall.SIGSTOP)
			paused := r.lockH.Now()
			lk, got := r.lock(c, 0, "paused", lease)
			r.fig.Recovery = time.Duration(got - paused)
			if r.write(lk, 0, "next-holder") != Done {
				t.Fatal("the next holder's write was refused")
			}
			p.Signal(syscall.SIGCONT)
			late := r.childWrite(p, 1, fence, "after-pause")
			if got := p.do(t, "wait-lost", 10*time.Second); got != "lost" {
				t.Errorf("paused holder: %s, want lost", got)
			}
			if got := r.childRelease(p, 1); got != "notheld" {
				t.Errorf("paused holder's Unlock: %s, want notheld", got)
			}
			r.unlock(lk, 0)
			if late == Refused {
				r.fig.Refused++
			}
			if !unfenced {
				if late != Refused {
					t.Errorf("the paused holder's late write: %v, want refused", late)
				}
				f := r.verify(porcupine.Ok, porcupine.Ok)
				f.Scenario = "holder SIGSTOPped past its lease, fenced resource"
				f.Report(t)
				return
			}
			f := r.verify(porcupine.Ok, porcupine.Illegal)
			f.Scenario = "control: holder SIGSTOPped, resource ignores tokens"
			f.Expect = ">0: the paused holder's late write lands (why Lock.Fence exists)"
			f.Report(t)
			if f.Violations == 0 {
				t.Error("the control found no violation")
			}
		})
	}
}
