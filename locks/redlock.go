package locks

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/internal/isnil"
	"github.com/cacheguard/cacheguard/internal/rcmd"
	"github.com/cacheguard/cacheguard/internal/rid"
	"github.com/cacheguard/cacheguard/internal/slot"
)

var (
	//go:embed redlock_acquire.lua
	redlockAcquireLua string
	//go:embed redlock_release.lua
	redlockReleaseLua string
	//go:embed redlock_extend.lua
	redlockExtendLua string

	redlockAcquireS = newGrant(redlockAcquireLua)
	redlockReleaseS = newScript(redlockReleaseLua)
	redlockExtendS  = newScript(redlockExtendLua)
)

var _ Locker = (*Redlock)(nil)

// Redlock takes locks on N independent Redis servers (masters without
// replicas, not a cluster) with the Redlock algorithm: a lock is held when a
// quorum of N/2+1 servers granted it within its validity. Any single server
// can crash, stall or be partitioned without stopping the locks, and without
// letting two holders in, as long as no server loses its keys while a lock is
// held (see "Restarts"). It is safe for concurrent use; Close stops its
// background work.
//
// One attempt sends the acquisition to every node at once, each with a
// timeout small against the lease (NodeTimeout), and measures the time
// taken on the local monotonic clock. The lock is granted when a quorum
// granted it and validity = lease − elapsed − drift is still positive, where
// drift = lease×1% + 2ms (Drift): Lock.TTL counts down that validity, not
// the lease. An attempt returns as soon as a quorum granted it (the other
// nodes' answers land just after). An attempt that fails, including one that
// reached a quorum too late (ErrNoValidity), is released on every node that
// did not refuse it, and Lock retries it after a random delay (between half
// and all of a tenth of the lease, capped at 250ms) until its wait budget or
// context ends. Failures are *RedlockError values that name the nodes that
// granted, refused and failed, and match
// ErrNotObtained. Renewal in the background and Lock.Extend also need a quorum
// within the remaining validity; Lost closes when a quorum can no longer be
// renewed in time. On a Redlock lock, Extend(ctx, d) makes d the new validity:
// the keys get d plus the drift allowance. Reentrancy by owner (WithOwner)
// works as on a Client: each acquisition is its own hold on every node, and a
// nested acquisition succeeds only when a quorum of nodes still has the
// owner's holding (ErrLost otherwise, as on a Client).
//
// Use an odd number of servers, 3 or 5. With an even N the quorum N/2+1 needs
// the same number of live servers as N+1 would, so the extra server adds
// cost and split votes without tolerating one more failure. A single server
// is accepted (quorum 1) but is only as available as that server.
//
// Fence tokens: independent servers keep independent counters, and a token
// built from them (say, the largest among the granting servers) does not
// increase across holders once a server has restarted or clocks disagree, so
// it would look safe without being so. Redlock therefore issues no tokens:
// Lock.Fence returns 0 for its locks. When
// the protected resource must refuse a holder that was paused past its
// validity, use a Client, whose tokens increase strictly.
//
// Restarts: a server that restarts empty right away forgets the locks it
// granted, and a second client can then assemble a quorum with it while the
// first still holds the lock. Run the servers with appendonly yes and
// appendfsync always, or keep a crashed server down for at least the longest
// lease in use before it rejoins.
//
// Clients: give each node's client ContextTimeoutEnabled: true, so that the
// per-node timeout also ends the socket wait (otherwise a stalled node's call
// is abandoned by the attempt and finishes on the client's ReadTimeout; Close
// waits for it), and small MaxRetries and DialerRetries, since retries have to
// fit in the per-node timeout anyway. The first call to a node also dials it:
// a node timeout shorter than a dial fails the first attempt. A node that did
// not answer in time may still apply the acquisition later; the attempt's
// release follows it, and at worst the stray grant expires with the lease.
type Redlock struct {
	nodes  []rlNode
	quorum int
	cfg    config
	ren    *renewer
	scopes scopes // owners' holdings in this process (WithOwner)
	life   life   // Close and Shutdown

	mu       sync.Mutex     // guards closed; orders inflight.Add before Close's Wait
	closed   bool           // closing finished: no more node calls
	inflight sync.WaitGroup // node calls still running, some abandoned by their caller
}

