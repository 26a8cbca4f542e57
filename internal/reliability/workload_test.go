package reliability

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/cacheguard/cacheguard/locks"
)

// mutex is what the workload needs of a lock: the library's Client, or a
// deliberately broken control.
type mutex interface {
	// acquire takes the lock, waiting (push-woken) when wait is set. It returns
	// errRefused for a definite refusal; any other error leaves the outcome unknown.
	acquire(ctx context.Context, wait bool) (holding, error)
}

// holding is one acquisition (*locks.Lock satisfies it).
type holding interface {
	Fence() uint64
	// TTL is how long the holder believes it still holds the lock.
	TTL() time.Duration
	// Unlock returns nil when released, locks.ErrNotHeld when the caller no
	// longer held the lock, anything else when the outcome is unknown.
	Unlock(ctx context.Context) error
}

var errRefused = errors.New("refused")

// libMutex is one lock name on a locks.Client or a Redlock, with a fixed
// lease so that the lock model knows every holder's lease.
type libMutex struct {
	c     locks.Locker
	name  string
	lease time.Duration
}

func (m libMutex) acquire(ctx context.Context, wait bool) (holding, error) {
	opts := []locks.CallOption{locks.Lease(m.lease), locks.NoRenewal()}
	var lk *locks.Lock
	var err error
	if wait {
		lk, err = m.c.Lock(ctx, m.name, append(opts, locks.WaitBudget(2*m.lease))...)
	} else {
		lk, err = m.c.TryLock(ctx, m.name, opts...)
	}
	if _, ok := m.c.(*locks.Redlock); ok && err != nil {
		// A Redlock grant is the client's own decision (a quorum within the
		// validity): a failed attempt never holds the lock, whatever the
		// nodes did, so every failure is a definite refusal.
		return nil, errRefused
	}
	return classify(lk, err)
}

// classify maps a Lock/TryLock result: a NotObtainedError without a cause is
// a definite refusal; any other error (Redis, network, context) is unknown.
func classify(lk *locks.Lock, err error) (holding, error) {
	if err == nil {
		return lk, nil
	}
	var no *locks.NotObtainedError
	if errors.As(err, &no) && no.Err == nil {
		return nil, errRefused
	}
	return nil, err
}

// workload runs clients that take one lock and, while holding it, read and
// write a fenced register, recording both histories. Client 0 is a
// straggler: after taking the lock it waits until another client has been
// granted it (a correct lock does that only after the straggler's lease ran
// out), then writes with its old token and releases — the paused-holder
// pattern, produced in-process.
type workload struct {
	mu        mutex
	reg       Register
	lease     time.Duration // the fixed lease of every acquisition
	clients   int           // besides the straggler
	ops       int           // acquisitions per client, at least
	straggles int           // straggler rounds
	opTimeout time.Duration // bounds each call; a timed-out call is unknown
	unfenced  bool          // the lock issues no fence tokens (Redlock): skip fence checks and the register

	lockH, regH *History

	grantMu sync.Mutex    // guards grantCh, linger, heals
	grantCh chan struct{} // closed and replaced on every grant to a non-straggler
	// linger is set while the straggler waits for a takeover: the client
	// that takes over keeps the lock until it is closed (the straggler's
	// round ended), so the straggler's late release meets a live holder.
	linger chan struct{}
	heals  []int64 // when the nemesis healed a fault (lockH time)
	writes atomic.Int64
}

// heal records that the nemesis just ended a fault, to measure recovery.
func (w *workload) heal() {
	now := w.lockH.Now()
	w.grantMu.Lock()
	w.heals = append(w.heals, now)
	w.grantMu.Unlock()
}

// init prepares the histories; run calls it, a nemesis that needs the
// clock before run may call it first.
func (w *workload) init() {
	if w.lockH == nil {
		w.lockH, w.regH = NewHistory(), NewHistory()
	}
}

// result is what a workload run produced.
type result struct {
	lockOps, regOps []porcupine.Operation
	fig             Figures
}

// granted signals a grant to a non-straggler and hands it the linger
// channel, if the straggler is waiting.
func (w *workload) granted(client int) (linger <-chan struct{}) {
	if client == 0 {
		return nil
	}
	w.grantMu.Lock()
	defer w.grantMu.Unlock()
	close(w.grantCh)
	w.grantCh = make(chan struct{})
	linger, w.linger = w.linger, nil
	return linger
}

