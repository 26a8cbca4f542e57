package reliability

import (
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/cacheguard/cacheguard/internal/redistest"
	"github.com/cacheguard/cacheguard/locks"
)

// scale returns full, or short under -short.
func scale(full, short int) int {
	if testing.Short() {
		return short
	}
	return full
}

// TestReliabilityLinearizable: clients take one lock (TryLock and waiting
// Lock) and write a fenced register inside the critical section, while a
// straggler holds past its lease; porcupine finds both histories
// linearizable. The negative controls run the same workload on locks without
// NX or without the release's token check, and porcupine must call their lock
// histories Illegal (their register histories show it only when a preempted
// holder happens to write last, so that verdict is reported, not required).
func TestReliabilityLinearizable(t *testing.T) {
	noLeaks(t)
	lease := 300 * time.Millisecond
	srv := redistest.Start(t)
	res := redistest.Start(t) // the protected resource lives apart from the lock
	newWorkload := func(m mutex, key string) *workload {
		return &workload{mu: m, reg: Register{RDB: res.Client(), Key: key}, lease: lease,
			clients: 4, ops: scale(60, 25), straggles: scale(3, 2)}
	}

	t.Run("locks.Client", func(t *testing.T) {
		c := locks.New(srv.Client())
		t.Cleanup(func() { c.Close() })
		w := newWorkload(libMutex{c: c, name: "lin", lease: lease}, "reg:lin")
		f := verify(t, w.run(t, nil), porcupine.Ok, porcupine.Ok)
		f.Scenario = "no faults: locks.Client, 4 clients + straggler"
		f.Report(t)
		if f.Violations != 0 {
			t.Errorf("%d violations", f.Violations)
		}
	})
	t.Run("control/without-NX", func(t *testing.T) {
		w := newWorkload(brokenMutex{rdb: srv.Client(), name: "nonx", lease: lease, noNX: true}, "reg:nonx")
		f := verify(t, w.run(t, nil), porcupine.Illegal, anyVerdict)
		f.Scenario = "control: lock without NX"
		f.Expect = ">0: SET without NX grants a held lock"
		f.Report(t)
	})
	t.Run("control/without-token-check", func(t *testing.T) {
		w := newWorkload(brokenMutex{rdb: srv.Client(), name: "notok", lease: lease, noTokenCheck: true}, "reg:notok")
		f := verify(t, w.run(t, nil), porcupine.Illegal, anyVerdict)
		f.Scenario = "control: release without token check"
		f.Expect = ">0: a late release deletes the next holder's lock"
		f.Report(t)
	})
}
