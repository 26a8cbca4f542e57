package cacheguard

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"sync"
	"time"
	"unsafe"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/internal/counter"
	"github.com/cacheguard/cacheguard/internal/rcmd"
)

// stored is what one read of an entry found.
type stored struct {
	b []byte // the envelope; nil when absent
	// gen is the key's generation, read with the envelope only when a
	// flight of the entry was running in this process as the read was sent
	// (see flights.admit): when absent, the server's clock at the read
	// (genpeek.lua: later than every generation it had, earlier than every
	// one it will have); 0 when not read; counter.Unknown when unknown (then
	// only a flight created after the read is joined).
	gen int64
	// mark is the serial of the last flight created before the read was
	// sent: a flight created after it sent its first script after the read.
	mark    uint64
	tagVers []uint64 // the versions of the call's tags, read with the value (counter.Unknown: absent)
	err     error    // Redis failed
	// flight, for a caller of a shared read that found the entry absent:
	// the flight it shares, ended (see Guard.endRead); counted, that the
	// caller was counted in Stats as a miss then (its observer not told).
	flight  *task[entry, *outcome]
	counted bool
}

// read sends one read of an entry per key of values (each a values hash, field
// the entry's representation in it), with the generation of the keys whose
// entry has a flight running in this process (which flight a call may join
// depends on it: see admit) and the versions of tags, in one round trip: an
// HGET, or a pipeline (on a cluster one per node). A lone HGET travels with
// other callers' (see hits) when share is set: when it is sent by a worker,
// or on its caller's goroutine under the command's bound alone (see inline).
func (g *Guard) read(ctx context.Context, values []string, field string, tags []string, out []stored, line *hget, share bool) {
	if len(values) == 1 && len(tags) == 0 {
		if mark, busy := g.flights.mark(entry{values[0], field}); !busy {
			if line == nil || line.name != values[0] || line.field != field {
				line = newLine(values[0], field)
			}
			var cmd *redis.Cmd
			if share {
				cmd = g.hits.do(ctx, line.args[:])
			} else {
				cmd = g.cmd.Do(ctx, line.args[:]...)
			}
			v, err := cmd.Text()
			switch {
			case err == nil:
				out[0] = stored{b: bytesOf(v), mark: mark}
			case errors.Is(err, redis.Nil):
				out[0] = stored{mark: mark}
			default:
				out[0] = stored{err: err}
			}
			return
		}
	}
	// One round trip: an HGET of each value, the generations, the tags'
	// versions. (A script reading every value cost Redis about 1.5 µs per
	// key in its calls back into Redis, against 0.5 for an HGET in a
	// pipeline: GetMany of 100 took 8% longer.)
	var cmds []redis.Cmder
	// Each command and its line in one allocation; each name boxed as a
	// pointer into a copy (boxing a string would allocate once per key; a
	// pointer into values would move the callers' slices to the heap).
	names := slices.Clone(values)
	hv := make([]hgetCmd, len(values))
	f := any(field)
	for i := range names {
		c := &hv[i]
		c.line = [3]any{"hget", &names[i], f}
		c.StringCmd = *redis.NewStringCmd(ctx, c.line[:]...)
		cmds = append(cmds, &c.StringCmd)
	}
	var gv []*redis.Cmd
	p := g.cfg.prefix
	for i, v := range values {
		var busy bool
		if out[i].mark, busy = g.flights.mark(entry{v, field}); busy {
			if gv == nil {
				gv = make([]*redis.Cmd, len(values))
			}
			// The generation's name: the values hash's, with "g:" for "v:".
			gv[i] = genPeekScript.Cmd(ctx, keys(p+"g:"+v[len(p)+len("v:"):]))
			cmds = append(cmds, gv[i])
		}
	}
	tv := make([]*redis.Cmd, len(tags))
	for i, t := range tags {
		tv[i] = redis.NewCmd(ctx, "get", g.name("t:", t))
		cmds = append(cmds, tv[i])
	}
	g.cmd.Exec(ctx, nil, cmds, 0, false)
	fail := func(err error) {
		for i := range out {
			out[i] = stored{err: err}
		}
	}
	vers, err := versions(tv)
	if err != nil {
		fail(err)
		return
	}
	for i := range values {
		s := &out[i]
		s.tagVers = vers
		switch v, err := hv[i].Result(); {
		case err == nil:
			s.b = bytesOf(v)
		case !errors.Is(err, redis.Nil):
			*s = stored{err: err}
			continue
		}
		if gv == nil || gv[i] == nil {
			continue
		}
		if s.gen, err = counter.Parse(gv[i].Text()); err != nil {
			*s = stored{err: err}
		}
	}
}