// straggle starts the straggler's wait for a takeover.
func (w *workload) straggle() (takeover <-chan struct{}, done func()) {
	w.grantMu.Lock()
	defer w.grantMu.Unlock()
	ch := make(chan struct{})
	w.linger = ch
	return w.grantCh, func() {
		w.grantMu.Lock()
		if w.linger == ch {
			w.linger = nil
		}
		w.grantMu.Unlock()
		close(ch)
	}
}

// run runs the workload while nemesis (if any) injects faults under a
// context cancelled when the clients are done.
func (w *workload) run(t *testing.T, nemesis func(ctx context.Context)) result {
	t.Helper()
	if w.opTimeout == 0 {
		w.opTimeout = 5 * time.Second
	}
	w.init()
	w.grantCh = make(chan struct{})
	var wg sync.WaitGroup
	var straggling atomic.Bool
	straggling.Store(w.straggles > 0)
	nctx, stop := context.WithCancel(t.Context())
	var nwg sync.WaitGroup
	var faulting atomic.Bool
	if nemesis != nil {
		// The clients keep going until the nemesis has injected every fault.
		faulting.Store(true)
		nwg.Go(func() {
			defer faulting.Store(false)
			nemesis(nctx)
		})
	}
	if w.straggles > 0 {
		wg.Go(func() {
			defer straggling.Store(false)
			for r := 0; r < w.straggles; r++ {
				// Each round holds the lock once (a control lock cannot wait).
				for try := 0; try < 200 && !w.round(0, true, true); try++ {
				}
			}
		})
	}
	for c := 1; c <= w.clients; c++ {
		wg.Go(func() {
			for i := 0; i < w.ops || straggling.Load() || faulting.Load(); i++ {
				w.round(c, i%4 != 0, false)
			}
		})
	}
	wg.Wait()
	stop()
	nwg.Wait()
	return w.summarise()
}

// round is one acquisition and, if granted, one critical section; it
// reports whether the lock was granted.
func (w *workload) round(client int, wait, straggle bool) bool {
	ctx, cancel := context.WithTimeout(context.Background(), w.opTimeout+2*w.lease)
	defer cancel()
	call := w.lockH.Now()
	h, err := w.mu.acquire(ctx, wait)
	ret := w.lockH.Now()
	in := LockInput{Op: Acquire, Client: client, Lease: w.lease, Call: call, Return: ret, Unfenced: w.unfenced}
	switch {
	case errors.Is(err, errRefused):
		w.lockH.Add(client, call, ret, in, LockOutput{Outcome: Refused})
		return false
	case err != nil:
		in.Return = Never
		w.lockH.Add(client, call, Never, in, LockOutput{Outcome: Unknown})
		return false
	}
	w.lockH.Add(client, call, ret, in, LockOutput{Outcome: Granted, Fence: h.Fence()})
	linger := w.granted(client)
	if straggle {
		// Hold on past the lease until somebody else got the lock (bounded).
		takeover, done := w.straggle()
		defer done()
		select {
		case <-takeover:
		case <-time.After(3 * w.lease):
		}
	}
	if !w.unfenced {
		w.critical(ctx, client, h)
	}
	if linger != nil {
		select { // hold until the straggler's round ended (bounded)
		case <-linger:
		case <-time.After(3 * w.lease):
		}
	}
	rctx, rcancel := context.WithTimeout(context.Background(), w.opTimeout)
	defer rcancel()
	call = w.lockH.Now()
	err = h.Unlock(rctx)
	ret = w.lockH.Now()
	in = LockInput{Op: Release, Client: client, Call: call, Return: ret}
	switch {
	case err == nil:
		w.lockH.Add(client, call, ret, in, LockOutput{Outcome: Released})
	case errors.Is(err, locks.ErrNotHeld):
		w.lockH.Add(client, call, ret, in, LockOutput{Outcome: NotHeld})
	default:
		in.Return = Never
		w.lockH.Add(client, call, Never, in, LockOutput{Outcome: Unknown})
	}
	return true
}

// critical reads the register and writes this holder's value with its fence.
func (w *workload) critical(ctx context.Context, client int, h holding) {
	ctx, cancel := context.WithTimeout(ctx, w.opTimeout)
	defer cancel()
	call := w.regH.Now()
	f, v, err := w.reg.Read(ctx)
	ret := w.regH.Now()
	if err == nil {
		w.regH.Add(client, call, ret, RegisterInput{Op: Read, Client: client}, RegisterOutput{Outcome: Done, Fence: f, Value: v})
	}
	fence := h.Fence()
	value := fmt.Sprintf("c%d#%d", client, w.writes.Add(1))
	before := w.regH.Now()
	validUntil := before + int64(h.TTL())
	call = w.regH.Now()
	ok, err := w.reg.Write(ctx, fence, value)
	ret = w.regH.Now()
	in := RegisterInput{Op: Write, Client: client, Fence: fence, Value: value, Valid: ret < validUntil}
	switch {
	case err != nil:
		in.Valid = false
		w.regH.Add(client, call, Never, in, RegisterOutput{Outcome: Unknown})
	case ok:
		w.regH.Add(client, call, ret, in, RegisterOutput{Outcome: Done})
	default:
		w.regH.Add(client, call, ret, in, RegisterOutput{Outcome: Refused})
	}
}

