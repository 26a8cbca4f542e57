package fleet

import (
	"sync"
	"testing"
)

// TestFleetConcurrent runs the scenarios that count outcomes rather than
// time at once, each on a fleet of its own: most of their wall time is spent
// waiting out pauses and outages, so running them one after another would
// triple the suite's time for little CPU. (t.Run from several goroutines;
// -parallel would limit them to GOMAXPROCS.) The wake-up probes, which
// measure time, run in TestFleetRedisFaults and TestFleetCluster, alone
// (and after the 30s outage, when the others are done).
func TestFleetConcurrent(t *testing.T) {
	var wg sync.WaitGroup
	for _, sc := range []struct {
		name string
		run  func(*testing.T)
	}{
		{"pauses/sqlite", func(t *testing.T) { testPauses(t, "sqlite") }},
		{"pauses/postgres", func(t *testing.T) { testPauses(t, "postgres") }},
		{"save-pauses/sqlite", func(t *testing.T) { testSavePauses(t, "sqlite") }},
		{"save-pauses/postgres", func(t *testing.T) { testSavePauses(t, "postgres") }},
		{"controls", testControls},
		{"edge", testEdge},
		{"rolling-restart", testRollingRestart},
		{"redlock", testRedlock},
		{"invalidation-pending", testInvalidationPending},
		// Mostly waiting for Redis to come back; its wake-up probes run
		// after the others have finished.
		{"redis-outage-30s", testOutage30s},
	} {
		wg.Go(func() { t.Run(sc.name, sc.run) })
	}
	wg.Wait()
}