// hgetCmd is an HGET of a read of several entries, with its line.
type hgetCmd struct {
	redis.StringCmd
	line [3]any
}

// hget is the command line of a single read (see read), in one allocation:
// boxing each name would cost one more each. A Get builds the name of the
// values hash into a hitLine's buffer when it fits (see Guard.readLine): its
// name and its line are then one allocation too.
type hget struct {
	args        [3]any
	name, field string
}

// hitLine is a hget with the bytes of its name.
type hitLine struct {
	hget
	buf [80]byte
}

// newLine returns the line of a read of field in the values hash name.
func newLine(name, field string) *hget {
	h := &hget{name: name, field: field}
	h.args = [3]any{"hget", &h.name, &h.field}
	return h
}

// versions reads the tags' versions from their commands' replies (an absent
// one is counter.Unknown: newer than any recorded).
func versions(cmds []*redis.Cmd) ([]uint64, error) {
	if len(cmds) == 0 {
		return nil, nil
	}
	vers := make([]uint64, len(cmds))
	for i, c := range cmds {
		v, err := counter.Parse(c.Text())
		if err != nil {
			return nil, fmt.Errorf("cacheguard: tag version: %w", err)
		}
		vers[i] = uint64(v)
	}
	return vers, nil
}

// entry names an entry in a process: its values hash and field.
type entry struct{ values, field string }

// readOne reads one entry for Get through g.reads: a read sent after this
// call began, shared with the callers of the entry that overlap it, so that a
// burst of reads of a hot entry costs limit+1 HGETs, not one per caller (of
// a cold one, limit: the burst shares a miss, see endRead). It
// returns when the read answers, ctx ends or the budget ends (at deadline,
// none when zero: errBudget), whichever is first; the read itself ends at the command
// timeout (see fetch). A call that found the entry absent and no flight of
// it running is given the callers that shared its read (chained): it must
// hand them to the flight it joins (flights.chain) or settle them. A caller
// that shared such a read (or a queued read handed to a running flight: see
// endRead) returns once that flight ended (the stored value's flight), or
// once the read answered when early (FailFast: it does not wait for loads);
// typ is the caller's type, which the flight must have; counted, that the
// caller was counted as a miss already (see call.awaitFill), so that a
// shared read that misses does not count it again (see answerMiss).
func (g *Guard) readOne(ctx context.Context, e entry, tags []string, deadline time.Time, line *hget, typ reflect.Type, early, counted bool) (s stored, chained *task[entry, stored], err error) {
	if g.slots != nil && g.nested(ctx) {
		// A loader's Get shares no read: the callers of a read that finds
		// the entry absent wait for the flight it is handed to, which this
		// Get must join itself to let it load without a slot (see
		// loadSlots.promote).
		var s [1]stored
		err := g.fetch(ctx, []string{e.values}, e.field, tags, deadline, s[:], line)
		return s[0], nil, err
	}
	admit := notStarted[entry, stored]
	if counted {
		admit = func(t *task[entry, stored]) admission {
			a := notStarted(t)
			if a == take {
				t.precounted++
			}
			return a
		}
	}
	t, leader, _ := g.reads.join(e, admit, func(t *task[entry, stored]) {
		if counted {
			t.precounted++
		}
		// A queued read runs detached from its callers, bounded by the
		// command timeout alone: one who gives up does not fail the others.
		rctx := context.WithoutCancel(ctx)
		t.asked, t.typ = make(chan struct{}), typ
		t.run = func() stored {
			var s [1]stored
			if err := g.fetch(rctx, []string{e.values}, e.field, tags, time.Time{}, s[:], nil); err != nil {
				s[0] = stored{err: err}
			}
			return s[0]
		}
	})
	if leader {
		var s [1]stored
		err := g.fetch(ctx, []string{e.values}, e.field, tags, deadline, s[:], line)
		ended := s[0]
		if err != nil && ended.err == nil {
			ended.err = err // its caller's context or budget ended it: no answer for the others
		}
		return s[0], g.endRead(e, nil, ended), err
	}
	if t == nil {
		return stored{}, nil, ErrClosed
	}
	var asked <-chan struct{}
	if early {
		asked = t.asked
	}
	var budget <-chan time.Time // none when deadline is zero (see config.readBound)
	if !deadline.IsZero() {
		timer := getTimer(time.Until(deadline))
		defer putTimer(timer)
		budget = timer.C
	}
	answered := func() (stored, bool) { // asked closes before done, with the result
		select {
		case <-t.asked:
			s := t.res
			s.counted = t.deferred
			return s, true
		default:
			return stored{}, false
		}
	}
	select {
	case <-t.done:
		s, _ := answered()
		s.flight, _ = t.flight.(*task[entry, *outcome])
		return s, nil, nil
	case <-asked:
		s, _ := answered()
		return s, nil, nil
	case <-ctx.Done():
		g.reads.leave(t, counted)
		s, _ := answered()
		return stored{counted: s.counted}, nil, deadlineErr(ctx)
	case <-budget:
		if s, ok := answered(); ok { // a miss, whose flight outlasted the budget: the miss path says so
			return s, nil, nil
		}
		g.reads.leave(t, counted)
		return stored{}, nil, errBudget
	}
}

