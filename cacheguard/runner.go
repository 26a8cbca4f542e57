package cacheguard

import (
	"sync"
	"time"
)

// runner runs functions on goroutines it keeps for a while, for the reads
// of Get: a read runs off the caller's goroutine (so that the caller can
// stop waiting at its budget), and the call path into go-redis needs a
// deeper stack than a new goroutine starts with — a goroutine per read would
// copy its stack on every hit. A worker that finds no work for workerIdle
// exits; close stops them all and waits. The zero value is not usable: see
// newRunner.
type runner struct {
	jobs chan func() // unbuffered: a send succeeds only when a worker is idle
	quit chan struct{}

	mu     sync.Mutex // guards closed
	closed bool
	wg     sync.WaitGroup // the workers
}

// workerIdle is how long an idle worker waits for work before it exits.
const workerIdle = 10 * time.Second

func newRunner() *runner {
	return &runner{jobs: make(chan func()), quit: make(chan struct{})}
}

// run runs f on an idle worker, or a new one; false after close.
func (r *runner) run(f func()) bool {
	select {
	case r.jobs <- f:
		return true
	default:
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return false
	}
	r.wg.Add(1)
	go r.work(f)
	return true
}

func (r *runner) work(f func()) {
	defer r.wg.Done()
	idle := time.NewTimer(workerIdle)
	defer idle.Stop()
	for {
		f()
		idle.Reset(workerIdle)
		select {
		case f = <-r.jobs:
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
