package cacheguard

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cacheguard/cacheguard/internal/counter"
	"github.com/cacheguard/cacheguard/internal/rcmd"
	"github.com/cacheguard/cacheguard/internal/rid"
)

// errFlightExpired ends a flight whose starter's wait budget ran out while it
// was waiting for another process's fill (a flight that loads runs on), or
// one that turned unfit before its load began (see fill): a call that finds
// it joins another flight.
var errFlightExpired = errors.New("cacheguard: flight expired")

// subscribeTimeout bounds waiting for the wake-up subscription; without it a
// flight still works, woken by the lease's expiry instead of a push.
const subscribeTimeout = time.Second

// followCheck bounds how long a flight waiting for another process's fill
// sleeps between two asks (the get-or-lease script): the holder's push never
// arrives when Redis stalls meanwhile (the holder cannot store either), and
// the next ask, bounded by the command timeout, then finds Redis silent and
// fails open — within this and a command timeout of the stall's start, not
// at the end of the holder's lease.
const followCheck = time.Second

// outcome is what a flight gives every caller sharing it.
type outcome struct {
	leader uint64 // the call that started the flight
	loaded bool   // the flight ran the loader
	val    any    // a T (flights are kept apart by type), or nil
	err    error
	// env is the header of val — the generation and tag versions it was
	// loaded under, its times — for judge; nil for a load without the lease.
	env    *envelope
	stored bool // val is in Redis as env says: it may enter the near cache
	// current: the fill's store or release found the generation its lease
	// was granted under, after every call that waits for it arrived (see
	// call.awaitFill).
	current bool
}

// flights are the misses of a process, one group task per flight: the calls
// of the process that miss an entry meanwhile share its flight when what it
// returns may be served to them (see admit).
type flights struct {
	group[entry, *outcome]
	// serial counts the flights created, running those not ended. Both
	// change under the group's mu (running first), and are read without it
	// by mark.
	serial  atomic.Uint64
	running atomic.Int64
	joined  atomic.Int64 // calls that joined a flight another call leads (tests)
	open    atomic.Int64 // flights whose store is open (see filling): a hit reads it alone
}

// mark returns what a read of e must carry for the calls sharing it to
// choose a flight (see admit): the serial of the last flight created, and
// whether a flight of e runs (then the read fetches the generation too).
func (fs *flights) mark(e entry) (serial uint64, busy bool) {
	serial = fs.serial.Load()
	if fs.running.Load() == 0 {
		return serial, false
	}
	fs.mu.Lock()
	busy = fs.m[e].out > 0
	fs.mu.Unlock()
	return serial, busy
}

// admit decides whether a call of type typ whose read found s may take what
// flight t returns. A flight created after that read (serial above s.mark)
// sends its scripts after it, so all it can return was loaded under the
// generation the call would have read, or a later one; a flight created
// before the read was sent was running then, so the read fetched the
// generation (s.gen; counter.Unknown when absent, which no floor reaches),
// and the call takes such a flight only if its floor is at least that. A flight that has not heard from Redis yet
// (its floor below s.gen) is held: the caller waits for its first answer
// (the flight may then have seen s.gen, typically the one its own script
// created) and asks again — so that callers that miss together share one
// flight.
func admit(s *stored, typ reflect.Type) func(*task[entry, *outcome]) admission {
	return func(t *task[entry, *outcome]) admission {
		switch {
		case t.shut.Load() || t.typ != typ:
			return skip
		case serves(s, t):
			return take
		}
		select {
		case <-t.asked:
			return skip
		default:
			return hold
		}
	}
}

// serves reports whether what flight t returns may serve a call whose read
// found s (see admit): read-your-writes after an invalidation rests on it.
func serves(s *stored, t *task[entry, *outcome]) bool {
	return t.serial > s.mark || t.floor.Load() >= s.gen
}

// taking returns the flight of e running now that a call of type typ whose
// read found s would take (see admit), if any.
func (fs *flights) taking(e entry, s *stored, typ reflect.Type) *task[entry, *outcome] {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	ok := admit(s, typ)
	for _, t := range fs.m[e].running {
		if ok(t) == take {
			return t
		}
	}
	return nil
}

// filling returns the flight of e of type typ that holds the fill lease for
// a miss and has not sent its store yet, if any. Its caller checks fs.open
// first: early refreshes run often, and a hit takes no lock for them.
func (fs *flights) filling(e entry, typ reflect.Type) *task[entry, *outcome] {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	for _, t := range fs.m[e].running {
		if t.typ == typ && t.fill.Load() == storeOpen {
			return t
		}
	}
	return nil
}

