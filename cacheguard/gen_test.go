package cacheguard_test

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"pgregory.net/rapid"

	"github.com/cacheguard/cacheguard/cacheguard"
	"github.com/cacheguard/cacheguard/internal/rcmd"
	"github.com/cacheguard/cacheguard/internal/redistest"
	"github.com/cacheguard/cacheguard/internal/testing/gen"
)

// TestGenCache is the package's state machine: three Guards (each on a
// client of its own, as processes are) on one server or on a 3-master
// cluster run Get and GetMany with random settings, variants and tags, slow
// and failing loaders, values slow to encode and caller deadlines, in the
// background, while Invalidate, InvalidateTags, Shutdown and Close run, and
// faults strike: FLUSHDB, one internal key deleted (a generation, a values
// hash, a tag's version, a fill lease), a node restarted without
// persistence, a reply dropped or delayed (a go-redis hook), a fill lease's
// request that reaches Redis after its caller gave up on it, or that runs
// there twice (the second run after its fill stored: a lease nobody fills),
// a process's subscription read late, a process paused (every command of a
// client held).
//
// The oracle is a model of the documented guarantees, kept from what the
// loaders and the calls saw, never from the Guard:
//   - read-your-writes: a call that began after an Invalidate of its key (or
//     an InvalidateTags of one of its tags) returned never gets a value
//     whose load began before that invalidation began (a near-cache hit of
//     another process: once the message had a second to arrive);
//   - one load per expiry: two loads of one entry never overlap, unless an
//     invalidation of the key or a fault that reached one of them came
//     between (which void leases or make a call fail open, as documented),
//     or the host stood still long enough for a lease to lapse; a load lasts
//     from its loader's start until its process heard the answer to the
//     value's store or the lease's release (a value slow to encode keeps its
//     lease: see genCodec);
//   - every call ends within its wait budget and context (plus a slack for
//     a starved -race host), every Shutdown within its grace;
//   - a call fails only for a cause the model saw, of the kind its error
//     names (see checkFailures): its process closing, its deadline, a
//     failing or slow load of its entries, a fault;
//   - an older value served as Stale was served within its stale window past
//     the TTL it was stored with — ServeStale's window, the early refresh's
//     grace (at most half the TTL), or FailSafe's max age, as set by the call
//     that loaded it, or by a FailSafe call whose load of the entry failed
//     after (see staleLimit) — or within the TTL past its TTL only while a
//     reload of the entry ran that another call started, or a fault may
//     have left another process's fill lease granted unseen (see
//     checkLates);
//   - reads do not go backwards within a process: once a call of a process
//     returned a value of a key (of any variant or tags) loaded after an
//     Invalidate of the key returned, read from Redis or its near cache, a
//     call of that process that begins later gets no value loaded before
//     that Invalidate, a near-cache hit included (see readPast);
//   - the near cache holds at most its entries;
//   - a fill lease's request sent after a give-back of that lease was
//     answered is never granted (see faultHook.watch): nobody would fill it;
//   - each key of a call is counted once at most, a hit or a miss: in the
//     observer's events, and in Stats (Hits + Misses never more than the
//     keys the calls on a Guard asked for: see checkStats).
func TestGenCache(t *testing.T) {
	single := redistest.Start(t)
	cl := redistest.StartCluster(t)
	var tot genTotals
	tot.stalls = []*gen.Stalls{gen.WatchStalls(t), gen.WatchRedisEvery(t, single.Addr(), genStall/8)}
	for _, s := range cl.Masters() {
		tot.stalls = append(tot.stalls, gen.WatchRedisEvery(t, s.Addr(), genStall/8))
	}
	// Long runs: the sequences that break a guarantee take a read, an
	// invalidation, a lost counter and a read again of one entry.
	if !flagSet("rapid.steps") {
		old := flag.Lookup("rapid.steps").Value.String()
		_ = flag.Set("rapid.steps", "100")
		defer func() { _ = flag.Set("rapid.steps", old) }()
	}
	gen.Check(t, 6, func(rt *rapid.T) {
		m := newGenModel(t, rt, single, cl, &tot)
		defer m.close()
		acts := map[string]func(*rapid.T){
			"":               m.check,
			"Get":            m.get,
			"Get2":           m.get, // calls weigh more than faults
			"Get3":           m.get,
			"Get4":           m.get,
			"GetMany":        m.getMany,
			"GetMany2":       m.getMany,
			"Invalidate":     m.invalidate,
			"Invalidate2":    m.invalidate,
			"InvalidateTags": m.invalidateTags,
			"Outlive":        m.outlive,
			"Outlive2":       m.outlive, // its window is often a fault's, which excuses an overlap
			"OutliveCalm":    m.outliveCalm,
			"NestedJoin":     m.nestedJoin,
			"QueuedInv":      m.queuedInvalidate,
			"LateCalls":      m.lateCalls,
			"LateAcross":     m.lateAcross,
			"LatePush":       m.latePush,
			"Settle":         func(rt *rapid.T) { m.settle() },
			"Shutdown":       m.shutdown,
			"Fault":          m.fault,
			"Fault2":         m.fault,
		}
		// CG_ONLY=Get,LateAcross,... keeps only those steps: a failure of
		// one kind of step, hunted under load (the checks still run).
		if only := os.Getenv("CG_ONLY"); only != "" {
			for k := range acts {
				if k != "" && !slices.Contains(strings.Split(only, ","), k) {
					delete(acts, k)
				}
			}
		}
		rt.Repeat(acts)
		m.settle()
		m.check(rt)
		m.checkOverlaps(rt)
		m.checkLates(rt)
		m.checkSlots(rt)
		m.checkWaits(rt)
		m.checkFailures(rt)
		m.checkGiveBacks(rt)
		m.checkStats(rt)
	})
	t.Logf("gen: %d runs, %d steps, %d calls (%d by loaders, %d of them joined a flight waiting for a slot; %d of %d NestedJoin steps queued one; %d keys invalidated while their fill queued for a slot; %d sent during their process's fill of the key, %d of them during a stalled fill, %d of those by GetMany), %d invalidations, %d faults %v, %d shutdowns, %d overlapping loads excused by a stall; failed calls excused by a fault in their scope: %d Redis unavailable, %d past their budget; %d near hits held to reads not going backwards; %d LateAcross and %d LatePush steps came to their last read",
		tot.runs.Load(), tot.steps.Load(), tot.calls.Load(), tot.nested.Load(), tot.promoted.Load(), tot.queued.Load(), tot.joins.Load(), tot.queuedInvs.Load(), tot.lates.Load(), tot.stalledLates.Load(), tot.stalledMany.Load(),
		tot.invs.Load(), tot.faults.Load(), tot.kinds(), tot.shutdowns.Load(), tot.stalledOverlaps.Load(), tot.unavailable.Load(), tot.waitedOut.Load(), tot.monotonic.Load(), tot.across.Load(), tot.pushes.Load())
	t.Logf("lateness past the bound, ≤ %v and beyond: %v; excused by a stall of the process: %v; latest not excused %v: %s; %d lease requests stuck on the wire",
		lateBins, tot.late, tot.lateStalled, tot.worstLate.Round(time.Millisecond), tot.worstLateOf, genStuck.Load())
	t.Logf("Stats: Hits + Misses − the keys asked for, by Guard (below 0: calls that ended before they knew, for a deadline, a Redis failure or Close): %v", tot.statsGap)
}

