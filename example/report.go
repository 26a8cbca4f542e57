package main

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"text/tabwriter"
	"time"
)

// report is what a demonstration measured.
type report struct {
	Guarded, Naive burstStats
	Edits          editStats
	Reads          readStats
}

// burstStats describes one burst of concurrent GETs at a cold key.
type burstStats struct {
	Requests int
	Failed   int           // not 200, or not the repository asked for
	Loads    int64         // database queries for the repository during the burst
	P50, P99 time.Duration // request latency
	Elapsed  time.Duration
}

// editStats describes the conflicting edits and what the database kept.
type editStats struct {
	Sent, Applied, Conflicts, Other int      // Other: neither 200 nor 409
	Lost                            int      // edits answered 200 that the final row does not hold
	Versions                        [2]int   // first and last version written by an applied edit
	MaxConcurrent                   int64    // the most edits ever inside their critical section at once
	FinalVersion                    int      // the row's version at the end
	Problems                        []string // broken invariants, if any
}

// readStats describes the reads made after the edits.
type readStats struct {
	Instances int // instances asked GET /repos/:id
	Fresh     int // of them, those serving the final version
	ListFresh bool
}

// ok reports whether the demonstration's invariants held.
func (r *report) ok() error {
	var errs []error
	if r.Guarded.Loads != 1 {
		errs = append(errs, fmt.Errorf("the guarded burst loaded the repository %d times, want 1", r.Guarded.Loads))
	}
	if r.Guarded.Failed > 0 || r.Naive.Failed > 0 {
		errs = append(errs, fmt.Errorf("%d guarded and %d unguarded reads failed", r.Guarded.Failed, r.Naive.Failed))
	}
	for _, p := range r.Edits.Problems {
		errs = append(errs, errors.New(p))
	}
	if r.Reads.Fresh != r.Reads.Instances || !r.Reads.ListFresh {
		errs = append(errs, fmt.Errorf("after the edits %d of %d instances (list: %v) served the final version",
			r.Reads.Fresh, r.Reads.Instances, r.Reads.ListFresh))
	}
	return errors.Join(errs...)
}

// checkEdits compares the answers with the final row: every edit answered 200
// must be in the row, in the order of the versions they wrote, with fences
// increasing in that order; every other edit must have been answered 409.
func checkEdits(results []editResult, final Repo) editStats {
	s := editStats{Sent: len(results), FinalVersion: final.Version}
	problem := func(format string, a ...any) { s.Problems = append(s.Problems, fmt.Sprintf(format, a...)) }
	var applied []editResult
	for _, r := range results {
		switch {
		case r.Err != nil:
			s.Other++
			problem("%s failed: %v", r.ID, r.Err)
		case r.Status == http.StatusOK:
			applied = append(applied, r)
		case r.Status == http.StatusConflict:
			s.Conflicts++
		default:
			s.Other++
			problem("%s answered %d, want 200 or 409", r.ID, r.Status)
		}
	}
	s.Applied = len(applied)
	slices.SortFunc(applied, func(a, b editResult) int { return a.Repo.Version - b.Repo.Version })
	if len(applied) > 0 {
		s.Versions = [2]int{applied[0].Repo.Version, applied[len(applied)-1].Repo.Version}
	}
	in := make(map[string]bool, len(final.Settings.Edits))
	for _, id := range final.Settings.Edits {
		if in[id] {
			problem("%s applied twice", id)
		}
		in[id] = true
	}
	for i, r := range applied {
		if !in[r.ID] {
			s.Lost++
		}
		if r.Repo.Version != i+1 {
			problem("%s wrote version %d, want %d (versions must run 1, 2, 3...)", r.ID, r.Repo.Version, i+1)
		}
		if i > 0 && r.Repo.Fence <= applied[i-1].Repo.Fence {
			problem("%s wrote fence %d after %s wrote %d", r.ID, r.Repo.Fence, applied[i-1].ID, applied[i-1].Repo.Fence)
		}
		if i < len(final.Settings.Edits) && final.Settings.Edits[i] != r.ID {
			problem("the row's edit %d is %s, but %s wrote version %d", i+1, final.Settings.Edits[i], r.ID, r.Repo.Version)
		}
	}
	if s.Lost > 0 {
		problem("%d edits answered 200 are missing from the row (lost updates)", s.Lost)
	}
	if final.Version != len(applied) || len(final.Settings.Edits) != len(applied) {
		problem("the row holds version %d and %d edits, but %d edits were answered 200",
			final.Version, len(final.Settings.Edits), len(applied))
	}
	return s
}

// printReport prints the compact table.
func printReport(out io.Writer, cfg demoConfig, r *report) {
	tw := tabwriter.NewWriter(out, 0, 0, 3, ' ', 0)
	fmt.Fprintf(tw, "reads of a cold repository\tguarded (cacheguard.Get)\tunguarded (cache-aside)\n")
	fmt.Fprintf(tw, "  requests\t%d\t%d\n", r.Guarded.Requests, r.Naive.Requests)
	fmt.Fprintf(tw, "  database loads\t%d\t%d\n", r.Guarded.Loads, r.Naive.Loads)
	fmt.Fprintf(tw, "  p50 latency\t%v\t%v\n", round(r.Guarded.P50), round(r.Naive.P50))
	fmt.Fprintf(tw, "  p99 latency\t%v\t%v\n", round(r.Guarded.P99), round(r.Naive.P99))
	fmt.Fprintf(tw, "  failed\t%d\t%d\n", r.Guarded.Failed, r.Naive.Failed)
	tw.Flush()
	fmt.Fprintln(out)
	e := r.Edits
	tw = tabwriter.NewWriter(out, 0, 0, 3, ' ', 0)
	fmt.Fprintf(tw, "conflicting settings edits\t%d concurrent, lock wait budget %v\n", e.Sent, cfg.EditWait)
	applied := fmt.Sprint(e.Applied)
	switch {
	case len(e.Problems) > 0:
		applied += ", NOT one at a time in order (see below)"
	case e.Applied == 1:
		applied += " (version 1)"
	case e.Applied > 1:
		applied += fmt.Sprintf(", one at a time, in order (versions %d-%d, fences increasing)", e.Versions[0], e.Versions[1])
	}
	fmt.Fprintf(tw, "  edits serialised\t%s\n", applied)
	fmt.Fprintf(tw, "  conflicts answered 409\t%d\n", e.Conflicts)
	if e.Other > 0 {
		fmt.Fprintf(tw, "  other answers\t%d\n", e.Other)
	}
	fmt.Fprintf(tw, "  lost updates\t%d\n", e.Lost)
	list := "and in the cached list"
	if !r.Reads.ListFresh {
		list = "but not in the cached list"
	}
	fmt.Fprintf(tw, "  reads after the edits\tversion %d on %d of %d instances, %s\n",
		e.FinalVersion, r.Reads.Fresh, r.Reads.Instances, list)
	tw.Flush()
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

// percentile returns the p-th percentile of sorted (nearest rank).
func percentile(sorted []time.Duration, p int) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	rank := (len(sorted)*p + 99) / 100 // ceil(n·p/100)
	return sorted[max(rank, 1)-1]
}