// invalidated marks the flights of the values hash values unfit (see
// unfitLocked): an Invalidate of their key in this process returned.
func (fs *flights) invalidated(values string) {
	if fs.running.Load() == 0 {
		return
	}
	fs.mu.Lock()
	defer fs.mu.Unlock()
	for e, l := range fs.m {
		if e.values == values {
			for _, t := range l.running {
				fs.unfitLocked(t)
			}
		}
	}
}

// unfit marks flight t unfit (see unfitLocked): a renewal found its lease
// lost — another process invalidated its key, or the lease expired.
func (fs *flights) unfit(t *task[entry, *outcome]) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	fs.unfitLocked(t)
}

// unfitLocked marks flight t, holding the fill lease for a miss and its
// store not sent yet, as unable to store when that lease is void, for good:
// it takes no new callers, the calls that begin from now on read rather than
// wait for its store, and every call waiting for it — whether it arrived
// during the fill (call.awaitFill), joined it after a read (call.wait) or
// shares a read chained to it (see chain) — stops waiting and joins a flight
// begun after. Waiting for it would be correct (its outcome is not current),
// but would cost a call the rest of a load that stores nothing — up to its
// wait budget, when the load stalls — while the key may have been filled
// elsewhere. A flight that does not hold the lease yet will load under the
// generation its lease is granted under, and one whose store was sent may
// have stored: their callers go on waiting. The only rule for when a call
// stops waiting for its process's fill; call with fs.mu held.
func (fs *flights) unfitLocked(t *task[entry, *outcome]) {
	if from, ok := fs.setStore(t, storeStale); ok && from == storeOpen {
		t.shut.Store(true)
		t.unfitAt = fs.serial.Load()
		close(t.unfit)
	}
}

// setStore moves t's store to state to (see task.fill), keeping fs.open:
// storeOpen only from storeNone, storeNone only from storeOpen, storeStale
// from either, for good. It reports the state it left and whether it moved.
func (fs *flights) setStore(t *task[entry, *outcome], to int32) (from int32, moved bool) {
	for {
		cur := t.fill.Load()
		if cur == to || cur == storeStale || to == storeOpen && cur != storeNone {
			return cur, false
		}
		if t.fill.CompareAndSwap(cur, to) {
			switch {
			case to == storeOpen:
				fs.open.Add(1)
			case cur == storeOpen:
				fs.open.Add(-1)
			}
			return cur, true
		}
	}
}

// join returns a flight of e that admit takes, or a new one (leader) of
// type typ and floor (the generation its starter read; an unknown one is no
// floor) that the caller must run and end with finish; see group.join.
func (fs *flights) join(e entry, typ reflect.Type, floor int64, admit func(*task[entry, *outcome]) admission) (t *task[entry, *outcome], leader, pending bool) {
	if floor == counter.Unknown {
		floor = 0
	}
	t, leader, pending = fs.group.join(e, admit, func(t *task[entry, *outcome]) {
		fs.running.Add(1)
		t.typ, t.serial, t.asked, t.unfit = typ, fs.serial.Add(1), make(chan struct{}), make(chan struct{})
		t.floor.Store(floor)
	})
	if t != nil && !leader {
		fs.joined.Add(1)
	}
	return t, leader, pending
}

// chain makes the callers of r, a read that found the entry absent (see
// Guard.endRead), wake when flight t ends, with t to serve them: they wait
// for one wake-up, not one for the read and one for the flight. (Should t
// turn unfit, the call that chained them joins a new flight and chains them
// to that: see call.join.)
func (fs *flights) chain(t *task[entry, *outcome], r *task[entry, stored]) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if t.settled.Load() { // ended
		r.settle(t)
		return
	}
	t.then = append(t.then, func() { r.settle(t) })
}

// finish ends a flight with o.
func (fs *flights) finish(f *flight, o *outcome) {
	if !f.ended {
		f.ended = true
		fs.end(f.t.key, f.t, o)
		fs.running.Add(-1)
	}
}

// flight is the state of one running flight that its goroutine keeps: the
// key, its names, and what the call that started it knew.
type flight struct {
	t        *task[entry, *outcome]
	key      string
	n        names
	id       uint64    // the call that started it
	force    bool      // the stored value is unreadable: replace it even if its header says fresh
	after    int64     // take a stored value fresh until later than this (unix ms; 0: now)
	fallback *envelope // an older value that may stand in for a failed load (see judge)
	near     nearTicket
	lease    lease // once granted
	ended    bool
}

