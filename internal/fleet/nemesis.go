package fleet

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/cacheguard/cacheguard/internal/faultproxy"
	"github.com/cacheguard/cacheguard/internal/redistest"
)

// The steps a request can be paused at (the service's testhooks.go).
const (
	StepAfterLock    = "after-lock"
	StepAfterRead    = "after-read"
	StepBeforeUpdate = "before-update"
	StepAfterUpdate  = "after-update"
	StepCacheLoad    = "cache-load"
)

// WriteSteps are the steps of an edit, in order.
var WriteSteps = []string{StepAfterLock, StepAfterRead, StepBeforeUpdate, StepAfterUpdate}

// parkWithin bounds the wait for a request to reach its step.
const parkWithin = 20 * time.Second

// parked is a request the driver sent with X-Pause-At, parked at its step.
type parked struct {
	proc *Proc
	tag  string
	done chan struct{} // closed when the request has been answered
}

// park sends a request to process p (send runs in a goroutine of its own,
// owned by the returned parked: wait on done) and waits until the process
// reports it parked at step.
func (f *Fleet) park(ctx context.Context, p int, step string, send func(tag string)) (*parked, error) {
	tag := f.NewID("h")
	reached := f.procs[p].Expect(tag)
	pk := &parked{proc: f.procs[p], tag: tag, done: make(chan struct{})}
	go func() {
		defer close(pk.done)
		send(tag)
	}()
	timer := time.NewTimer(parkWithin)
	defer timer.Stop()
	select {
	case <-reached:
		return pk, nil
	case <-pk.done:
		return nil, fmt.Errorf("%w: the request to process %d was answered without reaching step %s", errNotReached, p, step)
	case <-timer.C:
		<-pk.done // the client's timeout bounds this
		return nil, fmt.Errorf("the request to process %d did not reach step %s within %v", p, step, parkWithin)
	}
}

// parkTries bounds how often parkEdit sends an edit refused before its
// step; retryAfter is the Retry-After of the service's refusals.
const (
	parkTries  = 3
	retryAfter = time.Second
)

// parkEdit sends the edit r to its process, parked at r.pauseAt (see park).
// An edit refused before it reached its step (409, 423 or 503, documented
// answers: on a host too loaded to renew a lease in time, its lock was lost
// before the write; just after a SIGCONT, the process's Redis breaker is
// open) is sent again once the Retry-After its refusals carry (1s) has
// passed, up to parkTries times in all: the scenarios are about what
// happens from the step on. The refused edit stays in the history, so
// CheckEdits still checks it was not applied, and the fault log names it.
// The returned edit is filled in once pk.done is closed.
func (f *Fleet) parkEdit(ctx context.Context, r editRequest) (pk *parked, a *EditOp, err error) {
	a = new(EditOp)
	for try := 1; ; try++ {
		pk, err = f.park(ctx, r.proc, r.pauseAt, func(tag string) {
			r := r
			r.tag = tag
			*a = f.edit(ctx, r)
		})
		if err == nil {
			return pk, a, nil
		}
		// park returns an error only once the edit was answered: say how.
		err = fmt.Errorf("%w (answered %s)", err, a)
		if !errors.Is(err, errNotReached) || !refusal(a.Status) || try == parkTries {
			return nil, a, err
		}
		f.fault(fmt.Sprintf("edit %s refused before its step %s (%s): sent again", a.ID, r.pauseAt, a.answer()))()
		hold(ctx, retryAfter)
	}
}

// refusal reports whether status is a documented refusal of an edit.
func refusal(status int) bool {
	return status == http.StatusConflict || status == http.StatusLocked || status == http.StatusServiceUnavailable
}

// errNotReached: a request meant to park at a step was answered without
// reaching it (a read served from the cache has no load to park in).
var errNotReached = errors.New("fleet: step not reached")

