package cacheguard

import (
	"cmp"
	"context"
	"errors"
	"fmt"
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
}

// read sends one read of an entry per key of values (each a values hash, field
// the entry's representation in it), with the generation of the keys whose
// entry has a flight running in this process (which flight a call may join
// depends on it: see admit) and the versions of tags, in one round trip: an
// HGET, or a pipeline (on a cluster one per node).
func (g *Guard) read(ctx context.Context, values []string, field string, tags []string, out []stored) {
	if len(values) == 1 && len(tags) == 0 {
		if mark, busy := g.flights.mark(entry{values[0], field}); !busy {
			v, err := g.cmd.Do(ctx, "hget", values[0], field).Text()
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
	// One round trip: the values (one script call on a single server, an
	// HGET each on a cluster), the generations, the tags' versions.
	var cmds []redis.Cmder
	var many *redis.Cmd
	var hv []*redis.StringCmd
	if len(values) > 1 && !g.hub.Sharded() {
		// Each name boxed as a pointer into a copy (boxing a string would
		// allocate once per key; a pointer into values would move the
		// callers' slices to the heap).
		names := slices.Clone(values)
		kv := make([]any, len(names))
		for i := range names {
			kv[i] = &names[i]
		}
		many = readManyScript.Cmd(ctx, kv, field)
		cmds = append(cmds, many)
	} else {
		hv = make([]*redis.StringCmd, len(values))
		for i, v := range values {
			hv[i] = redis.NewStringCmd(ctx, "hget", v, field)
			cmds = append(cmds, hv[i])
		}
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
	var found []any
	if many != nil {
		if found, err = many.Slice(); err != nil || len(found) != len(values) {
			fail(cmp.Or(err, fmt.Errorf("cacheguard: bad reply to the read of %d keys", len(values))))
			return
		}
	}
	for i := range values {
		s := &out[i]
		s.tagVers = vers
		if many != nil {
			if v, ok := found[i].(string); ok {
				s.b = bytesOf(v)
			}
		} else {
			switch v, err := hv[i].Result(); {
			case err == nil:
				s.b = bytesOf(v)
			case !errors.Is(err, redis.Nil):
				*s = stored{err: err}
				continue
			}
		}
		if gv == nil || gv[i] == nil {
			continue
		}
		if s.gen, err = counter.Parse(gv[i].Text()); err != nil {
			*s = stored{err: err}
		}
	}
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
// returns when the read answers, ctx ends or the budget ends (at deadline:
// errBudget), whichever is first; the read itself ends at the command
// timeout (see fetch).
func (g *Guard) readOne(ctx context.Context, e entry, tags []string, deadline time.Time) (stored, error) {
	t, leader, _ := g.reads.join(e, notStarted, func(t *task[entry, stored]) {
		// A queued read runs detached from its callers, bounded by the
		// command timeout alone: one who gives up does not fail the others.
		rctx := context.WithoutCancel(ctx)
		t.run = func() stored {
			var s [1]stored
			if err := g.fetch(rctx, []string{e.values}, e.field, tags, time.Time{}, s[:]); err != nil {
				s[0] = stored{err: err}
			}
			return s[0]
		}
	})
	if leader {
		var s [1]stored
		err := g.fetch(ctx, []string{e.values}, e.field, tags, deadline, s[:])
		ended := s[0]
		if err != nil && ended.err == nil {
			ended.err = err // its caller's context or budget ended it: no answer for the others
		}
		g.endRead(e, nil, ended)
		return s[0], err
	}
	if t == nil {
		return stored{}, ErrClosed
	}
	timer := getTimer(time.Until(deadline))
	defer putTimer(timer)
	select {
	case <-t.done:
		return t.res, nil
	case <-ctx.Done():
		g.reads.leave(t)
		return stored{}, deadlineErr(ctx)
	case <-timer.C:
		g.reads.leave(t)
		return stored{}, errBudget
	}
}

// endRead ends a read of e (t, or a leader's own when nil) that found s, and
// runs the reads queued behind it, in turn, on a worker — unless the command
// timeout ended it: Redis did not answer a read sent before their callers
// arrived, and they end with its error instead of being sent into the same
// stall; or it found the entry absent: a miss serves nothing, so their
// callers share it, and join only flights created from now on (unknown),
// whose scripts are sent after every one of them arrived — a cold burst
// then costs one read and one flight's round trip, not two reads first.
func (g *Guard) endRead(e entry, t *task[entry, stored], s stored) {
	next := g.reads.end(e, t, s)
	for next != nil && errors.Is(s.err, rcmd.ErrTimeout) {
		next = g.reads.end(e, next, s)
	}
	for next != nil && s.b == nil && s.err == nil {
		next = g.reads.end(e, next, unknown(g))
	}
	if next != nil {
		g.work.run(funcJob(func() { g.endRead(e, next, next.run()) }))
	}
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

// honoursDeadlines reports whether rdb bounds every socket call by its
// context's deadline (go-redis's ContextTimeoutEnabled): then a read may run
// on the caller's goroutine.
func honoursDeadlines(rdb redis.UniversalClient) bool {
	switch c := rdb.(type) {
	case *redis.Client:
		return c.Options().ContextTimeoutEnabled
	case *redis.ClusterClient:
		return c.Options().ContextTimeoutEnabled
	case *redis.Ring:
		return c.Options().ContextTimeoutEnabled
	}
	return false
}

// errBudget means the wait budget ended before Redis answered.
var errBudget = errors.New("cacheguard: wait budget ended during a read")

// fetch reads the entries of values (field being their representation) in
// one round trip (see read) into out, bounded by ctx (its error), the wait
// budget (at deadline, none when zero: errBudget) and the command timeout
// (then each entry's error matches rcmd.ErrTimeout), whichever ends first.
// The read runs on the caller's goroutine when the client honours deadlines
// (ContextTimeoutEnabled) and neither ctx nor the budget ends before the
// command timeout: a hit then costs what a plain HGET does. Else it runs on a
// worker, and the caller waits only until those bounds; with
// ContextTimeoutEnabled, detached from the caller and bounded by the command
// timeout alone, since go-redis closes the connection of a command its
// context cuts (DESIGN.md, the read hand-off).
func (g *Guard) fetch(ctx context.Context, values []string, field string, tags []string, deadline time.Time, out []stored) error {
	if passed(ctx) {
		return deadlineErr(ctx)
	}
	// rctx: ctx bounded by the earlier of the budget's deadline and the
	// command timeout (see rcmd).
	d, ok := ctx.Deadline()
	budget := !deadline.IsZero() && (!ok || d.After(deadline)) && time.Until(deadline) < g.cmd.Timeout()
	var rctx context.Context
	var cancel context.CancelFunc
	if budget {
		rctx, cancel = context.WithDeadline(ctx, deadline)
	} else {
		rctx, cancel = g.cmd.Bound(ctx, 0)
	}
	defer cancel()
	if g.ctxDeadlines && !budget && !g.cmd.Cuts(ctx, 0) {
		g.read(rctx, values, field, tags, out)
	} else {
		j, _ := g.jobs.Get().(*readJob)
		if j == nil {
			j = &readJob{g: g, done: make(chan struct{}, 1)}
		}
		j.ctx, j.field, j.tags = rctx, field, tags
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
			j.ctx, j.tags = nil, nil
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

// readJob is a read that fetch hands to a worker; the Guard pools them.
type readJob struct {
	g      *Guard
	ctx    context.Context
	values []string
	field  string
	tags   []string
	out    []stored
	done   chan struct{} // buffered: one send per use, the worker never blocks
}

func (j *readJob) do() {
	j.g.read(j.ctx, j.values, j.field, j.tags, j.out)
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