func flagSet(name string) (set bool) {
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

type genTotals struct {
	runs, steps, calls, invs, faults, shutdowns atomic.Int64
	nested, promoted                            atomic.Int64 // Gets loaders made; flights waiting for a slot they joined
	joins, queued                               atomic.Int64 // NestedJoin steps; those whose second fill queued
	lates                                       atomic.Int64 // calls LateCalls sent during their process's fill
	stalledLates                                atomic.Int64 // those sent during a stalled fill
	across                                      atomic.Int64 // LateAcross steps that came to their last read
	pushes                                      atomic.Int64 // LatePush steps that came to their last read
	stalledMany                                 atomic.Int64 // those by GetMany (they read first)
	stalledOverlaps                             atomic.Int64 // overlapping loads excused by a stall (see stoodStill)
	queuedInvs                                  atomic.Int64 // invalidations of a key whose fill waited for a slot (see queuedInvalidate)
	// Failed calls judged: Redis unavailable, and waits past the budget, each
	// excused by a fault within its scope (see unreachable, heldUp).
	unavailable, waitedOut atomic.Int64
	monotonic              atomic.Int64 // near hits judged with no allowance for the message (see readPast)
	// The test process, the server and the cluster's masters: when they
	// stood still (a starved host), which lets a lease lapse as a fault does.
	stalls   []*gen.Stalls
	mu       sync.Mutex
	byKind   map[string]int
	statsGap map[int64]int
	// How late calls returned past their bound (budget, context): a count
	// per lateness (see lateBins) and the latest, apart for the calls that
	// a stall of the process excused (see genLateSlack).
	late, lateStalled [len(lateBins) + 1]int
	worstLate         time.Duration
	worstLateOf       string
}

// lateBins are the upper ends of the lateness counts (see genTotals.late).
var lateBins = [...]time.Duration{10 * time.Millisecond, 50 * time.Millisecond, 100 * time.Millisecond, 250 * time.Millisecond, 500 * time.Millisecond}

// returned counts a call that returned late past its bound; stalled, that a
// stall of the process excused it.
func (t *genTotals) returned(late time.Duration, stalled bool, of string) {
	i := 0
	for i < len(lateBins) && late > lateBins[i] {
		i++
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if stalled {
		t.lateStalled[i]++
		return
	}
	t.late[i]++
	if late > t.worstLate {
		t.worstLate, t.worstLateOf = late, of
	}
}

func (t *genTotals) fault(kind string) {
	t.faults.Add(1)
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.byKind == nil {
		t.byKind = map[string]int{}
	}
	t.byKind[kind]++
}

func (t *genTotals) kinds() map[string]int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return maps(t.byKind)
}

func maps(m map[string]int) map[string]int {
	out := make(map[string]int, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// genVal is what a loader returns: the serial of its load's start, and when
// it ended; Slow asks genCodec to take genSlow to encode it.
type genVal struct {
	Seq  int64 `json:"s"`
	End  int64 `json:"e"` // unix ns
	Slow bool  `json:"w,omitempty"`
}

// genCodec is every process's Codec: JSON, slow to encode a value of a
// "slowenc" loader, as a large value is on a busy host. The encoding comes
// after the loader returned and before the store, so the fill's lease must
// outlast it (see fill.go), or another process loads the entry again.
type genCodec struct{ cacheguard.JSON }

func (c genCodec) Marshal(v any) ([]byte, error) {
	if gv, ok := v.(genVal); ok && gv.Slow {
		time.Sleep(genSlow) // the value's encoding is slow: what the step tests, not a synchronisation
	}
	return c.JSON.Marshal(v)
}

const (
	genLease = 400 * time.Millisecond
	genCmd   = 300 * time.Millisecond
	genNear  = 8
	genSlack = 1500 * time.Millisecond // a starved -race host, 2 cores shared by 5 suites
	// genLateSlack is how late past its bound (budget, context) a call may
	// return, beyond how long the test process stood still meanwhile (the
	// locks generator's bound): 2 ms was the latest in a run beside
	// another generator.
	genLateSlack = 400 * time.Millisecond
	genSlow      = 600 * time.Millisecond
	genStale     = 500 * time.Millisecond
	genMaxAge    = time.Second
	genBackoff   = 200 * time.Millisecond
	// genStall is a stall of the process or of Redis that can let a fill
	// lease lapse: renewals come every third of the lease.
	genStall = genLease / 3
	// genStallBound bounds how long a call waits for its process's fill
	// once another process invalidated its key: a renewal (every third of
	// the lease) finds the lease void, then the call reads and loads.
	genStallBound = genLease + genSlack
)

var (
	genKeys = []string{"k0", "k1"}
	genTags = []string{"t0"}
)

// genProc is a Guard as a process: its own client, with a fault hook.
type genProc struct {
	g     *cacheguard.Guard
	rdb   redis.UniversalClient
	hook  *faultHook
	near  bool
	slots int // MaxConcurrentLoads (0: none; see checkSlots)
	// batched: its hit reads go on the wire one at a time, the others
	// queued behind it (cacheguard.SetHitsDirect)
	batched bool
	// keyCalls counts the keys the calls on this Guard asked for (a Get's
	// one, a GetMany's each, a loader's Get's), for checkStats.
	keyCalls atomic.Int64
}

type genInv struct {
	name        string // a key, or "#"+tag
	seq         int64  // the load serial when it began
	began, done time.Time
	ok          bool
}

type genLoad struct {
	key, entry string
	start, end time.Time // the loader's
	settled    time.Time // when its process heard its store's or release's answer (zero: not seen)
	sent       time.Time // when its process first sent that store or release (zero: not seen)
	unleased   error     // the cause of its call's fail-open, when it ran without the fill lease
	seq        int64     // the load's serial
	loader     string    // fast, slow, slowenc, fail, nested
	call       genCall
	by         *genCallRec // the call that started it
}

// describe says how l began, for a failure's message.
func (l genLoad) describe() string {
	s := fmt.Sprintf("load #%d (%s loader, policy %s, budget %v)", l.seq, l.loader, l.call.policy, l.call.budget)
	if r := l.by; r != nil {
		r.mu.Lock()
		defer r.mu.Unlock()
		s += fmt.Sprintf(" by a call that began %v and was served loads %v", r.began.Format("05.000"), r.served)
	}
	if l.unleased != nil {
		s += fmt.Sprintf(", without the lease (failed open: %v)", l.unleased)
	}
	return s
}

// stamped is when v, the value l returned, was stamped with its freshness
// at the latest: a TTL counts from the store (cacheguard.TTL), which is sent
// once the value is encoded — before its process heard the store's answer
// (settled), and about genSlow after the loader's end for a value slow to
// encode.
func (l genLoad) stamped(v genVal) time.Time {
	at := time.Unix(0, v.End)
	if v.Slow {
		at = at.Add(genSlow)
	}
	if l.settled.After(at) {
		return l.settled
	}
	return at
}

// until is when l ended: when its store or release was answered, or, when
// its process never heard that answer, when its loader returned.
// leased is the earliest time l's lease can have been granted: when the
// call that started l began, if l has one. A stall between the grant and the
// loader's start (its process heard the grant late) lets the lease lapse as
// surely as one during the load: the renewals run from the grant (CI 12-05
// 23:15, two loads of one entry overlapped 133 ms into the first, one
// renewal after it began, 547 ms after its call began).
func (l genLoad) leased() time.Time {
	if r := l.by; r != nil {
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.began.Before(l.start) {
			return r.began
		}
	}
	return l.start
}

func (l genLoad) until() time.Time {
	if l.settled.After(l.end) {
		return l.settled
	}
	return l.end
}

// sending records that a store or release of keys is sent with ctx now: the
// loads of those keys that ctx's call started end in Redis from now on.
func (m *genModel) sending(ctx context.Context, keys []string) {
	m.unsettled(ctx, keys, func(l *genLoad, now time.Time) bool {
		if l.sent.IsZero() {
			l.sent = now
		}
		return false
	})
}

// settled records that a store or release of keys, sent with ctx, was
// answered: the loads of those keys that ctx's call started end now.
func (m *genModel) settled(ctx context.Context, keys []string) {
	m.unsettled(ctx, keys, func(l *genLoad, now time.Time) bool {
		l.settled = now
		return true
	})
}

// unsettled runs f, under m.mu, on each load of keys that ctx's call started
// and whose store or release was not answered yet; f reports whether it is
// answered now.
func (m *genModel) unsettled(ctx context.Context, keys []string, f func(l *genLoad, now time.Time) bool) {
	rec, ok := ctx.Value(genCallKey{}).(*genCallRec)
	if !ok {
		return
	}
	now := time.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	rec.unsettled = slices.DeleteFunc(rec.unsettled, func(i int) bool {
		l := &m.loads[i]
		return slices.Contains(keys, l.key) && f(l, now)
	})
}

// genLateServe is a value served Stale past every window but its late one
// (see staleLimit): a reload of its entry must have run during the call,
// started by another call (checked once the run's loads are all recorded).
type genLateServe struct {
	key, entry    string
	seq           int64
	began, served time.Time
	by            *genCallRec
	what          string
}

type genModel struct {
	t       *testing.T
	tot     *genTotals
	single  *redistest.Server
	cl      *redistest.Cluster
	cluster bool
	prefix  string
	procs   []*genProc
	old     []*genProc // closed, kept until the run ends
	last    *genCall   // the last Get's settings, and its key
	lastKey string
	made    int // the processes started

	seq      atomic.Int64
	wg       sync.WaitGroup // the calls in the background
	loading  pending        // the loads running: a call's may outlive it (see settle)
	wiped    atomic.Int64   // see faultHook
	restarts []time.Time    // when each restart of Redis ended (guarded by mu)
	ends     genEnds        // the fill leases their holders are done with (see watchOrphans)
	stopScan func()         // stops watchOrphans

	mu      sync.Mutex // guards what follows
	invs    []genInv
	loads   []genLoad
	faultsW []genWindow       // fault windows: loads they reach may overlap each other
	calm    int               // the OutliveCalm steps that ran
	across  int               // the LateAcross and LatePush steps that ran (see nextEntry)
	excused map[[2]int64]bool // overlapping loads (their serials) a stall excused, counted once
	faults  [][2]time.Time    // the faults themselves, from injection to its step's end
	lates   []genLateServe
	bad     []string
	// The Gets loaders made (loader "nested"): by the serial of the load
	// whose loader made each, and those that waited out their budget.
	nestedIn map[int64][]genNested
	// Calls that waited past a bound (see checkWaits): the Gets loaders
	// made that waited out their budget, and the late calls of a stalled
	// fill that outlasted genStallBound.
	waits   []genNested
	failed  []genFailure // the calls that failed (see checkFailures)
	touches []genTouch   // every call's keys and span (see heldUp)
	// reads are the values served from Redis, or from the near cache, by
	// process and key, each with when it was checked (after its call
	// returned) and when its load began: reads do not go backwards (see
	// checkValue).
	reads map[*genProc]map[string][]genRead
}

// genRead is a value a process served (see genModel.reads).
type genRead struct{ checked, loaded time.Time }

// genTouch is a call's keys in a process, from its start to its end: while it
// runs, the process may hold or ask for the fill lease of each.
type genTouch struct {
	proc       *genProc
	keys       []string
	began, end time.Time
}

// genFailure is a call that returned an error.
type genFailure struct {
	c          genCall
	proc       *genProc
	keys       []string
	began, end time.Time
	err        error
}

// genNested is a Get a loader made under its load's context.
type genNested struct {
	proc        *genProc
	key, entry  string
	began, done time.Time
	what        string
}

func (n genNested) String() string {
	return fmt.Sprintf("%q %s–%s", n.entry, n.began.Format("05.000000"), n.done.Format("05.000000"))
}

var genRun atomic.Int64

func newGenModel(t *testing.T, rt *rapid.T, single *redistest.Server, cl *redistest.Cluster, tot *genTotals) *genModel {
	m := &genModel{t: t, tot: tot, single: single, cl: cl, cluster: rapid.Bool().Draw(rt, "cluster"), excused: map[[2]int64]bool{},
		prefix: "gen" + strconv.FormatInt(genRun.Add(1), 10) + rand8() + ":"}
	tot.runs.Add(1)
	for i := range 3 {
		m.procs = append(m.procs, m.newProc(i == 0, rapid.Bool().Draw(rt, "hits share round trips")))
	}
	m.stopScan = m.watchOrphans()
	return m
}

func rand8() string { return strconv.FormatInt(time.Now().UnixNano()%1e8, 36) }

// client returns a client of the model's server or cluster; cte sets
// ContextTimeoutEnabled (its hits' reads are sent on the callers' goroutines
// and share round trips: see hits).
func (m *genModel) client(cte bool) redis.UniversalClient {
	if m.cluster {
		return m.cl.Client(func(o *redis.ClusterOptions) { o.ContextTimeoutEnabled = cte })
	}
	return m.single.Client(func(o *redis.Options) { o.ContextTimeoutEnabled = cte })
}

// newProc starts a process; every second one's client has
// ContextTimeoutEnabled, and every third one runs one load at a time
// (MaxConcurrentLoads). With batched, one hit read at a time goes on the
// wire on its own, so that the few calls a process runs at once share round
// trips; without it, they go as the default has them (a read of one entry
// does not wait for another's late reply: see lateAcross).
func (m *genModel) newProc(near, batched bool) *genProc {
	rdb := m.client(m.made%2 == 1)
	m.made++
	var p *genProc
	h := &faultHook{bad: m.violation, wiped: &m.wiped, ends: &m.ends, settled: m.settled, sending: m.sending, struck: func(sent time.Time) { m.struck(p, sent) },
		delayBegins: make(chan struct{}, 1)}
	rdb.AddHook(h)
	opts := []cacheguard.Option{cacheguard.Prefix(m.prefix), cacheguard.Lease(genLease), cacheguard.CommandTimeout(genCmd),
		cacheguard.Logger(slog.New(slog.NewTextHandler(io.Discard, nil))), cacheguard.Observer(nearHits), cacheguard.Encoding(genCodec{})}
	if near {
		opts = append(opts, cacheguard.NearCache(genNear, 2*time.Second))
	}
	slots := 0
	if m.made%3 == 0 { // every third: loads past one wait for a slot, misses first
		slots = 1
		opts = append(opts, cacheguard.MaxConcurrentLoads(slots))
	}
	g := cacheguard.New(rdb, opts...)
	if batched {
		cacheguard.SetHitsDirect(g, 1)
	}
	p = &genProc{g: g, rdb: rdb, hook: h, near: near, slots: slots, batched: batched}
	return p
}

func (m *genModel) close() {
	m.settle()
	m.stopScan()
	for _, p := range append(m.procs, m.old...) {
		m.tot.promoted.Add(cacheguard.Promoted(p.g))
		p.g.Close()
	}
	for _, p := range append(m.procs, m.old...) {
		p.hook.late.wait() // held back after settle, by a Guard's own work
		p.rdb.Close()
	}
}

// pending counts what a test waits for, which may start while it waits (a
// sync.WaitGroup may not grow from zero during a Wait).
type pending struct {
	mu   sync.Mutex
	n    int
	zero chan struct{} // closed when n drops to 0 (made by wait)
}

func (p *pending) add() {
	p.mu.Lock()
	p.n++
	p.mu.Unlock()
}

func (p *pending) done() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.n--; p.n == 0 && p.zero != nil {
		close(p.zero)
		p.zero = nil
	}
}

// wait returns once nothing is pending.
func (p *pending) wait() {
	p.mu.Lock()
	if p.n == 0 {
		p.mu.Unlock()
		return
	}
	if p.zero == nil {
		p.zero = make(chan struct{})
	}
	z := p.zero
	p.mu.Unlock()
	<-z
}

// settle waits for the calls in the background, for the loads they started
// (a load goes on after a call that stopped waiting for it, and the checks
// judge a call by the loads that ran during it), and for the requests held
// back to reach Redis (see holdBack).
func (m *genModel) settle() {
	done := make(chan struct{})
	go func() {
		m.wg.Wait()
		m.loading.wait()
		for _, p := range append(m.procs, m.old...) {
			p.hook.late.wait() // each within genLate and its command's bound
		}
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		m.violation("calls still running 30s after they were started")
		<-done
	}
}

func (m *genModel) violation(format string, args ...any) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.bad = append(m.bad, fmt.Sprintf(format, args...))
}

// check fails the run with the violations seen so far, and checks the near
// cache's bound.
func (m *genModel) check(rt *rapid.T) {
	m.tot.steps.Add(1)
	for _, p := range m.procs {
		if p.near {
			if n := cacheguard.NearLen(p.g); n > genNear {
				rt.Fatalf("near cache holds %d entries, more than %d", n, genNear)
			}
		}
	}
	m.mu.Lock()
	bad := slices.Clone(m.bad)
	m.mu.Unlock()
	if len(bad) > 0 {
		rt.Fatalf("%d violations, first: %s", len(bad), bad[0])
	}
}

// settings draws a call's settings.
type genCall struct {
	opts    []cacheguard.CallOption
	tags    []string
	variant string
	budget  time.Duration
	ctxTime time.Duration // 0: none
	policy  string
	ttl     time.Duration
	loader  string
	started chan struct{} // when set, gets a value as the call's load starts
	hold    chan struct{} // a nested loader makes its Get once it closes; a held loader returns
	stalled *atomic.Bool  // set, a held loader waits for hold in its first run only
	nested  chan struct{} // when set, gets a value as a nested loader's Get returns
}

func (m *genModel) drawCall(rt *rapid.T) genCall {
	c := genCall{
		ttl:     rapid.SampledFrom([]time.Duration{300 * time.Millisecond, 2 * time.Second, 2 * time.Second}).Draw(rt, "ttl"),
		budget:  rapid.SampledFrom([]time.Duration{300 * time.Millisecond, time.Second}).Draw(rt, "budget"),
		ctxTime: rapid.SampledFrom([]time.Duration{0, 0, 100 * time.Millisecond}).Draw(rt, "ctx"),
		policy:  rapid.SampledFrom([]string{"wait", "stale", "failsafe", "soft"}).Draw(rt, "policy"),
		// Variants whose names look like a tag set's part of an entry's
		// field ("#<id of t0>", "a|b") are entries of their own.
		variant: rapid.SampledFrom([]string{"", "", "", "HEAD", "#" + tagSetID("t0"), "a|b"}).Draw(rt, "variant"),
		loader:  rapid.SampledFrom([]string{"fast", "fast", "slow", "slowenc", "fail", "nested"}).Draw(rt, "loader"),
	}
	c.tags = rapid.SampledFrom([][]string{nil, {"t0"}, {}}).Draw(rt, "tags") // Tags() is no tags (the model's entry: fmt.Sprint)
	c.opts = []cacheguard.CallOption{cacheguard.TTL(c.ttl), cacheguard.WaitBudget(c.budget)}
	switch c.policy {
	case "stale":
		c.opts = append(c.opts, cacheguard.ServeStale(genStale))
	case "failsafe":
		c.opts = append(c.opts, cacheguard.FailSafe(genMaxAge, genBackoff))
	case "soft":
		c.opts = append(c.opts, cacheguard.FailSafe(genMaxAge, genBackoff), cacheguard.SoftTimeout(100*time.Millisecond))
	}
	if c.variant != "" {
		c.opts = append(c.opts, cacheguard.Variant(c.variant))
	}
	if c.tags != nil {
		c.opts = append(c.opts, cacheguard.Tags(c.tags...))
	}
	return c
}

func (c genCall) String() string {
	return fmt.Sprintf("{ttl %v budget %v ctx %v %s variant %q tags %v loader %s}", c.ttl, c.budget, c.ctxTime, c.policy, c.variant, c.tags, c.loader)
}

func (c genCall) entry(key string) string {
	return key + "|" + c.variant + "|" + fmt.Sprint(c.tags)
}

// load runs a loader of kind for keys, recording its interval per entry.
func (m *genModel) load(ctx context.Context, c genCall, keys []string) (map[string]genVal, error) {
	m.loading.add()
	defer m.loading.done()
	seq := m.seq.Add(1)
	start := time.Now()
	if c.started != nil {
		select {
		case c.started <- struct{}{}:
		default:
		}
	}
	var err error
	switch c.loader {
	case "slow":
		select {
		case <-time.After(genSlow):
		case <-ctx.Done():
			err = ctx.Err()
		}
	case "held":
		if c.stalled != nil && !c.stalled.CompareAndSwap(false, true) {
			break // the stall was one load's: its call loads again, at once
		}
		select {
		case <-c.hold:
		case <-ctx.Done():
			err = ctx.Err()
		}
	case "fail":
		err = errDown
	case "nested":
		if c.hold != nil {
			select {
			case <-c.hold:
			case <-ctx.Done():
			}
		}
		m.nested(ctx, seq, keys)
		if c.nested != nil {
			c.nested <- struct{}{}
		}
	}
	end := time.Now()
	by, _ := ctx.Value(genCallKey{}).(*genCallRec) // a load's context keeps its starter's values
	var unleased error
	if by != nil {
		by.mu.Lock()
		unleased = by.failedOpen // noted before its loader ran
		by.mu.Unlock()
	}
	m.mu.Lock()
	for _, k := range keys {
		if by != nil {
			by.unsettled = append(by.unsettled, len(m.loads))
		}
		m.loads = append(m.loads, genLoad{key: k, entry: c.entry(k), start: start, end: end, seq: seq, loader: c.loader, call: c, by: by, unleased: unleased})
	}
	m.mu.Unlock()
	if err != nil {
		return nil, err
	}
	out := make(map[string]genVal, len(keys))
	for _, k := range keys {
		out[k] = genVal{Seq: seq, End: end.UnixNano(), Slow: c.loader == "slowenc"}
	}
	return out, nil
}

// errDown is the error of a "fail" loader.
var errDown = errors.New("database down")

// genNestedBudget is a nested Get's wait budget: past what a fill of its
// entry takes when it waits for slots behind slow loads, in any process.
const genNestedBudget = 4 * time.Second

// nested is what a "nested" loader does (the load of serial seq, for keys)
// before it returns: a Get of another key on its process, under its load's
// context — a Get that takes no load slot (see cacheguard.MaxConcurrentLoads)
// and must not wait for one, even through a flight of its entry that another
// call started and that waits for the slot this load holds. Its value is
// checked as any call's; a Get that waited out its budget is recorded, to be
// judged against the fault windows (see checkWaits).
func (m *genModel) nested(ctx context.Context, seq int64, keys []string) {
	rec, _ := ctx.Value(genCallKey{}).(*genCallRec)
	i := slices.IndexFunc(genKeys, func(k string) bool { return !slices.Contains(keys, k) })
	if rec == nil || i < 0 {
		return // a Get of its own entry would wait for itself
	}
	key := genKeys[i]
	c := genCall{ttl: 2 * time.Second, budget: genNestedBudget, policy: "wait", loader: "fast"}
	c.opts = []cacheguard.CallOption{cacheguard.TTL(c.ttl), cacheguard.WaitBudget(c.budget)}
	m.tot.calls.Add(1)
	m.tot.nested.Add(1)
	rec.proc.keyCalls.Add(1)
	n := &genCallRec{began: time.Now(), proc: rec.proc, pi: rec.pi, of: seq}
	var res cacheguard.Result
	v, err := cacheguard.Get(context.WithValue(ctx, genCallKey{}, n), rec.proc.g, key, func(ctx context.Context) (genVal, error) {
		vals, err := m.load(ctx, c, []string{key})
		return vals[key], err
	}, append(slices.Clone(c.opts), cacheguard.ReportTo(&res))...)
	done := genNested{proc: rec.proc, key: key, entry: c.entry(key), began: n.began, done: time.Now()}
	m.mu.Lock()
	m.touches = append(m.touches, genTouch{proc: rec.proc, keys: []string{key}, began: n.began, end: done.done})
	if m.nestedIn == nil {
		m.nestedIn = map[int64][]genNested{}
	}
	m.nestedIn[seq] = append(m.nestedIn[seq], done)
	m.countedOnce(n, fmt.Sprintf("a Get of %s made by load %d's loader (%v, %v)", key, seq, res, err))
	if errors.Is(err, cacheguard.ErrWaitTimeout) {
		done.what = fmt.Sprintf("a Get of %s made by load %d's loader (process %d) waited out its budget of %v: %v; %s",
			key, seq, rec.pi, c.budget, err, m.history(key, n.began))
		m.waits = append(m.waits, done)
	}
	m.mu.Unlock()
	if err == nil {
		if n.near(key) {
			res = cacheguard.NearHit
		}
		m.checkValue(c, key, v, res, n.began, rec.proc, n)
	}
}

func (m *genModel) get(rt *rapid.T) {
	p := rapid.IntRange(0, len(m.procs)-1).Draw(rt, "proc")
	key := rapid.SampledFrom(genKeys).Draw(rt, "key")
	c := m.drawCall(rt)
	if m.last != nil && rapid.Bool().Draw(rt, "same entry as the last call") {
		// Entries read again, invalidated, their counters lost: the
		// sequences that reviews find.
		// The options and what the model knows of them (policy, budget)
		// together: a call labelled Wait that ran another's FailSafe
		// options was judged by the wrong rules. Its loader and deadline
		// are its own.
		loader, ctxTime := c.loader, c.ctxTime
		key, c = m.lastKey, *m.last
		c.loader, c.ctxTime = loader, ctxTime
	}
	m.last, m.lastKey = &c, key
	n := rapid.IntRange(1, 3).Draw(rt, "callers")
	var wg sync.WaitGroup
	for range n {
		m.call(m.procs[p], c, []string{key}, false, &wg)
	}
	m.await(rt, &wg)
}

// outlive runs a slow load (or one slow to encode its value) on one process
// and, once it has held its fill lease longer than the lease, a Get of the
// same entry on another: the load outlives its lease only if the lease is
// renewed until the store, and if it is not, the second process loads the
// entry too (checkOverlaps).
func (m *genModel) outlive(rt *rapid.T) { m.outliveIn(rt, false) }

// outliveCalm is outlive once the windows of the faults that could reach
// its loads have passed (at most a window's length: faults come every few
// steps, and their windows would excuse an overlap), on a missing entry (a
// variant of its own).
func (m *genModel) outliveCalm(rt *rapid.T) { m.outliveIn(rt, true) }

func (m *genModel) outliveIn(rt *rapid.T, calm bool) {
	p := rapid.IntRange(0, len(m.procs)-1).Draw(rt, "proc")
	q := (p + rapid.IntRange(1, len(m.procs)-1).Draw(rt, "other")) % len(m.procs)
	key := rapid.SampledFrom(genKeys).Draw(rt, "key")
	c := m.drawCall(rt)
	if calm {
		if m.procs[p].hook.armed() || m.procs[q].hook.armed() {
			return // a fault armed earlier would strike during the step
		}
		m.mu.Lock()
		var until time.Time
		for _, w := range m.faultsW {
			if (w.proc == nil || w.proc == m.procs[p] || w.proc == m.procs[q]) && (w.key == "" || w.key == key) && w.to.After(until) {
				until = w.to
			}
		}
		m.calm++
		c.variant = "calm" + strconv.Itoa(m.calm)
		m.mu.Unlock()
		c.opts = append(c.opts, cacheguard.Variant(c.variant))
		time.Sleep(time.Until(until)) // what the faults left behind passes: the step's premise, not a synchronisation
	}
	// A slow loader, or a fast one whose value is slow to encode (genCodec):
	// the lease must outlast both.
	c.loader = rapid.SampledFrom([]string{"slow", "slowenc"}).Draw(rt, "outlive")
	c.ctxTime, c.budget, c.started = 0, time.Second, make(chan struct{}, 1)
	var wg sync.WaitGroup
	m.call(m.procs[p], c, []string{key}, false, &wg)
	ended := make(chan struct{})
	go func() { wg.Wait(); close(ended) }()
	select {
	case <-c.started:
	case <-ended: // a hit, or a call that failed: nothing to outlive
		return
	}
	// Past the lease, before the load or the encoding ends (genSlow): this places the second
	// call in that window; it waits for no event. The step holds the window
	// free of other steps' faults and invalidations, which would excuse an
	// overlap.
	time.Sleep(genLease + (genSlow-genLease)/2)
	c.loader, c.started = "fast", nil
	var wg2 sync.WaitGroup // wg may be waited on still
	m.call(m.procs[q], c, []string{key}, false, &wg2)
	m.await(rt, &wg2)
}

// lateAcross is the late read of another representation (f74cc6f), on a
// process P with a near cache whose subscription is slow: its messages
// arrive late (held, while it stays trusted), as does the reply to P's read
// of an entry (Variant a) that Redis answered before another process's
// Invalidate of the key. Meanwhile P reads another representation (Variant
// b) filled after the invalidation, and the entries it reads next evict that
// one from its near cache: the key has no node left when the late reply
// comes, and the value from before the invalidation must not enter, since
// P's next read of a would go backwards (readPast: no message allowance). A
// key's generation outlives its node for it (nearCache.keep); with that
// replaced by nothing, TestGenCache fails in its first run.
func (m *genModel) lateAcross(rt *rapid.T) {
	var near []*genProc // whose read of b does not queue behind the late one
	for _, p := range m.procs {
		if p.near && !p.batched {
			near = append(near, p)
		}
	}
	if len(near) == 0 || len(m.procs) < 2 {
		return
	}
	p := rapid.SampledFrom(near).Draw(rt, "proc")
	others := slices.DeleteFunc(slices.Clone(m.procs), func(o *genProc) bool { return o == p })
	q := rapid.SampledFrom(others).Draw(rt, "filling proc")
	inv := rapid.SampledFrom(others).Draw(rt, "invalidating proc")
	if p.hook.armed() {
		return // a fault armed earlier would strike instead
	}
	key := rapid.SampledFrom(genKeys).Draw(rt, "key")
	base := m.drawCall(rt)
	n := m.nextEntry()
	call := func(variant string) genCall { return entryCall(base, fmt.Sprintf("across%d%s", n, variant)) }
	a, b := call("a"), call("b")
	run := m.callAndWait
	// P's node of the key goes (its own Invalidate drops it at once): one
	// left would take b's generation as news and void P's late read.
	m.invalidateWith([]string{key}, func(ctx context.Context) error { return p.g.Invalidate(ctx, key) })
	run(q, a, key)
	select {
	case <-p.hook.delayBegins: // a delay of an earlier step's
	default:
	}
	const held, delay = 800 * time.Millisecond, 400 * time.Millisecond
	m.window("latemsgs", genWindow{proc: p}, func() {
		p.hook.subHeldUntil.Store(time.Now().Add(held).UnixNano())
		cacheguard.TrustNear(p.g, held) // as a proof heard just before would
		aim := "|" + a.variant          // the reply to P's read of a, not to a dial's HELLO
		p.hook.delayField.Store(&aim)
		p.hook.delay.Store(int64(delay))
		p.hook.delays.Add(1)
	})
	defer func() { p.hook.delays.Store(0); p.hook.delayField.Store(nil) }()
	var late sync.WaitGroup
	m.call(p, a, []string{key}, false, &late)
	ended := make(chan struct{})
	go func() { late.Wait(); close(ended) }()
	select {
	case <-p.hook.delayBegins: // Redis answered; P has yet to hear it
	case <-ended:
		return
	case <-time.After(genSlack):
		return // the delay struck another call, or none
	}
	m.invalidateWith([]string{key}, func(ctx context.Context) error { return inv.g.Invalidate(ctx, key) })
	run(q, b, key)
	run(p, b, key)           // a hit of b, loaded after the invalidation
	var evict sync.WaitGroup // b's entry, out of P's near cache: the key's node goes
	other := genKeys[(slices.Index(genKeys, key)+1)%len(genKeys)]
	for i := range genNear {
		m.call(p, call(fmt.Sprintf("e%d", i)), []string{other}, false, &evict)
	}
	evict.Wait()
	<-ended
	m.tot.across.Add(1)
	run(p, a, key)
}

// latePush: process P fills an entry while Q, subscribed to the key's
// wake-up channel (a wait for another representation's fill would do it),
// reads nothing for a moment; P's get-or-lease request runs twice in Redis
// (dupLease), its second run after an invalidation that followed P's fill:
// a lease under the new generation, with the token whose push Q has yet to
// read, that nobody fills. Q's call of the entry, begun after the
// invalidation returned, follows that lease — and must not take the held
// push, of a value loaded before the invalidation, as its answer (see
// call.fromWake). With pushes matched on the token alone, TestGenCache
// finds it here.
func (m *genModel) latePush(rt *rapid.T) {
	p := m.procs[rapid.IntRange(0, len(m.procs)-1).Draw(rt, "proc")]
	others := slices.DeleteFunc(slices.Clone(m.procs), func(o *genProc) bool { return o == p })
	if len(others) == 0 {
		return
	}
	q := rapid.SampledFrom(others).Draw(rt, "reading proc")
	inv := rapid.SampledFrom(m.procs).Draw(rt, "invalidating proc")
	if p.hook.armed() || q.hook.armed() {
		return // a fault armed earlier would strike instead
	}
	key := rapid.SampledFrom(genKeys).Draw(rt, "key")
	c := entryCall(m.drawCall(rt), fmt.Sprintf("push%d", m.nextEntry()))
	run := func(p *genProc) { m.callAndWait(p, c, key) }
	m.invalidateWith([]string{key}, func(ctx context.Context) error { return p.g.Invalidate(ctx, key) })
	release, err := cacheguard.HoldWake(q.g, key)
	if err != nil {
		return // not subscribed (a fault's aftermath): nothing to hold
	}
	defer release()
	// Q's reads are held until after the second run, before that lease ends.
	m.window("latesub", genWindow{proc: q}, func() { q.hook.subHeldUntil.Store(time.Now().Add(genDup + genLease/2).UnixNano()) })
	m.window("dup", genWindow{proc: p}, func() { p.hook.dupUntil.Store(time.Now().Add(100 * time.Millisecond).UnixNano()) })
	run(p)
	p.hook.dupUntil.Store(0)
	m.invalidateWith([]string{key}, func(ctx context.Context) error { return inv.g.Invalidate(ctx, key) })
	done := make(chan struct{})
	go func() { p.hook.late.wait(); close(done) }()
	select {
	case <-done: // the request's second run answered
	case <-time.After(genDup + genSlack):
		return // still on its way: settle waits for it
	}
	m.tot.pushes.Add(1)
	run(q)
}

// entryCall is base as a call of the entry variant (one no near cache holds
// yet: see nextEntry) with a fast loader, no tags and no deadline, a budget
// of a second and a TTL of two: what LateAcross and LatePush time.
func entryCall(base genCall, variant string) genCall {
	c := base
	c.variant, c.tags, c.loader, c.ctxTime, c.budget, c.ttl = variant, nil, "fast", 0, time.Second, 2*time.Second
	c.opts = []cacheguard.CallOption{cacheguard.TTL(c.ttl), cacheguard.WaitBudget(c.budget), cacheguard.Variant(c.variant)}
	return c
}

// callAndWait makes call c of key on process p, and waits for it.
func (m *genModel) callAndWait(p *genProc, c genCall, key string) {
	var wg sync.WaitGroup
	m.call(p, c, []string{key}, false, &wg)
	wg.Wait()
}

// nextEntry numbers the entries of a LateAcross or LatePush step: a variant
// no near cache holds yet.
func (m *genModel) nextEntry() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.across++
	return m.across
}

