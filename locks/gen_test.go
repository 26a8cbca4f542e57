package locks

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"pgregory.net/rapid"

	"github.com/cacheguard/cacheguard/internal/rcmd"
	"github.com/cacheguard/cacheguard/internal/redistest"
	"github.com/cacheguard/cacheguard/internal/testing/gen"
)

// TestGenLocks explores interleavings of the public API of several Clients
// (each with its own connection pool: processes) on a few lock names, with
// faults at reply granularity — a go-redis hook that delays, drops or
// duplicates the replies of a given script, Redis stalled by SIGSTOP — and
// checks them against Redis's own state, read by an independent client:
//
//   - at no instant does an acquisition (its Unlock not begun) report a
//     positive TTL while Redis says the lock is free or another holding's
//     (its fence differs);
//   - the fence Redis holds for a name never decreases, and fresh grants of
//     a name never share a fence;
//   - a name is granted to no other owner before the lease of its last
//     acquisition (for one handed the name, its claim: the shorter of its
//     lease and a queue place's life), counted from that call, has run out
//     on Redis's clock, unless it was given back by Unlock, its key deleted
//     or its lease set by Extend (see leaseBound);
//   - a Lock or TryLock that succeeds returns a Lock whose TTL is positive
//     (a grant read past its lease is not handed over);
//   - a Client's Lock or TryLock fails with ErrNoValidity only when a fault
//     struck its process, or a server paused, during the call (a waiter
//     handed the name after sleeping past its short lease must hold it);
//   - a Lock or TryLock fails at all only when something explains it: its
//     process closed, its context was cancelled or too short to judge, a
//     fault or a pause came near it, or another call occupied its name
//     (see obtained) — a name nobody else holds is obtained;
//   - every acquisition ends in exactly one EventReleased or EventLost;
//   - in runs whose processes have a Breaker (drawn), a breaker opens only
//     when Redis did not answer: a server paused within the cooldown before
//     it opened (its check's PING went unanswered), or the test process stood
//     still that long; a call it refused (ErrCircuitOpen) is explained by it;
//     and it closes within two cooldowns (plus genSlack) of the servers
//     answering again (see checkBreakers);
//   - every call returns within its context (plus a slack for a loaded
//     host);
//   - once every call has returned, Redis keeps no hold that no Lock is
//     held for (liveness: see orphans).
func TestGenLocks(t *testing.T) {
	s := redistest.Start(t)
	cl := redistest.StartCluster(t)
	single := genDeployment{
		name:    "single",
		servers: []*redistest.Server{s},
		client: func() redis.UniversalClient {
			return redis.NewClient(&redis.Options{Addr: s.Addr(), ContextTimeoutEnabled: true})
		},
	}
	cluster := genDeployment{
		name:    "cluster",
		servers: cl.Masters(), // a stall pauses one master
		client: func() redis.UniversalClient {
			return cl.Client(func(o *redis.ClusterOptions) { o.ContextTimeoutEnabled = true })
		},
	}
	st := &genStats{stalls: gen.WatchStalls(t)}
	// One generator (one budget): two runs in three on the single server,
	// one on the 3-master cluster.
	gen.Check(t, 40, func(rt *rapid.T) {
		d := single
		if rapid.IntRange(0, 2).Draw(rt, "deployment") == 2 {
			d = cluster
		}
		st.add(&st.deployments, d.name)
		genLocksRun(rt, d, st)
	})
	t.Logf("gen: %s", st)
}

// genDeployment is where a generator's processes take their locks.
type genDeployment struct {
	name    string
	servers []*redistest.Server          // what a stall may pause
	client  func() redis.UniversalClient // a process's own client (connection pools)
}

// genCommandTimeout is the processes' command timeout.
const genCommandTimeout = 250 * time.Millisecond

// genSlack is how late past its context a call may return on a loaded host.
const genSlack = 400 * time.Millisecond

// genStats counts what the generator explored, across checks.
type genStats struct {
	mu          sync.Mutex
	checks      int
	deployments map[string]int
	actions     map[string]int
	faults      map[string]int
	samples     int64
	worst       time.Duration // the latest a call returned past its context
	worstOf     string
	stalled     int            // calls later than genSlack past their context while the process stood still that long
	stalls      *gen.Stalls    // when the test process stood still (a starved host), watched every millisecond
	failures    map[string]int // failed Lock and TryLock calls, by what explained them (the obtain oracle)
	breakers    [2]int         // runs with a Breaker in each process, and the openings seen in them
}

func (st *genStats) add(m *map[string]int, k string) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if *m == nil {
		*m = map[string]int{}
	}
	(*m)[k]++
}

func (st *genStats) String() string {
	st.mu.Lock()
	defer st.mu.Unlock()
	count := func(m map[string]int) string {
		var ks []string
		n := 0
		for k, v := range m {
			ks = append(ks, k+"="+strconv.Itoa(v))
			n += v
		}
		sort.Strings(ks)
		return strconv.Itoa(n) + " (" + strings.Join(ks, " ") + ")"
	}
	return fmt.Sprintf("%d checks %s, steps %s, faults %s, failed lock calls %s, %d oracle samples, latest return past a context %v (%s), %d past the slack in a process stall; %d runs with breakers, %d openings",
		st.checks, count(st.deployments), count(st.actions), count(st.faults), count(st.failures), st.samples, st.worst.Round(time.Millisecond), st.worstOf, st.stalled, st.breakers[0], st.breakers[1])
}

// genRule is one fault of a genFault hook: the next left commands running
// script get mode.
type genRule struct {
	script *script
	mode   string // "delay", "drop", "dup", "late", "stuck"
	d      time.Duration
	until  <-chan struct{} // late: hold the request until it closes instead of for d
	left   int
}

// genFault is a go-redis hook that applies its rules to matching commands
// (alone or in a pipeline): late holds the request (see late), delay holds the reply (as a slow link: the
// command's context still cuts it), drop loses it (the command ran; its
// caller hears nothing until its context ends), dup sends the command twice
// (as go-redis retrying a command whose reply was lost). stuck acts below
// go-redis, on its connection (see keep): the request's bytes stay on
// the wire for d while the connection breaks (go-redis sends a command again
// on another one unless it is a grant's: rcmd.Script.Grant), and then reach
// Redis.
type genFault struct {
	mu      sync.Mutex
	rules   []*genRule
	effects []genSpan       // from each strike of a rule until the command it struck was done with (see around)
	acqs    map[string]bool // the acquisition ids of the attempts sent (acquire.lua)
	wg      sync.WaitGroup  // late requests (added under mu)
}

// genSpan is a span of time; an end still unknown is zero.
type genSpan struct{ from, to time.Time }

// meets reports whether s overlaps [a, b] (an open span does once begun).
func (s genSpan) meets(a, b time.Time) bool {
	return !s.from.After(b) && (s.to.IsZero() || !s.to.Before(a))
}

// anyMeets reports whether a span of spans overlaps [a, b].
func anyMeets(spans []genSpan, a, b time.Time) bool {
	return slices.ContainsFunc(spans, func(s genSpan) bool { return s.meets(a, b) })
}

func (f *genFault) set(r *genRule) {
	f.mu.Lock()
	f.rules = append(f.rules, r)
	f.mu.Unlock()
}

// struck reports whether the effect of a rule that struck met [a, b].
func (f *genFault) struck(a, b time.Time) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return anyMeets(f.effects, a, b)
}