// NewRedlock returns a Redlock over clients, one per independent server, with
// the given defaults. Like New, it panics with a "locks:" message on
// programmer error, before any call to Redis: clients empty, a nil client or
// the same node twice (compared by address for a *redis.Client, by its seed
// addresses for a *redis.ClusterClient, by identity otherwise), or an invalid
// option. Messages name nodes by address (or "node<i>", by position, when the
// client does not expose one).
func NewRedlock(clients []redis.UniversalClient, opts ...Option) *Redlock {
	if len(clients) == 0 {
		panic("locks: NewRedlock needs at least one client")
	}
	cfg := defaults()
	if err := applyAll(&cfg, opts); err != nil {
		panic(err.Error())
	}
	if err := redlockValidate(&cfg); err != nil {
		panic(err.Error())
	}
	r := &Redlock{quorum: len(clients)/2 + 1, cfg: cfg}
	seen := map[string]int{}
	for i, c := range clients {
		if c == nil || isnil.Pointer(c) {
			panic(fmt.Sprintf("locks: Redlock client %d is nil", i))
		}
		name, id := nodeIdentity(i, c)
		if j, dup := seen[id]; dup {
			panic(fmt.Sprintf("locks: Redlock clients %d and %d are the same node %s", j, i, name))
		}
		seen[id] = i
		r.nodes = append(r.nodes, rlNode{name: name, rdb: c, b: newBatcher(rcmd.New(c, cfg.cmdTimeout))})
	}
	r.ren = newRenewer(r.renewBatch)
	r.life.init()
	return r
}

func redlockValidate(cfg *config) error {
	if err := cfg.validate(); err != nil {
		return err
	}
	switch {
	case cfg.fair:
		return invalid("Fair is not supported by Redlock")
	case cfg.replicas > 0:
		return invalid("Replicas is not supported by Redlock (its servers have no replicas)")
	case cfg.fenceRetention != 0:
		return invalid("FenceRetention is not supported by Redlock (it keeps no fence counters)")
	case rlSpan(cfg, cfg.lease) <= 0:
		return invalid("drift allowance %v leaves no validity in lease %v", rlDrift(cfg, cfg.lease), cfg.lease)
	}
	return nil
}

// Quorum returns how many nodes must grant a lock: N/2+1.
func (r *Redlock) Quorum() int { return r.quorum }

// Close closes the Redlock at once, as Client.Close does: new calls fail with
// ErrClosed, waiting Lock calls end with ErrClosed, a grant that arrives
// meanwhile is given back, the renewal loop stops and node calls still
// running are waited for. Locks still held stop being renewed and count as
// lost (their Lost channels close with ErrClosed); they expire on the servers
// when their lease ends. Close does not close the clients, and always
// returns nil.
func (r *Redlock) Close() error {
	r.life.hurryUp()
	_ = r.Shutdown(context.Background()) // held locks are reported through Lost and the observer
	return nil
}

// Shutdown closes the Redlock gracefully, as Client.Shutdown does: it ends
// waiting calls at once, keeps renewing the locks still held until they are
// all Unlocked or ctx ends, and reports those still held then (ErrStillHeld).
func (r *Redlock) Shutdown(ctx context.Context) error {
	return r.life.shutdown(ctx, r.ren.waitEmpty, func(ctx context.Context) {
		for _, n := range r.nodes {
			n.b.drain(ctx)
		}
	}, func() {
		r.mu.Lock()
		r.closed = true
		r.mu.Unlock()
		r.ren.close()
		r.inflight.Wait()
		for _, n := range r.nodes {
			n.b.close()
		}
	})
}

func (r *Redlock) renewer() *renewer { return r.ren }

// TryLock makes one attempt to take the lock name on a quorum of the nodes.
// On failure the error is a *RedlockError matching ErrNotObtained.
func (r *Redlock) TryLock(ctx context.Context, name string, opts ...CallOption) (*Lock, error) {
	cfg, err := r.callConfig(name, opts)
	if err != nil {
		return nil, err
	}
	return r.acquire(ctx, name, cfg, false)
}