// lateCalls makes calls of one entry arrive on one process while that
// process fills it (a slow load, or a value slow to encode), before and
// after a process may invalidate the key: such a call waits for its
// process's fill without a read (a GetMany joins it after a read), and may
// share its outcome only when no invalidation came after it arrived
// (read-your-writes, checked by the model; see awaitFill).
func (m *genModel) lateCalls(rt *rapid.T) {
	p := m.procs[rapid.IntRange(0, len(m.procs)-1).Draw(rt, "proc")]
	q := m.procs[rapid.IntRange(0, len(m.procs)-1).Draw(rt, "invalidating proc")]
	key := rapid.SampledFrom(genKeys).Draw(rt, "key")
	c := m.drawCall(rt)
	if c.tags != nil { // a tagged call reads first (its tags' versions): drop them
		c.tags, c.opts = nil, c.opts[:len(c.opts)-1]
	}
	// The key missing, so that the call fills it.
	m.invalidateWith([]string{key}, func(ctx context.Context) error { return p.g.Invalidate(ctx, key) })
	// Stalled: the fill's load stalls until the step ends, and a process
	// invalidates the key — this one, or another, whose invalidation a
	// renewal of the fill's lease finds; every call waiting for the fill —
	// its starter, the calls that arrived during it, those that joined it
	// after a read — and those arriving after must then stop waiting for a
	// load that cannot store (see flights.unfitLocked). On a process with
	// one load slot, their own fill would wait for the stalled one's.
	stalled := rapid.Bool().Draw(rt, "stalled") && p.slots == 0
	if stalled {
		c.loader, c.hold, c.stalled = "held", make(chan struct{}), new(atomic.Bool)
		defer close(c.hold)
		// A budget and no deadline of their own, the starter's and the late
		// calls': they have time to wait for the stalled load.
		c.budget, c.ctxTime = genStallBound+genSlack, 0
		c.opts = append(slices.Clone(c.opts), cacheguard.WaitBudget(c.budget))
	} else {
		c.loader = rapid.SampledFrom([]string{"slow", "slowenc"}).Draw(rt, "filling")
	}
	c.ctxTime, c.started = 0, make(chan struct{}, 1)
	var wg sync.WaitGroup
	m.call(p, c, []string{key}, false, &wg)
	ended := make(chan struct{})
	go func() { wg.Wait(); close(ended) }()
	select {
	case <-c.started:
	case <-ended: // the call failed before its load: nothing to arrive during
		return
	}
	late := c
	late.loader, late.started, late.hold = "fast", nil, nil
	var wg2 sync.WaitGroup // wg may be waited on still
	many := 0
	before := rapid.IntRange(0, 3).Draw(rt, "before")
	for range before {
		m.call(p, late, []string{key}, m.drawMany(rt, &many), &wg2)
	}
	if rapid.Bool().Draw(rt, "invalidate") || stalled {
		m.invalidateWith([]string{key}, func(ctx context.Context) error { return q.g.Invalidate(ctx, key) })
	}
	invalidated := time.Now()
	after := rapid.IntRange(1, 3).Draw(rt, "after")
	for range after {
		m.call(p, late, []string{key}, m.drawMany(rt, &many), &wg2)
	}
	m.tot.lates.Add(int64(before + after))
	if !stalled {
		m.await(rt, &wg2)
		return
	}
	m.tot.stalledLates.Add(int64(before + after))
	m.tot.stalledMany.Add(int64(many))
	lateEnded := make(chan struct{})
	go func() { wg2.Wait(); wg.Wait(); close(lateEnded) }() // the starter's too
	select {
	case <-lateEnded:
	case <-time.After(genStallBound):
		m.mu.Lock()
		m.waits = append(m.waits, genNested{proc: p, key: key, entry: c.entry(key), began: invalidated, done: time.Now(),
			what: fmt.Sprintf("calls of %s on process %d still waited %v after process %d invalidated the key, for a fill there stalled in its loader; %s",
				key, slices.Index(m.procs, p), genStallBound, slices.Index(m.procs, q), m.history(key, invalidated))})
		m.mu.Unlock()
	}
}