// endRead ends a read of e (t, or a leader's own when nil) that found s, and
// runs the reads queued behind it, in turn, on a worker — unless the command
// timeout ended it: Redis did not answer a read sent before their callers
// arrived, and they end with its error instead of being sent into the same
// stall; or it found the entry absent and no flight of it runs: a miss
// serves nothing, so their callers share it, and join only flights created
// from now on (their mark), whose scripts are sent after every one of them
// arrived — a cold burst then costs one read and one flight's round trip,
// not two reads first. (With a flight running, a mark of now would make
// them wait for that flight's first answer and then start another: they
// read, as before, to learn its generation.) Ended by a leader (t nil), such
// a miss is answered without waking its callers: it is returned (chained),
// for the leader to hand to the flight it joins. A queued read (t) that
// found the entry absent while a flight its callers would take runs is
// handed to that flight the same way. So in a cold burst each caller wakes
// once, when the load is done, not also to join it.
func (g *Guard) endRead(e entry, t *task[entry, stored], s stored) (chained *task[entry, stored]) {
	var next *task[entry, stored]
	var f *task[entry, *outcome]
	if t != nil && s.b == nil && s.err == nil && t.typ != nil {
		f = g.flights.taking(e, &s, t.typ)
	}
	if f != nil {
		// Its callers would each wake to join f: they wait for it instead.
		next = g.answerMiss(e, t, s)
		g.flights.chain(f, t)
	} else {
		next = g.reads.end(e, t, s)
	}
	for next != nil && errors.Is(s.err, rcmd.ErrTimeout) {
		next = g.reads.end(e, next, s)
	}
	for next != nil && s.b == nil && s.err == nil {
		mark, busy := g.flights.mark(e)
		if busy {
			break // a flight of e runs: whether they may join it is what their read tells
		}
		miss := stored{mark: mark, gen: counter.Unknown}
		if t == nil && chained == nil {
			chained, next = next, g.answerMiss(e, next, miss)
			continue
		}
		next = g.reads.end(e, next, miss)
	}
	if next != nil {
		g.work.run(funcJob(func() { g.endRead(e, next, next.run()) }))
	}
	return chained
}

// answerMiss answers t, a read that found e absent, without waking its
// callers (see group.answer), and counts them as misses now: they wait for a
// flight from now on (a miss in Stats is a call already waiting); each tells
// the observer when it wakes. It returns the read queued behind t.
func (g *Guard) answerMiss(e entry, t *task[entry, stored], s stored) (next *task[entry, stored]) {
	next, waiting := g.reads.answer(e, t, s)
	g.stats.c[EventMiss].Add(uint64(waiting))
	return next
}

