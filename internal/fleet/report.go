package fleet

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"testing"
	"text/tabwriter"
	"time"
)

// Kind says how a row of the table is judged.
type Kind int

const (
	// Invariant rows must count 0, unless the defect behind them is listed
	// in the report's expected failures.
	Invariant Kind = iota
	// Control rows are negative controls: they must count more than 0 (the
	// suite bites when the protection is off).
	Control
	// Limitation rows count something documented as not guaranteed; they
	// never fail.
	Limitation
	// Figure rows carry a measurement (recovery times, loads, latencies).
	Figure
)

// Row is one line of the final table: scenario × invariant × count.
type Row struct {
	Scenario string
	Name     string
	Kind     Kind
	N        int
	Value    string   // for a Figure
	Issues   []string // issue items ("15.A1") whose defect makes N > 0; "doc:why" for a documented limitation
	History  []string // what shows it, for a violation
	Verdict  string
}

// Report collects the rows of every scenario of a run.
type Report struct {
	Seed int64
	// ExpectFail lists the issue items whose fixes have not landed yet: a
	// row caused by one of them reports its count without failing the run.
	// The lead empties it as fixes merge.
	ExpectFail map[string]string

	mu   sync.Mutex // guards rows
	rows []Row
}

// Scenario is one named scenario of a run: what it counts goes to the report.
type Scenario struct {
	Name  string
	F     *Fleet
	t     testing.TB
	rep   *Report
	rows  []Row
	start time.Time // when it began
}

// Scenario starts a scenario: the edits and reads that follow are labelled
// with its name.
func (f *Fleet) Scenario(t testing.TB, rep *Report, name string) *Scenario {
	f.Rec.Begin(name)
	return &Scenario{Name: name, F: f, t: t, rep: rep, start: time.Now()}
}

// Count adds an invariant's count; issues name the issue items whose defect it reproduces.
func (s *Scenario) Count(name string, n int, issues []string, history ...string) {
	s.rows = append(s.rows, Row{Scenario: s.Name, Name: name, Kind: Invariant, N: n, Issues: issues, History: history})
}

// Control adds a negative control's count, which must be above 0.
func (s *Scenario) Control(name string, n int, history ...string) {
	s.rows = append(s.rows, Row{Scenario: s.Name, Name: name, Kind: Control, N: n, History: history})
}

// Limitation adds a count of something documented as not guaranteed.
func (s *Scenario) Limitation(name string, n int, why string) {
	s.rows = append(s.rows, Row{Scenario: s.Name, Name: name + " (" + why + ")", Kind: Limitation, N: n})
}

// Figure adds a measurement.
func (s *Scenario) Figure(name, value string) {
	s.rows = append(s.rows, Row{Scenario: s.Name, Name: name, Kind: Figure, Value: value})
}

// FigureDuration adds a duration, rounded for the table.
func (s *Scenario) FigureDuration(name string, d time.Duration) {
	s.Figure(name, round(d).String())
}

// Done judges the scenario's rows, reports violations on t (with the seed and
// the history that shows each), and adds the rows to the report.
func (s *Scenario) Done() {
	s.t.Helper()
	for i := range s.rows {
		r := &s.rows[i]
		r.Verdict = s.rep.judge(*r)
		switch {
		case strings.HasPrefix(r.Verdict, "VIOLATION"), strings.HasPrefix(r.Verdict, "CONTROL"):
			s.t.Errorf("%s: %s = %d: %s (seed %d)%s", r.Scenario, r.Name, r.N, r.Verdict, s.rep.Seed, history(r.History))
			s.F.logFaults(s.t)
		case r.N > 0 && r.Kind == Invariant:
			s.t.Logf("%s: %s = %d: %s%s", r.Scenario, r.Name, r.N, r.Verdict, history(r.History))
		}
	}
	s.rep.mu.Lock()
	s.rep.rows = append(s.rep.rows, s.rows...)
	s.rep.mu.Unlock()
}

func history(h []string) string {
	if len(h) == 0 {
		return ""
	}
	const most = 12
	if len(h) > most {
		h = append(slices.Clone(h[:most]), fmt.Sprintf("... and %d more", len(h)-most))
	}
	return "\n\t" + strings.Join(h, "\n\t")
}

// judge returns the verdict of a row.
func (rep *Report) judge(r Row) string {
	switch r.Kind {
	case Figure:
		return ""
	case Limitation:
		return "documented"
	case Control:
		if r.N > 0 {
			return "control bites"
		}
		return "CONTROL DID NOT BITE"
	}
	var expected []string
	for _, is := range r.Issues {
		if why, ok := strings.CutPrefix(is, "doc:"); ok && r.N > 0 {
			return "documented: " + why
		}
		if _, ok := rep.ExpectFail[is]; ok {
			expected = append(expected, is)
		}
	}
	switch {
	case r.N == 0 && len(expected) > 0:
		return "ok (expected to fail until " + strings.Join(expected, ", ") + ": remove from expectFail once fixed)"
	case r.N == 0:
		return "ok"
	case len(expected) > 0:
		return "expected: issue " + strings.Join(expected, ", ")
	default:
		return "VIOLATION"
	}
}

// Print writes the table: scenario × invariant × count, then the issue items
// reproduced.
func (rep *Report) Print(w io.Writer) {
	rep.mu.Lock()
	rows := slices.Clone(rep.rows)
	rep.mu.Unlock()
	if len(rows) == 0 {
		return
	}
	fmt.Fprintf(w, "\nfleet: end-to-end table (seed %d)\n", rep.Seed)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "scenario\tinvariant / figure\tcount\tverdict")
	reproduced := map[string]int{}
	for _, r := range rows {
		v := fmt.Sprint(r.N)
		if r.Kind == Figure {
			v = r.Value
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", r.Scenario, r.Name, v, r.Verdict)
		if r.Kind == Invariant && r.N > 0 {
			for _, is := range r.Issues {
				if !strings.HasPrefix(is, "doc:") {
					reproduced[is] += r.N
				}
			}
		}
	}
	tw.Flush()
	if len(reproduced) > 0 {
		var items []string
		for is, n := range reproduced {
			items = append(items, fmt.Sprintf("%s (%d)", is, n))
		}
		slices.Sort(items)
		fmt.Fprintf(w, "issue items reproduced: %s\n", strings.Join(items, ", "))
	}
	var now []string
	for is := range rep.ExpectFail {
		if reproduced[is] == 0 {
			now = append(now, is)
		}
	}
	if len(now) > 0 {
		slices.Sort(now)
		fmt.Fprintf(w, "expected to fail but not reproduced in this run: %s\n", strings.Join(now, ", "))
	}
}

// round keeps durations short in the table.
func round(d time.Duration) time.Duration {
	switch {
	case d >= time.Second:
		return d.Round(10 * time.Millisecond)
	case d >= 10*time.Millisecond:
		return d.Round(time.Millisecond)
	default:
		return d.Round(100 * time.Microsecond)
	}
}

// logFaults logs the faults injected so far, with their times.
func (f *Fleet) logFaults(t testing.TB) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var b strings.Builder
	for _, e := range f.faults {
		fmt.Fprintf(&b, "\n\t%s..%s %s", clock(e.start), clock(e.end), e.what)
	}
	if b.Len() > 0 {
		t.Logf("faults injected:%s", b.String())
	}
}