// drawMany draws whether a late call is a GetMany, counting those in n.
func (m *genModel) drawMany(rt *rapid.T, n *int) bool {
	many := rapid.Bool().Draw(rt, "GetMany")
	if many {
		*n++
	}
	return many
}

// nestedJoin makes a loader's Get meet a flight of its entry that waits for
// the slot its loader holds: on a process with one load slot, a call whose
// nested loader holds the slot, a call of the other key whose fill queues
// for it, then the loader's Get of that key, which joins that fill — and
// must not wait for it (see checkWaits).
func (m *genModel) nestedJoin(rt *rapid.T) {
	i := slices.IndexFunc(m.procs, func(p *genProc) bool { return p.slots == 1 })
	if i < 0 || slices.ContainsFunc(m.procs, func(p *genProc) bool { return p.hook.armed() }) {
		return // a fault armed earlier would strike during the step (see checkWaits)
	}
	p := m.procs[i]
	keyA := rapid.SampledFrom(genKeys).Draw(rt, "key")
	keyB := genKeys[(slices.Index(genKeys, keyA)+1)%len(genKeys)]
	// Both keys missing, so that both calls load.
	m.invalidateWith([]string{keyA, keyB}, func(ctx context.Context) error { return p.g.Invalidate(ctx, keyA, keyB) })
	c := m.drawCall(rt)
	c.loader, c.ctxTime, c.started, c.hold, c.nested = "nested", 0, make(chan struct{}, 1), make(chan struct{}), make(chan struct{}, 1)
	held := true
	defer func() {
		if held {
			close(c.hold)
		}
	}()
	var wg sync.WaitGroup
	if !m.holdSlot(p, c, keyA, &wg) {
		return
	}
	m.tot.joins.Add(1)
	// The entry the loader's Get asks for (no variant, no tags: see nested).
	b := genCall{ttl: 2 * time.Second, budget: rapid.SampledFrom([]time.Duration{300 * time.Millisecond, time.Second}).Draw(rt, "budget"),
		policy: "wait", loader: "fast"}
	b.opts = []cacheguard.CallOption{cacheguard.TTL(b.ttl), cacheguard.WaitBudget(b.budget)}
	var wgB sync.WaitGroup
	m.call(p, b, []string{keyB}, false, &wgB)
	endedB := make(chan struct{})
	go func() { wgB.Wait(); close(endedB) }()
	deadline := time.Now().Add(2 * time.Second)
	for cacheguard.LoadsWaiting(p.g) == 0 && time.Now().Before(deadline) {
		select {
		case <-endedB: // served without a load here: nothing queued
			deadline = time.Now()
		case <-time.After(5 * time.Millisecond):
		}
	}
	if cacheguard.LoadsWaiting(p.g) > 0 {
		m.tot.queued.Add(1)
	}
	// The step lasts until the loader's Get returns, so that no other
	// step's fault excuses its wait (see checkWaits).
	held = false
	close(c.hold)
	select {
	case <-c.nested:
	case <-time.After(genNestedBudget + genSlack):
		m.violation("a Get made by a loader (%s) had not returned %v after it began", keyB, genNestedBudget+genSlack)
	}
}

// holdSlot runs c (a call whose loader reports its start and waits for
// c.hold) of key on p, and reports whether its load holds p's slot: false
// when the call ended first (a hit, or a failure: no load holds it).
func (m *genModel) holdSlot(p *genProc, c genCall, key string, wg *sync.WaitGroup) bool {
	m.call(p, c, []string{key}, false, wg)
	ended := make(chan struct{})
	go func() { wg.Wait(); close(ended) }()
	select {
	case <-c.started:
		return true
	case <-ended:
		return false
	}
}

// queuedInvalidate invalidates a key whose fill waits for a load slot: on a
// process with one slot, a held load of one key holds it, a call of another
// key queues its fill (holding that key's lease), and that key is
// invalidated — in this process (its flight turns unfit at once) or another
// (a renewal finds the lease void) — before the slot is freed. The call
// joins a flight begun after; the one invalidated must not load too
// (checkOverlaps: its store would fail, and nobody waits for it).
func (m *genModel) queuedInvalidate(rt *rapid.T) {
	i := slices.IndexFunc(m.procs, func(p *genProc) bool { return p.slots == 1 })
	if i < 0 {
		return
	}
	p := m.procs[i]
	keyA := rapid.SampledFrom(genKeys).Draw(rt, "key")
	keyB := genKeys[(slices.Index(genKeys, keyA)+1)%len(genKeys)]
	// Both keys missing, so that both calls load.
	m.invalidateWith([]string{keyA, keyB}, func(ctx context.Context) error { return p.g.Invalidate(ctx, keyA, keyB) })
	a := genCall{ttl: 2 * time.Second, budget: 3 * time.Second, policy: "wait", loader: "held", started: make(chan struct{}, 1), hold: make(chan struct{})}
	a.opts = []cacheguard.CallOption{cacheguard.TTL(a.ttl), cacheguard.WaitBudget(a.budget)}
	defer close(a.hold)
	var wg sync.WaitGroup
	if !m.holdSlot(p, a, keyA, &wg) {
		return
	}
	b := m.drawCall(rt)
	b.loader, b.ctxTime, b.budget = rapid.SampledFrom([]string{"fast", "slow", "slowenc"}).Draw(rt, "loader B"), 0, 3*time.Second
	b.opts = append(slices.Clone(b.opts), cacheguard.WaitBudget(b.budget))
	m.call(p, b, []string{keyB}, false, &wg)
	deadline := time.Now().Add(2 * time.Second)
	for cacheguard.LoadsWaiting(p.g) == 0 && time.Now().Before(deadline) {
		time.Sleep(2 * time.Millisecond) // polls a count the Guard keeps: no event to wait on
	}
	if cacheguard.LoadsWaiting(p.g) == 0 {
		return // served without a load here (a variant's value, a fault): nothing queued
	}
	m.tot.queuedInvs.Add(1)
	q := m.procs[rapid.IntRange(0, len(m.procs)-1).Draw(rt, "invalidating proc")]
	m.invalidateWith([]string{keyB}, func(ctx context.Context) error { return q.g.Invalidate(ctx, keyB) })
	// The slot is freed once the call has queued a fill of the flight it
	// joined (from another process's Invalidate, once a renewal of the
	// queued fill's lease found it void: a third of the lease at most), or
	// sooner when another call's fill queued too: then the queued fill finds
	// its lease void as it gets the slot (12-07: it loaded, and the call
	// loaded again beside it).
	for deadline = time.Now().Add(genLease); cacheguard.LoadsWaiting(p.g) < 2 && time.Now().Before(deadline); {
		time.Sleep(2 * time.Millisecond)
	}
}

// await waits for the calls of a step, unless it runs them in the
// background (then they overlap the next steps).
func (m *genModel) await(rt *rapid.T, wg *sync.WaitGroup) {
	if rapid.IntRange(0, 2).Draw(rt, "background") == 0 {
		return
	}
	wg.Wait() // each call ends within its budget, or its check says so
}

func (m *genModel) getMany(rt *rapid.T) {
	p := rapid.IntRange(0, len(m.procs)-1).Draw(rt, "proc")
	keys := rapid.SliceOfNDistinct(rapid.SampledFrom(genKeys), 1, 3, rapid.ID[string]).Draw(rt, "keys")
	var wg sync.WaitGroup
	m.call(m.procs[p], m.drawCall(rt), keys, true, &wg)
	m.await(rt, &wg)
}

// call runs one Get (or GetMany) in the background and checks what it
// returned against the model.
func (m *genModel) call(p *genProc, c genCall, keys []string, many bool, step *sync.WaitGroup) {
	m.tot.calls.Add(1)
	p.keyCalls.Add(int64(len(keys)))
	pi := slices.Index(m.procs, p) // m.procs changes under the step's goroutine only
	m.wg.Add(1)
	step.Add(1)
	go func() {
		defer m.wg.Done()
		defer step.Done()
		rec := &genCallRec{began: time.Now(), proc: p, pi: pi}
		ctx := context.WithValue(context.Background(), genCallKey{}, rec)
		if c.ctxTime > 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, c.ctxTime)
			defer cancel()
		}
		var res cacheguard.Result
		opts := append(slices.Clone(c.opts), cacheguard.ReportTo(&res))
		began := time.Now()
		got := map[string]genVal{}
		var err error
		if many {
			got, err = cacheguard.GetMany(ctx, p.g, keys, func(ctx context.Context, ks []string) (map[string]genVal, error) {
				return m.load(ctx, c, ks)
			}, opts...)
		} else {
			var v genVal
			v, err = cacheguard.Get(ctx, p.g, keys[0], func(ctx context.Context) (genVal, error) {
				vals, err := m.load(ctx, c, keys)
				return vals[keys[0]], err
			}, opts...)
			if err == nil {
				got[keys[0]] = v
			}
		}
		took, end := time.Since(began), time.Now()
		m.mu.Lock()
		m.touches = append(m.touches, genTouch{proc: p, keys: keys, began: began, end: end})
		if err != nil {
			m.failed = append(m.failed, genFailure{c: c, proc: p, keys: keys, began: began, end: end, err: err})
		}
		m.mu.Unlock()
		bound := c.budget
		if c.ctxTime > 0 {
			bound = min(bound, c.ctxTime)
		}
		if over := took - bound; !errors.Is(err, cacheguard.ErrClosed) {
			// No call waits longer than its context and its budget: past
			// genLateSlack only by as long as this process stood still
			// meanwhile (a descheduled process returns late whatever the
			// library does); a Redis stall excuses nothing.
			stalled := over > genLateSlack && m.tot.stalls[0].Since(began, over-genLateSlack)
			m.tot.returned(over, stalled, fmt.Sprintf("%s of %v (%v, %v)", c, keys, res, err))
			if over > genLateSlack && !stalled {
				m.violation("%s of %v took %v, bound %v (%v, %v)", c, keys, took, bound, res, err)
			}
		}
		m.countedOnce(rec, fmt.Sprintf("%s of %v on process %d (%v, %v)", c, keys, pi, res, err))
		for k, v := range got {
			if rec.near(k) {
				res = cacheguard.NearHit // a GetMany's result is its worst key's
			}
			m.checkValue(c, k, v, res, began, p, rec)
		}
	}()
}

// history is what happened to key up to a call that began at began (m.mu
// held): its last invalidations and loads, times in seconds of the minute, to
// read a violation with.
func (m *genModel) history(key string, began time.Time) string {
	type ev struct {
		at   time.Time
		what string
	}
	var evs []ev
	for _, inv := range m.invs {
		if inv.name == key {
			evs = append(evs, ev{inv.began, fmt.Sprintf("invalidated %s–%s (ok %v)", inv.began.Format("05.000000"), inv.done.Format("05.000000"), inv.ok)})
		}
	}
	for _, l := range m.loads {
		if l.key == key {
			what := fmt.Sprintf("load %d (%s, %q) %s–%s", l.seq, l.loader, l.entry, l.start.Format("05.000000"), l.end.Format("05.000000"))
			if l.by != nil {
				what += fmt.Sprintf(" in process %d", l.by.pi)
			}
			if !l.settled.IsZero() {
				what += " settled " + l.settled.Format("05.000000")
			}
			if l.unleased != nil {
				what += fmt.Sprintf(" unleased (%v)", l.unleased)
			}
			evs = append(evs, ev{l.start, what})
		}
	}
	slices.SortFunc(evs, func(a, b ev) int { return a.at.Compare(b.at) })
	out := "call began " + began.Format("05.000000") + "; before it:"
	for _, e := range evs[max(len(evs)-8, 0):] {
		out += " " + e.what + ";"
	}
	return out
}