// Lock takes the lock name on a quorum of the nodes, retrying failed attempts
// after a random delay until it is held, the wait budget ends (WaitBudget; 30s
// by default; no attempt is started that could not end within it) or ctx
// ends. On failure the error is the last attempt's *RedlockError, matching
// ErrNotObtained and, when ctx ended the wait, ctx's error.
func (r *Redlock) Lock(ctx context.Context, name string, opts ...CallOption) (*Lock, error) {
	cfg, err := r.callConfig(name, opts)
	if err != nil {
		return nil, err
	}
	return r.acquire(ctx, name, cfg, cfg.wait > 0)
}

func (r *Redlock) callConfig(name string, opts []CallOption) (*config, error) {
	if r == nil {
		return nil, invalid("nil Redlock")
	}
	if err := validName(name); err != nil {
		return nil, err
	}
	if len(opts) == 0 {
		return &r.cfg, nil
	}
	cfg := r.cfg
	if err := applyAll(&cfg, opts); err != nil {
		return nil, err
	}
	if err := redlockValidate(&cfg); err != nil {
		return nil, err
	}
	return &cfg, nil
}

// redlockKey is the lock's key on every node: a hash of the owner and one
// field per acquisition (see redlock_acquire.lua). It differs from a Client's
// key so that the two layouts never meet; its hash tag is a Client's (see keys).
func redlockKey(prefix, name string) string {
	tag, rest := slot.Tag(name)
	return prefix + "rlock:{" + tag + "}" + rest
}

