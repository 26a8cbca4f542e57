package cacheguard

import "sync"

// queue coalesces work per key in a process so that a caller only ever
// shares work that starts after it arrived: a GET sent after the call began
// never returns what Redis held before it (a Get that begins after an
// Invalidate returned never sees the invalidated entry), and a load started
// after the call began never returns data older than the call. When the key
// is idle a caller starts the work at once; callers that arrive while it runs
// queue for the next one, which starts when the running one ends and is
// shared by all of them — so a burst of N calls costs two GETs (or loads),
// not N. A queued work whose callers all gave up is dropped, so nothing is
// left behind. The zero value is ready to use.
//
// The work runs on a goroutine of the queue's (of its runner, when it has
// one), detached from every caller (a caller that gives up does not fail the
// others); close waits for it.
type queue[K comparable, R any] struct {
	runner *runner // runs the work, when set; else a goroutine per work

	mu      sync.Mutex // guards m, closed, closedR and every queued's and work's waiting
	m       map[K]*queued[R]
	closed  bool
	closedR R // given to work that would start after close
	wg      sync.WaitGroup
}

type queued[R any] struct {
	inflight *work[R] // started, result pending
	next     *work[R] // callers that arrived while inflight ran; starts when it ends
}

type work[R any] struct {
	run     func() R
	done    chan struct{} // closed when r is set
	r       R
	waiting int // callers still waiting for it (counted while it is queued)
}

// join returns the work whose result the caller shares (read w.r once w.done
// is closed): started now if the key is idle, or queued behind the running
// work. run does the work; of the callers of one queued work, the first one's
// run is used. After close, join returns nil.
//
// With lead, work started now for an idle key is not started: the caller
// runs it itself (led is true) and must then call end. Only that caller ever
// shares such a work: the callers that arrive meanwhile queue for the next.
func (q *queue[K, R]) join(key K, run func() R, lead bool) (w *work[R], led bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return nil, false
	}
	if q.m == nil {
		q.m = map[K]*queued[R]{}
	}
	kq := q.m[key]
	if kq == nil {
		kq = &queued[R]{}
		q.m[key] = kq
	}
	if kq.inflight == nil {
		w := &work[R]{run: run, done: make(chan struct{})}
		kq.inflight = w
		q.wg.Add(1)
		if lead {
			return w, true
		}
		q.start(key, w)
		return w, false
	}
	if kq.next == nil {
		kq.next = &work[R]{run: run, done: make(chan struct{})}
	}
	kq.next.waiting++
	return kq.next, false
}

// leave is called by a caller that stops waiting for w before it is done: a
// queued work that nobody waits for any more is dropped.
func (q *queue[K, R]) leave(key K, w *work[R]) {
	q.mu.Lock()
	defer q.mu.Unlock()
	w.waiting--
	if kq := q.m[key]; kq != nil && kq.next == w && w.waiting <= 0 {
		kq.next = nil
	}
}

// start runs w, the key's work in flight (counted in q.wg), on a goroutine;
// q.mu is held.
func (q *queue[K, R]) start(key K, w *work[R]) {
	f := func() { q.end(key, w, w.run()) }
	if q.runner == nil || !q.runner.run(f) {
		go f()
	}
}

// end ends w, the key's work in flight, with r, and starts the work queued
// behind it.
func (q *queue[K, R]) end(key K, w *work[R], r R) {
	defer q.wg.Done()
	q.mu.Lock()
	defer q.mu.Unlock()
	w.r = r
	close(w.done)
	kq := q.m[key]
	kq.inflight = nil
	if n := kq.next; n != nil {
		kq.next = nil
		if q.closed {
			n.r = q.closedR
			close(n.done)
		} else {
			kq.inflight = n
			q.wg.Add(1)
			q.start(key, n)
		}
	}
	if kq.inflight == nil {
		delete(q.m, key)
	}
}

// close makes later joins return nil and queued work end with r instead of
// starting, and waits for the work running.
func (q *queue[K, R]) close(r R) {
	q.mu.Lock()
	q.closed, q.closedR = true, r
	q.mu.Unlock()
	q.wg.Wait()
}
