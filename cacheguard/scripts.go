package cacheguard

import (
	"context"
	"embed"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/internal/counter"
	"github.com/cacheguard/cacheguard/internal/rcmd"
	"github.com/cacheguard/cacheguard/internal/rid"
	"github.com/cacheguard/cacheguard/internal/slot"
)

//go:embed *.lua
var lua embed.FS

// script reads an embedded .lua file into a Script; with counters, after the
// counter functions (see internal/counter).
func script(name string, counters bool) *rcmd.Script {
	src, err := lua.ReadFile(name)
	if err != nil {
		panic(err)
	}
	if counters {
		return rcmd.NewScript(counter.Script(string(src)))
	}
	return rcmd.NewScript(string(src))
}

var (
	leaseScript      = script("lease.lua", true).Grant() // go-redis never sends a lease request again on its own (see rcmd.Script.Grant)
	fillScript       = script("fill.lua", false)
	releaseScript    = script("release.lua", false)
	renewScript      = script("renew.lua", false)
	invalidateScript = script("invalidate.lua", true)
	tagReadScript    = script("tagread.lua", true)
	tagBumpScript    = script("tagbump.lua", true)
	genPeekScript    = script("genpeek.lua", true)
)

// Every Redis command goes through the Guard's rcmd.Runner (g.cmd): bounded
// on its own by the command timeout (besides a call's wait budget), every
// script sent as EVALSHA, alone or in a pipeline.

// keys boxes Redis key names for a script call.
func keys(names ...string) []any {
	kv := make([]any, len(names))
	for i, n := range names {
		kv[i] = n
	}
	return kv
}

// genTTL is the shortest life of a key's generation in Redis: a generation
// created by a miss or an invalidation lives at least this long, and as long
// as every lease granted and value stored under it. One that expired or was
// lost reads as unknown (internal/counter) and comes back later than every
// value it had. It costs one small key per cache key invalidated or filled,
// for at most this long past its last value.
const genTTL = time.Minute

// never is the "after" of a get-or-lease for a value that cannot be used:
// no value is fresh until later (maxTime, see envelope.go).
const never = "9007199254740991"

// leaseReply is the get-or-lease script's answer for one key.
type leaseReply struct {
	fresh   bool          // value is fresh enough
	value   []byte        // the envelope, when fresh
	granted bool          // the fill lease is this caller's
	pttl    time.Duration // the other holder's remaining lease
	holder  string        // the other holder's token
	gen     int64         // the key's generation
}

// lease is a fill lease as stored: the generation it was granted under and
// the holder's token.
type lease struct {
	gen   int64
	token string
}

func (l lease) String() string  { return l.genText() + " " + l.token }
func (l lease) genText() string { return strconv.FormatInt(l.gen, 10) }

// lease runs the get-or-lease script for the entries of fs in one round
// trip — one script call per hash slot (one in all on a single server) — and
// reads, in the same round trip, the versions of the call's tags as a fill
// records them (creating the absent ones): read before any load the replies
// grant begins. A request is sent once (leaseScript is a grant: go-redis
// never sends it again) and asked again, when at all, under a new token,
// after the give-back of the token asked under before, in the same round
// trip (see leaseOnce): Redis then ends whatever the earlier request took —
// now, or, with its tombstone, when that request arrives later — before it
// answers the new one, so a lease is never held by a token nobody fills,
// and the new request never finds the lease held by its own earlier token.
// It asks again when the command timeout ended a round trip while this
// process, not Redis, was slow (rcmd.Busy) — failing open would cost a load
// — until it is answered, times out with Redis silent, or ctx ends; and when
// a lease granted ran out on the local clock at the send of the round trip
// that was granted it plus the lease (config.spent): never loaded under
// (Redis may already have let another process take the fill over). lease
// returns the token the replies are for, and the send (sent) that the
// leases they grant run from.
func (g *Guard) lease(ctx context.Context, fs []*flight, tok string, cfg *config) (rs []leaseReply, vers []uint64, sent time.Time, used string, err error) {
	back := "" // the token asked under before, given back ahead of the next ask
	for {
		sent = time.Now()
		rs, vers, err = g.leaseOnce(ctx, fs, tok, back, cfg)
		switch {
		case err == nil && cfg.spent(sent) && slices.ContainsFunc(rs, func(r leaseReply) bool { return r.granted }):
		case rcmd.Busy(err):
		default:
			return rs, vers, sent, tok, err
		}
		back, tok = tok, rid.New()
		if passed(ctx) {
			g.giveBack(ctx, fs, back, time.Now().Add(rcmd.CleanupHorizon))
			return nil, nil, sent, tok, deadlineErr(ctx)
		}
	}
}