func (r *Redlock) acquire(ctx context.Context, name string, cfg *config, wait bool) (*Lock, error) {
	start := time.Now()
	owner, _ := OwnerFrom(ctx)
	entered := r.life.enter(ctx, owner != "")
	if entered {
		defer r.life.leave()
	}
	closing := !entered || r.life.closed.Load()
	key := redlockKey(cfg.prefix, name)
	px := cfg.lease.Truncate(time.Millisecond)
	budgetEnd := start.Add(cfg.wait)
	if closing && owner == "" {
		e := r.opError("lock", name)
		e.Err = ErrClosed
		cfg.emit(ctx, Event{Kind: EventNotObtained, Name: name, Err: e})
		return nil, e
	}
	if err := ctx.Err(); err != nil {
		e := r.opError("lock", name)
		e.Err = err
		cfg.emit(ctx, Event{Kind: EventNotObtained, Name: name, Err: e})
		return nil, e
	}
	fail := func(e *RedlockError, attempts int) (*Lock, error) {
		e.Attempts, e.Waited = attempts, time.Since(start)
		if err := ctx.Err(); err != nil && !errors.Is(e.Err, err) {
			e.Err = errors.Join(e.Err, err)
		}
		cfg.emit(ctx, Event{Kind: EventNotObtained, Name: name, Wait: e.Waited, Err: e})
		return nil, e
	}
	// A nested acquisition (this owner's scope of the name has Locks not yet
	// Unlocked) may only re-enter that holding: it never waits for another
	// owner, retries (Lock only) an attempt that failing nodes kept from a
	// quorum, and fails with ErrLost when the holding is gone.
	scoped := owner != ""
	if !scoped {
		owner = rid.New()
	}
	var sc *scope
	var timer *time.Timer
	respun := false // a nested attempt spoiled by its holding's end was made again (see below)
	for attempt := 1; ; attempt++ {
		// The owner's attempts at the name in this process take turns, and
		// each learns its scope once it has the turn: two at once, reaching
		// the nodes in different orders, would each begin the holding on
		// some nodes and re-enter it on the others, and neither could tell
		// that it re-entered the other's (a Redlock holding has no fence).
		endTurn := func() {}
		if scoped {
			var err error
			if endTurn, err = r.scopes.turn(ctx, owner, name); err == nil {
				if sc, err = r.scopes.find(owner, name); err == nil && closing && sc == nil {
					err = ErrClosed // only a nested acquisition goes on while closing
				}
			}
			if err != nil {
				endTurn()
				e := r.opError("lock", name)
				e.Err = err
				return fail(e, attempt-1)
			}
		}
		h, reentered, e := r.attempt(ctx, name, key, owner, px, cfg, sc != nil)
		if h != nil {
			defer endTurn()
			giveBack := func(err error) (*Lock, error) {
				rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
				if _, rerr := r.release(rctx, h); rerr != nil {
					r.releaseInBackground(h, time.Time{}) // once more; at worst the keys expire with the lease
				}
				cancel()
				e = r.opError("lock", name)
				e.Err = err
				return fail(e, attempt)
			}
			if r.life.closed.Load() && !(scoped && r.scopes.held(owner, name)) {
				return giveBack(ErrClosed) // closing: only a nested acquisition goes on
			}
			if scoped {
				if err := r.scopes.join(h, owner, reentered); err != nil {
					return giveBack(err)
				}
			}
			if !r.ren.add(h) {
				if h.sc != nil {
					h.sc.leave(h)
				}
				return giveBack(ErrClosed)
			}
			kind := EventAcquired
			if reentered {
				kind = EventReentered
			}
			cfg.emit(ctx, Event{Kind: kind, Name: name, Wait: time.Since(start)})
			return &Lock{h: h, parent: ctx}, nil
		}
		endTurn()
		if sc != nil && !r.scopes.current(sc) && !respun {
			// The owner's holding was Unlocked during this nested attempt,
			// which counted re-entries only: its refusal says nothing of
			// other owners. Once more at once, as a fresh acquisition (a
			// TryLock too: nobody else may hold the name).
			respun = true
			continue
		}
		if errors.Is(e.Err, ErrLost) {
			if r.scopes.current(sc) {
				r.scopes.lose(sc, ErrLost)
				return fail(e, attempt)
			}
			e.Err = nil // the scope ended meanwhile: an ordinary refusal
		}
		// A nested attempt never waits for another owner (none can hold the
		// name while the owner's holding lasts, and a holding found gone
		// returned ErrLost above), but like any Lock it tries again when
		// failing nodes kept it from a quorum.
		if !wait || ctx.Err() != nil || (sc != nil && !errors.Is(e, ErrUnavailable)) {
			return fail(e, attempt)
		}
		if r.life.closed.Load() {
			e.Err = errors.Join(e.Err, ErrClosed)
			return fail(e, attempt)
		}
		// Retry after a random delay, if another attempt (acquisition plus
		// release, each bounded by the node timeout) still fits in the budget.
		now := time.Now()
		latest := budgetEnd.Add(-2 * rlNodeTimeout(cfg, px))
		if !now.Before(latest) {
			return fail(e, attempt)
		}
		delay := min(rlRetryDelay(cfg), latest.Sub(now))
		if timer == nil {
			timer = time.NewTimer(delay)
			defer timer.Stop()
		} else {
			timer.Reset(delay)
		}
		select {
		case <-timer.C:
		case <-ctx.Done():
			return fail(e, attempt)
		case <-r.life.closing.Done():
			e.Err = errors.Join(e.Err, ErrClosed)
			return fail(e, attempt)
		}
	}
}

