package fleet

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"time"
)

// The invariants, as the table names them.
const (
	InvLost         = "lost updates (answered 200, missing from the row)"
	InvDupVersion   = "duplicate versions (two 200s with one version)"
	InvRefused      = "refused edits applied (409/423/503, yet in the row)"
	InvStatus       = "undocumented statuses (not 200/409/423/503)"
	InvNoAnswer     = "edits without an answer (process not killed)"
	InvOverlap      = "overlapping critical sections (neither told its lock was lost)"
	InvRow          = "row integrity (version = edits applied, each once)"
	InvStaleGet     = "stale reads, Get route (older than an acknowledged write)"
	InvStaleCache   = "stale reads, ginmw.Cache route"
	InvBackwards    = "reads going backwards in one process"
	InvReadErrors   = "failed reads (not 200)"
	InvCrash        = "process crashes (panic, data race, unexpected exit)"
	InvLoads        = "loads per cold key above 1"
	InvKilledEdit   = "edits of a SIGKILLed holder applied"
	InvEdge5xx      = "5xx or no answer at the HTTP edge"
	InvKeysLeft     = "Redis keys left by bad requests"
	InvSlowWake     = "wake-ups slower than before the fault (fastest of 3 probes)"
	InvRestartError = "requests failed by another process's shutdown"
	InvSilentStale  = "edits answered 200 with their invalidation failed, not saying so"
	InvBreaker      = "Redis breakers opened with Redis answering (a process's own pause)"
)

// documented is the set of statuses an edit may be answered with.
var documented = []int{http.StatusOK, http.StatusConflict, http.StatusLocked, http.StatusServiceUnavailable}

// Issues maps an invariant to the issue items whose defect would make it count.
type Issues map[string][]string

// editInvariants is the order CheckEdits reports in.
var editInvariants = []string{InvLost, InvRefused, InvStatus, InvNoAnswer, InvDupVersion, InvOverlap, InvRow}

// CheckEdits counts the edit invariants of the scenario against the rows as
// they are now in the database.
func (s *Scenario) CheckEdits(ctx context.Context, issues Issues) {
	s.t.Helper()
	v := s.EditViolations(ctx)
	for _, inv := range editInvariants {
		s.Count(inv, len(v[inv]), issues[inv], v[inv]...)
	}
}

// EditViolations returns, for each edit invariant, the history lines of the
// scenario's edits that break it.
func (s *Scenario) EditViolations(ctx context.Context) map[string][]string {
	s.t.Helper()
	rows, err := s.F.Rows(ctx)
	if err != nil {
		s.t.Fatalf("read the rows: %v", err)
	}
	mine := s.F.Rec.Edits(s.Name)
	all := s.F.Rec.Edits("")
	inRow := func(e EditOp) bool { return slices.Contains(rows[e.Repo].Settings.Edits, e.ID) }
	v := map[string][]string{}

	touched := map[uint]bool{}
	for _, e := range mine {
		touched[e.Repo] = true
		switch {
		case e.Err != nil:
			if !s.F.procs[e.Proc].killedDuring(e.Start, e.End) {
				v[InvNoAnswer] = append(v[InvNoAnswer], e.String())
			}
		case e.Status == http.StatusOK:
			if !inRow(e) {
				v[InvLost] = append(v[InvLost], e.String()+fmt.Sprintf(" — row %d now v%d", e.Repo, rows[e.Repo].Version))
			}
		case !slices.Contains(documented, e.Status):
			v[InvStatus] = append(v[InvStatus], e.String())
		}
		if e.Err == nil && e.Status != http.StatusOK && slices.Contains(documented, e.Status) && inRow(e) {
			v[InvRefused] = append(v[InvRefused], e.String())
		}
	}

	// Duplicate versions: two acknowledged edits of one repository that
	// wrote the same version, at least one of them in this scenario.
	byVersion := map[[2]int][]EditOp{}
	for _, e := range all {
		if e.Err == nil && e.Status == http.StatusOK {
			k := [2]int{int(e.Repo), e.Version}
			byVersion[k] = append(byVersion[k], e)
		}
	}
	for _, es := range byVersion {
		if len(es) > 1 && slices.ContainsFunc(es, func(e EditOp) bool { return e.Scenario == s.Name }) {
			for _, e := range es[1:] {
				v[InvDupVersion] = append(v[InvDupVersion], e.String()+" and "+es[0].String())
			}
		}
	}

	v[InvOverlap] = s.overlaps(all)

	for id := range touched {
		r := rows[id]
		seen := map[string]bool{}
		for _, e := range r.Settings.Edits {
			if seen[e] {
				v[InvRow] = append(v[InvRow], fmt.Sprintf("row %d holds edit %s twice", id, e))
			}
			seen[e] = true
		}
		if r.Version != len(r.Settings.Edits) {
			v[InvRow] = append(v[InvRow], fmt.Sprintf("row %d: version %d but %d edits", id, r.Version, len(r.Settings.Edits)))
		}
	}
	return v
}

