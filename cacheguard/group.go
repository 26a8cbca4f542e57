package cacheguard

import (
	"reflect"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// group is the coalescer of a Guard, for every kind of work it shares
// between the calls of its process: the reads of hits, the flights of misses
// and the loads run without the fill lease. A caller takes the result of a
// task of its key that it admits, or of a new one; at most limit pieces of
// work of a key run at once (0: no limit), and the callers that arrive beyond
// them share the next task, which the caller that ends one of them starts —
// so that a caller who admits only tasks not started yet shares only work
// begun after it arrived, and a burst of N callers costs limit+1 pieces of
// work, not N. A queued task whose callers all left is dropped.
type group[K comparable, T any] struct {
	limit int

	mu      sync.Mutex // guards m, closed, closedT, and every task's waiting and started
	m       map[K]line[K, T]
	closed  bool
	closedT T // what a queued task ends with after close
}

// line is the state of one key's tasks.
type line[K comparable, T any] struct {
	out     int           // pieces of work running
	running []*task[K, T] // the tasks running, kept without a limit only (the others admit none of them)
	next    *task[K, T]   // queued behind them
}

// task is one piece of shared work. Its caller (the leader, or whoever
// starts it) runs it and ends it with group.end; the others wait for done.
type task[K comparable, T any] struct {
	key     K
	run     func() T      // the work of a queued task
	done    chan struct{} // closed once res is set
	res     T
	waiting int  // callers waiting for it while it is queued
	started bool // set under the group's mu
	// Of waiting, the callers of a read already counted as a miss (see
	// Guard.answerMiss); set under the group's mu.
	precounted int

	// For flights (see flights.admit): its serial, the lowest generation of
	// anything it may return, and whether its first get-or-lease script
	// answered.
	typ     reflect.Type
	serial  uint64
	floor   atomic.Int64
	asked   chan struct{}
	askOnce sync.Once
	shut    atomic.Bool // takes no new callers
	nested  atomic.Bool // a loader's Get joined it: it loads without a slot (see loadSlots.promote)
	// elsewhere: its first script found the fill lease held by another
	// process, whose fill it follows (set before asked closes).
	elsewhere atomic.Bool
	// fill: whether calls may wait for its store without a read (see
	// call.awaitFill): storeOpen from its lease's grant for a miss until its
	// store is sent, storeNone before and after, storeStale for good once an
	// Invalidate of its key in this process returned or a renewal found its
	// lease lost (see flights.unfitLocked); unfit is closed then, when the
	// move was from storeOpen (under the flights' mu).
	fill    atomic.Int32
	unfit   chan struct{}
	unfitAt uint64 // the flights' serial when unfit closed
	// then runs as the task ends, under the group's mu: the reads chained
	// to a flight (see flights.chain).
	then []func()

	// For a read that found its entry absent (see Guard.endRead): the
	// flight its callers share, once it ended (a *task[entry, *outcome];
	// nil: none), set as done closes (see settle); asked closed when the
	// read answered.
	flight   any
	settled  atomic.Bool
	deferred bool // answered without waking its callers (set before asked closes)
}

// The states of a flight's store (see task.fill).
const (
	storeNone int32 = iota
	storeOpen
	storeStale
)

// admission is what a caller makes of a task of its key.
type admission uint8

const (
	skip admission = iota // not for this caller
	take                  // its result is the caller's
	hold                  // may turn out to be: wait for asked, then ask again
)

// join returns the task whose result the caller shares: one that admit
// takes (a queued one counts the caller as waiting: see leave), or a new one,
// which mk completes before anyone else sees it. The caller leads (leader)
// when fewer than limit pieces of work run: in a group without a limit it
// gets a new task to run and end, in one with a limit no task (nobody shares
// a running piece of work there: it runs its own and calls end with a nil
// task). Else the new task is queued, and started when one of them ends (see
// end). With pending, a task admit holds is returned: wait for its asked
// channel and join again. After close, join returns nil and false.
func (q *group[K, T]) join(key K, admit func(*task[K, T]) admission, mk func(*task[K, T])) (t *task[K, T], leader, pending bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return nil, false, false
	}
	if q.m == nil {
		q.m = map[K]line[K, T]{}
	}
	l := q.m[key]
	var held *task[K, T]
	for _, t := range l.running {
		switch admit(t) {
		case take:
			return t, false, false
		case hold:
			held = t
		}
	}
	switch {
	case l.next != nil && admit(l.next) == take:
		l.next.waiting++
		return l.next, false, false
	case held != nil:
		return held, false, true
	case q.limit > 0 && l.out >= q.limit:
		if l.next == nil {
			l.next = q.newTask(key, mk)
			q.m[key] = l
		}
		l.next.waiting++
		return l.next, false, false
	}
	l.out++
	if q.limit == 0 {
		t = q.newTask(key, mk)
		t.started = true
		l.running = append(l.running, t)
	}
	q.m[key] = l
	return t, true, false
}

func (q *group[K, T]) newTask(key K, mk func(*task[K, T])) *task[K, T] {
	t := &task[K, T]{key: key, done: make(chan struct{})}
	mk(t)
	return t
}