// attempt runs one round of the algorithm: acquire on every node at once,
// count the grants, check the validity left, and on failure release on every
// node. It returns the holding (not yet registered with the renewer) and
// whether a quorum of nodes granted it as a re-entry of the owner's holding,
// or the nodes' answers. A nested attempt (the owner's scope of the name is
// held in this process) succeeds only as such a re-entry, and fails with
// ErrLost when too few nodes can still have the owner's holding.
func (r *Redlock) attempt(ctx context.Context, name, key, owner string, px time.Duration, cfg *config, nested bool) (*held, bool, *RedlockError) {
	acq := rid.New() // per attempt: a late release of a failed attempt never removes a later grant
	timeout := rlNodeTimeout(cfg, px)
	span := rlSpan(cfg, px)
	// count counts the nodes that granted: any grant (least 1), or re-entries
	// only (least 2); see redlock_acquire.lua.
	count := func(res []nodeResult[[]int64], least int64) int {
		n := 0
		for _, x := range res {
			if x.done && x.err == nil && len(x.v) == 2 && x.v[0] == 1 && x.v[1] >= least {
				n++
			}
		}
		return n
	}
	granted := func(res []nodeResult[[]int64]) int {
		if nested {
			return count(res, 2) // re-entries only
		}
		return count(res, 1)
	}
	// Each node's goroutine waits for the verdict after its acquisition
	// returns. If the attempt failed, it releases the acquisition there. If
	// the attempt succeeded before this node answered, and the holding is
	// already being released by the time it does, it releases this late grant
	// (the holding's own release may have reached the node first). Either way
	// the release is sent after the node's acquisition ended, so it can never
	// be overtaken by it.
	decided := make(chan struct{})
	var failed bool               // written before decided is closed
	var hold *held                // the holding when the attempt succeeded; written before decided is closed
	var res []nodeResult[[]int64] // the answers the verdict used; written before decided is closed
	released := make(chan int, len(r.nodes))
	keyv, argv := rlRelease(key, owner, acq, px.Milliseconds()) // the acquire script's too, boxed once for every node
	release := func(i int, x nodeResult[[]int64]) {
		<-decided
		refused := x.err == nil && len(x.v) == 2 && x.v[0] == 0 // nothing of this attempt is on the node
		if !failed {
			late := !res[i].done
			if late && !refused && hold.givenBack() {
				r.releaseOn(ctx, i, keyv, argv, timeout)
			}
			return
		}
		if !refused {
			r.releaseOn(ctx, i, keyv, argv, timeout)
		}
		released <- i
	}
	// A node's call that ran after its caller gave up on it (queued past the
	// node's time: see batcher.do) is undone there once its reply comes,
	// unless the attempt succeeded without it and the holding is not being
	// given back: its grant is then the holding's own, which renewals extend
	// (and count) and every release removes. Undoing it then would take a
	// node from under a validity a renewal counted it in. Undecided, the
	// grant is kept too: a failed attempt's release (release, above) is sent
	// after the verdict, so after this grant.
	keep := func() bool {
		select {
		case <-decided:
			return hold != nil && !hold.givenBack()
		default:
			return true
		}
	}
	cleanup := func() ([]any, func() bool) { return redlockReleaseS.call(keyv, argv), keep }
	start := time.Now()
	res = fanout(r, ctx, timeout, refuseAfterClose, func(ctx context.Context, n *rlNode) ([]int64, error) {
		// A call that was still queued when its node's time ran out returns
		// at once, before the node has seen it; if it then grants, it is
		// released there (release, below, may have been sent too early).
		return redlockAcquireS.runVia(ctx, n.b, cleanup, keyv, argv...).Int64Slice()
	}, func(res []nodeResult[[]int64]) bool { return granted(res) >= r.quorum }, release)

	var noValidity error
	if n := granted(res); n >= r.quorum {
		if g := (grant{Sent: start, Lease: span}); !g.Spent() {
			hcfg := *cfg
			hcfg.lease = span // the held's lease is its validity: deadline = start + lease − drift
			hold = newHeld(r, name, []string{key, acq}, owner, 0, &hcfg, g)
			close(decided)
			return hold, count(res, 2) >= r.quorum, nil
		}
		noValidity = ErrNoValidity
	} else if nested {
		// The owner's holding can only be on the nodes that re-entered it and
		// those not heard from; fewer than a quorum means it is gone.
		unknown := 0
		for _, x := range res {
			if !x.done || x.err != nil {
				unknown++
			}
		}
		if n+unknown < r.quorum {
			noValidity = ErrLost
		}
	}
	failed = true
	close(decided)
	e := r.opError("lock", name)
	e.Err = noValidity
	waitFor := make([]bool, len(r.nodes)) // the granting nodes: they answered just now, so the caller waits for their release
	pending := 0
	for i, x := range res {
		switch {
		case !x.done && x.err == nil:
			e.Failed = append(e.Failed, NodeError{Addr: r.nodes[i].name, Err: errPending})
		case x.err != nil:
			e.Failed = append(e.Failed, NodeError{Addr: r.nodes[i].name, Err: x.err})
		case len(x.v) != 2:
			e.Failed = append(e.Failed, NodeError{Addr: r.nodes[i].name, Err: errors.New("locks: unexpected acquire reply")})
		case x.v[0] == 1:
			if nested && x.v[1] < 2 {
				// A fresh grant to a nested attempt: the owner's holding was gone there.
				e.Refused = append(e.Refused, r.nodes[i].name)
			} else {
				e.Granted = append(e.Granted, r.nodes[i].name)
			}
			waitFor[i] = true
			pending++
		default:
			e.Refused = append(e.Refused, r.nodes[i].name)
		}
	}
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for pending > 0 {
		select {
		case i := <-released:
			if waitFor[i] {
				pending--
			}
		case <-timer.C:
			pending = 0
		}
	}
	return nil, false, e
}

