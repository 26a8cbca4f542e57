package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"runtime/trace"
	"strings"
	"time"

	xtrace "golang.org/x/exp/trace"
)

// wakesIntro explains the tables' wake-up columns.
const wakesIntro = " *Goroutine wake-ups* and *hand-offs* per call come from a second run of " +
	"150ms under the Go execution tracer (the tracer slows calls, so it never runs during the timed run): " +
	"each time one of the process's goroutines was woken or started. A *hand-off* is one made by another goroutine " +
	"of the process (a channel send, a lock or WaitGroup released, a go statement): work passed between " +
	"goroutines, fixed by the code whatever the host. The other wake-ups are the runtime's: a reply found on a " +
	"socket by the network poller, a timer; a reply already there when the caller reads costs none, so their " +
	"number depends on how soon the server answers, and differs between hosts."

// wakeTraceFor is how long a Job.Wakes run lasts.
const wakeTraceFor = 150 * time.Millisecond

// wakes runs job again under the execution tracer (a Job.Wakes run of
// wakeTraceFor, after its timed run) and returns who woke its goroutines,
// per operation (see wakesPer).
func (e *env) wakes(ctx context.Context, job Job) (wake, hand float64, err error) {
	job.Wakes, job.Duration = true, wakeTraceFor
	reps, err := e.spares.run(ctx, []Job{job}, Hooks{})
	if err == nil {
		err = firstErr(reps)
	}
	if err != nil {
		return math.NaN(), math.NaN(), fmt.Errorf("wake-up trace: %w", err)
	}
	wake, hand = wakesPer(reps[0].Wakes)
	return wake, hand, nil
}

// wakes is who woke the process's goroutines during a traced run, counted
// from the Go runtime's execution trace: each time a goroutine went from
// waiting to runnable, or was started. Unlike context switches, which also
// count the runtime's own threads sleeping and waking (sysmon polls every
// 20 µs to 10 ms while the process runs, so a longer call costs more of
// them) and the host's preemptions, these are events of the program
// itself, the same on any host:
//
//   - byRuntime: woken by the runtime on no goroutine's behalf — a reply
//     arriving on a socket (the network poller), a timer;
//   - handOffs: woken, or started, by another goroutine of the process — a
//     channel send, a mutex or WaitGroup released, a go statement: work
//     passed from one goroutine to another.
//
// A call sent on its caller's goroutine costs one byRuntime wake-up per
// round trip whose reply was not already there, and no hand-off. The
// tracer's own goroutines are left out.
type wakes struct {
	ops, byRuntime, handOffs int64
}

// wakesPer returns the wake-ups and the hand-offs per operation of a
// traced run; NaN when the run was not traced.
func wakesPer(w *WakeCounts) (wake, hand float64) {
	if w == nil || w.Ops == 0 {
		return math.NaN(), math.NaN()
	}
	ops := float64(w.Ops)
	return float64(w.ByRuntime+w.HandOffs) / ops, float64(w.HandOffs) / ops
}

// traceWakes runs run (which returns how many operations it did) under the
// execution tracer and counts its wake-ups.
func traceWakes(run func() int64) (wakes, error) {
	var buf bytes.Buffer
	if err := trace.Start(&buf); err != nil {
		return wakes{}, err
	}
	ops := run()
	trace.Stop()
	w, err := countWakes(&buf)
	w.ops = ops
	return w, err
}

func countWakes(r io.Reader) (wakes, error) {
	var w wakes
	tr, err := xtrace.NewReader(r)
	if err != nil {
		return w, err
	}
	for {
		ev, err := tr.ReadEvent()
		if errors.Is(err, io.EOF) {
			return w, nil
		}
		if err != nil {
			return w, err
		}
		if ev.Kind() != xtrace.EventStateTransition {
			continue
		}
		st := ev.StateTransition()
		if st.Resource.Kind != xtrace.ResourceGoroutine {
			continue
		}
		from, to := st.Goroutine()
		if to != xtrace.GoRunnable || from != xtrace.GoWaiting && from != xtrace.GoNotExist {
			continue // a snapshot at the trace's start (GoUndetermined), a preemption, a syscall
		}
		by := ev.Goroutine()
		switch {
		case tracerOwn(ev.Stack()):
		case by == xtrace.NoGoroutine || by == st.Resource.Goroutine():
			w.byRuntime++
		default:
			w.handOffs++
		}
	}
}

// tracerOwn reports whether a wake-up was made by the tracer's own code.
func tracerOwn(s xtrace.Stack) bool {
	for f := range s.Frames() {
		if strings.HasPrefix(f.Func, "runtime/trace.") || strings.HasPrefix(f.Func, "runtime.traceAdvance") {
			return true
		}
	}
	return false
}