// giveBackCmd is the give-back of what tok may hold of f's entry, or may
// take later (see giveBack).
func (g *Guard) giveBackCmd(ctx context.Context, f *flight, tok string) *redis.Cmd {
	return releaseScript.Cmd(ctx, keys(f.n.lease, g.goneKey(f.n)), "*"+tok, f.n.wake, g.pub, "h"+tok+" ", rcmd.CleanupHorizon.Milliseconds())
}

// leaseOnce is one round trip of lease; back, when not "", is a token to give
// back for every entry of fs first, in the same pipeline (given back on a
// task of its own, see giveBack, when Redis did not answer those).
func (g *Guard) leaseOnce(ctx context.Context, fs []*flight, tok, back string, cfg *config) ([]leaseReply, []uint64, error) {
	groups := map[int][]int{}
	for i, f := range fs {
		s := 0
		if g.hub.Sharded() {
			s = slot.Of(f.n.gen)
		}
		groups[s] = append(groups[s], i)
	}
	now := strconv.FormatInt(time.Now().UnixMilli(), 10)
	var cmds []redis.Cmder
	if back != "" {
		for _, f := range fs {
			cmds = append(cmds, g.giveBackCmd(ctx, f, back))
		}
	}
	type call struct {
		cmd *redis.Cmd
		idx []int
	}
	calls := make([]call, 0, len(groups))
	for _, idx := range groups {
		kv := make([]any, 0, 4*len(idx))
		args := []any{tok, cfg.lease.Milliseconds(), genTTL.Milliseconds()}
		for _, i := range idx {
			f := fs[i]
			after := now
			switch {
			case f.force:
				after = never
			case f.after > 0:
				after = strconv.FormatInt(f.after, 10)
			}
			kv = append(kv, f.n.values, f.n.lease, f.n.gen, g.goneKey(f.n))
			args = append(args, f.n.field, after)
		}
		c := call{leaseScript.Cmd(ctx, kv, args...), idx}
		calls, cmds = append(calls, c), append(cmds, c.cmd)
	}
	tags := cfg.tags.list()
	tv := make([]*redis.Cmd, len(tags))
	for i, t := range tags {
		// A tag's version outlives every value read under it: keep with a
		// load as long as the TTL is the longest (the grace at its cap).
		tv[i] = tagReadScript.Cmd(ctx, keys(g.name("t:", t)), max(cfg.keep(cfg.ttl, cfg.ttl).Milliseconds(), genTTL.Milliseconds()))
		cmds = append(cmds, tv[i])
	}
	g.cmd.Exec(ctx, nil, cmds, 0, false)
	if back != "" && slices.ContainsFunc(cmds[:len(fs)], func(c redis.Cmder) bool { return c.Err() != nil }) {
		g.giveBack(ctx, fs, back, time.Now().Add(rcmd.CleanupHorizon))
	}
	rs := make([]leaseReply, len(fs))
	for _, c := range calls {
		replies, err := c.cmd.Slice()
		if err != nil {
			return nil, nil, err
		}
		if len(replies) != len(c.idx) {
			return nil, nil, fmt.Errorf("cacheguard: %d get-or-lease replies for %d keys", len(replies), len(c.idx))
		}
		for j, r := range replies {
			v, _ := r.([]any)
			if rs[c.idx[j]], err = parseLeaseReply(v); err != nil {
				return nil, nil, err
			}
		}
	}
	vers, err := versions(tv)
	if err != nil {
		return nil, nil, err
	}
	return rs, vers, nil
}

// parseLeaseReply reads one key's reply of the get-or-lease script: its
// status, what goes with it, and the key's generation last.
func parseLeaseReply(v []any) (r leaseReply, err error) {
	var status int64 = -1
	if len(v) >= 2 {
		status, _ = v[0].(int64)
		s, _ := v[len(v)-1].(string)
		if r.gen, err = strconv.ParseInt(s, 10, 64); err != nil {
			r.gen = 0
		}
	}
	switch {
	case r.gen <= 0:
	case status == 0 && len(v) == 3:
		s, _ := v[1].(string)
		r.fresh, r.value = true, []byte(s)
		return r, nil
	case status == 1 && len(v) == 2:
		r.granted = true
		return r, nil
	case status == 2 && len(v) == 4:
		pttl, _ := v[1].(int64)
		r.pttl = time.Duration(pttl) * time.Millisecond
		r.holder, _ = v[2].(string)
		return r, nil
	}
	return leaseReply{}, fmt.Errorf("cacheguard: unexpected get-or-lease reply %v", v)
}