// around is what happened to key, and every fault, between from and to (m.mu
// held), times in seconds of the minute.
func (m *genModel) around(key string, from, to time.Time) string {
	type ev struct {
		at   time.Time
		what string
	}
	var evs []ev
	in := func(a, b time.Time) bool { return a.Before(to) && b.After(from) }
	for _, inv := range m.invs {
		if inv.name == key && in(inv.began, inv.done) {
			evs = append(evs, ev{inv.began, fmt.Sprintf("invalidated %s–%s", inv.began.Format("05.000000"), inv.done.Format("05.000000"))})
		}
	}
	for _, l := range m.loads {
		if l.key == key && in(l.start, l.end) {
			evs = append(evs, ev{l.start, fmt.Sprintf("load %d (%s, %q) %s–%s", l.seq, l.loader, l.entry, l.start.Format("05.000000"), l.end.Format("05.000000"))})
		}
	}
	for _, w := range m.faults {
		if in(w[0], w[1]) {
			evs = append(evs, ev{w[0], fmt.Sprintf("fault %s–%s", w[0].Format("05.000000"), w[1].Format("05.000000"))})
		}
	}
	slices.SortFunc(evs, func(a, b ev) int { return a.at.Compare(b.at) })
	var out []string
	for _, e := range evs {
		out = append(out, e.what)
	}
	return strings.Join(out, "; ")
}

// genCallRec is what the observer learns of a call (through its context):
// the keys served from the near cache. A GetMany reports one result, its
// worst key's, and a near hit may serve a value an invalidation in another
// process voided until the message arrives.
type genCallRec struct {
	began time.Time // when the call began (a reload it starts may queue for a slot: see checkLates)
	proc  *genProc  // the process it ran in, where the loads it starts run (see checkSlots)
	pi    int       // proc's index in the model's procs when the call began (read by the call's goroutine: procs changes)
	of    int64     // for a Get a loader made, its load's serial (see nested)
	mu    sync.Mutex
	keys  []string
	// The loads it started whose store or release was not answered yet:
	// indexes in the model's loads (guarded by the model's mu; see settled).
	unsettled []int
	served    []int64                           // the loads whose values it was served (their serials; guarded by mu)
	counted   map[string][]cacheguard.EventKind // hits and misses told to the observer, by key (guarded by mu)
	trail     []string                          // every event told to the observer under its context, for a violation's message (guarded by mu)
	// failedOpen is the cause of its fail-open (EventFailOpen), if it failed
	// open: the loads it started then ran without the fill lease (guarded by mu).
	failedOpen error
}

// countedOnce checks that the observer heard of each key of a call (what)
// once at most, as a hit or a miss.
func (m *genModel) countedOnce(r *genCallRec, what string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for k, evs := range r.counted {
		if len(evs) > 1 {
			m.violation("%s: %s counted as %v", what, k, evs)
		}
	}
}

// index is the index of the call's process (-1: unknown).
func (r *genCallRec) index() int {
	if r == nil {
		return -1
	}
	return r.pi
}

// events is what the observer heard under the call's context (nil: none).
func (r *genCallRec) events() string {
	if r == nil {
		return "none recorded"
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return strings.Join(r.trail, "; ")
}

// saw reports whether the call was served the value of load seq.
func (r *genCallRec) saw(seq int64) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Contains(r.served, seq)
}

type genCallKey struct{}

func (r *genCallRec) near(key string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Contains(r.keys, key)
}

// nearHits is every process's observer: it records a call's near hits, its
// hits and misses, and its fail-open.
func nearHits(ctx context.Context, e cacheguard.Event) {
	if r, ok := ctx.Value(genCallKey{}).(*genCallRec); ok {
		at := fmt.Sprintf("%s %s +%.1fms", e.Kind, e.Key, float64(time.Since(r.began).Microseconds())/1000)
		if e.Err != nil {
			at += " (" + e.Err.Error() + ")"
		}
		r.mu.Lock()
		r.trail = append(r.trail, at)
		r.mu.Unlock()
	}
	if r, ok := ctx.Value(genCallKey{}).(*genCallRec); ok && e.Kind == cacheguard.EventFailOpen {
		r.mu.Lock()
		r.failedOpen = e.Err
		r.mu.Unlock()
	}
	if r, ok := ctx.Value(genCallKey{}).(*genCallRec); ok && e.Kind == cacheguard.EventNearHit {
		r.mu.Lock()
		r.keys = append(r.keys, e.Key)
		r.mu.Unlock()
	}
	if r, ok := ctx.Value(genCallKey{}).(*genCallRec); ok && (e.Kind == cacheguard.EventHit || e.Kind == cacheguard.EventMiss) {
		r.mu.Lock()
		if r.counted == nil {
			r.counted = map[string][]cacheguard.EventKind{}
		}
		r.counted[e.Key] = append(r.counted[e.Key], e.Kind)
		r.mu.Unlock()
	}
}

// checkValue checks a value a call that began at began got for key.
func (m *genModel) checkValue(c genCall, key string, v genVal, res cacheguard.Result, began time.Time, p *genProc, rec *genCallRec) {
	if v.Seq == 0 {
		m.violation("%s: a zero value served (%v)", key, res)
		return
	}
	if rec != nil {
		rec.mu.Lock()
		rec.served = append(rec.served, v.Seq)
		rec.mu.Unlock()
	}
	names := []string{key}
	for _, tg := range c.tags {
		names = append(names, "#"+tg)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, inv := range m.invs {
		if !inv.ok || !slices.Contains(names, inv.name) {
			continue
		}
		after := inv.done
		if res == cacheguard.NearHit {
			if inv.name == key && m.readPast(p, key, inv, began) {
				m.tot.monotonic.Add(1)
			} else {
				after = after.Add(time.Second) // the message's latency, on a starved host
			}
		}
		if began.After(after) && v.Seq <= inv.seq {
			m.bad = append(m.bad, fmt.Sprintf("%s (%v, %v) began %v after the invalidation of %s returned and got load %d, begun before it (serial %d then); process %d, %s; its events: %s",
				key, res, c.policy, began.Sub(inv.done), inv.name, v.Seq, inv.seq, rec.index(), m.history(key, began), rec.events()))
		}
	}
	if w := m.loadOf(key, v); w != nil && (res == cacheguard.Hit || res == cacheguard.NearHit) {
		if m.reads == nil {
			m.reads = map[*genProc]map[string][]genRead{}
		}
		if m.reads[p] == nil {
			m.reads[p] = map[string][]genRead{}
		}
		m.reads[p][key] = append(m.reads[p][key], genRead{checked: time.Now(), loaded: w.start})
	}
	if res == cacheguard.Stale {
		if limit, why := m.staleLimit(key, v, c); began.After(limit) {
			what := fmt.Sprintf("%s served Stale %v past %s (load %d) to %s; %s", key, began.Sub(limit), why, v.Seq, c, m.history(key, began))
			if w := m.loadOf(key, v); w != nil && !began.After(w.stamped(v).Add(2*w.call.ttl+50*time.Millisecond)) {
				m.lates = append(m.lates, genLateServe{key: key, entry: w.entry, seq: v.Seq, began: began, served: time.Now(), by: rec, what: what})
			} else {
				m.bad = append(m.bad, what)
			}
		}
	}
}

// readPast reports whether process p had served a value of key (any
// variant or tags) loaded after inv returned, from Redis or its near cache,
// in a call that returned before began (m.mu held). Reads do not go
// backwards within a process (the package doc): a call that begins then
// gets no value from before inv, whether or not inv's message has arrived.
func (m *genModel) readPast(p *genProc, key string, inv genInv, began time.Time) bool {
	return slices.ContainsFunc(m.reads[p][key], func(r genRead) bool {
		return r.checked.Before(began) && r.loaded.After(inv.done)
	})
}

// loadOf is the load that returned v of key, if recorded (m.mu held).
func (m *genModel) loadOf(key string, v genVal) *genLoad {
	for i := range m.loads {
		if l := &m.loads[i]; l.seq == v.Seq && l.key == key {
			return l
		}
	}
	return nil
}

// checkSlots checks MaxConcurrentLoads against the loader itself: on a
// process with one slot, no two loader calls that took a slot ran at once,
// faults or not — a fail-open load takes one too; one a loader's Get ran or
// joined need not (see slotFree). A loader call that loaded several keys
// (GetMany) is one load.
func (m *genModel) checkSlots(rt *rapid.T) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for i, a := range m.loads {
		if a.by == nil || a.by.proc.slots != 1 {
			continue
		}
		for _, b := range m.loads[i+1:] {
			if b.by == nil || b.by.proc != a.by.proc || b.seq == a.seq {
				continue
			}
			if b.start.Before(a.end) && a.start.Before(b.end) && !m.slotFree(a) && !m.slotFree(b) {
				rt.Fatalf("process %p, one load slot: loads %s and %s ran at once", a.by.proc, m.describe(a), m.describe(b))
			}
		}
	}
}

// slotFree reports whether load b may have run without a slot: a Get made
// by a loader of its process (any load's, a load that took no slot itself
// included: the relation chains) ran it or joined it — a loader call that
// loaded that Get's entry and ended after the Get began; with a GetMany's
// other keys, the whole call; and though it may begin after the Get stopped
// waiting for it (m.mu held).
func (m *genModel) slotFree(b genLoad) bool {
	for _, ns := range m.nestedIn {
		if slices.ContainsFunc(ns, func(n genNested) bool {
			return n.proc == b.by.proc && b.end.After(n.began) &&
				slices.ContainsFunc(m.loads, func(l genLoad) bool { return l.seq == b.seq && l.entry == n.entry })
		}) {
			return true
		}
	}
	return false
}

// describe is a load for a violation's message (m.mu held): its loader
// call's entries, and the call that started it.
func (m *genModel) describe(l genLoad) string {
	var entries []string
	for _, o := range m.loads {
		if o.seq == l.seq {
			entries = append(entries, o.entry)
		}
	}
	of := int64(0)
	if l.by != nil {
		of = l.by.of
	}
	return fmt.Sprintf("%d (%s, %q, %v–%v; entries %q; started by %s%s; its loader's Gets %v)", l.seq, l.loader, l.entry,
		l.start.Format("05.000000"), l.end.Format("05.000000"), entries, l.call, map[bool]string{true: fmt.Sprintf(", a Get of load %d's loader", of)}[of != 0], m.nestedIn[l.seq])
}

// checkWaits checks the calls whose waits are bounded: none of the Gets
// loaders made waited out its budget (genNestedBudget, far past any load's
// time), and no late call of a stalled fill outlasted genStallBound after
// another process invalidated its key (see lateCalls), unless it was held
// up as any call's wait may be (heldUp): a fault in its scope — of every
// process, of its own, on its key, or of another process while that one
// held its key — during its wait or within what the fault leaves behind,
// or a stall. A fault of another process on other keys excuses nothing.
func (m *genModel) checkWaits(rt *rapid.T) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, n := range m.waits {
		if !m.heldUp(n.proc, []string{n.key}, n.began, n.done) {
			rt.Fatalf("%s", n.what)
		}
	}
}

// checkStats checks each Guard's Stats against the calls made on it: each
// key a call asks for counts once at most, a hit or a miss.
func (m *genModel) checkStats(rt *rapid.T) {
	for i, p := range append(slices.Clone(m.procs), m.old...) {
		st, n := p.g.Stats(), uint64(p.keyCalls.Load())
		m.tot.mu.Lock()
		if m.tot.statsGap == nil {
			m.tot.statsGap = map[int64]int{}
		}
		m.tot.statsGap[int64(st.Hits+st.Misses)-int64(n)]++
		m.tot.mu.Unlock()
		if st.Hits+st.Misses > n {
			rt.Fatalf("process %d: Stats counts %d hits and %d misses for %d calls of a key: %+v", i, st.Hits, st.Misses, n, st)
		}
	}
}

// checkFailures checks that every call that failed had a cause the model
// saw, of the kind its error says: its process closing (ErrClosed); its own
// deadline (the context's error, or ErrWaitTimeout); a loader's failure —
// its own, or another call's load of one of its entries that failed during
// the call (a failure is shared by the calls waiting for it); its wait
// budget (ErrWaitTimeout) — a slow load of its entries, one holding a load
// slot of its process, or a fault; Redis
// unavailable — a fault.
func (m *genModel) checkFailures(rt *rapid.T) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, f := range m.failed {
		ran := func(kinds ...string) bool { // a load of kinds, of one of f's entries, during f or just before
			return slices.ContainsFunc(m.loads, func(l genLoad) bool {
				return slices.Contains(kinds, l.loader) && l.start.Before(f.end) && l.end.Add(time.Second).After(f.began) &&
					slices.ContainsFunc(f.keys, func(k string) bool { return l.entry == f.c.entry(k) })
			})
		}
		// On a process with load slots (MaxConcurrentLoads), a fill waits
		// for a slot that a load of any entry holds, and holds its fill
		// lease meanwhile: the calls of its entry wait with it, on that
		// process and on every other one (whose fill is that lease's,
		// loaded once the slot is free: after the call began).
		busy := func(p *genProc) bool { // a slow load held one of p's slots during f
			return p.slots > 0 && slices.ContainsFunc(m.loads, func(l genLoad) bool {
				return l.loader != "fast" && l.by != nil && l.by.proc == p && l.start.Before(f.end) && l.end.After(f.began)
			})
		}
		slotted := busy(f.proc) || slices.ContainsFunc(m.loads, func(l genLoad) bool {
			return l.by != nil && l.by.proc != f.proc && !l.start.Before(f.began) &&
				slices.ContainsFunc(f.keys, func(k string) bool { return l.entry == f.c.entry(k) }) && busy(l.by.proc)
		})
		var why string
		switch {
		case errors.Is(f.err, cacheguard.ErrClosed):
			continue
		case strings.Contains(f.err.Error(), errDown.Error()):
			if f.c.loader == "fail" || ran("fail") {
				continue
			}
			why = "a loader's failure, though no load of its entries failed"
		case errors.Is(f.err, context.DeadlineExceeded) || errors.Is(f.err, context.Canceled):
			if f.c.ctxTime > 0 {
				continue
			}
			why = "a context's end, though the call's context has no deadline"
		case errors.Is(f.err, cacheguard.ErrWaitTimeout):
			if f.c.ctxTime == 0 && m.heldUp(f.proc, f.keys, f.began, f.end) {
				m.tot.waitedOut.Add(1)
				continue
			}
			if f.c.ctxTime > 0 || slotted || f.c.loader == "nested" || f.c.loader == "held" || (f.c.loader == "slow" || f.c.loader == "slowenc") && f.c.budget < genSlow+genCmd ||
				ran("slow", "slowenc", "nested", "fail", "held") {
				continue
			}
			why = "its wait budget, though no load of its entries was slow and no fault struck"
		case errors.Is(f.err, cacheguard.ErrUnavailable):
			if m.unreachable(f.proc, f.began, f.end) {
				m.tot.unavailable.Add(1)
				continue
			}
			why = "Redis unavailable, though no fault struck its process or every process, and nothing stood still"
		default:
			why = "an error the model has no cause for"
		}
		rt.Fatalf("%s of %v failed with %s: %v; call %s–%s; around it: %s", f.c, f.keys, why, f.err,
			f.began.Format("05.000000"), f.end.Format("05.000000"), m.around(f.keys[0], f.began.Add(-2*time.Second), f.end.Add(time.Second)))
	}
	m.failed = nil
}

