package fleet

import "sync"

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

func (r *Recorder) addRead(op ReadOp, k seenKey) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.reads = append(r.reads, op)
	if op.Status != 200 || op.Err != nil {
		return
	}
	if op.Version < op.Acked {
		r.stale = append(r.stale, op)
	}
	if op.Version < op.Seen {
		r.backwards = append(r.backwards, op)
	}
	if op.Version > r.seen[k] {
		r.seen[k] = op.Version
	}
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

// violations returns the stale and backwards reads of scenario.
func (r *Recorder) violations(scenario string) (stale, backwards []ReadOp) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, op := range r.stale {
		if op.Scenario == scenario {
			stale = append(stale, op)
		}
	}
	for _, op := range r.backwards {
		if op.Scenario == scenario {
			backwards = append(backwards, op)
		}
	}
	return stale, backwards
}