func (f *genFault) clear() {
	f.mu.Lock()
	f.rules = nil
	f.mu.Unlock()
}

// match returns the rule that strikes cmds, if any, with the index of its
// effect's span in effects, open until ended.
func (f *genFault) match(cmds []redis.Cmder) (*genRule, int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, cmd := range cmds {
		if sc, _ := scriptCall(cmd); sc != &acquireS && sc != &redlockAcquireS {
			continue
		}
		args := cmd.Args() // EVALSHA sha numkeys keys… owner acq …: both acquire scripts
		numkeys, _ := strconv.Atoi(fmt.Sprint(args[2]))
		if at := 3 + numkeys + 1; len(args) > at {
			if f.acqs == nil {
				f.acqs = map[string]bool{}
			}
			f.acqs[fmt.Sprint(args[at])] = true
		}
	}
	for _, cmd := range cmds {
		sc, _ := scriptCall(cmd)
		for _, r := range f.rules {
			if r.left > 0 && r.script == sc && r.mode != "stuck" {
				r.left--
				f.effects = append(f.effects, genSpan{from: time.Now()}) // open until ended
				if r.mode == "late" {
					f.wg.Add(1) // under mu: a Wait after clear waits for it
				}
				return r, len(f.effects) - 1
			}
		}
	}
	return nil, 0
}

// ended closes the span of effect i: the command it struck is done with —
// its caller has its reply or gave up, and a late request has reached Redis
// and been answered. What it left behind (a grant, a queue place, a slow
// connection) the checks allow for from there (genCalmBefore, claims).
func (f *genFault) ended(i int) {
	f.mu.Lock()
	f.effects[i].to = time.Now()
	f.mu.Unlock()
}

func (f *genFault) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := next(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &gen.StuckConn{Conn: c, Keep: f.keep}, nil
	}
}

// keep is a connection's gen.StuckConn.Keep: a write that a stuck rule
// strikes stays on the wire for the rule's d, and its effect's span ends
// once it reached Redis.
func (f *genFault) keep(b []byte) (time.Duration, func(), bool) {
	r, effect := f.stuck(b)
	if r == nil {
		return 0, nil, false
	}
	return r.d, func() {
		f.ended(effect)
		f.wg.Done() // added by stuck
	}, true
}

// stuck returns the stuck rule that strikes a write of b (a request naming
// its script's SHA1), if any, with the index of its effect's span.
func (f *genFault) stuck(b []byte) (*genRule, int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, r := range f.rules {
		if r.left > 0 && r.mode == "stuck" && bytes.Contains(b, []byte(r.script.sha)) {
			r.left--
			f.effects = append(f.effects, genSpan{from: time.Now()}) // open until the request reached Redis
			f.wg.Add(1)                                              // under mu: a Wait after clear waits for it
			return r, len(f.effects) - 1
		}
	}
	return nil, 0
}

func (f *genFault) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		return f.around(ctx, []redis.Cmder{cmd}, func(ctx context.Context, cmds []redis.Cmder) error { return next(ctx, cmds[0]) })
	}
}
func (f *genFault) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		return f.around(ctx, cmds, next)
	}
}

func (f *genFault) around(ctx context.Context, cmds []redis.Cmder, send func(context.Context, []redis.Cmder) error) error {
	r, i := f.match(cmds)
	if r == nil {
		return send(ctx, cmds)
	}
	if r.mode == "late" {
		return f.late(ctx, cmds, r, i, send) // ends it when the request has been answered
	}
	defer f.ended(i)
	if r.mode == "dup" {
		_ = send(ctx, cmds)
		return send(ctx, cmds)
	}
	err := send(ctx, cmds)
	var wait <-chan time.Time
	switch r.mode {
	case "delay":
		wait = time.After(r.d)
	case "drop":
		wait = time.After(5 * time.Second) // until the command's context ends: every command of ours has a bound
	}
	givenUp, why, stop := gen.ReplyGivenUp(ctx)
	defer stop()
	select {
	case <-wait:
		if r.mode == "delay" {
			return err
		}
		err = errors.New("gen: reply dropped")
	case <-givenUp:
		err = why()
	}
	for _, c := range cmds {
		c.SetErr(err)
	}
	return err
}

// late holds the request for d before it reaches Redis; it reaches Redis
// then even when its caller has given up meanwhile (a request stuck on the
// wire), on a copy, whose reply the caller gets if it still waits.
func (f *genFault) late(ctx context.Context, cmds []redis.Cmder, r *genRule, effect int, send func(context.Context, []redis.Cmder) error) error {
	copies := make([]redis.Cmder, len(cmds))
	for i, c := range cmds {
		copies[i] = redis.NewCmd(context.Background(), c.Args()...)
	}
	done := make(chan error, 1)
	go func() {
		defer f.wg.Done() // added by match
		if r.until != nil {
			select { // the fault: the request is slow to arrive
			case <-r.until:
			case <-time.After(10 * time.Second): // a bound for a test whose event never comes
			}
		} else {
			time.Sleep(r.d) // the fault: the request is slow to arrive
		}
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		err := send(sctx, copies)
		f.ended(effect)
		done <- err
	}()
	givenUp, why, stop := gen.ReplyGivenUp(ctx)
	defer stop()
	select {
	case err := <-done:
		for i, c := range cmds {
			if x, ok := rcmd.AsCmd(c); ok {
				v, e := copies[i].(*redis.Cmd).Result()
				if len(cmds) == 1 {
					e = err // go-redis sets it only once the hooks returned
				}
				x.SetVal(v)
				x.SetErr(e)
			}
		}
		return err
	case <-givenUp:
		err := why()
		for _, c := range cmds {
			c.SetErr(err)
		}
		return err
	}
}

// genProc is one process: a Client with its own connection pool and fault hook.
type genProc struct {
	c     *Client
	rdb   redis.UniversalClient
	fault *genFault
	ev    *endEvents
	owner string
	br    *genBreaker // its client's Breaker, in runs that have them
}

// genBreakerCooldown is the Cooldown of the processes' Breakers (the
// default); their other settings are the defaults too.
const genBreakerCooldown = 250 * time.Millisecond

// genBreaker records when a process's Breaker was open.
type genBreaker struct {
	mu    sync.Mutex
	spans []genSpan // from each EventBreakerOpened to the EventBreakerClosed after it (zero while open)
}

func (gb *genBreaker) observe(e Event) {
	gb.mu.Lock()
	defer gb.mu.Unlock()
	switch n := len(gb.spans); e.Kind {
	case EventBreakerOpened:
		gb.spans = append(gb.spans, genSpan{from: time.Now()})
	case EventBreakerClosed:
		if n > 0 && gb.spans[n-1].to.IsZero() {
			gb.spans[n-1].to = time.Now()
		}
	}
}

func (gb *genBreaker) snapshot() []genSpan {
	gb.mu.Lock()
	defer gb.mu.Unlock()
	return slices.Clone(gb.spans)
}