// heldUp reports whether a fault can have held up a call of p on keys from
// began to end (kept it waiting past its budget, or a reload of its keys from
// storing): one of every process or of p's own, or of one of the keys, or of
// another process while it had one of the keys in hand (a call of it or a
// load of it running: the fill lease waited for may be that process's), or
// what such a fault leaves behind reached into the span, or the host or a
// server stood still in it. A fault of a process that touched none of the
// keys cannot (m.mu held).
func (m *genModel) heldUp(p *genProc, keys []string, began, end time.Time) bool {
	if m.stoodStill(began.Add(-genCmd), end) {
		return true
	}
	mine := func(k string) bool { return slices.Contains(keys, k) }
	return slices.ContainsFunc(m.faultsW, func(w genWindow) bool {
		if !w.from.Before(end) || !began.Before(w.to) {
			return false
		}
		if w.key != "" {
			return mine(w.key)
		}
		if w.proc == nil || w.proc == p {
			return true
		}
		in := func(a, b time.Time) bool { return a.Before(w.to) && w.from.Before(b) }
		return slices.ContainsFunc(m.touches, func(t genTouch) bool {
			return t.proc == w.proc && in(t.began, t.end) && slices.ContainsFunc(t.keys, mine)
		}) || slices.ContainsFunc(m.loads, func(l genLoad) bool {
			return l.by != nil && l.by.proc == w.proc && in(l.start, l.until()) && mine(l.key)
		})
	})
}

// unreachable reports whether Redis can have been out of p's reach from
// began to end: a fault of every process (a restart, a flush) or of p's own
// (a reply dropped, delayed or held, a pause), or what it leaves behind,
// reached into that span, or the host or a server stood still in it. A fault
// of another process cannot: its holder's wait is a wait (ErrWaitTimeout),
// never Redis failing this process (m.mu held).
func (m *genModel) unreachable(p *genProc, began, end time.Time) bool {
	return m.stoodStill(began.Add(-genCmd), end) || slices.ContainsFunc(m.faultsW, func(w genWindow) bool {
		return (w.proc == nil || w.proc == p) && w.from.Before(end) && began.Before(w.to)
	})
}

// checkLates checks the values served Stale in their late window only: a
// value is served up to its TTL past its TTL only to a call during which a
// reload of its entry ran that another call started (see
// cacheguard.EarlyRefresh), or another process held its fill lease: under a
// fault, a lease can be granted in Redis while its holder never loads (its
// grant read too late: slowGrant; its request late: lateLease), and to
// every other call that is a reload running.
func (m *genModel) checkLates(rt *rapid.T) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, ls := range m.lates {
		if m.heldUp(ls.by.proc, []string{ls.key}, ls.began, ls.served) {
			continue
		}
		ok := slices.ContainsFunc(m.loads, func(l genLoad) bool {
			// A reload runs from its fill's start: on a process with
			// MaxConcurrentLoads its loader may begin later, once a slot
			// frees, so the fill is taken to start with the call that
			// started it. It runs until its store was answered (a value
			// slow to encode: see genCodec).
			start := l.start
			if l.by != nil && l.by.began.Before(start) {
				start = l.by.began
			}
			return l.entry == ls.entry && l.seq != ls.seq && l.by != ls.by && start.Before(ls.served) && l.until().After(ls.began)
		})
		if !ok {
			rt.Fatalf("no reload of %s ran during the call (one started by another call): %s", ls.entry, ls.what)
		}
	}
}

// staleLimit is how late a call c may begin and still be served v of key as
// Stale (see TestGenCache), and what sets it. Called with m.mu held.
func (m *genModel) staleLimit(key string, v genVal, c genCall) (time.Time, string) {
	w := m.loadOf(key, v)
	if w == nil {
		end := time.Unix(0, v.End)
		if v.Slow {
			end = end.Add(genSlow)
		}
		return end.Add(2*time.Second + genMaxAge), "the longest TTL and max age (its load unrecorded)"
	}
	end := w.stamped(v)
	// 50 ms: the fill's clock read after the load's end, and Redis's
	// expiry in whole milliseconds.
	// The early refresh's grace: twice the load (as the Guard measured it:
	// a little longer than the loader ran, its value's encoding included),
	// between a quarter and half the TTL.
	window, why := min(max(2*(end.Sub(w.start)+25*time.Millisecond), w.call.ttl/4), w.call.ttl/2), "the early refresh's grace"
	switch w.call.policy {
	case "stale":
		window, why = max(window, genStale), "its stale window"
	case "failsafe", "soft":
		window, why = genMaxAge, "its FailSafe max age"
	}
	for _, l := range m.loads {
		if l.entry == w.entry && l.loader == "fail" && l.start.After(w.start) && (l.call.policy == "failsafe" || l.call.policy == "soft") {
			window, why = max(window, genMaxAge), "the max age of a FailSafe call whose load failed after"
		}
	}
	if c.policy == "soft" {
		// SoftTimeout serves the call's fallback within the call's own
		// FailSafe max age, when the value is still in Redis (its hash
		// kept by another representation's fill).
		window, why = max(window, genMaxAge), "the serving call's own FailSafe max age (SoftTimeout)"
	}
	return end.Add(w.call.ttl + window + 50*time.Millisecond), fmt.Sprintf("%s (TTL %v, %s)", why, w.call.ttl, w.call.policy)
}

func (m *genModel) invalidate(rt *rapid.T) {
	p := m.procs[rapid.IntRange(0, len(m.procs)-1).Draw(rt, "proc")]
	keys := rapid.SliceOfNDistinct(rapid.SampledFrom(genKeys), 1, 2, rapid.ID[string]).Draw(rt, "keys")
	if m.last != nil && rapid.Bool().Draw(rt, "the last call's key") {
		keys = []string{m.lastKey}
	}
	m.invalidateWith(keys, func(ctx context.Context) error { return p.g.Invalidate(ctx, keys...) })
}

func (m *genModel) invalidateTags(rt *rapid.T) {
	p := m.procs[rapid.IntRange(0, len(m.procs)-1).Draw(rt, "proc")]
	tags := rapid.SliceOfNDistinct(rapid.SampledFrom(genTags), 1, 2, rapid.ID[string]).Draw(rt, "tags")
	names := make([]string, len(tags))
	for i, tg := range tags {
		names[i] = "#" + tg
	}
	m.invalidateWith(names, func(ctx context.Context) error { return p.g.InvalidateTags(ctx, tags...) })
}

func (m *genModel) invalidateWith(names []string, do func(context.Context) error) {
	m.tot.invs.Add(1)
	seq, began := m.seq.Load(), time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	err := do(ctx)
	done := time.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, n := range names {
		m.invs = append(m.invs, genInv{name: n, seq: seq, began: began, done: done, ok: err == nil})
	}
}

// shutdown closes a process (gracefully or not) and starts another in its
// place.
func (m *genModel) shutdown(rt *rapid.T) {
	i := rapid.IntRange(0, len(m.procs)-1).Draw(rt, "proc")
	grace := rapid.SampledFrom([]time.Duration{0, 300 * time.Millisecond, time.Second}).Draw(rt, "grace")
	p := m.procs[i]
	m.tot.shutdowns.Add(1)
	start := time.Now()
	if grace == 0 {
		p.g.Close()
	} else {
		ctx, cancel := context.WithTimeout(context.Background(), grace)
		_ = p.g.Shutdown(ctx)
		cancel()
	}
	if took := time.Since(start); took > grace+genSlack {
		m.violation("Shutdown with a grace of %v took %v", grace, took)
	}
	m.old = append(m.old, p)
	m.procs[i] = m.newProc(p.near, rapid.Bool().Draw(rt, "hits share round trips"))
}

// fault injects one fault, a deleted internal key twice as often as each of
// the others.
func (m *genModel) fault(rt *rapid.T) {
	kinds := []string{"flushdb", "del", "del2", "restart", "drop", "droplease", "delay", "pause", "late", "slowgrant", "dup", "latesub", "stuck"}
	if only := os.Getenv("CG_FAULTS"); only != "" { // a hunt (see CG_ONLY)
		kinds = slices.DeleteFunc(kinds, func(k string) bool { return !slices.Contains(strings.Split(only, ","), k) })
	}
	map[string]func(*rapid.T){
		"flushdb": m.flush, "del": m.delKey, "del2": m.delKey, "restart": m.restart,
		"drop": m.dropReply, "droplease": m.dropLeaseReply, "delay": m.delayReply, "pause": m.pause, "late": m.lateLease, "slowgrant": m.slowGrant,
		"dup": m.dupLease, "latesub": m.lateSub, "stuck": m.stuckLease,
	}[rapid.SampledFrom(kinds).Draw(rt, "fault")](rt)
}

// dupLease makes the fill lease requests a process sends in the next moment
// run twice in Redis: each again genDup after, on a copy, as a request stuck
// on the wire that the client sent again on another connection (or that the
// process resent, the first one late) — after its flight stored, perhaps after
// an invalidation: a lease nobody fills, whose token an earlier fill's push
// names (see call.fromWake). Its window covers that lease's life.
func (m *genModel) dupLease(rt *rapid.T) {
	p := m.procs[rapid.IntRange(0, len(m.procs)-1).Draw(rt, "proc")]
	m.window("dup", genWindow{proc: p}, func() { p.hook.dupUntil.Store(time.Now().Add(300 * time.Millisecond).UnixNano()) })
}

// stuckLease makes the fill lease requests a process writes in the next
// moment stay on the wire genLate while their connections break (see
// keep): the round trip fails, its flight gives the token back and fails
// open, and the request reaches Redis after all that. Its window covers
// the request's arrival and what it may take.
func (m *genModel) stuckLease(rt *rapid.T) {
	p := m.procs[rapid.IntRange(0, len(m.procs)-1).Draw(rt, "proc")]
	m.window("stuck", genWindow{proc: p}, func() { p.hook.stuckUntil.Store(time.Now().Add(300 * time.Millisecond).UnixNano()) })
	m.mu.Lock()
	m.faultsW[len(m.faultsW)-1].to = m.faultsW[len(m.faultsW)-1].to.Add(300*time.Millisecond + genLate)
	m.mu.Unlock()
}

// lateSub holds what a process's subscription reads for a moment: its
// waiters hear pushes (and its near cache the messages) late, some after
// their flights followed another lease; the near cache is not trusted
// meanwhile (no proof comes).
func (m *genModel) lateSub(rt *rapid.T) {
	p := m.procs[rapid.IntRange(0, len(m.procs)-1).Draw(rt, "proc")]
	m.window("latesub", genWindow{proc: p}, func() { p.hook.subHeldUntil.Store(time.Now().Add(800 * time.Millisecond).UnixNano()) })
}

// window marks a fault window from now until do returns, plus what a fault
// may leave behind (a lease granted unseen, a call failing open).
func (m *genModel) window(kind string, scope genWindow, do func()) {
	m.tot.fault(kind)
	start := time.Now()
	do()
	m.mu.Lock()
	scope.from, scope.to = start, time.Now().Add(genLease+2*genCmd+genSlack)
	m.faultsW = append(m.faultsW, scope)
	m.faults = append(m.faults, [2]time.Time{start, time.Now()})
	m.mu.Unlock()
}

// struck records the window of a delay or drop that struck p's reply to
// commands sent at sent: a fault armed by one step strikes when the process
// next hears a reply, perhaps steps later, and its window (see window) runs
// from then, not only from its arming.
func (m *genModel) struck(p *genProc, sent time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := time.Now()
	m.faultsW = append(m.faultsW, genWindow{from: sent, to: now.Add(genLease + 2*genCmd + genSlack), proc: p})
	m.faults = append(m.faults, [2]time.Time{sent, now})
}

func (m *genModel) masters() []*redistest.Server {
	if m.cluster {
		return m.cl.Masters()
	}
	return []*redistest.Server{m.single}
}

func (m *genModel) flush(rt *rapid.T) {
	m.window("flushdb", genWindow{}, func() {
		for _, s := range m.masters() {
			if _, err := s.Do(context.Background(), "flushall"); err != nil {
				rt.Fatalf("flushall: %v", err)
			}
		}
		m.wiped.Store(time.Now().UnixNano())
	})
}

func (m *genModel) delKey(rt *rapid.T) {
	kind := rapid.SampledFrom([]string{"g:", "v:", "t:", "fl:"}).Draw(rt, "internal key")
	name := rapid.SampledFrom(genKeys).Draw(rt, "key")
	if m.last != nil && rapid.Bool().Draw(rt, "the last call's key") {
		name = m.lastKey
	}
	if kind == "t:" {
		name = rapid.SampledFrom(genTags).Draw(rt, "tag")
	}
	scope := genWindow{key: name}
	if kind == "t:" {
		scope.key = "" // a tag's version: every entry under the tag
	}
	m.window("del "+kind, scope, func() {
		ctx := context.Background()
		rdb := m.procs[0].rdb
		if kind != "fl:" {
			_ = rdb.Del(ctx, m.prefix+kind+"{"+name+"}").Err()
			return
		}
		// Every fill lease of the key (one per representation).
		for _, s := range m.masters() {
			ks, _ := s.Do(ctx, "keys", m.prefix+"fl:{"+name+"}*")
			list, _ := ks.([]any)
			for _, k := range list {
				_, _ = s.Do(ctx, "del", k)
			}
		}
	})
}

func (m *genModel) restart(rt *rapid.T) {
	ms := m.masters()
	s := ms[rapid.IntRange(0, len(ms)-1).Draw(rt, "node")]
	m.window("restart", genWindow{}, func() {
		if err := s.Restart(); err != nil {
			rt.Fatalf("restart: %v", err)
		}
		m.wiped.Store(time.Now().UnixNano())
		m.mu.Lock()
		m.restarts = append(m.restarts, time.Now())
		m.mu.Unlock()
		if m.cluster {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := m.cl.WaitStable(ctx); err != nil {
				rt.Fatalf("cluster after a restart: %v", err)
			}
		}
	})
}

func (m *genModel) dropReply(rt *rapid.T) {
	p := m.procs[rapid.IntRange(0, len(m.procs)-1).Draw(rt, "proc")]
	n := rapid.IntRange(1, 3).Draw(rt, "replies")
	m.window("drop", genWindow{proc: p}, func() { p.hook.drop.Add(int64(n)) })
}

// dropLeaseReply drops the reply to a process's next fill-lease round trip
// (a get-or-lease request, a store or a release; the command ran): what the
// lease became is unknown to its holder, which must give it back
// (checkGiveBacks).
func (m *genModel) dropLeaseReply(rt *rapid.T) {
	p := m.procs[rapid.IntRange(0, len(m.procs)-1).Draw(rt, "proc")]
	m.window("droplease", genWindow{proc: p}, func() { p.hook.dropLease.Add(1) })
}

