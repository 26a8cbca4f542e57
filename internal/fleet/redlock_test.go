package fleet

import (
	"fmt"
	"testing"
	"time"
)

// testRedlock runs the edit workload with the repository locks taken as a
// Redlock over 3 independent redis-servers (the cache stays on the main
// Redis): under steady load, with one lock server SIGSTOPped (the quorum of
// the other two keeps granting), and with one killed and restarted (with
// appendfsync always, as the restart rule asks). A Redlock issues no fence
// tokens, so the plugin runs without fencing: a holder paused past its
// lease is not refused — the documented limit, not run here.
func testRedlock(t *testing.T) {
	f := Start(t, Config{Redlock: 3})
	ctx := t.Context()
	load := LoadConfig{Seed: uint64(rep.Seed), Writers: 3, Readers: 2, Repos: []uint{1, 2, 3}, Think: 15 * time.Millisecond}

	s := f.Scenario(t, rep, "Redlock over 3 servers: steady load, 4 processes")
	l := f.StartLoad(ctx, load)
	hold(ctx, 3*time.Second)
	l.Stop()
	s.CheckEdits(ctx, nil)
	s.CheckReads(readIssues, false)
	s.Figure("edits answered 200", fmt.Sprintf("%d of %d", l.acked.Load(), l.edits.Load()))
	s.CheckProcs(nil)
	s.Done()

	srv := f.LockServers[2]
	minorityFault(t, f, load, "Redlock: one of 3 lock servers SIGSTOPped 2.5s under load", "stopped",
		2500*time.Millisecond, srv.Pause, func() error { srv.Resume(); return nil })
	srv = f.LockServers[1]
	minorityFault(t, f, load, "Redlock: a lock server SIGKILLed and restarted (appendfsync always) under load", "down",
		time.Second, srv.Kill, srv.Restart)
}

// minorityFault runs the load while one lock server is out (from fault to
// heal, for d): the quorum of the others keeps granting, counted.
func minorityFault(t *testing.T, f *Fleet, load LoadConfig, name, state string, d time.Duration, fault func(), heal func() error) {
	ctx := t.Context()
	s := f.Scenario(t, rep, name)
	l := f.StartLoad(ctx, load)
	hold(ctx, 500*time.Millisecond)
	before := l.acked.Load()
	fault()
	hold(ctx, d)
	during := l.acked.Load() - before
	if err := heal(); err != nil {
		t.Fatal(err)
	}
	hold(ctx, time.Second)
	l.Stop()
	if during == 0 {
		s.Count("no edit answered 200 while a minority of lock servers was "+state, 1, nil)
	}
	s.Figure("edits answered 200 while the server was "+state, fmt.Sprint(during))
	s.CheckEdits(ctx, nil)
	s.CheckReads(readIssues, false)
	s.CheckProcs(nil)
	s.Done()
}