// genHold is an acquisition the run holds.
type genHold struct {
	lk        *Lock
	name      string
	proc      int
	unlocking atomic.Bool   // its Unlock began: its release decides
	deleted   atomic.Bool   // its key was deleted (a fault no lock survives): not checked
	extended  atomic.Bool   // an Extend began: it may have shortened the lease
	start     time.Time     // when its Lock call began
	got       time.Time     // when its Lock call returned
	lease     time.Duration // its lease, when the run checks its bound (see leaseBound); else 0
	released  time.Time     // when an Unlock of it returned nil (zero: never)
	faults    []*genFault   // its process's (nil: the run does not track them)
	// freed: Close dropped it, and an Unlock begun after that returned in
	// calm (see unlock): its release reached Redis, so its key must be gone.
	freed atomic.Bool
}

// genCall is a Lock or TryLock call of the run, for the obtain oracle (see
// obtained).
type genCall struct {
	name       string
	owner      string // the owner it ran under (WithOwner); "" when it had one of its own
	proc       int
	start, end time.Time
	claim      time.Duration // how long a grant it left behind can keep the name (its lease, a queue place's life)
	err        error
	excuse     string      // why its failure needs no occupant (set when it returned); "" when it must have one
	hold       *genHold    // when it succeeded
	faults     []*genFault // its process's
}

// genBase is what the locks generators share: a run's log, its
// violations, the acquisitions it holds, its calls in flight.
type genBase struct {
	st    *genStats
	start time.Time
	calls sync.WaitGroup

	mu         sync.Mutex // guards the fields below, and those of the world embedding genBase
	log        []string   // what happened, for a failure's report
	holds      []*genHold
	all        []*genHold // every acquisition the run held, also those Unlocked since
	lockCalls  []*genCall // every Lock and TryLock call that returned
	violations []string
	deletedAt  map[string]time.Time // the last DEL of each name's key
	stalled    bool                 // a server is paused
	// breakerReach is how long before a call a pause can still keep its
	// process's Breaker open (0: the processes have none).
	breakerReach time.Duration
	pauses       []genSpan // every pause of a server (the last one's end zero while it lasts)

	panicky bool // the processes' Observers panic after recording an event (drawn per run)
}

// observed is what every process's Observer does last: in a run drawn
// panicky it panics, which the lock must recover (see notify) whatever the
// event, its state and its invariants unharmed.
func (w *genBase) observed(e Event) {
	if w.panicky {
		panic(fmt.Sprintf("gen: an Observer panics on %v", e.Kind))
	}
}

// badCall is the action of a call with bad input — a nil option, a lease
// below MinLease, a negative wait budget or replica count, an empty or
// too long name — on l (drawn among locks): it must fail with ErrInvalid
// within the slack, before any Redis call, so that Redis has no key for the
// name afterwards (exists reads every node).
func (w *genBase) badCall(rt *rapid.T, locks []Locker, exists func(name string) bool) {
	l := locks[rapid.IntRange(0, len(locks)-1).Draw(rt, "proc")]
	kind := rapid.SampledFrom([]string{"nil option", "short lease", "negative budget", "negative replicas", "empty name", "long name"}).Draw(rt, "bad")
	try := rapid.Bool().Draw(rt, "try")
	w.step("bad")
	name := fmt.Sprintf("bad-%d", genRunID.Add(1))
	var opts []CallOption
	switch kind {
	case "nil option":
		opts = []CallOption{Lease(time.Second), nil}
	case "short lease":
		opts = []CallOption{Lease(MinLease - time.Millisecond)}
	case "negative budget":
		opts = []CallOption{WaitBudget(-time.Millisecond)}
	case "negative replicas":
		opts = []CallOption{Replicas(-1, time.Second)}
	case "empty name":
		name = ""
	case "long name":
		name = strings.Repeat("x", MaxNameLen+1)
	}
	start := time.Now()
	call := l.Lock
	if try {
		call = l.TryLock
	}
	lk, err := call(context.Background(), name, opts...)
	took := time.Since(start)
	w.note("bad call (%s, try %v): %v in %v", kind, try, err, took)
	if lk != nil {
		_ = lk.Unlock(context.Background())
		w.violate("a call with bad input (%s) was granted", kind)
		return
	}
	if !errors.Is(err, ErrInvalid) {
		w.violate("a call with bad input (%s) failed with %v, not ErrInvalid", kind, err)
	}
	if took > genSlack {
		w.violate("a call with bad input (%s) took %v", kind, took)
	}
	if name != "" && len(name) <= MaxNameLen && exists(name) {
		w.violate("a call with bad input (%s) reached Redis: its key exists", kind)
	}
}

// stall pauses one of servers (SIGSTOP) for a drawn time, up to longest,
// unless one is paused already.
func (w *genBase) stall(rt *rapid.T, servers []*redistest.Server, longest time.Duration) {
	d := time.Duration(rapid.IntRange(50, int(longest/time.Millisecond)).Draw(rt, "stall")) * time.Millisecond
	w.mu.Lock()
	busy := w.stalled
	w.stalled = true
	w.mu.Unlock()
	if busy {
		rt.Skip("stalled already")
	}
	w.step("stall")
	w.st.add(&w.st.faults, "redis-sigstop")
	srv := rapid.IntRange(0, len(servers)-1).Draw(rt, "server")
	w.note("redis %d stalled for %v", srv, d)
	w.mu.Lock()
	w.pauses = append(w.pauses, genSpan{from: time.Now()})
	w.mu.Unlock()
	servers[srv].Pause()
	w.calls.Go(func() {
		time.Sleep(d) // the fault's length
		servers[srv].Resume()
		w.note("redis %d resumed", srv)
		w.mu.Lock()
		w.stalled = false
		w.pauses[len(w.pauses)-1].to = time.Now()
		w.mu.Unlock()
	})
}

// lose runs del, which deletes name's lock key (a fault no lock survives).
// The holds of the name, and those begun before del returned (still on their
// way: their script may run before it), are exempt from the monitor. While
// del is in flight every hold that returns is: the monitor may read its
// effect before it returns here.
func (w *genBase) lose(name string, del func()) {
	w.step("del")
	w.st.add(&w.st.faults, "del-key")
	exempt := func(until time.Time) {
		w.mu.Lock()
		for _, h := range w.holds {
			if h.name == name {
				h.deleted.Store(true)
			}
		}
		w.deletedAt[name] = until
		w.mu.Unlock()
	}
	exempt(time.Now().Add(time.Hour))
	del()
	exempt(time.Now())
}

type genWorld struct {
	genBase
	rt    *rapid.T
	d     genDeployment
	mon   redis.UniversalClient
	names []string
	procs []*genProc
	old   []*genProc // closed, replaced
	// breakers: each process's client has a Breaker (drawn per run).
	breakers bool

	// guarded by mu
	fences  map[string]uint64 // the last fence Redis held, per name
	granted map[string]map[uint64]bool
}

// note adds a line to the run's log.
func (w *genBase) note(format string, args ...any) {
	line := fmt.Sprintf("%7.1fms ", float64(time.Since(w.start).Microseconds())/1000) + fmt.Sprintf(format, args...)
	w.mu.Lock()
	w.log = append(w.log, line)
	w.mu.Unlock()
}

func (w *genBase) violate(format string, args ...any) {
	w.note("VIOLATION: "+format, args...)
	w.mu.Lock()
	w.violations = append(w.violations, fmt.Sprintf(format, args...))
	w.mu.Unlock()
}

var genRunID atomic.Int64

