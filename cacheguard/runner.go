package cacheguard

import (
	"sync"
	"time"
)

// runner runs reads on goroutines it keeps for a while: a read runs off the
// caller's goroutine (so that the caller can stop waiting at its budget), and
// the call path into go-redis needs a deeper stack than a new goroutine
// starts with — a goroutine per read would copy its stack on every hit. A
// worker that finds no work for workerIdle exits; close stops them all once
// they are idle, and waits.
type runner struct {
	do   func(*readWork)
	jobs chan *readWork // unbuffered: a send succeeds only when a worker is idle
	quit chan struct{}

	mu     sync.Mutex // guards closed
	closed bool
	wg     sync.WaitGroup // the workers
}

// workerIdle is how long an idle worker waits for work before it exits.
const workerIdle = 10 * time.Second

func newRunner(do func(*readWork)) *runner {
	return &runner{do: do, jobs: make(chan *readWork), quit: make(chan struct{})}
}

// run runs w on an idle worker, or a new one (after close, on a goroutine of
// its own: the reads that close waits for are still run).
func (r *runner) run(w *readWork) {
	select {
	case r.jobs <- w:
		return
	default:
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		go r.do(w)
		return
	}
	r.wg.Add(1)
	go r.work(w)
}

func (r *runner) work(w *readWork) {
	defer r.wg.Done()
	idle := time.NewTimer(workerIdle)
	defer idle.Stop()
	for {
		r.do(w)
		idle.Reset(workerIdle)
		select {
		case w = <-r.jobs:
		case <-idle.C:
			return
		case <-r.quit:
			return
		}
	}
}

// close stops the workers once they finish what they run, and waits.
func (r *runner) close() {
	r.mu.Lock()
	if !r.closed {
		r.closed = true
		close(r.quit)
	}
	r.mu.Unlock()
	r.wg.Wait()
}
