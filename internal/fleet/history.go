package fleet

import (
	"sync"
	"time"
)

// Recorder keeps every edit and read the driver made, labelled with the
// scenario running when it started, and checks reads as they complete.
type Recorder struct {
	mu        sync.Mutex // guards the fields below
	cur       string
	edits     []EditOp
	reads     []ReadOp
	acked     map[uint]int    // repo -> newest version acknowledged (200) so far
	seen      map[seenKey]int // newest version a process returned on a route
	stale     []ReadOp        // reads older than a version acknowledged before they started
	excused   []ReadOp        // stale or backwards reads older only by edits whose invalidation was pending (see pending)
	backwards []ReadOp        // reads older than one their process had returned before they started
}

type seenKey struct {
	proc, run int
	route     string
	repo      uint
}

func newRecorder() *Recorder {
	return &Recorder{acked: map[uint]int{}, seen: map[seenKey]int{}}
}

// Begin labels what follows with scenario.
func (r *Recorder) Begin(scenario string) {
	r.mu.Lock()
	r.cur = scenario
	r.mu.Unlock()
}

func (r *Recorder) scenario() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cur
}

func (r *Recorder) addEdit(op EditOp) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.edits = append(r.edits, op)
	if op.Status == 200 && op.Err == nil && op.Version > r.acked[op.Repo] {
		r.acked[op.Repo] = op.Version
	}
}

// readStart returns what a read of repo starting now must not go below.
func (r *Recorder) readStart(k seenKey) (acked, seen int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.acked[k.repo], r.seen[k]
}

// addRead records op and checks it; it returns op as checked (Excused).
func (r *Recorder) addRead(op ReadOp, k seenKey) ReadOp {
	r.mu.Lock()
	defer r.mu.Unlock()
	if op.Status != 200 || op.Err != nil {
		r.reads = append(r.reads, op)
		return op
	}
	if op.Version < op.Acked {
		if r.pending(op, op.Acked) {
			op.Excused = true
		} else {
			r.stale = append(r.stale, op)
		}
	}
	if op.Version < op.Seen {
		if r.pending(op, op.Seen) {
			op.Excused = true
		} else {
			r.backwards = append(r.backwards, op)
		}
	}
	if op.Excused {
		r.excused = append(r.excused, op)
	}
	if op.Version > r.seen[k] {
		r.seen[k] = op.Version
	}
	r.reads = append(r.reads, op)
	return op
}

// staleGrace is how long after an edit answered Stale a read may still
// return the value before it: gormplugin's background retries of the
// invalidation (8 attempts from 100 ms, backoff doubling to 5 s: about 16 s
// in all), with a margin.
const staleGrace = 20 * time.Second

// pending reports whether read op is older than version newer (the newest
// acknowledged, or the newest its process served: a fail-open load reads the
// database) only by edits of its repository answered 200 with their
// invalidation pending (EditOp.Stale), each within staleGrace before the
// read started. (Called under mu.)
func (r *Recorder) pending(op ReadOp, newer int) bool {
	n := 0
	for _, e := range r.edits {
		if e.Repo != op.Repo || e.Status != 200 || e.Err != nil || e.Version <= op.Version || e.Version > newer {
			continue
		}
		if !e.Stale || op.Start.Sub(e.End) > staleGrace {
			return false
		}
		n++
	}
	return n > 0
}

// Edits returns the edits recorded in scenario ("" for all).
func (r *Recorder) Edits(scenario string) []EditOp {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []EditOp
	for _, e := range r.edits {
		if scenario == "" || e.Scenario == scenario {
			out = append(out, e)
		}
	}
	return out
}

// Reads returns the reads recorded in scenario.
func (r *Recorder) Reads(scenario string) []ReadOp {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []ReadOp
	for _, op := range r.reads {
		if op.Scenario == scenario {
			out = append(out, op)
		}
	}
	return out
}

// violations returns the stale and backwards reads of scenario, and the
// stale reads a pending invalidation excuses.
func (r *Recorder) violations(scenario string) (stale, backwards, excused []ReadOp) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, op := range r.stale {
		if op.Scenario == scenario {
			stale = append(stale, op)
		}
	}
	for _, op := range r.excused {
		if op.Scenario == scenario {
			excused = append(excused, op)
		}
	}
	for _, op := range r.backwards {
		if op.Scenario == scenario {
			backwards = append(backwards, op)
		}
	}
	return stale, backwards, excused
}