func genLocksRun(rt *rapid.T, d genDeployment, st *genStats) {
	st.mu.Lock()
	st.checks++
	st.mu.Unlock()
	run := genRunID.Add(1)
	w := &genWorld{genBase: genBase{st: st, start: time.Now(), deletedAt: map[string]time.Time{}}, rt: rt, d: d, mon: d.client(), fences: map[string]uint64{}, granted: map[string]map[uint64]bool{}}
	defer w.mon.Close()
	for i := range 2 {
		w.names = append(w.names, fmt.Sprintf("gen%d-%d", run, i))
	}
	w.panicky = rapid.IntRange(0, 3).Draw(rt, "panicky observers") == 0
	if w.breakers = rapid.Bool().Draw(rt, "breakers"); w.breakers {
		w.breakerReach = 2*genBreakerCooldown + genSlack // it closes within two cooldowns (checkBreakers)
		st.mu.Lock()
		st.breakers[0]++
		st.mu.Unlock()
	}
	for range 3 {
		w.procs = append(w.procs, w.newProc())
	}
	stop := make(chan struct{})
	monDone := make(chan struct{})
	go func() {
		defer close(monDone)
		w.monitor(stop)
	}()
	defer func() {
		// A run rapid ends early (a failure, or one it deems invalid: an
		// action skipped too often, its data used up while shrinking) never
		// reaches the wind-down below: its processes are closed here, or
		// their goroutines outlive the test (goleak).
		for _, p := range append(w.procs, w.old...) {
			p.fault.clear()
		}
		w.calls.Wait()
		for _, p := range append(w.procs, w.old...) {
			_ = p.c.Close() // again after the wind-down: Close is idempotent
			_ = p.rdb.Close()
			p.fault.wg.Wait()
		}
		close(stop)
		<-monDone
	}()

	actions := map[string]func(*rapid.T){
		"a-lock": func(rt *rapid.T) {
			w.step("lock")
			p := rapid.IntRange(0, len(w.procs)-1).Draw(rt, "proc")
			name := rapid.SampledFrom(w.names).Draw(rt, "name")
			try := rapid.Bool().Draw(rt, "try")
			owned := rapid.Bool().Draw(rt, "owned")
			var opts []CallOption
			lease := rapid.SampledFrom([]time.Duration{200 * time.Millisecond, 600 * time.Millisecond, 2 * time.Second}).Draw(rt, "lease")
			opts = append(opts, Lease(lease), WaitBudget(rapid.SampledFrom([]time.Duration{300 * time.Millisecond, time.Second}).Draw(rt, "budget")))
			if rapid.IntRange(0, 3).Draw(rt, "fair") == 0 {
				opts = append(opts, Fair())
			}
			if rapid.IntRange(0, 5).Draw(rt, "fixed") == 0 {
				opts = append(opts, NoRenewal())
			}
			timeout := rapid.SampledFrom([]time.Duration{50 * time.Millisecond, 400 * time.Millisecond, 1500 * time.Millisecond}).Draw(rt, "ctx")
			cancelAfter := time.Duration(-1)
			if rapid.IntRange(0, 4).Draw(rt, "cancel") == 0 {
				cancelAfter = time.Duration(rapid.IntRange(0, 100).Draw(rt, "cancelAfter")) * time.Millisecond
			}
			// A Lock may be handed the name under a claim, the shorter of
			// its lease and a queue place's life, until it renews it.
			w.lock(p, name, try, owned, timeout, cancelAfter, opts, min(lease, placeTTL))
		},
		"b-unlock": w.unlockAction(genFence),
		"c-extend": w.extendAction([]time.Duration{150 * time.Millisecond, 700 * time.Millisecond, 3 * time.Second}, genFence),
		"e-fault": func(rt *rapid.T) {
			p := rapid.IntRange(0, len(w.procs)-1).Draw(rt, "proc")
			sc := rapid.SampledFrom([]*script{&acquireS, &releaseS, &extendS}).Draw(rt, "script")
			mode := rapid.SampledFrom([]string{"late", "delay", "drop", "dup", "stuck"}).Draw(rt, "mode")
			d := time.Duration(rapid.IntRange(20, 600).Draw(rt, "delay")) * time.Millisecond
			n := rapid.IntRange(1, 3).Draw(rt, "count")
			w.step("fault")
			w.st.add(&w.st.faults, mode+":"+map[*script]string{&acquireS: "acquire", &releaseS: "release", &extendS: "extend"}[sc])
			w.note("p%d fault %s %v x%d on %s", p, mode, d, n, map[*script]string{&acquireS: "acquire", &releaseS: "release", &extendS: "extend"}[sc])
			w.procs[p].fault.set(&genRule{script: sc, mode: mode, d: d, left: n})
		},
		"f-stall": func(rt *rapid.T) {
			if rapid.IntRange(0, 2).Draw(rt, "stall?") != 0 {
				w.wait(rt)
				return
			}
			// Long enough, at times, for a Breaker to open (Silence, then
			// a check's cooldown), in the runs that have them.
			longest := 700 * time.Millisecond
			if w.breakers {
				longest = 1600 * time.Millisecond
			}
			w.stall(rt, w.d.servers, longest)
		},
		"h-del": func(rt *rapid.T) {
			if rapid.IntRange(0, 3).Draw(rt, "del?") != 0 {
				w.wait(rt)
				return
			}
			name := rapid.SampledFrom(w.names).Draw(rt, "name")
			w.note("DEL %s", name)
			w.lose(name, func() { w.mon.Del(context.Background(), "cg:lock:{"+name+"}") })
		},
		"g-close": w.closeAction(len(w.procs), func(p int) (func(context.Context) error, func() error) {
			old := w.procs[p]
			w.old = append(w.old, old)
			w.procs[p] = w.newProc()
			return old.c.Shutdown, old.c.Close
		}, genFence),
		"d-wait": w.wait,
		"i-bad": func(rt *rapid.T) {
			ls := make([]Locker, len(w.procs))
			for i, p := range w.procs {
				ls[i] = p.c
			}
			w.badCall(rt, ls, func(name string) bool {
				return w.mon.Exists(context.Background(), "cg:lock:{"+name+"}").Val() != 0
			})
		},
		"": func(rt *rapid.T) { w.check(rt) },
	}
	// Stalls, DELs and closing a process act on a third or a quarter of
	// their draws (a wait otherwise): they end what the calls build.
	rt.Repeat(actions)

	// Wind down: no more faults, every call returned, every acquisition
	// ended (Close drops what is held), then the oracle's last word.
	for _, p := range w.procs {
		p.fault.clear()
	}
	w.calls.Wait()
	for _, p := range append(w.procs, w.old...) {
		p.fault.clear()
		p.fault.wg.Wait()
	}
	w.checkBreakers()
	w.obtained()
	w.orphans()
	for _, p := range append(w.procs, w.old...) {
		_ = p.c.Close()
	}
	w.check(rt)
	for i, p := range append(w.procs, w.old...) {
		if begun, ends := p.ev.counts(); begun != ends {
			rt.Fatalf("process %d: %d acquisitions, %d end events", i, begun, ends)
		}
	}
}

// calm reports whether nothing delayed a process's replies from a to b: no
// effect of a fault of its (faults: one per client) and no paused server met
// that span.
func (w *genBase) calm(faults []*genFault, a, b time.Time) bool { return w.unrest(faults, a, b) == "" }