// store returns the write of env, an envelope of f's entry loaded under f's
// lease, with the lease's compare-and-set: it releases the lease and
// publishes the envelope to the waiters and the news to the near caches. Its
// reply is 1 when it wrote.
func (g *Guard) store(ctx context.Context, f *flight, env []byte, ttl time.Duration) *redis.Cmd {
	return fillScript.Cmd(ctx, keys(f.n.values, f.n.lease, f.n.gen),
		f.lease.String(), env, max(ttl.Milliseconds(), 1), f.n.wake, g.pub, f.lease.genText(), f.n.field,
		time.Now().UnixMilli(), g.ncChannel, g.origin+" f"+f.key)
}

// release returns the release of f's lease, telling its waiters why with
// msg: its kind ('e' failed, 'n' not found, 'h' handed over) followed by
// what it says, naming the lease (see call.fromWake).
func (g *Guard) release(ctx context.Context, f *flight, msg string) *redis.Cmd {
	return releaseScript.Cmd(ctx, keys(f.n.lease, f.n.gen), f.lease.String(), f.n.wake, g.pub, msg[:1]+f.lease.String()+" "+msg[1:])
}

// giveBackEvery is how often giveBack asks a silent Redis again.
const giveBackEvery = 100 * time.Millisecond

// giveBack releases, on a task of its own (see every), the fill leases of fs
// that tok may hold unbeknown to its caller (the get-or-lease round trip
// ended unanswered, but Redis may run it), telling their waiters to take the
// fill over at once ('h') rather than wait for the lease's expiry: every
// giveBackEvery until Redis answers, until passes (rcmd.CleanupHorizon: a
// request written into a stall runs when Redis resumes, however long the
// stall, and takes its lease from then), or Close. tok stays refused for
// rcmd.CleanupHorizon from then (see release.lua): not only for the lease
// its request asked for, since that request may reach Redis later than that.
func (g *Guard) giveBack(ctx context.Context, fs []*flight, tok string, until time.Time) {
	release := func(ctx context.Context, f *flight) redis.Cmder { return g.giveBackCmd(ctx, f, tok) }
	unanswered := func(_ *flight, c redis.Cmder) bool { return c.Err() != nil }
	g.every(ctx, fs, giveBackEvery, 0, until, false, release, unanswered)
}

// every sends, on a goroutine of the Guard's (Close waits for it), one
// pipeline of cmd(f) for the flights of fs every period — the first after
// first (at once when not positive) — keeping for the next the flights for
// which keep(f, its command) holds, until none is left, the deadline passes,
// stop is called (once or more), or — unless pastClose — the Guard closes.
// A tick that comes as stop is called sends nothing. Nothing runs before
// first has passed: no goroutine, ticker or deadline exists until then, so a
// fill whose load ends sooner (most: the renewals come every third of the
// lease) costs a timer and no goroutine of its own. It reports ok false,
// starting nothing, when the Guard is closed and ctx is no task's (see
// track). It is the one loop of the fill leases' renewals and give-backs.
func (g *Guard) every(ctx context.Context, fs []*flight, period, first time.Duration, deadline time.Time, pastClose bool,
	cmd func(context.Context, *flight) redis.Cmder, keep func(*flight, redis.Cmder) bool) (stop func(), ok bool) {
	tctx, done, ok := g.track(context.WithoutCancel(ctx))
	if !ok {
		return nil, false
	}
	quit := make(chan struct{})
	live := append([]*flight(nil), fs...)
	loop := func() {
		defer done()
		select {
		case <-quit: // stopped as the first tick came: nothing sent
			return
		default:
		}
		parent := tctx
		if pastClose {
			parent = context.WithoutCancel(tctx) // still a task Shutdown waits for
		}
		rctx, cancel := context.WithDeadline(parent, deadline)
		defer cancel()
		if rctx.Err() != nil { // the deadline came first, or Close
			return
		}
		t := time.NewTicker(period)
		defer t.Stop()
		for wait := false; len(live) > 0; wait = true {
			if wait {
				select {
				case <-quit:
					return
				case <-rctx.Done():
					return
				case <-t.C:
				}
				select {
				case <-quit: // stopped as the tick came: nothing sent
					return
				default:
				}
			}
			cmds := make([]redis.Cmder, len(live))
			for i, f := range live {
				cmds[i] = cmd(rctx, f)
			}
			g.cmd.Exec(rctx, nil, cmds, 0, false)
			kept := live[:0]
			for i, f := range live {
				if keep(f, cmds[i]) {
					kept = append(kept, f)
				}
			}
			live = kept
		}
	}
	if first <= 0 {
		go loop()
		return sync.OnceFunc(func() { close(quit) }), true
	}
	timer := time.AfterFunc(first, loop)
	return sync.OnceFunc(func() {
		if timer.Stop() {
			done() // the loop never ran, and never will
			return
		}
		close(quit) // the loop runs, or is about to: it ends and calls done
	}), true
}
