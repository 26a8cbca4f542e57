package fleet

import (
	"fmt"
	"net/http"
	"testing"
	"time"
)

// testRollingRestart restarts the processes one at a time under load,
// as a deployment does: SIGTERM (a graceful shutdown), then SIGKILL as the
// control. Another process's shutdown must never fail a request.
func testRollingRestart(t *testing.T) {
	f := Start(t, Config{CacheTTL: 2 * time.Second})
	ctx := t.Context()

	// A process is shut down while it holds a fill lease: its load is slower
	// than the shutdown's grace (the service's 5s), so the shutdown closes the
	// cache guard under it. Readers waiting in the other processes must get
	// the value (one of them takes the load over), not an error.
	s := f.Scenario(t, rep, "graceful shutdown of a process holding a fill lease")
	repo := f.FreshRepo()
	others := []int{1, 2, 3}[:f.Procs()-1]
	before, err := f.CacheLoads(ctx, others...)
	if err != nil {
		t.Fatal(err)
	}
	pk, err := f.park(ctx, 0, StepCacheLoad, func(tag string) {
		f.read(ctx, 0, RouteGet, repo, StepCacheLoad, tag)
	})
	if err != nil {
		t.Fatal(err)
	}
	waiting := make(chan ReadOp, f.Procs()-1)
	for p := 1; p < f.Procs(); p++ {
		go func() { waiting <- f.Read(ctx, p, RouteGet, repo) }()
	}
	end := f.fault("process 0 SIGTERMed while its cache load is parked")
	f.Proc(0).Term(30 * time.Second)
	end()
	<-pk.done
	var failed []string
	for p := 1; p < f.Procs(); p++ {
		if op := <-waiting; op.Status != http.StatusOK {
			failed = append(failed, op.String())
		}
	}
	s.Count(InvRestartError, len(failed), nil, failed...)
	after, err := f.CacheLoads(ctx, others...)
	if err != nil {
		t.Fatal(err)
	}
	// The closing process's load, plus at most one taking its fill over.
	loads := 1 + after - before
	s.Count("loads of the key beyond 2 (the closed process's and one takeover)", int(max(loads-2, 0)), nil)
	s.Figure("loads of the key", fmt.Sprint(loads))
	if err := f.Restart(0); err != nil {
		t.Fatal(err)
	}
	s.Done()

	s = f.Scenario(t, rep, "rolling restart under load (SIGTERM each process, then SIGKILL each)")
	load := f.StartLoad(ctx, LoadConfig{Seed: uint64(rep.Seed), Writers: 3, Readers: 3, Repos: []uint{1, 2, 3}, Think: 20 * time.Millisecond, Mixed: true})
	for _, graceful := range []bool{true, false} {
		for p := range f.Procs() {
			hold(ctx, 300*time.Millisecond)
			what := fmt.Sprintf("process %d SIGKILLed and restarted", p)
			if graceful {
				what = fmt.Sprintf("process %d SIGTERMed and restarted", p)
			}
			end := f.fault(what)
			if graceful {
				if !f.Proc(p).Term(15 * time.Second) {
					s.Count(fmt.Sprintf("process %d did not exit within 15s of SIGTERM", p), 1, nil)
				}
			} else {
				f.Proc(p).Kill()
			}
			err := f.Restart(p)
			end()
			if err != nil {
				load.Stop()
				t.Fatal(err)
			}
		}
	}
	hold(ctx, 300*time.Millisecond)
	load.Stop()
	s.CheckEdits(ctx, nil)
	s.CheckReads(Issues{InvStaleGet: {"14.1"}, InvStaleCache: {"14.1"}, InvBackwards: {"14.1"}, InvReadErrors: {"22.1"}}, false)
	s.Figure("edits answered 200", fmt.Sprintf("%d of %d", load.acked.Load(), load.edits.Load()))
	s.CheckProcs(nil)
	s.Done()
}
