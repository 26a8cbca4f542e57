package reliability

import (
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"
)

// ReportEnv names the environment variable with the path of a Markdown file to
// which every scenario appends one table row.
const ReportEnv = "RELIABILITY_REPORT"

// Figures are one scenario's results.
type Figures struct {
	Scenario  string
	Attempted int // operations attempted (acquisitions, writes, loads)
	Succeeded int
	Refused   int // refused by design (held by another, stale token)
	Unknown   int // timed out or failed in transit: outcome unknown
	// Violations counts broken guarantees: models porcupine found illegal,
	// overlapping holders, fences out of order, stale writes applied.
	Violations int
	// Expect says what Violations must be: "0", or for a control, why it
	// must not be 0 (the limitation it reproduces).
	Expect string
	// Recovery is how long service took to come back after the fault healed
	// (negative when not measured).
	Recovery time.Duration
	Note     string
}

var reportMu sync.Mutex // serialises appends to the report file

// Header is the table's header, as written at the top of a new report file.
const Header = "| scenario | attempted | succeeded | refused | unknown | violations | expected | recovery | note |\n|---|---:|---:|---:|---:|---:|---|---:|---|\n"

// Report logs f as one line and, when RELIABILITY_REPORT is set, appends it as
// a table row (writing the header first to a new file).
func (f Figures) Report(tb testing.TB) {
	tb.Helper()
	rec := "-"
	if f.Recovery >= 0 {
		rec = f.Recovery.Round(time.Millisecond).String()
	}
	if f.Expect == "" {
		f.Expect = "0"
	}
	tb.Logf("figures: %s: attempted=%d succeeded=%d refused=%d unknown=%d violations=%d (expected %s) recovery=%s %s",
		f.Scenario, f.Attempted, f.Succeeded, f.Refused, f.Unknown, f.Violations, f.Expect, rec, f.Note)
	path := os.Getenv(ReportEnv)
	if path == "" {
		return
	}
	esc := strings.NewReplacer("|", `\|`, "\n", " ").Replace
	row := fmt.Sprintf("| %s | %d | %d | %d | %d | %d | %s | %s | %s |\n",
		esc(f.Scenario), f.Attempted, f.Succeeded, f.Refused, f.Unknown, f.Violations, esc(f.Expect), rec, esc(f.Note))
	reportMu.Lock()
	defer reportMu.Unlock()
	_, statErr := os.Stat(path)
	fh, err := os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		tb.Logf("report: %v", err)
		return
	}
	defer fh.Close()
	if os.IsNotExist(statErr) {
		fh.WriteString(Header)
	}
	fh.WriteString(row)
}