// overlaps returns the pairs of edits of one repository whose critical
// sections, as their processes reported them, overlap while neither process
// was stopped and neither had been told its lock was lost — at least one of
// them in this scenario.
func (s *Scenario) overlaps(all []EditOp) []string {
	byRepo := map[uint][]EditOp{}
	for _, e := range all {
		if e.Span.from == 0 {
			continue
		}
		if s.F.procs[e.Proc].wasStopped(interval{e.Span.from, e.End.UnixNano()}) {
			continue // a stopped holder overlaps by design: fencing handles it
		}
		byRepo[e.Repo] = append(byRepo[e.Repo], e)
	}
	var out []string
	for _, es := range byRepo {
		slices.SortFunc(es, func(a, b EditOp) int { return int(a.Span.from - b.Span.from) })
		for i, a := range es {
			for _, b := range es[i+1:] {
				if b.Span.from >= a.Span.to {
					break
				}
				if a.Scenario == s.Name || b.Scenario == s.Name {
					out = append(out, fmt.Sprintf("%s [%s] overlaps %s [%s]", a, spanString(a), b, spanString(b)))
				}
			}
		}
	}
	return out
}

func spanString(e EditOp) string {
	s := fmt.Sprintf("in %s..%s", clock(time.Unix(0, e.Span.from)), clock(time.Unix(0, e.Span.to)))
	if e.Lost != 0 {
		s += ", lost at " + clock(time.Unix(0, e.Lost))
	}
	return s
}

// CheckReads counts the read invariants of the scenario: stale reads by
// route, reads going backwards in a process, and failed reads (which only
// count where the scenario says reads must not fail: allowFail false).
func (s *Scenario) CheckReads(issues Issues, allowFail bool) {
	stale, backwards, excused := s.F.Rec.violations(s.Name)
	var get, cache, back, failed []string
	for _, op := range stale {
		if op.Route == RouteGet {
			get = append(get, op.String())
		} else {
			cache = append(cache, op.String())
		}
	}
	for _, op := range backwards {
		back = append(back, op.String())
	}
	reads := s.F.Rec.Reads(s.Name)
	var slowest time.Duration
	for _, op := range reads {
		if op.PausedAt == "" {
			slowest = max(slowest, op.End.Sub(op.Start))
		}
		if (op.Err != nil || op.Status != http.StatusOK) && !s.F.procs[op.Proc].killedDuring(op.Start, op.End) {
			failed = append(failed, op.String())
		}
	}
	s.Count(InvStaleGet, len(get), issues[InvStaleGet], get...)
	s.Count(InvStaleCache, len(cache), issues[InvStaleCache], cache...)
	s.Count(InvBackwards, len(back), issues[InvBackwards], back...)
	if len(excused) > 0 {
		s.Limitation("stale or backwards reads", len(excused), "older only by edits answered with their invalidation pending: gormplugin retries it in the background")
	}
	if allowFail {
		s.Limitation("failed reads", len(failed), "a fault is on: 503 is documented")
	} else {
		s.Count(InvReadErrors, len(failed), issues[InvReadErrors], failed...)
	}
	s.Figure("reads", fmt.Sprint(len(reads)))
	s.FigureDuration("slowest read (not paused)", slowest)
}

// CheckProcs counts crashes: panics or data races on stderr, and processes
// that exited without being told to.
func (s *Scenario) CheckProcs(issues Issues) {
	var crashes []string
	for _, p := range s.F.procs {
		n := p.Panics()
		p.mu.Lock()
		n -= p.panicsSeen
		p.panicsSeen += n
		p.mu.Unlock()
		if n > 0 {
			crashes = append(crashes, fmt.Sprintf("process %d: %d panics or races; stderr:\n%s", p.Index, n, p.Stderr()))
		}
		if p.Exited() && !p.down() {
			crashes = append(crashes, fmt.Sprintf("process %d exited unexpectedly; stderr:\n%s", p.Index, p.Stderr()))
		}
	}
	s.Count(InvCrash, len(crashes), issues[InvCrash], crashes...)
}

// CheckBreakers counts the processes whose Redis breaker opened since the
// scenario began: in a scenario whose faults stop or kill processes, never
// Redis, a breaker that opened did so on a healthy Redis (a process that
// resumes finds its commands past their deadlines, the answers unread in
// its sockets: locks.Breaker must not take that for a stall).
func (s *Scenario) CheckBreakers(ctx context.Context) {
	var opened []string
	for i := range s.F.Procs() {
		o, _, err := s.F.breaker(ctx, i)
		switch {
		case errors.Is(err, errNoProc):
		case err != nil:
			opened = append(opened, fmt.Sprintf("p%d: stats: %v", i, err))
		case !o.Before(s.start):
			opened = append(opened, fmt.Sprintf("p%d: breaker opened %v into the scenario", i, o.Sub(s.start).Round(time.Millisecond)))
		}
	}
	s.Count(InvBreaker, len(opened), nil, opened...)
}

// errNoProc: the process is not running.
var errNoProc = errors.New("fleet: process not running")

// breaker returns when process i's Redis breaker last opened and closed
// (the Unix epoch when never), from its /stats.
func (f *Fleet) breaker(ctx context.Context, i int) (opened, closed time.Time, err error) {
	u := f.Proc(i).URL()
	if u == "" {
		return opened, closed, errNoProc
	}
	var st struct {
		Opened int64 `json:"breaker_opened_ms"`
		Closed int64 `json:"breaker_closed_ms"`
	}
	if err := f.getJSON(ctx, u+"/stats", &st); err != nil {
		return opened, closed, err
	}
	return time.UnixMilli(st.Opened), time.UnixMilli(st.Closed), nil
}