// releaseOn releases an acquisition on node i (keys and args: see
// rlRelease), whatever ctx's state.
func (r *Redlock) releaseOn(ctx context.Context, i int, keys, args []any, timeout time.Duration) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
	defer cancel()
	_, _ = releaseNode(rctx, &r.nodes[i], keys, args) // unknown outcomes are sent again
}

// releaseNode releases an acquisition on node n, within ctx: keys and args
// are redlock_release.lua's (see rlRelease), shared by the nodes. A release
// whose outcome is unknown is sent again until the node answers it (see
// batcher.later). It is the one way a Redlock acquisition is given back on a
// node: whatever a request of the attempt did there, or does when it arrives
// late, ends with it.
func releaseNode(ctx context.Context, n *rlNode, keys, args []any) (int64, error) {
	call := redlockReleaseS.call(keys, args) // one per node: a NOSCRIPT turns it into EVAL in place
	v, err := n.b.do(ctx, call, nil).Int64()
	if undelivered(err) {
		n.b.later(call)
	}
	return v, err
}

// rlRelease returns redlock_release.lua's keys and arguments for acquisition
// acq of owner, whose key lease is pxms, boxed once for every node. Its
// tombstone lives rcmd.CleanupHorizon: a request of the attempt written into
// a stall may reach the node that long after it.
func rlRelease(key, owner, acq string, pxms int64) (keys, args []any) {
	return []any{key, rlTomb(key, acq)}, []any{owner, acq, pxms, tombLifeV}
}

// tombLifeV is how long a given-back attempt stays refused (ms, boxed once):
// as long as a request of it may still reach Redis (rcmd.CleanupHorizon).
var tombLifeV any = rcmd.CleanupHorizon.Milliseconds()

// rlTomb is the key of acquisition acq's tombstone (see redlock_release.lua).
func rlTomb(key, acq string) string { return key + ":g:" + acq }

// releasing marks h as being given back, before its release is sent: a
// node call of its attempt that returns from now on, or whose reply comes
// after its caller gave up on it, undoes its own grant (see attempt). It must
// be called before the release is sent.
func (r *Redlock) releasing(h *held) {
	h.mu.Lock()
	h.giving = true
	h.mu.Unlock()
}

// errPending is the cause recorded for a node whose answer was still
// outstanding when a quorum (reached too late) ended the attempt.
var errPending = errors.New("locks: redlock node's answer still pending")

// rlDrift is the clock-drift allowance for a key lease of px.
func rlDrift(cfg *config, px time.Duration) time.Duration { return px/100 + cfg.drift }

// rlSpan is the validity a key lease of px gives, before the time taken to set it.
func rlSpan(cfg *config, px time.Duration) time.Duration { return px - rlDrift(cfg, px) }

// rlPXFor returns the shortest key lease, in whole milliseconds, whose span is
// at least v: renewals and Extend keep a held's validity v with it.
func rlPXFor(cfg *config, v time.Duration) time.Duration {
	px := ((v+cfg.drift)*100/99 + time.Millisecond - 1).Truncate(time.Millisecond)
	for rlSpan(cfg, px) < v {
		px += time.Millisecond
	}
	return px
}

// rlNodeTimeout is how long one node may take to answer, for a key lease px.
func rlNodeTimeout(cfg *config, px time.Duration) time.Duration {
	if cfg.nodeTimeout > 0 {
		return cfg.nodeTimeout
	}
	return min(max(px/20, 5*time.Millisecond), 250*time.Millisecond)
}

// rlRetryDelay is the random pause before another attempt.
func rlRetryDelay(cfg *config) time.Duration {
	hi := max(min(cfg.lease/10, 250*time.Millisecond), time.Millisecond)
	return hi/2 + rand.N(hi-hi/2+1)
}