// passed reports whether ctx has ended or its deadline has passed. A
// context's timer can run late on a starved CPU, while a client that bounds
// its socket calls by the deadline (ContextTimeoutEnabled) fails them with a
// timeout at once: a Redis call that failed once its deadline passed failed
// for the deadline, not for Redis, and must not count as a Redis failure
// (whose answer is to run the loader uncached).
func passed(ctx context.Context) bool {
	if ctx.Err() != nil {
		return true
	}
	d, ok := ctx.Deadline()
	return ok && !time.Now().Before(d)
}

// deadlineErr is ctx's error, or DeadlineExceeded when its deadline passed
// before its timer ran (see passed).
func deadlineErr(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return context.DeadlineExceeded
}

// redisFailed is the one classification of err, the failure of Redis
// commands sent under ctx for key: when ctx has ended or its deadline passed
// (see passed), the failure is the caller's, not Redis's, and nothing is
// counted; else it counts a Redis error (EventRedisError) and reports true.
func (g *Guard) redisFailed(ctx context.Context, key string, err error) bool {
	if passed(ctx) {
		return false
	}
	g.note(ctx, EventRedisError, key, 0, err)
	return true
}

// commandFailed classifies err (see redisFailed) for a call's caller: ctx's
// error, or err as matching ErrUnavailable (what names the commands).
func (g *Guard) commandFailed(ctx context.Context, key, what string, err error) error {
	if !g.redisFailed(ctx, key, err) {
		return fmt.Errorf("cacheguard: %s: %w", what, deadlineErr(ctx))
	}
	return fmt.Errorf("%w: %s: %w", ErrUnavailable, what, err)
}

// notStarted admits only a task not started yet: a read sent after the
// caller arrived.
func notStarted[K comparable, T any](t *task[K, T]) admission {
	if t.started {
		return skip
	}
	return take
}

// bytesOf returns the bytes of s without copying them. The envelope is
// only ever read (decodeEnvelope, Codec.Unmarshal, which must not modify
// its input), never written.
// An empty value is not nil (nil is an absent one).
func bytesOf(s string) []byte {
	if s == "" {
		return []byte{}
	}
	return unsafe.Slice(unsafe.StringData(s), len(s))
}

// clientBounds reports whether rdb bounds every socket call by its
// context's deadline (go-redis's ContextTimeoutEnabled), and else how long one
// attempt of a command may take on it at most, whatever its context:
// WriteTimeout plus ReadTimeout, go-redis's defaults resolved (0 when either
// is none, or the client is of another kind: unknown).
func clientBounds(rdb redis.UniversalClient) (ctxDeadlines bool, attempt time.Duration) {
	var r, w time.Duration
	switch c := rdb.(type) {
	case *redis.Client: // its options are resolved: 0 is none
		o := c.Options()
		ctxDeadlines, r, w = o.ContextTimeoutEnabled, o.ReadTimeout, o.WriteTimeout
	case *redis.ClusterClient: // resolved too
		o := c.Options()
		ctxDeadlines, r, w = o.ContextTimeoutEnabled, o.ReadTimeout, o.WriteTimeout
	case *redis.Ring: // as set: its shards' clients resolve them (0: the default, 5s)
		o := c.Options()
		ctxDeadlines, r, w = o.ContextTimeoutEnabled, o.ReadTimeout, o.WriteTimeout
		if r == 0 {
			r = 5 * time.Second
		}
		if w == 0 {
			w = r
		}
	}
	if r <= 0 || w <= 0 {
		return ctxDeadlines, 0
	}
	return ctxDeadlines, r + w
}

// errBudget means the wait budget ended before Redis answered.
var errBudget = errors.New("cacheguard: wait budget ended during a read")