// summarise counts the outcomes and the violations that direct checks find
// (porcupine's verdicts are added by verify).
func (w *workload) summarise() result {
	r := result{lockOps: w.lockH.Ops(), regOps: w.regH.Ops(), fig: Figures{Recovery: -1}}
	for _, op := range r.lockOps {
		in, out := op.Input.(LockInput), op.Output.(LockOutput)
		if in.Op != Acquire {
			continue
		}
		r.fig.Attempted++
		switch out.Outcome {
		case Granted:
			r.fig.Succeeded++
		case Refused:
			r.fig.Refused++
		default:
			r.fig.Unknown++
		}
	}
	r.fig.Violations = staleApplied(r.regOps)
	if !w.unfenced {
		r.fig.Violations += fenceInversions(r.lockOps)
	}
	w.grantMu.Lock()
	heals := append([]int64(nil), w.heals...)
	w.grantMu.Unlock()
	r.fig.Recovery = recovery(r.lockOps, heals)
	return r
}

// recovery is the longest time from a heal to the first grant returned
// after it, or -1 without heals.
func recovery(ops []porcupine.Operation, heals []int64) time.Duration {
	worst := time.Duration(-1)
	for _, h := range heals {
		first := int64(Never)
		for _, op := range ops {
			if out := op.Output.(LockOutput); out.Outcome == Granted && op.Return >= h {
				first = min(first, op.Return)
			}
		}
		if first != Never {
			worst = max(worst, time.Duration(first-h))
		}
	}
	return worst
}

// fenceInversions counts pairs of grants where the later (called after the
// earlier returned) has the smaller fence.
func fenceInversions(ops []porcupine.Operation) int {
	n := 0
	for _, a := range ops {
		if out := a.Output.(LockOutput); out.Outcome != Granted {
			continue
		}
		for _, b := range ops {
			if out := b.Output.(LockOutput); out.Outcome == Granted && b.Call > a.Return &&
				b.Output.(LockOutput).Fence <= a.Output.(LockOutput).Fence {
				n++
			}
		}
	}
	return n
}

// staleApplied counts writes applied although a write with a higher token
// had been applied (returned) before they were called.
func staleApplied(ops []porcupine.Operation) int {
	n := 0
	for _, a := range ops {
		ai, ao := a.Input.(RegisterInput), a.Output.(RegisterOutput)
		if ai.Op != Write || ao.Outcome != Done {
			continue
		}
		for _, b := range ops {
			bi, bo := b.Input.(RegisterInput), b.Output.(RegisterOutput)
			if bi.Op == Write && bo.Outcome == Done && b.Call > a.Return && bi.Fence < ai.Fence {
				n++
			}
		}
	}
	return n
}

// anyVerdict, as a wanted verdict, accepts any: a control whose violation
// shows reliably in one history but only by chance in the other.
const anyVerdict porcupine.CheckResult = ""

// verify checks both histories with porcupine against the wanted verdicts,
// adds an illegal verdict to the violations, and returns the figures.
func verify(t *testing.T, r result, wantLock, wantReg porcupine.CheckResult) Figures {
	t.Helper()
	lock := Check(t, "lock", LockModel, r.lockOps, wantLock)
	reg := Check(t, "register", RegisterModel, r.regOps, wantReg)
	for _, v := range []porcupine.CheckResult{lock, reg} {
		if v != porcupine.Ok {
			r.fig.Violations++
		}
	}
	if wantLock != anyVerdict && lock != wantLock {
		t.Errorf("lock history: porcupine says %s, want %s", lock, wantLock)
	}
	if wantReg != anyVerdict && reg != wantReg {
		t.Errorf("register history: porcupine says %s, want %s", reg, wantReg)
	}
	r.fig.Note = fmt.Sprintf("lock model %s, register model %s; %d lock ops, %d register ops", lock, reg, len(r.lockOps), len(r.regOps)) + r.fig.Note
	return r.fig
}