// unrest names what delayed a process's replies from a to b ("a pause", "a
// fault"), or returns "" when nothing did (see calm).
func (w *genBase) unrest(faults []*genFault, a, b time.Time) string {
	w.mu.Lock()
	paused := anyMeets(w.pauses, a, b)
	w.mu.Unlock()
	switch {
	case paused:
		return "a pause"
	case slices.ContainsFunc(faults, func(f *genFault) bool { return f.struck(a, b) }):
		return "a fault"
	}
	return ""
}

// genGiveBack is how long after a call failed, with no fault of its
// process nor a pause since genCalmBefore before it, what it was granted or
// queued for may still hold its name: its give-back is sent as it returns,
// and a loaded host may take that long to run it.
const genGiveBack = time.Second

// genCalmBefore is how long after a fault's effect ended (the command it
// struck done with: see ended) or a server resumed a call's failure is
// still excused by it: a resumed server answers its backlog first, and a
// loaded host runs what the fault left to do (a give-back, a redial) late.
// What it left in Redis (a grant, a queue place) is not excused this way:
// the call that failed under the fault occupies its name for its claim
// (see obtained).
const genCalmBefore = 300 * time.Millisecond

// excuse says why a Lock or TryLock that failed with err, under a context of
// timeout (cancelled after cancelAfter unless negative), needs no other
// holder of its name to explain it; "" when it does (see obtained).
func (w *genBase) excuse(err error, timeout, cancelAfter time.Duration, faults []*genFault, start, end time.Time) string {
	switch {
	case errors.Is(err, ErrClosed):
		return "its process closed"
	case cancelAfter >= 0 && errors.Is(err, context.Canceled):
		return "cancelled"
	case timeout < 400*time.Millisecond && errors.Is(err, context.DeadlineExceeded):
		return "a context too short to judge on a loaded host"
	case errors.Is(err, ErrCircuitOpen):
		return "its process's breaker was open" // only when Redis did not answer: see checkBreakers
	}
	return w.unrest(faults, start.Add(-genCalmBefore), end)
}

// obtained is the obtain oracle, run once every call has returned: a Lock or
// TryLock fails only when something explains it — its process closed, its
// context was cancelled or too short, a fault struck its process or a
// server paused (from genCalmBefore before the call), or another call of its
// name occupied it during the call: one that obtained it (under another
// owner: a hold of the call's own owner it re-enters, unless it failed with
// ErrLost, the loss of that hold), from its start until
// an Unlock of it returned nil (never, if none did), or one that
// failed, from its start until genGiveBack past its end when it was calm
// that long, else until its claim past its end (a grant or a queue place a
// fault may have kept). A name that nothing else held must be obtained: a
// departed waiter's queue place, a hand-off to a caller gone, a stale flag
// that outlived what it stood for would fail it.
func (w *genBase) obtained() {
	w.mu.Lock()
	calls := slices.Clone(w.lockCalls)
	w.mu.Unlock()
	forever := time.Now().Add(time.Hour)
	for _, c := range calls {
		if c.err == nil {
			continue
		}
		if c.excuse != "" {
			w.st.add(&w.st.failures, c.excuse)
			continue
		}
		occupied := false
		for _, o := range calls {
			if o == c || o.name != c.name {
				continue
			}
			if o.hold != nil && c.owner != "" && o.owner == c.owner && !errors.Is(c.err, ErrLost) {
				continue // a hold of its own owner never keeps a call out (it re-enters), unless the hold was lost
			}
			until := o.end.Add(o.claim)
			if o.hold == nil && w.calm(o.faults, o.start.Add(-genCalmBefore), o.end.Add(genGiveBack)) {
				until = o.end.Add(genGiveBack) // it gave back what it had at once
			}
			if o.hold != nil {
				w.mu.Lock()
				until = o.hold.released
				w.mu.Unlock()
				if until.IsZero() {
					until = forever
				}
			}
			if o.start.Before(c.end) && until.After(c.start) {
				occupied = true
				break
			}
		}
		w.st.add(&w.st.failures, map[bool]string{true: "occupied", false: "unexplained"}[occupied])
		if !occupied {
			w.violate("p%d: a call of %s (%v to %v) failed with %v, though no other call occupied the name, no fault struck its process and no server paused",
				c.proc, c.name, c.start.Sub(w.start).Round(10*time.Microsecond), c.end.Sub(w.start).Round(10*time.Microsecond), c.err)
		}
	}
}

func (w *genBase) step(name string) { w.st.add(&w.st.actions, name) }

// wait lets time pass (leases run out, renewals happen, faults end).
func (w *genBase) wait(rt *rapid.T) {
	w.step("wait")
	time.Sleep(time.Duration(rapid.IntRange(5, 250).Draw(rt, "ms")) * time.Millisecond) // time passing is the subject
}

func (w *genWorld) newProc() *genProc {
	f := &genFault{}
	rdb := w.d.client()
	ev := &endEvents{}
	pn := len(w.procs) + len(w.old)
	var br *genBreaker
	if w.breakers {
		// Above the fault hook: it sees what the faults do to replies.
		br = &genBreaker{}
		rdb.AddHook(&Breaker{Cooldown: genBreakerCooldown, Logger: slog.New(slog.DiscardHandler), Observer: func(_ context.Context, e Event) {
			br.observe(e)
			w.note("p%d breaker %v err=%v", pn, e.Kind, e.Err)
		}})
	}
	rdb.AddHook(f)
	c := New(rdb, CommandTimeout(genCommandTimeout), Observer(func(ctx context.Context, e Event) {
		ev.observe(ctx, e)
		w.note("p%d event %v %s fence=%d err=%v", pn, e.Kind, e.Name, e.Fence, e.Err)
		if e.Kind == EventAcquired && e.Fence != 0 {
			w.mu.Lock()
			m := w.granted[e.Name]
			if m == nil {
				m = map[uint64]bool{}
				w.granted[e.Name] = m
			}
			dup := m[e.Fence]
			m[e.Fence] = true
			w.mu.Unlock()
			if dup {
				w.violate("%s: fence %d granted twice", e.Name, e.Fence)
			}
		}
		w.observed(e)
	}))
	// rdb outlives c's Close: the Unlock of a lock Close dropped still sends
	// its release (closed with the run).
	return &genProc{c: c, rdb: rdb, fault: f, ev: ev, owner: NewOwnerID(), br: br}
}

// call runs f on a goroutine under a context of timeout and checks that it
// returns within it (plus genSlack).
func (w *genBase) call(what string, timeout time.Duration, f func(ctx context.Context)) {
	w.callBound(what, timeout, 0, f)
}

// callBound is call for a call that may take extra past its context.
func (w *genBase) callBound(what string, timeout, extra time.Duration, f func(ctx context.Context)) {
	w.calls.Go(func() {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		start := time.Now()
		f(ctx)
		w.late(what, start, time.Since(start)-timeout-extra)
	})
}

// late checks that a call begun at start returned within genSlack past its
// context (over is how far past it returned), or past it by no more than
// the process stood still meanwhile: a descheduled test process returns late
// whatever the library does.
func (w *genBase) late(what string, start time.Time, over time.Duration) {
	stalled := over > genSlack && w.st.stalls != nil && w.st.stalls.Since(start, over-genSlack)
	w.st.mu.Lock()
	if over > w.st.worst {
		w.st.worst, w.st.worstOf = over, what
	}
	if stalled {
		w.st.stalled++
	}
	w.st.mu.Unlock()
	if over > genSlack && !stalled {
		w.violate("%s returned %v past its context", what, over)
	}
}