// fetch reads the entries of values (field being their representation) in
// one round trip (see read) into out, bounded by ctx (its error), the wait
// budget (at deadline, none when zero: errBudget) and the command timeout
// (then each entry's error matches rcmd.ErrTimeout), whichever ends first.
// The read runs on the caller's goroutine when the client keeps those bounds
// on its own (see inline): a hit then costs what a plain HGET does. Else it
// runs on a worker, and the caller waits only until those bounds; with
// ContextTimeoutEnabled, detached from the caller and bounded by the command
// timeout alone, since go-redis closes the connection of a command its
// context cuts (DESIGN.md, the read hand-off). line, when not nil, is the
// command line of a single read (see hget).
func (g *Guard) fetch(ctx context.Context, values []string, field string, tags []string, deadline time.Time, out []stored, line *hget) error {
	if passed(ctx) {
		return deadlineErr(ctx)
	}
	d, ok := ctx.Deadline()
	budget := !deadline.IsZero() && (!ok || d.After(deadline)) && time.Until(deadline) < g.cmd.Timeout()
	// rctx: ctx bounded by the earlier of the budget's deadline and the
	// command timeout (see rcmd); sctx, when not nil, what the read is sent
	// under on the caller's goroutine.
	rctx, sctx, cancel, scancel := g.inline(ctx, deadline, budget)
	defer cancel()
	if sctx != nil {
		g.read(sctx, values, field, tags, out, line, sctx == rctx && g.ctxDeadlines)
		scancel()
		// Sent under a context that ends one attempt before rctx (without
		// ContextTimeoutEnabled): a timeout before rctx ended is a command
		// timeout (the client's own, or go-redis told to try no more in time
		// for rctx), not the caller's deadline or the budget.
		if sctx != rctx && !passed(rctx) && slices.ContainsFunc(out, func(s stored) bool { return s.err != nil && rcmd.IsTimeout(s.err) }) {
			for i := range out {
				out[i] = stored{err: rcmd.ErrTimeout}
			}
		}
	} else {
		j, _ := g.jobs.Get().(*readJob)
		if j == nil {
			j = &readJob{g: g, done: make(chan struct{}, 1)}
		}
		j.ctx, j.field, j.tags, j.line = rctx, field, tags, line
		if g.ctxDeadlines {
			j.ctx = context.WithoutCancel(ctx) // read bounds it by the command timeout
		}
		j.values = append(j.values[:0], values...)
		j.out = slices.Grow(j.out[:0], len(out))[:len(out)]
		g.work.run(j)
		select {
		case <-j.done:
			copy(out, j.out)
			clear(j.out)
			clear(j.values)
			j.ctx, j.tags, j.line = nil, nil, nil
			g.jobs.Put(j)
		case <-rctx.Done(): // the worker keeps j: it is not reused
			for i := range out {
				out[i] = stored{err: rctx.Err()}
			}
		}
	}
	if !passed(rctx) || !slices.ContainsFunc(out, func(s stored) bool { return s.err != nil }) {
		return nil
	}
	// Failed once rctx passed: for the caller's ctx, the budget, or the
	// command timeout (see passed).
	s, err := stored{err: rcmd.ErrTimeout}, error(nil)
	switch {
	case passed(ctx):
		s, err = stored{}, deadlineErr(ctx)
	case budget:
		s, err = stored{}, errBudget
	}
	for i := range out {
		out[i] = s
	}
	return err
}