// fly runs fs, new flights this call started, on a goroutine that Close
// cancels and waits for, detached from the callers (one who gives up does
// not end a load the others share): one get-or-lease round trip for all of
// them, one load of the keys whose leases it got, and for the others a wait
// for their holders' pushes.
func (c *call[T]) fly(ctx context.Context, fs []*flight, deadline time.Time, kind fillKind) {
	g := c.g
	ctx, done, ok := g.track(context.WithoutCancel(ctx))
	if !ok {
		for _, f := range fs {
			g.flights.finish(f, &outcome{leader: f.id, err: ErrClosed})
		}
		return
	}
	go func() {
		defer done()
		var wg sync.WaitGroup // the flights that wait for another process's fill
		defer c.unfinished(fs)
		defer wg.Wait() // first: unfinished may end only flights nobody follows
		wctx, cancel := context.WithDeadline(ctx, deadline)
		defer cancel()
		rs, tagVers, sent, tok, err := g.lease(wctx, fs, rid.New(), &c.cfg)
		for i, f := range fs {
			if err == nil {
				f.t.saw(rs[i].gen)
				g.near.seen(f.key, rs[i].gen)
				f.t.elsewhere.Store(!rs[i].granted && !rs[i].fresh)
			}
			f.t.answered()
		}
		if err != nil {
			c.leaseFailed(ctx, wctx, fs, tok, err)
			return
		}
		var mine []*flight
		for i, f := range fs {
			switch r := rs[i]; {
			case r.granted:
				f.lease = lease{gen: r.gen, token: tok}
				mine = append(mine, f)
			case r.fresh && c.remote(ctx, f, r.value, tagVers):
			case len(fs) == 1:
				c.follow(ctx, wctx, f, tok, kind)
			default:
				wg.Go(func() {
					defer c.unfinished([]*flight{f})
					c.follow(ctx, wctx, f, tok, kind)
				})
			}
		}
		if len(mine) > 0 {
			c.fill(ctx, mine, tagVers, kind, sent)
		}
	}()
}

// unfinished ends the flights of fs that have no outcome yet, when a codec
// or an observer panicked on the way.
func (c *call[T]) unfinished(fs []*flight) {
	p := recover()
	for _, f := range fs {
		if !f.ended {
			err := error(ErrClosed)
			if p != nil {
				err = newPanicError(p)
			}
			c.g.flights.finish(f, &outcome{leader: f.id, err: err})
		}
	}
}

// leaseFailed ends flights whose get-or-lease round trip (made with tok)
// failed: Close stopped them, or their starter's budget ended, or Redis
// failed (then they fail open, or closed). A round trip that timed out or
// broke (rcmd.Runner.MayHaveRun) may have run in Redis, or may run when it resumes,
// and granted leases nobody fills: they are given back (see giveBack) while
// the flights fail open.
func (c *call[T]) leaseFailed(ctx, wctx context.Context, fs []*flight, tok string, err error) {
	if c.g.cmd.MayHaveRun(err) || passed(wctx) {
		c.g.giveBack(ctx, fs, tok, time.Now().Add(rcmd.CleanupHorizon))
	}
	switch {
	case ctx.Err() != nil:
		err = ErrClosed
	case passed(wctx): // its budget ended, whether or not Redis failed too
		err = errFlightExpired
	default:
		c.g.redisFailed(ctx, fs[0].key, err) // ctx has not ended: counted
		for i, o := range c.loadUnleased(ctx, keysOf(fs), fs[0].id, time.Now().Add(c.cfg.wait), err) {
			o.leader = fs[i].id
			c.g.flights.finish(fs[i], o)
		}
		return
	}
	for _, f := range fs {
		c.g.flights.finish(f, &outcome{leader: f.id, err: err})
	}
}

// follow waits for another fill of f's entry: it subscribes to the key's
// wake-up channel, asks again (a push sent before the subscription was
// confirmed would be missed, but its value is then in Redis), and sleeps
// until the holder's push or a little past its lease (it may die without a
// word), and asks again — taking the lease over, and loading, once it is
// free. (The flight that gets the lease never subscribes: it is everyone's
// critical path, and only waiters need the push.)
func (c *call[T]) follow(ctx, wctx context.Context, f *flight, tok string, kind fillKind) {
	g := c.g
	var wakeC <-chan string
	sctx, scancel := context.WithTimeout(wctx, subscribeTimeout)
	sub, err := g.hub.Subscribe(sctx, f.n.wake)
	scancel()
	if err == nil {
		defer sub.Close()
		wakeC = sub.C()
	}
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	fl := []*flight{f}
	for {
		rs, tagVers, sent, used, err := g.lease(wctx, fl, tok, &c.cfg)
		if tok = used; err != nil {
			c.leaseFailed(ctx, wctx, fl, tok, err)
			return
		}
		r := rs[0]
		f.t.saw(r.gen)
		g.near.seen(f.key, r.gen)
		switch {
		case r.granted:
			f.lease = lease{gen: r.gen, token: tok}
			c.fill(ctx, fl, tagVers, kind, sent)
			return
		case r.fresh && c.remote(ctx, f, r.value, tagVers):
			return
		case r.fresh:
			continue // unreadable or refused: f.force is set
		}
		d := r.pttl + time.Millisecond
		timer.Reset(min(d+rand.N(d/10+1), followCheck))
		select {
		case m := <-wakeC:
			if c.fromWake(ctx, f, m, lease{gen: r.gen, token: r.holder}.String(), tagVers) {
				return
			}
		case <-timer.C:
		case <-wctx.Done():
			err := errFlightExpired
			if ctx.Err() != nil {
				err = ErrClosed
			}
			g.flights.finish(f, &outcome{leader: f.id, err: err})
			return
		}
	}
}