func (w *genWorld) lock(p int, name string, try, owned bool, timeout, cancelAfter time.Duration, opts []CallOption, lease time.Duration) {
	proc := w.procs[p]
	w.genBase.lock(p, proc.c, proc.owner, name, try, owned, timeout, cancelAfter, opts, lease, genFence, []*genFault{proc.fault}, 0)
}

// genFence names a Client's Lock in a run's log.
func genFence(lk *Lock) string { return fmt.Sprintf("fence %d", lk.h.fence) }

// closeAction is the action that closes one of n processes, gracefully
// (Shutdown) or not (Close); replace puts a new process in its place and
// returns the old one's. Half the time, the acquisitions the old process
// held are then Unlocked (describe names them in the log): Close dropped
// them, and their Unlock gives their keys back (see genHold.freed).
func (w *genBase) closeAction(n int, replace func(p int) (shutdown func(context.Context) error, close func() error), describe func(*Lock) string) func(*rapid.T) {
	return func(rt *rapid.T) {
		if rapid.IntRange(0, 2).Draw(rt, "close?") != 0 {
			w.wait(rt)
			return
		}
		// A process that holds something, when one does: what Close does
		// to acquisitions held is the subject.
		w.mu.Lock()
		holding := map[int]bool{}
		for _, h := range w.holds {
			holding[h.proc] = true
		}
		w.mu.Unlock()
		procs := slices.Sorted(maps.Keys(holding))
		if len(procs) == 0 {
			procs = []int{rapid.IntRange(0, n-1).Draw(rt, "proc")}
		}
		p := rapid.SampledFrom(procs).Draw(rt, "holder")
		graceful := rapid.Bool().Draw(rt, "shutdown")
		unlock := rapid.Bool().Draw(rt, "unlock after")
		w.step("close")
		w.note("p%d closed (shutdown %v, unlock after %v); a new process replaces it", p, graceful, unlock)
		var held []*genHold
		w.mu.Lock()
		for _, h := range w.holds {
			if h.proc == p && !h.unlocking.Load() {
				held = append(held, h)
			}
		}
		w.mu.Unlock()
		shutdown, closeProc := replace(p)
		after := func() {
			if unlock {
				for _, h := range held {
					if !h.unlocking.Load() {
						w.unlock(h, time.Second, describe)
					}
				}
			}
		}
		if graceful {
			// Shutdown's documented bound (Client.Shutdown): one command
			// bound (twice the command timeout) after ctx ends, or three
			// after it began, whichever is later.
			const timeout, bound = 300 * time.Millisecond, 2 * genCommandTimeout
			w.callBound("Shutdown", timeout, max(bound, 3*bound-timeout), func(ctx context.Context) { _ = shutdown(ctx); after() })
		} else {
			w.calls.Go(func() { _ = closeProc(); after() })
		}
	}
}

// unlockAction is the action that Unlocks an acquisition held; describe
// names it in the log.
func (w *genBase) unlockAction(describe func(*Lock) string) func(*rapid.T) {
	return func(rt *rapid.T) {
		h := w.pick(rt)
		if h == nil {
			rt.Skip("nothing held")
		}
		w.step("unlock")
		w.unlock(h, rapid.SampledFrom([]time.Duration{100 * time.Millisecond, time.Second}).Draw(rt, "ctx"), describe)
	}
}

// extendAction is the action that Extends an acquisition held to one of
// leases; describe names it in the log.
func (w *genBase) extendAction(leases []time.Duration, describe func(*Lock) string) func(*rapid.T) {
	return func(rt *rapid.T) {
		h := w.pick(rt)
		if h == nil {
			rt.Skip("nothing held")
		}
		w.step("extend")
		d := rapid.SampledFrom(leases).Draw(rt, "lease")
		w.extend(h, d, rapid.SampledFrom([]time.Duration{100 * time.Millisecond, time.Second}).Draw(rt, "ctx"), describe)
	}
}

// unlock runs h's Unlock on a goroutine; describe names it in the log.
func (w *genBase) unlock(h *genHold, timeout time.Duration, describe func(*Lock) string) {
	h.unlocking.Store(true)
	w.note("p%d Unlock(%s) %s begins", h.proc, h.name, describe(h.lk))
	w.call("Unlock", timeout, func(ctx context.Context) {
		dropped := errors.Is(h.lk.h.lostErr(), ErrClosed) // by its process's Close
		start := time.Now()
		err := h.lk.Unlock(ctx)
		w.note("p%d Unlock(%s) %s: %v", h.proc, h.name, describe(h.lk), err)
		// An Unlock of a lock Close dropped gives its key back (Lock.Unlock):
		// when it returned in time, and nothing held its process's replies
		// meanwhile (nor a pause, nor a Breaker a pause opened), the key must go.
		if dropped && errors.Is(err, ErrNotHeld) && ctx.Err() == nil && h.faults != nil &&
			w.calm(h.faults, start.Add(-w.breakerReach), time.Now()) {
			h.freed.Store(true)
			w.step("freed after close") // counted: how often the oracle checks it
			w.note("p%d Unlock(%s) %s: freed after Close", h.proc, h.name, describe(h.lk))
		}
		if err == nil {
			w.mu.Lock()
			h.released = time.Now()
			w.mu.Unlock()
		}
		w.drop(h)
	})
}

// extend runs h's Extend(d) on a goroutine; describe names it in the log.
func (w *genBase) extend(h *genHold, d, timeout time.Duration, describe func(*Lock) string) {
	h.extended.Store(true)
	w.note("p%d Extend(%s, %v) %s begins", h.proc, h.name, d, describe(h.lk))
	w.call("Extend", timeout, func(ctx context.Context) {
		err := h.lk.Extend(ctx, d)
		w.note("p%d Extend(%s, %v) %s: %v, ttl %v", h.proc, h.name, d, describe(h.lk), err, h.lk.TTL())
	})
}