// end ends a running piece of work of key — t with res, or (t nil) a
// leader's own in a group with a limit — and returns the task queued behind
// the key's running ones, if any, which is running now: the caller must run
// it (its run) and end it.
func (q *group[K, T]) end(key K, t *task[K, T], res T) (next *task[K, T]) {
	return q.endWith(key, t, res, true)
}

// answer is end for a task whose callers wait on (see settle): t's result
// is res, its asked channel closed, its done channel not yet. It returns
// how many callers wait for t too, leaving out those counted already.
func (q *group[K, T]) answer(key K, t *task[K, T], res T) (next *task[K, T], waiting int) {
	return q.endWith(key, t, res, false), t.waiting - t.precounted
}

func (q *group[K, T]) endWith(key K, t *task[K, T], res T, finish bool) (next *task[K, T]) {
	q.mu.Lock()
	defer q.mu.Unlock()
	l := q.m[key]
	if t != nil {
		if finish {
			t.finish(res)
		} else {
			t.res, t.deferred = res, true
			t.answered()
		}
		l.running = slices.DeleteFunc(l.running, func(r *task[K, T]) bool { return r == t })
	}
	l.out--
	if n := l.next; n != nil {
		l.next = nil
		if q.closed {
			n.finish(q.closedT)
		} else {
			n.started = true
			l.out++
			next = n
		}
	}
	if l.out == 0 {
		delete(q.m, key)
	} else {
		q.m[key] = l
	}
	return next
}

// finish sets t's result and wakes its callers.
func (t *task[K, T]) finish(res T) {
	t.res = res
	t.settled.Store(true)
	t.answered()
	// Before done: a caller woken by it must find the reads chained to t
	// settled with t (its leader's own settle, after, changes nothing).
	for _, f := range t.then {
		f()
	}
	t.then = nil
	close(t.done)
}

// settle wakes the callers of a task answered (see group.answer), telling
// them the flight they share (nil: none); only its first call counts.
func (t *task[K, T]) settle(flight any) {
	if t != nil && t.settled.CompareAndSwap(false, true) {
		t.flight = flight
		close(t.done)
	}
}

// leave is called by a caller that stops waiting for t before it ended
// (counted: one of t.precounted): a queued task that nobody waits for any
// more is dropped.
func (q *group[K, T]) leave(t *task[K, T], counted bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if t.started {
		return
	}
	t.waiting--
	if counted {
		t.precounted--
	}
	if l, ok := q.m[t.key]; ok && l.next == t && t.waiting <= 0 {
		l.next = nil
		if l.out == 0 {
			delete(q.m, t.key)
		} else {
			q.m[t.key] = l
		}
	}
}

// close makes later joins return nil, and tasks queued from now on end with
// r instead of starting.
func (q *group[K, T]) close(r T) {
	q.mu.Lock()
	q.closed, q.closedT = true, r
	q.mu.Unlock()
}

// answered marks the first get-or-lease answer of a flight (or its end).
func (t *task[K, T]) answered() {
	if t.asked != nil {
		t.askOnce.Do(func() { close(t.asked) })
	}
}

// saw raises a flight's floor to gen.
func (t *task[K, T]) saw(gen int64) {
	for {
		cur := t.floor.Load()
		if gen <= cur || t.floor.CompareAndSwap(cur, gen) {
			return
		}
	}
}

// workers run work off its caller's goroutine, on goroutines kept for a
// while: a read runs off its caller's goroutine when the client does not
// bound its socket calls by the context (so that the caller can stop waiting
// at its budget), and the call path into go-redis needs a deeper stack than
// a new goroutine starts with — a goroutine per read would grow its stack on
// every hit. A worker that finds no work for workerIdle exits; close stops
// them all once idle, and waits.
type workers struct {
	jobs chan job // unbuffered: a send succeeds only when a worker is idle
	quit chan struct{}

	mu     sync.Mutex // guards closed
	closed bool
	wg     sync.WaitGroup
}

// workerIdle is how long an idle worker waits for work before it exits.
const workerIdle = 10 * time.Second

// job is a piece of work for the workers: a task (with nothing to allocate
// on a hit), or a func.
type job interface{ do() }

type funcJob func()

func (f funcJob) do() { f() }

// run runs j on an idle worker, or a new one (after close, on a goroutine of
// its own: the work close waits for still runs).
func (w *workers) run(j job) {
	select {
	case w.jobs <- j:
		return
	default:
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		go j.do()
		return
	}
	w.wg.Add(1)
	go w.work(j)
}

func (w *workers) work(j job) {
	defer w.wg.Done()
	idle := time.NewTimer(workerIdle)
	defer idle.Stop()
	for {
		j.do()
		idle.Reset(workerIdle)
		select {
		case j = <-w.jobs:
		case <-idle.C:
			return
		case <-w.quit:
			return
		}
	}
}

// close stops the workers once they finish what they run, and waits.
func (w *workers) close() {
	w.mu.Lock()
	if !w.closed {
		w.closed = true
		close(w.quit)
	}
	w.mu.Unlock()
	w.wg.Wait()
}
