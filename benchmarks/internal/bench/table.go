package bench

import (
	"fmt"
	"math"
	"strings"

	"github.com/cacheguard/cacheguard/benchmarks/internal/stats"
)

// Metric is one column of a table.
type Metric struct {
	Key  string // used in code
	Head string // column heading, with its unit
	Fmt  string // fmt verb for one value, e.g. "%.0f"
}

// Row is one system's measurements: one value per repetition per metric.
type Row struct {
	System string
	Skip   string // why the row has no data (e.g. not merged yet)
	Errs   []string
	vals   map[string][]float64
}

func (r *Row) add(key string, v float64) {
	if r.vals == nil {
		r.vals = map[string][]float64{}
	}
	r.vals[key] = append(r.vals[key], v)
}

// Summary returns the median and range of metric key over repetitions.
func (r *Row) Summary(key string) (stats.Summary, bool) {
	xs := r.vals[key]
	if len(xs) == 0 {
		return stats.Summary{}, false
	}
	return stats.Summarise(xs), true
}

// Table is one scenario's results.
type Table struct {
	ID, Title, Intro string
	Metrics          []Metric
	Rows             []*Row
	X                []float64 // a sweep's x value for each metric, for its chart
}

// Row returns the row of system, adding it.
func (t *Table) Row(system string) *Row {
	for _, r := range t.Rows {
		if r.System == system {
			return r
		}
	}
	r := &Row{System: system}
	t.Rows = append(t.Rows, r)
	return r
}

// Median returns the median of metric key for system.
func (t *Table) Median(system, key string) (float64, bool) {
	for _, r := range t.Rows {
		if r.System == system {
			s, ok := r.Summary(key)
			return s.Median, ok
		}
	}
	return math.NaN(), false
}

func cell(f string, s stats.Summary) string {
	v := func(x float64) string { return fmt.Sprintf(f, x) }
	if s.N <= 1 || v(s.Min) == v(s.Max) {
		return v(s.Median)
	}
	return fmt.Sprintf("%s (%s–%s)", v(s.Median), v(s.Min), v(s.Max))
}

// Markdown renders the table: medians over repetitions with min–max.
func (t *Table) Markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "### %s\n\n", t.Title)
	if t.Intro != "" {
		b.WriteString(t.Intro + "\n\n")
	}
	b.WriteString("| system |")
	for _, m := range t.Metrics {
		b.WriteString(" " + m.Head + " |")
	}
	b.WriteString("\n|---|")
	for range t.Metrics {
		b.WriteString("---:|")
	}
	b.WriteString("\n")
	var notes []string
	for _, r := range t.Rows {
		b.WriteString("| " + r.System + " |")
		if r.Skip != "" {
			for i := range t.Metrics {
				if i == 0 {
					b.WriteString(" " + r.Skip + " |")
				} else {
					b.WriteString(" |")
				}
			}
			b.WriteString("\n")
			continue
		}
		for _, m := range t.Metrics {
			s, ok := r.Summary(m.Key)
			if !ok {
				b.WriteString(" – |")
				continue
			}
			b.WriteString(" " + cell(m.Fmt, s) + " |")
		}
		b.WriteString("\n")
		if len(r.Errs) > 0 {
			notes = append(notes, fmt.Sprintf("%s: %d failed run(s), first: %s", r.System, len(r.Errs), r.Errs[0]))
		}
	}
	for _, n := range notes {
		b.WriteString("\n> " + n + "\n")
	}
	b.WriteString("\n")
	return b.String()
}