// lock runs a Lock or TryLock of process p's Locker l (under owner when
// owned; cancelled after cancelAfter unless negative) on a goroutine, and
// records what it got; describe names a Lock in the log. lease, when not 0,
// is the lease opts set, whose bound the run checks (see leaseBound). With
// quiet (whether no fault of p's struck since a time), it checks that a call
// failed with ErrNoValidity only when a reply may have been held.
func (w *genBase) lock(p int, l Locker, owner, name string, try, owned bool, timeout, cancelAfter time.Duration, opts []CallOption, lease time.Duration, describe func(*Lock) string, faults []*genFault, span time.Duration) {
	w.calls.Go(func() {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		if owned {
			ctx = WithOwner(ctx, owner)
		}
		if cancelAfter >= 0 {
			stop := time.AfterFunc(cancelAfter, cancel)
			defer stop.Stop()
		}
		start := time.Now()
		var lk *Lock
		var err error
		if try {
			lk, err = l.TryLock(ctx, name, opts...)
		} else {
			lk, err = l.Lock(ctx, name, opts...)
		}
		if err == nil && lk.TTL() <= 0 { // looked at the instant it returned
			// A grant is handed over only with its margin left (see
			// internal/lease): a TTL of 0 here is a loss that came since
			// (a Close, a lost scope: its Context tells the caller), or a
			// stall that outlasted the margin, or a violation.
			deadline, margin, ended, cause := lk.Ended()
			switch {
			case ended && cause != nil:
				w.note("p%d: %s lost as it returned: %v", p, name, cause)
			case w.st.stalls != nil && w.st.stalls.Since(start, margin/2):
				w.note("p%d: %s returned with TTL 0 after a host stall", p, name)
			default:
				w.violate("p%d: %s returned a Lock whose TTL is 0: its caller would act without the lock (ended %v by %v; deadline %v before, call took %v, margin %v)",
					p, name, ended, cause, time.Since(deadline), time.Since(start), margin)
			}
		}
		end := time.Now()
		w.late("Lock", start, end.Sub(start)-timeout)
		what := map[bool]string{true: "TryLock", false: "Lock"}[try]
		c := &genCall{name: name, proc: p, start: start, end: end, claim: lease + placeTTL, err: err, faults: faults}
		if owned {
			c.owner = owner
		}
		if err != nil {
			w.note("p%d %s(%s) owned=%v ctx=%v: %v", p, what, name, owned, timeout, err)
			if errors.Is(err, ErrNoValidity) && faults != nil && w.calm(faults, start, end) && (span == 0 || end.Sub(start) < span) {
				// Only a reply later than the lease spends a grant: a
				// waiter handed the name must hold it. (A Redlock's
				// validity also shrinks with its round itself: span is
				// what the call may take before that can spend it.)
				w.violate("p%d: %s(%s) failed with ErrNoValidity, though no reply was held and Redis did not pause: %v", p, what, name, err)
			}
			c.excuse = w.excuse(err, timeout, cancelAfter, faults, start, end)
			w.mu.Lock()
			w.lockCalls = append(w.lockCalls, c)
			w.mu.Unlock()
			return
		}
		w.note("p%d %s(%s) owned=%v ctx=%v opts=%d: %s ttl %v", p, what, name, owned, timeout, len(opts), describe(lk), lk.TTL())
		w.mu.Lock()
		h := &genHold{lk: lk, name: name, proc: p, start: start, got: time.Now(), lease: lease, faults: faults}
		if start.Before(w.deletedAt[name]) {
			h.deleted.Store(true)
		}
		violations := w.leaseBound(h)
		w.holds = append(w.holds, h)
		w.all = append(w.all, h)
		c.hold = h
		w.lockCalls = append(w.lockCalls, c)
		w.mu.Unlock()
		for _, v := range violations {
			w.violate("%s", v)
		}
	})
}

// leaseBound checks b, just granted, against the earlier acquisitions of its
// name whose bound the run checks: an acquisition a granted before b's call
// began keeps its name until its lease, counted from a's call, has run out
// on Redis's clock (a millisecond early at most: PX counts from the current
// millisecond) — its key cannot expire sooner, and a give-back before then
// (a hold lost at its local deadline, which comes the drift allowance
// earlier on a Redlock) would let b in while a may still act on its last
// check of its validity. Unlock, a DEL of the key and Extend (which may set
// a shorter lease) end that promise; so does the same owner (re-entry).
// It returns the violations, for the caller to report once it released
// w.mu, held by the call.
func (w *genBase) leaseBound(b *genHold) (violations []string) {
	for _, a := range w.all {
		if a.name != b.name || a.lease == 0 || !a.got.Before(b.start) || a.lk.h.owner == b.lk.h.owner ||
			a.unlocking.Load() || a.deleted.Load() || a.extended.Load() {
			continue
		}
		if end := a.start.Add(a.lease - time.Millisecond); b.got.Before(end) {
			violations = append(violations, fmt.Sprintf("%s: process %d's acquisition granted %v before the lease %v of process %d's (its call at %v) ran out",
				b.name, b.proc, end.Sub(b.got).Round(10*time.Microsecond), a.lease, a.proc, a.start.Sub(w.start).Round(10*time.Microsecond)))
		}
	}
	return violations
}

func (w *genBase) pick(rt *rapid.T) *genHold {
	w.mu.Lock()
	var open []*genHold
	for _, h := range w.holds {
		if !h.unlocking.Load() {
			open = append(open, h)
		}
	}
	w.mu.Unlock()
	if len(open) == 0 {
		return nil
	}
	return open[rapid.IntRange(0, len(open)-1).Draw(rt, "hold")]
}

func (w *genBase) drop(h *genHold) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for i, x := range w.holds {
		if x == h {
			w.holds = append(w.holds[:i], w.holds[i+1:]...)
			return
		}
	}
}

// genBelief is what an acquisition believes: that it holds its lock until.
type genBelief struct {
	h     *genHold
	until time.Time
}

// beliefs reads the beliefs of the acquisitions held and checked (Unlock
// not begun, key not deleted) that believe they hold their lock.
func (w *genBase) beliefs() []genBelief {
	w.mu.Lock()
	defer w.mu.Unlock()
	var bs []genBelief
	for _, h := range w.holds {
		if !h.unlocking.Load() && !h.deleted.Load() {
			now := time.Now()
			if ttl := h.lk.TTL(); ttl > 0 {
				bs = append(bs, genBelief{h, now.Add(ttl)})
			}
		}
	}
	return bs
}

// monitor samples, until stop, each held acquisition's belief (its TTL)
// and then Redis's state of its lock, and records every instant at which an
// acquisition believed it held a lock that Redis had free or another's.
func (w *genWorld) monitor(stop <-chan struct{}) {
	ctx := context.Background()
	for {
		select {
		case <-stop:
			return
		default:
		}
		bs := w.beliefs()
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		pipe := w.mon.Pipeline()
		cmds := make([]*redis.SliceCmd, len(w.names))
		for i, n := range w.names {
			cmds[i] = pipe.HMGet(rctx, "cg:lock:{"+n+"}", "f")
		}
		_, err := pipe.Exec(rctx)
		cancel()
		read := time.Now()
		if err != nil && !errors.Is(err, redis.Nil) {
			continue // Redis stalled: nothing to compare with
		}
		atomic.AddInt64(&w.st.samples, 1)
		fences := map[string]uint64{}
		for i, n := range w.names {
			v := cmds[i].Val()
			if len(v) == 1 && v[0] != nil {
				f, _ := strconv.ParseUint(v[0].(string), 10, 64)
				fences[n] = f
				w.mu.Lock()
				last := w.fences[n]
				w.fences[n] = max(last, f)
				w.mu.Unlock()
				if f < last {
					w.violate("%s: Redis's fence went from %d back to %d", n, last, f)
				}
			}
		}
		for _, b := range bs {
			if b.until.After(read.Add(2*time.Millisecond)) && !b.h.unlocking.Load() && !b.h.deleted.Load() && fences[b.h.name] != b.h.lk.h.fence {
				w.violate("%s: process %d's acquisition (fence %d) held %v more while Redis had fence %d",
					b.h.name, b.h.proc, b.h.lk.h.fence, b.until.Sub(read).Round(time.Millisecond), fences[b.h.name])
			}
		}
		time.Sleep(2 * time.Millisecond) // the sampling period
	}
}