func (m *genModel) delayReply(rt *rapid.T) {
	p := m.procs[rapid.IntRange(0, len(m.procs)-1).Draw(rt, "proc")]
	d := rapid.SampledFrom([]time.Duration{50 * time.Millisecond, 500 * time.Millisecond}).Draw(rt, "delay")
	m.window("delay", genWindow{proc: p}, func() {
		p.hook.delay.Store(int64(d))
		p.hook.delays.Add(1)
	})
}

// lateLease holds back the fill lease requests a process sends in the next
// moment: each reaches Redis after its caller gave up on it (see holdBack).
func (m *genModel) lateLease(rt *rapid.T) {
	p := m.procs[rapid.IntRange(0, len(m.procs)-1).Draw(rt, "proc")]
	m.window("late", genWindow{proc: p}, func() { p.hook.lateUntil.Store(time.Now().Add(300 * time.Millisecond).UnixNano()) })
}

// slowGrant holds the replies to the fill lease requests a process sends in
// the next moment until after their leases ran out (genSlowGrant), within
// the commands' bound: a grant read that late is given back, never loaded
// under, so unlike the other faults it excuses no overlapping loads (its
// window is marked grant).
func (m *genModel) slowGrant(rt *rapid.T) {
	p := m.procs[rapid.IntRange(0, len(m.procs)-1).Draw(rt, "proc")]
	m.tot.fault("slowgrant")
	start := time.Now()
	until := start.Add(300 * time.Millisecond)
	p.hook.slowUntil.Store(until.UnixNano())
	m.mu.Lock()
	m.faults = append(m.faults, [2]time.Time{start, until.Add(genSlowGrant)})
	m.faultsW = append(m.faultsW, genWindow{from: start, to: until.Add(genSlowGrant + genLease + 2*genCmd + genSlack), proc: p, grant: true})
	m.mu.Unlock()
}

func (m *genModel) pause(rt *rapid.T) {
	p := m.procs[rapid.IntRange(0, len(m.procs)-1).Draw(rt, "proc")]
	d := rapid.SampledFrom([]time.Duration{200 * time.Millisecond, 700 * time.Millisecond}).Draw(rt, "pause")
	m.window("pause", genWindow{proc: p}, func() { p.hook.pausedUntil.Store(time.Now().Add(d).UnixNano()) })
}

// stoodStill reports whether the process or a Redis server stood still for
// genStall at some moment from from to to (m.mu held).
func (m *genModel) stoodStill(from, to time.Time) bool {
	return slices.ContainsFunc(m.tot.stalls, func(s *gen.Stalls) bool { return s.During(from, to, genStall) })
}

// genWindow is a fault's window: from its injection until what it leaves
// behind (a lease granted unseen, a command timed out) has passed, and what
// it can reach: one process's loads (proc), one key's (key), or every load.
type genWindow struct {
	from, to time.Time
	proc     *genProc
	key      string
	grant    bool // a grant read late (slowgrant): given back, it excuses no overlapping loads
}

// reaches reports whether w can have made load l lose its lease or load
// without one: l ran during w, in w's process or on w's key when w has one.
func (w genWindow) reaches(l genLoad) bool {
	return !w.grant && l.start.Before(w.to) && l.until().After(w.from) &&
		(w.proc == nil || l.by == nil || l.by.proc == w.proc) && (w.key == "" || w.key == l.key)
}

// checkOverlaps checks that no two loads of one entry overlapped, unless an
// invalidation of its key or a fault that reached one of them came between
// (a fault of another process or key excuses nothing), or the process or
// Redis stood still during the first's lease (see leased) long enough for it
// to lapse. A load lasts until
// its store or release was answered: its lease must, or a waiter elsewhere
// takes it over while the value is still on its way (a slow encoding). But
// one that began after that store or release was sent is no overlap: the
// command ended the lease at some point between its send and its answer. And
// a load started by a call that was served the first's value began after
// the first's store ran in Redis (which ended its lease), whenever its
// process heard the answer (a refresh of a value whose store's answer came
// late). A value slower to encode than its TTL is no excuse: its TTL counts
// from the store (TestLeaseKeptWhileEncoding).
func (m *genModel) checkOverlaps(rt *rapid.T) {
	m.mu.Lock()
	defer m.mu.Unlock()
	inFault := func(l genLoad) bool {
		return slices.ContainsFunc(m.faultsW, func(w genWindow) bool { return w.reaches(l) })
	}
	invalidated := func(a, b genLoad) bool {
		for _, inv := range m.invs {
			if inv.name == a.key && !inv.began.After(b.start) && !inv.done.Before(a.start) {
				return true
			}
		}
		return false
	}
	// A load that failed open on a connection that a restart before it broke
	// ran without the lease, as documented for Redis out of reach; a process
	// that used no connection since the restart can find one broken after the
	// fault's window (TestGenCache, 12-06 05:44: "tag version: EOF" 1.7 s
	// after a restart).
	brokenBefore := func(l genLoad) bool {
		return l.unleased != nil && connBroken(l.unleased) &&
			slices.ContainsFunc(m.restarts, func(r time.Time) bool { return r.Before(l.start) })
	}
	for i, a := range m.loads {
		for _, b := range m.loads[i+1:] {
			if a.entry != b.entry || inFault(a) || inFault(b) || brokenBefore(a) || brokenBefore(b) {
				continue
			}
			first, second := a, b
			if second.start.Before(first.start) {
				first, second = second, first
			}
			// A second load that began once the first's store or release was
			// on its way ran after that command ended the first's lease in
			// Redis, as far as anyone can tell: whenever the first's process
			// heard the answer (a release pushed to a waiter elsewhere, which
			// took the fill over at once, reached it first: TestGenCache at
			// scale 3, 12-06 05:34, 0.3 ms apart).
			onItsWay := !first.sent.IsZero() && !second.start.Before(first.sent)
			if second.start.Before(first.until()) && !onItsWay && !invalidated(first, second) && (second.by == nil || !second.by.saw(first.seq)) {
				if m.stoodStill(first.leased(), first.until()) {
					if k := [2]int64{first.seq, second.seq}; !m.excused[k] {
						m.excused[k] = true
						m.tot.stalledOverlaps.Add(1)
					}
					continue
				}
				rt.Fatalf("two loads of %s overlapped: %v–%v (loader until %v) and %v–%v; %s and %s", a.entry,
					first.start.Format("05.000"), first.until().Format("05.000"), first.end.Format("05.000"),
					second.start.Format("05.000"), second.until().Format("05.000"), first.describe(), second.describe())
			}
		}
	}
}

// connBroken reports whether err says a connection broke: the end of its
// stream, or a reset or closed socket.
func connBroken(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.EPIPE) || errors.Is(err, net.ErrClosed)
}

// faultHook holds, delays or drops replies of one client, holds back its
// fill leases' requests (late), and watches its give-backs (see watch).
type faultHook struct {
	drop         atomic.Int64 // replies to drop (the command ran)
	dropLease    atomic.Int64 // replies to fill-lease round trips to drop (the command ran)
	delays       atomic.Int64 // replies to delay by delay
	delay        atomic.Int64
	delayBegins  chan struct{}          // told (when it can take it) as a delayed reply begins its delay
	delayField   atomic.Pointer[string] // when set, only a reply to a command naming this values field is delayed
	subHeldUntil atomic.Int64           // unix ns: what the subscription reads reaches the near cache then (see DialHook)
	pausedUntil  atomic.Int64           // unix ns: every command waits until then
	lateUntil    atomic.Int64           // unix ns: fill lease requests sent before then arrive late (see holdBack)
	dupUntil     atomic.Int64           // unix ns: fill lease requests sent before then run again genDup after (see again)
	stuckUntil   atomic.Int64           // unix ns: fill lease requests written before then stay on the wire genLate (see keep)
	slowUntil    atomic.Int64           // unix ns: replies to fill lease requests sent before then come genSlowGrant late
	lateKey      string                 // when set, only those of this values hash
	deliver      chan struct{}          // when set, they arrive once it is closed, not genLate after
	late         pending                // requests held back, not sent yet
	bad          func(format string, args ...any)
	// settled is told of the fill stores and lease releases answered, and
	// sending of those about to be sent.
	settled, sending func(ctx context.Context, keys []string)
	wiped            *atomic.Int64 // unix ns: when the last fault that loses every key (FLUSHALL, a restart) ended
	ends             *genEnds      // the model's record of the fill leases their holders are done with (nil: none)
	// struck is told when a reply to commands sent at the time it is given
	// was delayed or dropped (see after).
	struck func(sent time.Time)

	mu       sync.Mutex
	gaveBack map[string]time.Time // "<lease key> <token>": when a give-back of it was answered
	gaveTok  map[string]bool      // tokens a give-back was answered for
	owed     map[string]string    // token → the failed round trip that owes its give-back (see owe)
	stuck    map[string]bool      // the requests kept on the wire (see stuckOnce)
}

var errDropped = errors.New("gen: reply dropped")

// armed reports whether a fault injected earlier has yet to strike or end:
// replies to drop or delay, a pause or late lease requests still to come, or
// requests held back.
func (h *faultHook) armed() bool {
	now := time.Now().UnixNano()
	h.late.mu.Lock()
	held := h.late.n > 0
	h.late.mu.Unlock()
	return h.drop.Load() > 0 || h.dropLease.Load() > 0 || h.delays.Load() > 0 || h.pausedUntil.Load() > now || h.lateUntil.Load() > now ||
		h.dupUntil.Load() > now || h.subHeldUntil.Load() > now || h.stuckUntil.Load() > now ||
		h.slowUntil.Load() > now || held
}

// genSlowGrant is how late a slow grant's reply comes (slowGrant): after its
// lease ran out in Redis, within the command's bound.
const genSlowGrant = genLease + 100*time.Millisecond

// genLate is how late a held-back fill lease request reaches Redis: after its
// command's bound (twice the command timeout while Redis answers), so after
// its caller gave up on it and gave it back.
const genLate = 2*genCmd + 400*time.Millisecond

// DialHook marks the client's subscription connection (subConn): what it
// reads while a late-messages fault lasts (subHeldUntil) reaches the near
// cache once it ends.
func (h *faultHook) DialHook(next redis.DialHook) redis.DialHook {
	dial := subDial(next, h.subWait)
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &gen.StuckConn{Conn: c, Keep: h.keep}, nil
	}
}

// genStuck counts the requests kept on the wire (see keep).
var genStuck atomic.Int64

// keep is a connection's gen.StuckConn.Keep: while a stuck fault lasts
// (stuckUntil), the first write of a fill lease request (see stuckOnce) stays
// on the wire genLate while its connection breaks, so go-redis gives up on
// it — and would send the request again on another connection, were it not a
// grant's (rcmd.Script.Grant); the kept request then reaches Redis all the
// same, its reply read by nobody but the fault. This acts below go-redis,
// where the hook's faults (late, dup) cannot: on its resends.
func (h *faultHook) keep(b []byte) (time.Duration, func(), bool) {
	if time.Now().UnixNano() >= h.stuckUntil.Load() || !bytes.Contains(b, []byte(cacheguard.LeaseScriptSHA())) || !h.stuckOnce(b) {
		return 0, nil, false
	}
	genStuck.Add(1)
	h.late.add()
	return genLate, h.late.done, true
}

// stuckOnce reports whether the request b is to be kept: the first time it
// is written. Its copy written again (a client's resend, on another
// connection: the same bytes) goes through, as it would on the wire.
func (h *faultHook) stuckOnce(b []byte) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.stuck == nil {
		h.stuck = map[string]bool{}
	}
	if h.stuck[string(b)] {
		return false
	}
	h.stuck[string(b)] = true
	return true
}

// subWait holds a message read on the subscription until the late-messages
// fault ends: the fault, not a synchronisation.
func (h *faultHook) subWait() {
	if d := time.Until(time.Unix(0, h.subHeldUntil.Load())); d > 0 {
		time.Sleep(d)
	}
}

func (h *faultHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		return h.around(ctx, []redis.Cmder{cmd}, func(ctx context.Context, cmds []redis.Cmder) error { return next(ctx, cmds[0]) })
	}
}

func (h *faultHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error { return h.around(ctx, cmds, next) }
}

func (h *faultHook) around(ctx context.Context, cmds []redis.Cmder, send func(context.Context, []redis.Cmder) error) error {
	h.before()
	if time.Now().UnixNano() < h.lateUntil.Load() && slices.ContainsFunc(cmds, h.holds) {
		err := h.holdBack(ctx, cmds, send)
		h.owe(cmds)
		return err
	}
	if h.sending != nil {
		if keys := fillKeys(cmds); keys != nil {
			h.sending(ctx, keys)
		}
	}
	sent := time.Now()
	err := send(ctx, cmds)
	h.watch(sent, cmds)
	if sent.UnixNano() < h.dupUntil.Load() {
		h.again(cmds, send)
	}
	if sent.UnixNano() < h.slowUntil.Load() && slices.ContainsFunc(cmds, isLeaseCall) {
		time.Sleep(genSlowGrant) // the fault: the reply comes after the lease ran out
	}
	dropped := h.after(sent, cmds)
	if !dropped && slices.ContainsFunc(cmds, isFillLeaseCall) && h.dropLease.Load() > 0 && h.dropLease.Add(-1) >= 0 {
		dropped = true
		if h.struck != nil {
			h.struck(sent)
		}
	}
	if dropped {
		for _, c := range cmds {
			c.SetErr(errDropped)
		}
		err = errDropped
	}
	h.owe(cmds)
	if h.settled != nil {
		if keys := fillKeys(cmds); keys != nil {
			h.settled(ctx, keys)
		}
	}
	return err
}

// fillKeys returns the keys of the fill stores and lease releases in cmds
// that were answered (not with NOSCRIPT: those are sent again).
func fillKeys(cmds []redis.Cmder) []string {
	var keys []string
	for _, c := range cmds {
		a := c.Args() // evalsha|eval, sha|source, numkeys, values hash or lease, ...
		if len(a) < 4 || !cacheguard.IsFillCall(a) && !cacheguard.IsReleaseCall(a) ||
			c.Err() != nil && strings.HasPrefix(c.Err().Error(), "NOSCRIPT") {
			continue
		}
		name, _ := a[3].(string)
		if i, j := strings.IndexByte(name, '{'), strings.IndexByte(name, '}'); i >= 0 && j > i {
			keys = append(keys, name[i+1:j])
		}
	}
	return keys
}