// remote ends f with an envelope another caller stored, read from Redis or
// pushed, when judge serves it under the tags' versions read (tagVers); else
// it reports false, with f.force set when the value must be replaced
// (unreadable, or loaded before a tag invalidation).
func (c *call[T]) remote(ctx context.Context, f *flight, b []byte, tagVers []uint64) bool {
	g := c.g
	env, v, verdict := c.decode(ctx, f.key, b, &view{now: time.Now().UnixMilli(), tags: tagVers})
	if verdict == refused {
		f.force = true
	}
	if verdict != fresh && verdict != failSafe {
		return false // else already old: ask Redis
	}
	o := &outcome{leader: f.id, env: &env, stored: !env.failSafe}
	g.note(ctx, EventCoalescedRemote, f.key, 0, nil)
	if env.negative {
		g.note(ctx, EventNegativeHit, f.key, 0, nil)
		o.err = notFound(f.key)
	} else {
		o.val = v
	}
	env.payload = nil
	if o.stored && o.err == nil && g.near != nil {
		g.near.put(f.near, f.key, c.nearID(), c.cfg.tags.list(), o.val, &env, false)
	}
	g.flights.finish(f, o)
	return true
}

// fromWake handles a push on the key's channel (shared by every
// representation of the key), each naming a lease ("<generation> <token>",
// as the lease holds it): 'v'+lease+' '+envelope (its fill stored it),
// 'e'+lease+' '+message (the fill's load failed: ErrRemoteLoad),
// 'p'+lease+' '+value (it panicked: ErrRemoteLoad and a *PanicError),
// 'u'+lease+' '+message (its answer is not to be cached: ErrUncached, not a
// failure), 'n'+lease+' ' (the load found nothing and negative caching is
// off), 'h'+token+' ' (a closing Guard handed its fill over, or a request's
// lease was given back: take the lease now), 'x' (invalidated). A kind it
// does not know (a newer process's) makes the flight ask again, as 'h' does:
// the lease may be free. Only a push naming holding, the lease this flight
// saw, is trusted — its generation with its token: a push from an earlier
// fill can arrive after an invalidation that came later (the subscription may
// predate this flight), and one token can hold the lease again under the
// later generation (a request Redis ran twice: resent after a stall, retried
// by the client, stuck on the wire) with nobody to fill it; that fill's push
// names the same token (TestLatePushOfAnEarlierLeaseIsNotTrusted). It
// reports whether it ended f; else the flight asks again.
func (c *call[T]) fromWake(ctx context.Context, f *flight, m, holding string, tagVers []uint64) bool {
	if m == "" || m[0] == 'x' {
		return false
	}
	named, body, ok := cutLease(m[1:])
	if !ok || named != holding {
		return false
	}
	switch m[0] {
	case 'v':
		return len(body) >= envHeaderLen && c.remote(ctx, f, []byte(body), tagVers)
	case 'e':
		c.g.flights.finish(f, &outcome{leader: f.id, err: fmt.Errorf("%w: %q: %s", ErrRemoteLoad, f.key, body)})
		return true
	case 'p':
		c.g.flights.finish(f, &outcome{leader: f.id, err: fmt.Errorf("%w: %q: %w", ErrRemoteLoad, f.key, &PanicError{Value: body})})
		return true
	case 'u':
		c.g.flights.finish(f, &outcome{leader: f.id, err: fmt.Errorf("%w: %q, in another process: %s", ErrUncached, f.key, body)})
		return true
	case 'n':
		c.g.flights.finish(f, &outcome{leader: f.id, err: notFound(f.key)})
		return true
	}
	return false
}

// cutLease cuts s, a push after its kind, after the lease it names
// ("<generation> <token>") and the space that follows.
func cutLease(s string) (lease, rest string, ok bool) {
	gen, after, ok := strings.Cut(s, " ")
	if !ok {
		return "", "", false
	}
	tok, rest, ok := strings.Cut(after, " ")
	return s[:len(gen)+1+len(tok)], rest, ok
}