// orphans is the liveness oracle, read once every call has returned and
// every late request has reached Redis: Redis keeps no hold that no Lock is
// held for — a grant nobody will use blocks its name for a lease — except
// those a Close dropped (held, or an attempt's whose clean-up had not reached
// Redis yet): they expire with their lease, as documented, unless an Unlock
// gave them back (genHold.freed). holds reads what
// Redis keeps: per name, the acquisition ids holding it (on each node, for
// Redlock), each with a description for the report; acqOf is a Lock's
// acquisition id, closed the attempts sent by closed processes. A hold may
// outlive its Lock by the clean-ups still being sent (every 100 ms until
// Redis answers), so only one seen for orphanGrace is reported.
func (w *genBase) orphans(holds func(ctx context.Context) (map[string]map[string]string, error), acqOf func(*Lock) string, closed map[string]bool) {
	ctx := context.Background()
	first := map[string]time.Time{}
	for {
		live, freed := map[string]bool{}, map[string]bool{}
		w.mu.Lock()
		for _, h := range w.all {
			// Held, or dropped by its process's Close: what is held then expires
			// with its lease, as documented (the application may still use it),
			// unless an Unlock gave it back (see unlock).
			k := h.name + " " + acqOf(h.lk)
			switch {
			case h.freed.Load():
				freed[k] = true
			case !h.unlocking.Load() && h.lk.TTL() > 0 || errors.Is(h.lk.h.lostErr(), ErrClosed):
				live[k] = true
			}
		}
		w.mu.Unlock()
		now := time.Now()
		seen := map[string]time.Time{}
		// A cluster that a step restarted or stalled answers CLUSTERDOWN
		// until its slots are served again: the oracle waits for that.
		in, err := holds(ctx)
		for deadline := time.Now().Add(10 * time.Second); err != nil && time.Now().Before(deadline); in, err = holds(ctx) {
			time.Sleep(50 * time.Millisecond) // the polling period of a read that cannot be woken
		}
		if err != nil {
			w.violate("liveness: reading Redis: %v", err)
			return
		}
		for n, acqs := range in {
			for acq, what := range acqs {
				k := n + " " + acq
				if live[k] || closed[acq] && !freed[k] {
					continue
				}
				seen[k] = now
				if t, ok := first[k]; ok {
					seen[k] = t
					if now.Sub(t) >= orphanGrace {
						why := "no Lock is held for it"
						if freed[k] {
							why = "an Unlock begun after its process's Close returned in calm"
						}
						w.violate("liveness: %s: Redis keeps hold %s (%s) %v after its calls returned, and %s",
							n, acq, what, now.Sub(t).Round(time.Millisecond), why)
						return
					}
				}
			}
		}
		if len(seen) == 0 {
			return
		}
		first = seen
		time.Sleep(20 * time.Millisecond) // the polling period
	}
}

// closedAcqs are the acquisition ids of the attempts faults saw, sent by
// processes closed since.
func closedAcqs(faults []*genFault) map[string]bool {
	closed := map[string]bool{}
	for _, f := range faults {
		f.mu.Lock()
		maps.Copy(closed, f.acqs)
		f.mu.Unlock()
	}
	return closed
}

// orphans is the liveness oracle (see genBase.orphans) on the lock hashes.
func (w *genWorld) orphans() {
	var faults []*genFault
	for _, p := range w.old {
		faults = append(faults, p.fault)
	}
	w.genBase.orphans(func(ctx context.Context) (map[string]map[string]string, error) {
		in := map[string]map[string]string{}
		for _, n := range w.names {
			key := "cg:lock:{" + n + "}"
			fields, err := w.mon.HGetAll(ctx, key).Result()
			if err != nil {
				return nil, err
			}
			for f := range fields {
				if acq, ok := strings.CutPrefix(f, "h:"); ok {
					if in[n] == nil {
						in[n] = map[string]string{}
					}
					in[n][acq] = fmt.Sprintf("fence %s, %v of its lease left", fields["f"], w.mon.PTTL(ctx, key).Val())
				}
			}
		}
		return in, nil
	}, func(lk *Lock) string { return lk.h.acqv.(string) }, closedAcqs(faults))
}

// orphanGrace is how long a hold nobody holds may stay in Redis once
// every call has returned: its clean-up's retries.
const orphanGrace = time.Second

func (w *genBase) check(rt *rapid.T) {
	w.mu.Lock()
	v := w.violations
	w.violations = nil
	w.mu.Unlock()
	if len(v) > 0 {
		w.mu.Lock()
		log := strings.Join(w.log, "\n")
		w.mu.Unlock()
		rt.Fatalf("%d violations, first: %s\nlog:\n%s", len(v), strings.Join(v[:min(len(v), 5)], "; "), log)
	}
}

// checkBreakers checks the processes' Breakers, once every call has
// returned (every server answers again): each opened only when Redis did not
// answer — a server paused within the cooldown (and a moment) before it
// opened, when its check's PING went unanswered, or the test process stood
// still half that long — and each closed within two cooldowns and genSlack
// of the last such pause's end (a probe every cooldown), or the test process
// stood still meanwhile. The Breaker of a process closed while it was open
// stays open: only its opening is checked.
func (w *genWorld) checkBreakers() {
	live := map[*genProc]bool{}
	for _, p := range w.procs {
		live[p] = true
	}
	for i, p := range append(w.procs, w.old...) {
		if p.br == nil {
			continue
		}
		for _, sp := range p.br.snapshot() {
			w.st.mu.Lock()
			w.st.breakers[1]++
			w.st.mu.Unlock()
			from := sp.from.Add(-genBreakerCooldown - 50*time.Millisecond)
			answered := sp.from // when Redis answered again: the end of the pauses that explain the opening
			w.mu.Lock()
			paused := false
			for _, ps := range w.pauses {
				if ps.meets(from, sp.from) {
					paused = true
					answered = later(answered, ps.to)
				}
			}
			// Redis answers again for good only once no pause begins
			// before the breaker had to close: a server paused again
			// within two cooldowns of resuming leaves no probe an answer.
			for again := true; again; {
				again = false
				for _, ps := range w.pauses {
					if ps.to.After(answered) && ps.meets(answered, answered.Add(2*genBreakerCooldown+genSlack)) {
						answered, again = ps.to, true
					}
				}
			}
			w.mu.Unlock()
			stood := w.st.stalls != nil && w.st.stalls.During(from, sp.from, genBreakerCooldown/2)
			if !paused && !stood {
				w.violate("p%d: its breaker opened at %v though no server paused in the %v before it and the test process did not stand still: Redis answered its check",
					i, sp.from.Sub(w.start).Round(time.Millisecond), sp.from.Sub(from))
				continue
			}
			if !live[p] && sp.to.IsZero() {
				continue
			}
			limit := answered.Add(2*genBreakerCooldown + genSlack)
			closed := sp.to
			for closed.IsZero() && time.Now().Before(limit.Add(genSlack)) {
				time.Sleep(10 * time.Millisecond) // bounded wait for the observable event
				if spans := p.br.snapshot(); len(spans) > 0 {
					closed = spans[len(spans)-1].to
				}
			}
			if closed.IsZero() {
				closed = time.Now()
			}
			if closed.After(limit) && (w.st.stalls == nil || !w.st.stalls.During(answered, closed, genSlack)) {
				w.violate("p%d: its breaker, opened at %v, closed %v after Redis answered again (at %v), past two cooldowns and %v",
					i, sp.from.Sub(w.start).Round(time.Millisecond), closed.Sub(answered).Round(time.Millisecond), answered.Sub(w.start).Round(time.Millisecond), genSlack)
			}
		}
	}
}

// later returns the later of a and b.
func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
