package locks

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
)

// life is the closing of a Client or a Redlock, shared by both.
//
// Close and Shutdown first refuse new acquisitions (ErrClosed) and end every
// waiting Lock at once: its place in the lock's queue is withdrawn (a
// hand-off that reached it meanwhile is handed on), so a release goes to
// another process at once instead of to a closed waiter. A grant that comes
// back while closing (an attempt already on the wire) is given back, and its
// call fails with ErrClosed. Once every acquisition in progress has returned,
// Shutdown waits, until its context ends, for the locks still held: they stay
// renewed while the application finishes with them (a nested acquisition of a
// scope still held re-enters, see WithOwner), and releases and other
// clean-ups still queued are sent. Close does not wait. What is still held
// at the end is dropped: renewal stops, Lost closes with ErrClosed (the
// observer sees a Lost event for each), and the keys expire with their lease,
// or when their Unlock is called, whichever comes first — Shutdown returns
// those locks' names in an error matching ErrStillHeld.
// Finally the background work stops and every goroutine started has ended.
type life struct {
	closed atomic.Bool  // Close or Shutdown began: no new acquisitions
	calls  sync.RWMutex // held for reading by every acquisition in progress

	once        sync.Once
	closing     context.Context // cancelled when closing begins: ends waiting calls
	stopWaiting context.CancelFunc
	hurry       context.Context // cancelled by Close: ends a Shutdown's grace period
	hurryUp     context.CancelFunc
	shut        chan struct{} // closed when closing has finished
	passed      chan struct{} // closed when closing's barrier has passed
}

func (l *life) init() {
	l.once.Do(func() {
		l.closing, l.stopWaiting = context.WithCancel(context.Background())
		l.hurry, l.hurryUp = context.WithCancel(context.Background())
		l.shut = make(chan struct{})
		l.passed = make(chan struct{})
	})
}

// enter starts an acquisition, which checks closed itself (a nested
// acquisition of a scope still held may go on while closing); leave must
// follow when it reports true. While Close waits for the acquisitions in
// progress (its barrier), a new one that could not go on anyway (owned
// reports whether it acquires for an owner, which may nest) is refused at
// once — enter reports false — instead of waiting behind the barrier for as
// long as they take; one that may nest waits for the barrier to pass, or
// for ctx to end (false).
func (l *life) enter(ctx context.Context, owned bool) bool {
	if l.calls.TryRLock() {
		return true
	}
	if !owned && l.closed.Load() { // a writer waits or holds: the barrier
		return false
	}
	select {
	case <-l.passed:
	case <-ctx.Done():
		return false
	}
	l.calls.RLock()
	return true
}

func (l *life) leave() { l.calls.RUnlock() }

// waitFor returns a context that ends with ctx or when closing begins, for a
// wait; stop releases it.
func (l *life) waitFor(ctx context.Context) (context.Context, func()) {
	wctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(l.closing, cancel)
	return wctx, func() {
		stop()
		cancel()
	}
}

// backCtx is what a wait's clean-up is sent under, wctx being the wait's
// context (see waitFor) and ctx its caller's: once closing began, the
// caller's own, so that a wait Close ended withdraws from the lock's queue
// before its caller returns, within the caller's deadline; else wctx.
func (l *life) backCtx(ctx, wctx context.Context) context.Context {
	if l.closed.Load() {
		return ctx
	}
	return wctx
}

// cause is why a wait under ctx ended: the caller's context, the closing, or
// (nil) the wait budget.
func (l *life) cause(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if l.closed.Load() {
		return ErrClosed
	}
	return nil
}

// shutdown runs the closing. waitHeld waits (until its ctx ends) until no
// lock is held and returns the names of those still held; drain sends the
// clean-ups still queued (until its ctx ends); finish stops the background
// work. A second call waits for the first to finish (cutting its grace
// period short when ctx ends first).
func (l *life) shutdown(ctx context.Context, waitHeld func(context.Context) []string, drain func(context.Context), finish func()) error {
	l.init()
	if l.closed.Swap(true) {
		select {
		case <-l.shut:
		case <-ctx.Done():
			l.hurryUp()
			<-l.shut
		}
		return nil
	}
	defer close(l.shut)
	l.stopWaiting()
	l.calls.Lock() // a barrier: it returns once every acquisition in progress has returned
	//lint:ignore SA2001 the empty critical section is the barrier
	l.calls.Unlock()
	close(l.passed)
	gctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(l.hurry, cancel)
	defer stop()
	held := waitHeld(gctx)
	drain(gctx)
	finish()
	if len(held) == 0 {
		return nil
	}
	sort.Strings(held)
	return fmt.Errorf("%w: %q: %w", ErrStillHeld, held, context.Cause(gctx))
}

// lateWork runs work detached from its callers' deadlines (a grant that must
// be answered or undone, a give-back past its caller's context) on goroutines
// the Client owns: Shutdown waits for them before it closes the batcher, and
// takes no more from then on.
type lateWork struct {
	mu   sync.Mutex // guards done, and orders Go before wait's Wait
	done bool
	wg   sync.WaitGroup
}

// Go runs f on a goroutine Shutdown waits for; false, without running it,
// once Shutdown has begun to wait.
func (l *lateWork) Go(f func()) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.done {
		return false
	}
	l.wg.Go(f)
	return true
}

// wait takes no more work and waits for what runs.
func (l *lateWork) wait() {
	l.mu.Lock()
	l.done = true
	l.mu.Unlock()
	l.wg.Wait()
}