// holdBack sends cmds genLate from now (or once deliver is closed), on
// copies, as a request stuck on the wire reaches Redis even when its caller
// gave up on it; the caller hears nothing before its command's bound ends.
func (h *faultHook) holdBack(ctx context.Context, cmds []redis.Cmder, send func(context.Context, []redis.Cmder) error) error {
	copies := make([]redis.Cmder, len(cmds))
	for i, c := range cmds {
		copies[i] = redis.NewCmd(context.Background(), c.Args()...)
	}
	h.late.add()
	go func() {
		defer h.late.done()
		if h.deliver == nil {
			time.Sleep(genLate) // the fault: the request is slow to arrive
		} else {
			select { // the fault, until the test's event
			case <-h.deliver:
			case <-time.After(10 * time.Second): // a bound for a test whose event never comes
			}
		}
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		sent := time.Now()
		_ = send(sctx, copies)
		h.watch(sent, copies)
	}()
	givenUp, why, stop := gen.ReplyGivenUp(ctx) // every command of a Guard has a bound
	defer stop()
	<-givenUp
	err := why()
	for _, c := range cmds {
		c.SetErr(err)
	}
	return err
}

// genDup is how late a fill lease request runs again (dupLease): after its
// flight's fill stored, typically, within the fault's window.
const genDup = 500 * time.Millisecond

// again sends the fill lease requests of cmds once more genDup from now, on
// copies, whose replies nobody hears: the request ran twice in Redis.
func (h *faultHook) again(cmds []redis.Cmder, send func(context.Context, []redis.Cmder) error) {
	var copies []redis.Cmder
	for _, c := range cmds {
		if isLeaseCall(c) {
			copies = append(copies, redis.NewCmd(context.Background(), c.Args()...))
			h.ends.ranTwice(c.Args())
		}
	}
	if copies == nil {
		return
	}
	h.late.add()
	go func() {
		defer h.late.done()
		time.Sleep(genDup) // the fault: the request's second run comes late
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		sent := time.Now()
		_ = send(sctx, copies)
		h.watch(sent, copies)
	}()
}

// isFillLeaseCall reports whether cmd is a round trip of a fill lease: a
// get-or-lease request, a store or a release (a give-back included).
func isFillLeaseCall(cmd redis.Cmder) bool {
	return isLeaseCall(cmd) || cacheguard.IsFillCall(cmd.Args()) || cacheguard.IsReleaseCall(cmd.Args())
}

// isLeaseCall reports whether cmd is a get-or-lease request (lease.lua), as
// EVALSHA or as the EVAL that follows a NOSCRIPT.
func isLeaseCall(cmd redis.Cmder) bool {
	a := cmd.Args()
	return len(a) > 1 && (a[0] == "evalsha" && a[1] == cacheguard.LeaseScriptSHA() || a[0] == "eval" && a[1] == cacheguard.LeaseScriptSource())
}

// holds reports whether cmd is a request h holds back while armed.
func (h *faultHook) holds(cmd redis.Cmder) bool {
	a := cmd.Args() // evalsha, sha, numkeys, the first values hash, ...
	return isLeaseCall(cmd) && (h.lateKey == "" || len(a) > 3 && a[3] == h.lateKey)
}

// watch is the fill leases' liveness oracle, from the replies alone: a
// token's request for a fill lease sent after a give-back of that token's
// lease was answered is never granted. Its caller gave up on it (the give-back
// says so), so nobody would fill the lease, and the entry's other callers
// would wait for its expiry instead of taking the fill over. (Unless a fault
// lost every key since: the give-back's record with them.)
func (h *faultHook) watch(sent time.Time, cmds []redis.Cmder) {
	for _, cmd := range cmds {
		a := cmd.Args() // evalsha|eval, sha|source, numkeys, keys..., args...
		if len(a) < 4 || a[0] != "evalsha" && a[0] != "eval" || cmd.Err() != nil {
			continue
		}
		keys, tok, ok := scriptArgs(a)
		if !ok {
			continue
		}
		if k := giveBackOf(cmd); k != "" {
			h.mu.Lock()
			if h.gaveBack == nil {
				h.gaveBack = map[string]time.Time{}
			}
			h.gaveBack[k+" "+tok[1:]] = time.Now()
			if h.gaveTok == nil {
				h.gaveTok = map[string]bool{}
			}
			h.gaveTok[tok[1:]] = true
			delete(h.owed, tok[1:])
			h.mu.Unlock()
			h.ends.end(k, tok[1:])
			continue
		}
		switch {
		case cacheguard.IsFillCall(a): // values, lease, generation; "<generation> <token>", ...
			h.ends.end(fmt.Sprint(keys[1]), tok[strings.LastIndexByte(tok, ' ')+1:])
		case cacheguard.IsReleaseCall(a): // lease, generation; "<generation> <token>", ...
			h.ends.end(fmt.Sprint(keys[0]), tok[strings.LastIndexByte(tok, ' ')+1:])
		}
		// An answered round trip of a token (a retry of one that failed
		// unanswered: rcmd resends a command the process, not Redis, was
		// slow for) tells its holder what the lease became: nothing is owed.
		h.mu.Lock()
		switch {
		case isLeaseCall(cmd):
			delete(h.owed, tok)
		case cacheguard.IsFillCall(a) || cacheguard.IsReleaseCall(a):
			delete(h.owed, tok[strings.LastIndexByte(tok, ' ')+1:])
		}
		h.mu.Unlock()
		if !isLeaseCall(cmd) {
			continue
		}
		c, _ := rcmd.AsCmd(cmd)
		replies, _ := c.Slice()
		if len(replies) == 0 || len(keys)%len(replies) != 0 {
			continue
		}
		stride := len(keys) / len(replies) // values, lease, generation[, ...] per key
		for i, r := range replies {
			v, _ := r.([]any)
			if len(v) != 2 || v[0] != int64(1) {
				continue
			}
			lk := fmt.Sprint(keys[stride*i+1])
			h.mu.Lock()
			at, ok := h.gaveBack[lk+" "+tok]
			h.mu.Unlock()
			if ok && sent.After(at) && h.wiped.Load() < at.UnixNano() {
				h.bad("fill lease %s granted to %s by a request sent %v after its give-back was answered: nobody fills it", lk, tok, sent.Sub(at))
			}
		}
	}
}

// owe records the fill-lease round trips of cmds (a get-or-lease request, a
// store, a release) that failed: each may have run, or not yet, and so owes
// a give-back of its token (checkGiveBacks), or the lease it took or failed
// to end keeps every other caller of the key waiting for its expiry. The
// oracle's own rule, not the library's: any error, an error reply included,
// since these clients retry (go-redis's defaults: MaxRetries, MaxRedirects)
// and report the last attempt's error alone, and an attempt before it may
// have run.
func (h *faultHook) owe(cmds []redis.Cmder) {
	for _, cmd := range cmds {
		a := cmd.Args() // evalsha|eval, sha|source, numkeys, keys..., args...
		if err := cmd.Err(); err == nil || len(a) < 4 || giveBackOf(cmd) != "" {
			continue
		}
		_, arg, ok := scriptArgs(a)
		if !ok {
			continue
		}
		var tok string
		switch {
		case isLeaseCall(cmd):
			tok = arg
		case cacheguard.IsFillCall(a) || cacheguard.IsReleaseCall(a): // "<generation> <token>"
			tok = arg[strings.LastIndexByte(arg, ' ')+1:]
		default:
			continue
		}
		h.mu.Lock()
		if h.owed == nil {
			h.owed = map[string]string{}
		}
		if !h.gaveTok[tok] {
			kind := map[bool]string{true: "get-or-lease", false: "store or release"}[isLeaseCall(cmd)]
			h.owed[tok] = fmt.Sprintf("%s (%s) of %v, token %s, failed at %s: %v", a[0], kind, a[3], tok, time.Now().Format("05.000"), cmd.Err())
		}
		h.mu.Unlock()
	}
}

// checkGiveBacks checks, once every call has returned, that each fill-lease
// round trip of a live process that failed without a reply (see owe) had its
// token given back, within 3s (give-backs are sent every 100ms until Redis
// answers; a pause or a restart delays them). A closed process's give-backs
// are dropped with it: only the live ones are checked.
func (m *genModel) checkGiveBacks(rt *rapid.T) {
	deadline := time.Now().Add(3 * time.Second)
	for {
		var unpaid []string
		for _, p := range m.procs {
			p.hook.mu.Lock()
			for tok, what := range p.hook.owed {
				if !p.hook.gaveTok[tok] {
					unpaid = append(unpaid, what)
				}
			}
			p.hook.mu.Unlock()
		}
		if len(unpaid) == 0 {
			return
		}
		if time.Now().After(deadline) {
			rt.Fatalf("%d fill-lease round trips that failed unanswered were never given back, first: %s", len(unpaid), unpaid[0])
		}
		time.Sleep(20 * time.Millisecond) // polls the hooks' record of the give-backs answered, within the deadline
	}
}

// genEnds records the fill leases whose holders are done with them: a
// store, a release or a give-back of the lease by its token was answered.
// The lease held by that token in Redis after then is one nobody fills
// (see watchOrphans).
type genEnds struct {
	mu       sync.Mutex
	ended    map[string]time.Time // "<lease key> <token>": when its holder's end was answered
	twice    map[string]bool      // tokens whose lease requests the dup fault ran twice
	reported map[string]bool      // the orphans reported, by lease key and token
}

// end records that lease's holder tok was done with it. A hook made without
// a record (a test of its own, not a generator's) keeps none.
func (e *genEnds) end(lease, tok string) {
	if e == nil {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.ended == nil {
		e.ended = map[string]time.Time{}
	}
	if _, ok := e.ended[lease+" "+tok]; !ok {
		e.ended[lease+" "+tok] = time.Now()
	}
}

// ranTwice records the token of a lease request (its command line a) that
// the dup fault runs twice: a copy of it may take a lease after its flight
// ended — the fault's own doing, which no client could prevent.
func (e *genEnds) ranTwice(a []any) {
	if e == nil {
		return
	}
	_, tok, ok := scriptArgs(a)
	if !ok {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.twice == nil {
		e.twice = map[string]bool{}
	}
	e.twice[tok] = true
}

// scriptArgs returns the keys and the first argument of a script's command
// line a (evalsha|eval, sha|source, numkeys, keys..., args...), if it has one.
func scriptArgs(a []any) (keys []any, first string, ok bool) {
	if len(a) < 3 {
		return nil, "", false
	}
	nk, isInt64 := a[2].(int64)
	if !isInt64 {
		n, _ := a[2].(int)
		nk = int64(n)
	}
	if nk < 0 || int(nk)+3 >= len(a) {
		return nil, "", false
	}
	return a[3 : 3+nk], fmt.Sprint(a[3+nk]), true
}

// endedBefore reports when lease's holder tok was done with it, if before t
// and not reported already (then it reports it).
func (e *genEnds) endedBefore(lease, tok string, t time.Time) (time.Time, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	at, ok := e.ended[lease+" "+tok]
	if !ok || !at.Before(t) || e.twice[tok] || e.reported[lease+" "+tok] {
		return time.Time{}, false
	}
	if e.reported == nil {
		e.reported = map[string]bool{}
	}
	e.reported[lease+" "+tok] = true // once is enough
	return at, true
}

// watchOrphans is the fill leases' liveness oracle from Redis's own state:
// every genOrphanScan, it reads every fill lease of the run on every master,
// and a lease held by a token whose store, release or give-back of it was
// answered before the read is a violation — its flight has ended, so nobody
// fills it, and every caller of the key waits for its expiry (an orphan:
// a request of that token that ran late, on the wire or sent again by a
// client). Excused: a fault that lost every key since (the give-back's
// record with them), and the dup fault's copies. It returns the function that
// stops it.
func (m *genModel) watchOrphans() (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	clients := map[string]*redis.Client{}
	go func() {
		defer close(done)
		defer func() {
			for _, c := range clients {
				_ = c.Close()
			}
		}()
		tick := time.NewTicker(genOrphanScan)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			for _, s := range m.masters() {
				c := clients[s.Addr()]
				if c == nil {
					c = redis.NewClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1, DialTimeout: time.Second, ReadTimeout: time.Second})
					clients[s.Addr()] = c
				}
				m.scanOrphans(ctx, c)
			}
		}
	}()
	return func() { cancel(); <-done }
}

// genOrphanScan is how often watchOrphans reads the leases: well within a
// lease (genLease), which an orphan outlives by nothing.
const genOrphanScan = 50 * time.Millisecond

func (m *genModel) scanOrphans(ctx context.Context, c *redis.Client) {
	var cursor uint64
	for {
		keys, next, err := c.Scan(ctx, cursor, m.prefix+"fl:*", 1000).Result()
		if err != nil {
			return // a restart, or the run's end
		}
		for _, k := range keys {
			read := time.Now()
			v, err := c.Get(ctx, k).Result()
			if err != nil {
				continue
			}
			tok := v[strings.LastIndexByte(v, ' ')+1:]
			at, ended := m.ends.endedBefore(k, tok, read)
			if !ended || m.wiped.Load() > at.UnixNano() {
				continue
			}
			left, _ := c.PTTL(ctx, k).Result()
			m.violation("orphan fill lease %s: Redis holds %q (%v of its lease left) %v after that token's store, release or give-back of it was answered: nobody fills it, and the key's callers wait for its expiry",
				k, v, left, read.Sub(at).Round(time.Millisecond))
		}
		if cursor = next; cursor == 0 {
			return
		}
	}
}

func (h *faultHook) before() {
	if d := time.Until(time.Unix(0, h.pausedUntil.Load())); d > 0 {
		time.Sleep(d) // the process is paused: the fault, not a synchronisation
	}
}

// aimed reports whether a delay may strike the reply to cmds: when
// delayField is set, only one to a command with an argument ending so (a
// values field, "|<variant>", or a fill lease's name).
func (h *faultHook) aimed(cmds []redis.Cmder) bool {
	f := h.delayField.Load()
	return f == nil || slices.ContainsFunc(cmds, func(c redis.Cmder) bool {
		return slices.ContainsFunc(c.Args(), func(a any) bool { return strings.HasSuffix(argString(a), *f) })
	})
}

// after delays the reply to commands sent at sent when a delay is due, and
// reports whether to drop it. A delay or drop strikes here, when the process
// next hears a reply, which may be long after it was armed: struck is told.
func (h *faultHook) after(sent time.Time, cmds []redis.Cmder) bool {
	delayed := h.delays.Load() > 0 && h.aimed(cmds) && h.delays.Add(-1) >= 0
	if delayed {
		select {
		case h.delayBegins <- struct{}{}:
		default:
		}
		time.Sleep(time.Duration(h.delay.Load()))
	}
	dropped := h.drop.Load() > 0 && h.drop.Add(-1) >= 0
	if (delayed || dropped) && h.struck != nil {
		h.struck(sent)
	}
	return dropped
}
