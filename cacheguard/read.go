package cacheguard

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/internal/rcmd"
)

// stored is what one read of an entry found.
type stored struct {
	b []byte // the envelope; nil when absent
	// gen is the key's generation, read with the envelope only when a
	// flight of the entry was running in this process as the read was sent
	// (see flights.admit); 0 when not read or absent.
	gen int64
	// mark is the serial of the last flight created before the read was
	// sent: a flight created after it sent its first script after the read.
	mark    uint64
	tagVers []uint64 // the versions of the call's tags, read with the value (0: absent)
	err     error    // Redis failed
}

// A hit is one HGET of the representation's field in the key's values hash.
// An Invalidate deletes that hash in the script that moves the generation, so
// a value present in Redis is always of the current generation and a hit
// does not read the generation. The miss path needs it only to decide which
// flight of the process a call may join, and reads it — in the same round
// trip — only when such a flight is running.

// read sends one read of an entry per key of values (each a values hash, field
// the entry's representation in it), with the generation of the keys whose
// entry has a flight running in this process and the versions of tags, in
// one round trip: an HGET, or a pipeline (on a cluster one per node).
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
	var gv []*redis.StringCmd
	p := g.cfg.prefix
	for i, v := range values {
		var busy bool
		if out[i].mark, busy = g.flights.mark(entry{v, field}); busy {
			if gv == nil {
				gv = make([]*redis.StringCmd, len(values))
			}
			gv[i] = redis.NewStringCmd(ctx, "get", p+"g:"+v[len(p)+len("v:"):]) // the generation's name: the values hash's, with "g:" for "v:"
			cmds = append(cmds, gv[i])
		}
	}
	tv := make([]*redis.Cmd, len(tags))
	for i, t := range tags {
		tv[i] = redis.NewCmd(ctx, "get", g.tagKey(t))
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
	var found string
	if many != nil {
		if found, err = many.Text(); err != nil {
			fail(err)
			return
		}
	}
	for i := range values {
		s := &out[i]
		s.tagVers = vers
		if many != nil {
			var ok bool
			if s.b, found, ok = cutValue(found); !ok {
				fail(fmt.Errorf("cacheguard: bad reply to the read of %d keys", len(values)))
				return
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
		switch v, err := gv[i].Result(); {
		case err == nil:
			s.gen, _ = strconv.ParseInt(v, 10, 64)
		case !errors.Is(err, redis.Nil):
			*s = stored{err: err}
		}
	}
}

// versions reads the tags' versions from their commands' replies (an absent
// one is 0).
func versions(cmds []*redis.Cmd) ([]uint64, error) {
	if len(cmds) == 0 {
		return nil, nil
	}
	vers := make([]uint64, len(cmds))
	for i, c := range cmds {
		switch s, err := c.Text(); {
		case err == nil:
			if vers[i], err = strconv.ParseUint(s, 10, 64); err != nil {
				return nil, fmt.Errorf("cacheguard: tag version %q: %w", s, err)
			}
		case !errors.Is(err, redis.Nil):
			return nil, err
		}
	}
	return vers, nil
}

// cutValue takes the first value off s, readmany.lua's reply: its bytes (nil
// when absent) and the rest of s.
func cutValue(s string) (b []byte, rest string, ok bool) {
	if strings.HasPrefix(s, "-") {
		return nil, s[1:], true
	}
	n, after, _ := strings.Cut(s, ":")
	l, err := strconv.Atoi(n)
	if err != nil || l < 0 || l > len(after) {
		return nil, "", false
	}
	return bytesOf(after[:l]), after[l:], true
}

// entry names an entry in a process: its values hash and field.
type entry struct{ values, field string }

// readOne reads one entry through g.reads: a read sent after this call
// began, shared with the other callers of the entry that overlap it. It
// returns when the read answers, ctx ends, the budget ends (at deadline:
// errBudget) or the command timeout does (a Redis error), whichever is first.
// The command timeout runs from when the read is sent: a caller queued
// behind the reads in flight does not count the time it waits for them
// (until its read is sent it counts from when it queued, so that a read
// ahead that Redis does not answer ends it as well; one that the command
// timeout ended ends the reads queued behind it with its error at once).
//
// Unless the client bounds its socket calls by the context's deadline
// (ContextTimeoutEnabled), the read runs on a worker of the Guard's, so that
// a Redis that does not answer (black-holed, paused) holds no caller beyond
// those bounds whatever the client's own timeouts (go-redis bounds a read by
// ReadTimeout and its retries then, not by the context). With it, a caller
// that reads alone does so on its own goroutine: a hit then costs what a
// plain HGET does.
func (g *Guard) readOne(ctx context.Context, e entry, tags []string, deadline time.Time) (stored, error) {
	q := &g.reads
	t, solo, _ := q.join(e, notStarted, nil)
	if t == nil {
		return stored{}, ErrClosed
	}
	if solo && g.ctxDeadlines {
		rctx, cancel, budget := g.bound(ctx, deadline)
		var s [1]stored
		g.read(rctx, []string{e.values}, e.field, tags, s[:])
		res, err := s[0], error(nil)
		if res.err != nil {
			res, err = g.ended(ctx, rctx, budget, res)
		}
		cancel()
		if next := g.endRead(t, res); next != nil {
			next.ctx, next.tags = ctx, tags
			g.work.run(next)
		}
		<-t.ready
		q.recycle(t)
		return res, err
	}
	if solo {
		t.ctx, t.tags = ctx, tags
		g.work.run(t)
	}
	signal := t.done
	if t.solo {
		signal = t.ready
	}
	timeout := g.cmd.Timeout()
	timer := getTimer(min(time.Until(deadline), timeout))
	defer putTimer(timer)
	for {
		select {
		case <-signal:
			s := t.res
			if solo {
				q.recycle(t)
			}
			return s, nil
		case <-ctx.Done():
			q.leave(t) // a solo task ends on its worker, and is not reused
			return stored{}, ctx.Err()
		case <-timer.C:
			left := time.Until(deadline)
			if left <= 0 {
				q.leave(t)
				return stored{}, errBudget
			}
			if sent := t.sent.Load(); sent != 0 {
				if rest := time.Duration(sent) + timeout - sinceStart(); rest > 0 {
					timer.Reset(min(rest, left)) // sent after this caller queued
					continue
				}
			}
			q.leave(t)
			return stored{err: rcmd.ErrTimeout}, nil
		}
	}
}

// start is the origin of sinceStart.
var start = time.Now()

// sinceStart is a reading of the monotonic clock, never 0.
func sinceStart() time.Duration { return time.Since(start) + 1 }

// endRead ends t, a read, with s, and returns the read queued behind it for
// the caller to run, if any: when the command timeout ended t, Redis did not
// answer a read sent before the queued one's callers arrived, and the queued
// read ends with t's error instead of being sent into the same stall.
func (g *Guard) endRead(t *task[entry, stored], s stored) *task[entry, stored] {
	next := g.reads.end(t, s)
	if next != nil && errors.Is(s.err, rcmd.ErrTimeout) {
		for next != nil {
			next = g.reads.end(next, stored{err: rcmd.ErrTimeout})
		}
	}
	return next
}

// readTask is the exec of g.reads: it sends t, a read, on a worker, then the
// reads queued behind it (on the same worker: their callers are waiting
// already). A solo read runs under its caller's ctx, a queued one under one
// detached from its callers, bounded by the command timeout.
func (g *Guard) readTask(t *task[entry, stored]) {
	for t != nil {
		ctx, tags := t.ctx, t.tags // t goes back to the pool once ended
		rctx, cancel := ctx, context.CancelFunc(func() {})
		if !t.solo {
			rctx, cancel = g.cmd.Bound(context.WithoutCancel(ctx), 0)
		}
		var s [1]stored
		t.sent.Store(int64(sinceStart()))
		g.read(rctx, []string{t.key.values}, t.key.field, tags, s[:])
		if s[0].err != nil && rctx != ctx && passed(rctx) {
			s[0] = stored{err: rcmd.ErrTimeout} // its bound, the command timeout, ended it
		}
		cancel()
		if t = g.endRead(t, s[0]); t != nil {
			t.ctx, t.tags = ctx, tags
		}
	}
}

// bound returns ctx bounded by the earlier of the wait budget's deadline and
// the command timeout (see rcmd), and whether the budget is the earlier.
func (g *Guard) bound(ctx context.Context, deadline time.Time) (context.Context, context.CancelFunc, bool) {
	if d, ok := ctx.Deadline(); ok && !d.After(deadline) || time.Until(deadline) >= g.cmd.Timeout() {
		rctx, cancel := g.cmd.Bound(ctx, 0)
		return rctx, cancel, false
	}
	rctx, cancel := context.WithDeadline(ctx, deadline)
	return rctx, cancel, true
}

// ended tells what ended a read that failed under rctx (see bound): the
// caller's ctx (its error), the wait budget (errBudget), or Redis (s, its
// error; the command timeout's included). Call it before cancelling rctx.
func (g *Guard) ended(ctx, rctx context.Context, budget bool, s stored) (stored, error) {
	switch {
	case passed(ctx):
		return stored{}, deadlineErr(ctx)
	case budget && passed(rctx):
		return stored{}, errBudget
	case passed(rctx):
		return stored{err: rcmd.ErrTimeout}, nil
	}
	return s, nil
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

// readMany reads the entries of values (field being their representation)
// in one round trip (see read), bounded as readOne's read is, on the caller's
// goroutine when the client honours context deadlines, else on a worker (the
// caller waiting for it at most until the bound).
func (g *Guard) readMany(ctx context.Context, values []string, field string, tags []string, deadline time.Time, out []stored) error {
	rctx, cancel, budget := g.bound(ctx, deadline)
	defer cancel()
	failed := func() error {
		s, err := g.ended(ctx, rctx, budget, stored{err: rctx.Err()})
		if err == nil {
			for i := range out {
				out[i] = s
			}
		}
		return err
	}
	if g.ctxDeadlines {
		g.read(rctx, values, field, tags, out)
		if passed(rctx) {
			return failed()
		}
		return nil
	}
	tmp := make([]stored, len(out))
	done := make(chan struct{})
	g.work.run(funcJob(func() {
		g.read(rctx, values, field, tags, tmp)
		close(done)
	}))
	select {
	case <-done:
		copy(out, tmp)
		return nil
	case <-rctx.Done():
		return failed()
	}
}
