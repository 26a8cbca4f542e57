package fleet

import (
	"fmt"
	"testing"
	"time"

	"github.com/cacheguard/cacheguard/internal/redistest"
)

// lockMaster returns the master that serves repository repo's lock.
func (f *Fleet) lockMaster(repo uint) *redistest.Server {
	return f.Cluster.MasterForSlot(f.Cluster.Slot(fmt.Sprintf("{repos:%d}", repo)))
}

// repoOn returns a fresh repository whose lock lives on master m.
func (f *Fleet) repoOn(t *testing.T, m *redistest.Server) uint {
	t.Helper()
	for {
		r := f.FreshRepo()
		if f.lockMaster(r) == m {
			return r
		}
	}
}

// TestFleetCluster runs the service on a 3-master cluster (one replica each):
// a steady load; one master paused while a process holds locks on it and on
// another master (a slow shard must not stall the healthy one's renewals);
// and a master paused until its replica took over.
func TestFleetCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("cluster: skipped in -short mode")
	}
	f := Start(t, Config{Cluster: true, Repos: 120})
	ctx := t.Context()
	masters := f.Cluster.Masters()

	s := f.Scenario(t, rep, "steady load, 4 processes (cluster)")
	load := f.StartLoad(ctx, LoadConfig{Seed: uint64(rep.Seed), Writers: 3, Readers: 3, Repos: []uint{1, 2, 3}, Think: 15 * time.Millisecond, Mixed: true})
	hold(ctx, 2*time.Second)
	load.Stop()
	s.CheckEdits(ctx, nil)
	s.CheckReads(readIssues, false)
	s.Done()

	pr := f.newProbes()
	ref := probeWake(ctx, t, f, pr)

	// Process 0 holds a lock on master 0 and one on master 1; process 1
	// waits for the second. Master 0 is paused for 2.5s (lease 1s).
	s = f.Scenario(t, rep, "a master SIGSTOPped 2.5s while a process holds locks on it and on another (cluster)")
	slow, healthy := f.repoOn(t, masters[0]), f.repoOn(t, masters[1])
	pkSlow, onSlow, err := f.parkEdit(ctx, editRequest{proc: 0, repo: slow, pauseAt: StepAfterLock})
	if err != nil {
		t.Fatal(err)
	}
	pkHealthy, onHealthy, err := f.parkEdit(ctx, editRequest{proc: 0, repo: healthy, pauseAt: StepAfterLock})
	if err != nil {
		t.Fatal(err)
	}
	waiter := make(chan EditOp, 1)
	go func() { waiter <- f.Edit(ctx, 1, healthy) }()
	f.PauseMaster(ctx, masters[0], 2500*time.Millisecond)
	for _, pk := range []*parked{pkHealthy, pkSlow} {
		if err := f.release(ctx, pk.proc, pk.tag); err != nil {
			t.Error(err)
		}
		<-pk.done
	}
	other := <-waiter
	s.CheckEdits(ctx, Issues{InvOverlap: {"13.1"}})
	s.Figure("edit on the paused master's lock", onSlow.answer())
	s.Figure("edit holding the healthy master's lock", onHealthy.answer())
	s.Figure("edit waiting for the healthy master's lock", other.answer())
	s.Done()

	// A master paused until its replica is promoted; it then rejoins as a
	// replica. Writes acknowledged by the old master but not yet replicated
	// can be lost (Redis replicates asynchronously; the locks' Replicas
	// asks for acknowledgements, which the service does not use).
	s = f.Scenario(t, rep, "a master SIGSTOPped until its replica took over (cluster)")
	victim := f.lockMaster(recoverRepo)
	load = f.StartLoad(ctx, LoadConfig{Seed: uint64(rep.Seed) + 1, Writers: 3, Readers: 2, Repos: []uint{1, 2, 3, recoverRepo}, Think: 30 * time.Millisecond, Mixed: true})
	hold(ctx, 500*time.Millisecond)
	took, err := f.FailOver(ctx, victim, 20*time.Second)
	if err != nil {
		load.Stop()
		t.Fatal(err)
	}
	rec, ok := f.FirstEdit(ctx, recoverRepo, 30*time.Second)
	load.Stop()
	if !ok {
		s.Count("no successful edit within 30s of the failover", 1, nil)
	}
	s.FigureDuration("failover: pause to the replica's promotion", took)
	s.FigureDuration("recovery: promotion to the first edit answered 200", rec)
	after := probeWake(ctx, t, f, pr)
	checkRecovery(s, ref, ref, after, []string{"13.2"})
	s.CheckEdits(ctx, Issues{InvOverlap: {"doc:asynchronous replication"}, InvLost: {"doc:asynchronous replication"}})
	s.CheckReads(readIssues, true)
	s.CheckProcs(nil)
	s.Done()
}