// inline decides, in one place, whether a read runs on the caller's
// goroutine, and bounds it: rctx is ctx bounded by the wait budget (at
// deadline) when budget is set, else by the command timeout; sctx is what the
// read is sent under on the caller's goroutine, nil when it is handed to a
// worker. It runs there when the client ends it within rctx on its own:
//
//   - with ContextTimeoutEnabled, when rctx is the command's bound, not the
//     caller's deadline or the budget (those would cut the command, and
//     go-redis closes the connection of a command its context cut: see
//     rcmd.Runner.Cuts); sent under rctx;
//   - without it, when one attempt's bound (see clientBounds) fits before
//     rctx's deadline, the earliest of the caller's, the budget's and the
//     command's. The socket calls ignore the context then, but go-redis waits
//     for a pooled connection, dials and sleeps between retries under it, so
//     the read is sent under a context that ends one attempt before rctx: no
//     attempt starts after it, and each ends within rctx. With go-redis's
//     defaults (5s each way) no read qualifies (DESIGN.md, the read hand-off).
//
// When the command's bound comes first, both are made from the deadline the
// Runner shares among the commands it sends within a moment (see shared): no
// timer per read.
func (g *Guard) inline(ctx context.Context, deadline time.Time, budget bool) (rctx, sctx context.Context, cancel, scancel context.CancelFunc) {
	if !budget && !g.cmd.Cuts(ctx, 0) && (g.ctxDeadlines || g.attempt > 0 && g.attempt <= g.cmd.Timeout()) {
		tick, _ := g.cmd.Bound(context.Background(), 0) // shared: no cancel
		rctx = g.shared(ctx, tick)
		if g.ctxDeadlines {
			return rctx, rctx, noCancel, noCancel
		}
		st := g.starts.Load()
		if st == nil || st.parent != tick {
			end, _ := tick.Deadline()
			st = &startBy{parent: tick}
			st.ctx, st.cancel = context.WithDeadline(tick, end.Add(-g.attempt))
			g.starts.Store(st)
		}
		return rctx, g.shared(ctx, st.ctx), noCancel, noCancel
	}
	if budget {
		rctx, cancel = context.WithDeadline(ctx, deadline)
	} else {
		rctx, cancel = g.cmd.Bound(ctx, 0)
	}
	end, _ := rctx.Deadline()
	if g.ctxDeadlines || g.attempt == 0 || time.Until(end) < g.attempt {
		return rctx, nil, cancel, noCancel
	}
	sctx, scancel = context.WithDeadline(rctx, end.Add(-g.attempt))
	return rctx, sctx, cancel, scancel
}

func noCancel() {}

// shared returns a read's context under ctx made from end, a deadline shared
// by the reads sent within a moment: end itself under context.Background,
// else ctx's values with end's Done and Err and, as its deadline, the
// earlier of end's and the command's bound (so that rcmd.Runner.Bound keeps
// it). It has no timer of its own, where a context.WithDeadline of ctx costs
// three allocations, and a timer set and stopped, per hit. ctx's
// cancellation is not its own: go-redis's socket calls never see one (they
// follow the deadline, or the client's timeouts), its pool wait, dial and
// retry sleep end at end, and the caller sees it when the read returns.
func (g *Guard) shared(ctx, end context.Context) context.Context {
	if ctx == context.Background() {
		return end
	}
	d, _ := end.Deadline()
	if b := time.Now().Add(g.cmd.Timeout()); b.Before(d) {
		d = b
	}
	return &boundCtx{Context: ctx, end: end, d: d}
}

// boundCtx is a read's context (see shared).
type boundCtx struct {
	context.Context                 // the caller's: its values
	end             context.Context // the shared deadline: Done, Err
	d               time.Time
}

func (c *boundCtx) Deadline() (time.Time, bool) { return c.d, true }
func (c *boundCtx) Done() <-chan struct{}       { return c.end.Done() }
func (c *boundCtx) Err() error                  { return c.end.Err() }

// startBy is the context the reads under a shared deadline (parent) are sent
// under on a client without ContextTimeoutEnabled: parent's, one attempt
// earlier (see inline).
type startBy struct {
	parent, ctx context.Context
	cancel      context.CancelFunc // never called: its deadline, or parent's, ends ctx
}

// readJob is a read that fetch hands to a worker; the Guard pools them.
type readJob struct {
	g      *Guard
	ctx    context.Context
	values []string
	field  string
	tags   []string
	line   *hget // see hget; nil: read makes one
	out    []stored
	done   chan struct{} // buffered: one send per use, the worker never blocks
}

func (j *readJob) do() {
	j.g.read(j.ctx, j.values, j.field, j.tags, j.out, j.line, true)
	j.done <- struct{}{}
}

// timers recycles the budget timers of Get calls, which every call needs
// (the read of a hit is bounded by the budget too) and most stop unfired.
// Since Go 1.23 a stopped timer's channel holds no stale value, so a timer
// can be reused after Stop.
var timers = sync.Pool{New: func() any {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return t
}}

func getTimer(d time.Duration) *time.Timer {
	t := timers.Get().(*time.Timer)
	t.Reset(d)
	return t
}

func putTimer(t *time.Timer) {
	t.Stop()
	timers.Put(t)
}