// hold waits d (the fault's duration is the subject here, not a guess at
// synchronisation) unless ctx ends first.
func hold(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// Pause describes a paused edit.
type Pause struct {
	Step string        // where the edit stops
	P, Q int           // the paused process, and the one that edits meanwhile
	Repo uint          // the repository both edit
	For  time.Duration // how long p stays stopped (longer than the lease)
	// IgnoreLost: the paused edit's transaction does not watch its lock's
	// loss (X-Ignore-Lost), so it meets the plugin's checks and the fence
	// instead of a cancelled context.
	IgnoreLost bool
	// Rename: the paused edit is a rename (plain GORM calls under the
	// request's lock) rather than a settings edit (gormplugin.Transaction).
	Rename bool
	// Save: both edits are settings edits that read the row with First and
	// write it back with Save under the request's lock, without
	// gormplugin.Transaction (PATCH /repos/:id/settings).
	Save bool
}

// PauseEdit is the central fencing scenario at one step: an edit of the
// repository on process P is parked at the step, the whole process is
// SIGSTOPped (longer than the lease), meanwhile process Q edits the same
// repository (the same way, for Save, else by a settings edit); then P is
// continued. It returns the paused edit and the other.
func (f *Fleet) PauseEdit(ctx context.Context, pz Pause) (paused, other EditOp, err error) {
	p, q, repo, step, pause := pz.P, pz.Q, pz.Repo, pz.Step, pz.For
	pk, a, err := f.parkEdit(ctx, editRequest{proc: p, repo: repo, pauseAt: step, ignoreLost: pz.IgnoreLost, rename: pz.Rename, save: pz.Save})
	if err != nil {
		return *a, other, err
	}
	end := f.fault(fmt.Sprintf("process %d SIGSTOPped %v at %s (edit of repo %d)", p, pause, step, repo))
	pk.proc.Stop()
	bDone := make(chan EditOp, 1)
	go func() { bDone <- f.edit(ctx, editRequest{proc: q, repo: repo, save: pz.Save}) }()
	hold(ctx, pause)
	pk.proc.Cont()
	end()
	<-pk.done
	return *a, <-bDone, nil
}

// LoadPause describes a cache load held inside its process.
type LoadPause struct {
	Route string // RouteGet or RouteList
	P, Q  int    // the process whose load is held, and the one that edits meanwhile
	Repo  uint   // the repository read and edited
	// For: how long P stays SIGSTOPped; 0 holds the load without a stop
	// (P keeps renewing its fill lease) until the reads below are waiting.
	For time.Duration
	// Late: reads of the repository sent to P while its load is held, before
	// the edit and again after it was answered (a process's fill joined by
	// calls arriving late: cacheguard's awaitFill). Those sent after the
	// edit must be given its version (read-your-writes), whether P was
	// stopped when they were sent (they wait in its socket) or not.
	Late int
}

// PauseLoad holds a cache load (lz says how): a read of lz.Repo on process
// lz.P is parked inside its load (after the database read, before the value
// is stored), lz.Late more reads are sent to P and wait for that load, P is
// SIGSTOPped for lz.For (or not), process lz.Q edits the repository, lz.Late
// reads are sent to P again and, when P is stopped, every other process
// reads the repository; then P is continued (or its load released), and
// once every read was answered, every process reads the repository again.
func (f *Fleet) PauseLoad(ctx context.Context, lz LoadPause) error {
	p, route, repo := lz.P, lz.Route, lz.Repo
	var pk *parked
	var err error
	// A read finds the repository or the list cached when a reader filled
	// it since the last edit (the soak's load reads them all the time): an
	// edit drops them; try again.
	for range 10 {
		pk, err = f.park(ctx, p, StepCacheLoad, func(tag string) {
			f.read(ctx, p, route, repo, StepCacheLoad, tag)
		})
		if !errors.Is(err, errNotReached) {
			break
		}
		f.Edit(ctx, lz.Q, repo)
	}
	if err != nil {
		return err
	}
	var late sync.WaitGroup
	defer late.Wait()
	// lateReads sends lz.Late reads to P and, unless P is stopped, waits
	// until they wait for its load: a call joining it counts as a miss as it
	// starts waiting.
	lateReads := func(stopped bool) error {
		var before uint64
		if !stopped {
			var err error
			if before, err = f.cacheMisses(ctx, p); err != nil {
				return err
			}
		}
		for range lz.Late {
			late.Go(func() { f.Read(ctx, p, route, repo) })
		}
		if stopped {
			return nil
		}
		return f.waitMisses(ctx, p, before+uint64(lz.Late))
	}
	held := "held"
	if lz.For > 0 {
		held = fmt.Sprintf("SIGSTOPped %v", lz.For)
	}
	end := f.fault(fmt.Sprintf("process %d %s inside a cache load (%s, repo %d, %d late reads before and after an edit)", p, held, route, repo, lz.Late))
	errLate := lateReads(false)
	if lz.For > 0 {
		pk.proc.Stop()
	}
	f.Edit(ctx, lz.Q, repo)
	if lz.For > 0 {
		if errLate == nil {
			errLate = lateReads(true) // queued in P's socket until SIGCONT
		}
		for i := range f.procs {
			if i != p {
				f.Read(ctx, i, route, repo)
			}
		}
		hold(ctx, lz.For)
		pk.proc.Cont()
	} else {
		if errLate == nil {
			errLate = lateReads(false)
		}
		if err := f.release(ctx, pk.proc, pk.tag); err != nil && errLate == nil {
			errLate = err
		}
	}
	end()
	<-pk.done
	late.Wait()
	for i := range f.procs {
		f.Read(ctx, i, route, repo)
	}
	return errLate
}

// cacheMisses returns the Misses process p's Guard reports (GET /stats).
func (f *Fleet) cacheMisses(ctx context.Context, p int) (uint64, error) {
	u := f.procs[p].URL()
	if u == "" {
		return 0, errDown
	}
	var s struct {
		Cache struct{ Misses uint64 }
	}
	err := f.getJSON(ctx, u+"/stats", &s)
	return s.Cache.Misses, err
}

// waitMisses waits until process p's Guard reports at least n misses,
// within parkWithin.
func (f *Fleet) waitMisses(ctx context.Context, p int, n uint64) error {
	deadline := time.Now().Add(parkWithin)
	for {
		got, err := f.cacheMisses(ctx, p)
		switch {
		case err != nil:
			return err
		case got >= n:
			return nil
		case time.Now().After(deadline):
			return fmt.Errorf("process %d: %d cache misses after %v, want %d (late reads not waiting for its held load)", p, got, parkWithin, n)
		}
		hold(ctx, 5*time.Millisecond)
	}
}

// KillEdit SIGKILLs process kz.P while its edit of kz.Repo is parked after
// the read (a settings edit, or kz.Rename's or kz.Save's kind: see Pause),
// lets process kz.Q edit the repository (the same way, for Save, else by a
// settings edit), and restarts P. It returns the killed edit, the other edit
// and the time from the kill to the other edit's answer.
func (f *Fleet) KillEdit(ctx context.Context, kz Pause) (killed, other EditOp, recovery time.Duration, err error) {
	p, q, repo := kz.P, kz.Q, kz.Repo
	pk, a, err := f.parkEdit(ctx, editRequest{proc: p, repo: repo, pauseAt: StepAfterRead, rename: kz.Rename, save: kz.Save})
	if err != nil {
		return *a, other, 0, err
	}
	end := f.fault(fmt.Sprintf("process %d SIGKILLed after the read of an edit of repo %d", p, repo))
	killedAt := time.Now()
	pk.proc.Kill()
	<-pk.done
	end()
	other = f.edit(ctx, editRequest{proc: q, repo: repo, save: kz.Save})
	recovery = other.End.Sub(killedAt)
	return *a, other, recovery, f.Restart(p)
}

// RedisOutage kills redis-server, keeps it down for d, and restarts it (same
// port, its append-only file replayed).
func (f *Fleet) RedisOutage(ctx context.Context, d time.Duration) error {
	end := f.fault(fmt.Sprintf("redis-server killed, restarted after %v", d))
	defer end()
	f.Redis.Kill()
	hold(ctx, d)
	return f.Redis.Restart()
}

// RedisPause SIGSTOPs redis-server for d.
func (f *Fleet) RedisPause(ctx context.Context, d time.Duration) {
	end := f.fault(fmt.Sprintf("redis-server SIGSTOPped %v", d))
	defer end()
	f.Redis.Pause()
	hold(ctx, d)
	f.Redis.Resume()
}

// BlackHole makes the proxy swallow all traffic both ways for d: a partition.
func (f *Fleet) BlackHole(ctx context.Context, d time.Duration) {
	end := f.fault(fmt.Sprintf("redis black-holed %v (fault proxy)", d))
	defer end()
	f.Proxy.Set(faultproxy.BlackHole)
	hold(ctx, d)
	f.Proxy.Set(faultproxy.Pass)
}

// PauseMaster SIGSTOPs master m for d (no failover when d is below the
// cluster's node timeout, 1s).
func (f *Fleet) PauseMaster(ctx context.Context, m *redistest.Server, d time.Duration) {
	end := f.fault(fmt.Sprintf("cluster master %s SIGSTOPped %v", m.Addr(), d))
	defer end()
	m.Pause()
	hold(ctx, d)
	m.Resume()
}

// FailOver SIGSTOPs master m until the cluster has promoted its replica
// (bounded by within), then continues m, which rejoins as a replica. It
// returns how long the failover took.
func (f *Fleet) FailOver(ctx context.Context, m *redistest.Server, within time.Duration) (time.Duration, error) {
	var replica *redistest.Server
	for i, mm := range f.Cluster.Masters() {
		if mm == m {
			replica = f.Cluster.Replicas()[i]
		}
	}
	if replica == nil {
		return 0, fmt.Errorf("%s is not a master with a replica", m.Addr())
	}
	end := f.fault(fmt.Sprintf("cluster master %s SIGSTOPped until its replica %s took over", m.Addr(), replica.Addr()))
	defer end()
	start := time.Now()
	m.Pause()
	defer m.Resume()
	for deadline := start.Add(within); ; {
		info, err := replica.Info(ctx, "replication")
		if err == nil && info["role"] == "master" {
			return time.Since(start), nil
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("replica %s not promoted within %v", replica.Addr(), within)
		}
		hold(ctx, 50*time.Millisecond)
	}
}

// FirstEdit edits repo, round robin over the processes, until an edit is
// answered 200 or within passes, and returns how long that took.
func (f *Fleet) FirstEdit(ctx context.Context, repo uint, within time.Duration) (time.Duration, bool) {
	start := time.Now()
	for i := 0; time.Since(start) < within; i++ {
		if op := f.Edit(ctx, i%len(f.procs), repo); op.Status == http.StatusOK {
			return time.Since(start), true
		}
		hold(ctx, 20*time.Millisecond)
	}
	return time.Since(start), false
}

// EveryProcessEdits waits until each process has answered an edit of repo
// with 200, and reports how long that took, or false if within ran out: a
// process whose Redis circuit breaker is still open answers 503 until its
// probe sees Redis again.
func (f *Fleet) EveryProcessEdits(ctx context.Context, repo uint, within time.Duration) (time.Duration, bool) {
	start := time.Now()
	for p := range f.procs {
		for f.Edit(ctx, p, repo).Status != http.StatusOK {
			if time.Since(start) >= within || ctx.Err() != nil {
				return time.Since(start), false
			}
			hold(ctx, 20*time.Millisecond)
		}
	}
	return time.Since(start), true
}

// WakeLock measures how fast a waiting edit is woken: an edit of repo on
// process p holds the lock (parked after it) for holdFor while process q's
// edit of the same repository waits; it returns the time from the release
// of p's edit to q's answer.
func (f *Fleet) WakeLock(ctx context.Context, p, q int, repo uint, holdFor time.Duration) (time.Duration, error) {
	pk, a, err := f.parkEdit(ctx, editRequest{proc: p, repo: repo, pauseAt: StepAfterLock})
	if err != nil {
		return 0, err
	}
	bDone := make(chan EditOp, 1)
	go func() { bDone <- f.Edit(ctx, q, repo) }()
	hold(ctx, holdFor)
	released := time.Now()
	if err := f.release(ctx, pk.proc, pk.tag); err != nil {
		<-pk.done
		<-bDone
		return 0, err
	}
	<-pk.done
	b := <-bDone
	if a.Status != http.StatusOK || b.Status != http.StatusOK {
		return 0, fmt.Errorf("wake probe: %s; %s", *a, b)
	}
	return b.End.Sub(released), nil
}

// WakeFill measures how fast a read waiting for another process's cache fill
// is woken: a read of a cold repository on process p is parked inside its
// load for holdFor while process q reads the same repository; it returns the
// time from the release of p's load to q's answer.
func (f *Fleet) WakeFill(ctx context.Context, p, q int, repo uint, holdFor time.Duration) (time.Duration, error) {
	var a ReadOp
	pk, err := f.park(ctx, p, StepCacheLoad, func(tag string) {
		a = f.read(ctx, p, RouteGet, repo, StepCacheLoad, tag)
	})
	if err != nil {
		return 0, err
	}
	bDone := make(chan ReadOp, 1)
	go func() { bDone <- f.Read(ctx, q, RouteGet, repo) }()
	hold(ctx, holdFor)
	released := time.Now()
	if err := f.release(ctx, pk.proc, pk.tag); err != nil {
		<-pk.done
		<-bDone
		return 0, err
	}
	<-pk.done
	b := <-bDone
	if a.Status != http.StatusOK || b.Status != http.StatusOK {
		return 0, fmt.Errorf("wake probe: %s; %s", a, b)
	}
	return b.End.Sub(released), nil
}

// EditIntoStall commits an edit of repo on process p just after redis-server
// is SIGSTOPped, so that its invalidation fails, has process q read the
// repository on both routes from before the stall, during it and once it
// ended, and returns the edit, the reads made while it was pending, and how
// long after Redis resumed q first read the edit's version on both routes
// (the plugin's background retry having landed).
func (f *Fleet) EditIntoStall(ctx context.Context, p, q int, repo uint, stall time.Duration) (edit EditOp, during []ReadOp, fresh time.Duration, err error) {
	routes := []string{RouteGet, RouteList}
	for _, route := range routes {
		f.Read(ctx, q, route, repo) // cached on both routes
	}
	pk, a, err := f.parkEdit(ctx, editRequest{proc: p, repo: repo, pauseAt: StepAfterUpdate})
	if err != nil {
		return *a, nil, 0, err
	}
	end := f.fault(fmt.Sprintf("redis-server SIGSTOPped %v as process %d commits an edit of repo %d", stall, p, repo))
	f.Redis.Pause()
	stopped := time.Now()
	err = f.release(ctx, pk.proc, pk.tag)
	<-pk.done // committed; its invalidation failed, or it was refused
	edit = *a
	// Reads that begin before Redis resumes, and wait for it.
	hold(ctx, stall-time.Since(stopped)-100*time.Millisecond)
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, route := range routes {
		wg.Go(func() {
			op := f.Read(ctx, q, route, repo)
			mu.Lock()
			during = append(during, op)
			mu.Unlock()
		})
	}
	hold(ctx, stall-time.Since(stopped))
	f.Redis.Resume()
	resumed := time.Now()
	end()
	wg.Wait()
	if err != nil {
		return edit, during, 0, err
	}
	for {
		n := 0
		for _, route := range routes {
			if op := f.Read(ctx, q, route, repo); op.Status == 200 && op.Version >= edit.Version {
				n++
			}
		}
		if n == len(routes) {
			return edit, during, time.Since(resumed), nil
		}
		if time.Since(resumed) > staleGrace {
			return edit, during, 0, fmt.Errorf("process %d still read repo %d older than v%d %v after Redis resumed", q, repo, edit.Version, staleGrace)
		}
		hold(ctx, 50*time.Millisecond)
	}
}
