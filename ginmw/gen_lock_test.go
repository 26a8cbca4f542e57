package ginmw_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/redis/go-redis/v9"
	"pgregory.net/rapid"

	"github.com/cacheguard/cacheguard/ginmw"
	"github.com/cacheguard/cacheguard/internal/rcmd"
	"github.com/cacheguard/cacheguard/internal/redistest"
	"github.com/cacheguard/cacheguard/internal/testing/gen"
	"github.com/cacheguard/cacheguard/locks"
)

// TestGenLock drives Lock the way a service is driven: two processes (each
// a Gin engine with Lock on three routes of one resource kind, one of them
// locking it twice, one with a lease of its own, over a locks.Client of its
// own, or a Redlock over three servers) serve concurrent
// requests whose targets spell a resource's id in many ways (leading
// zeros, '+', escapes, dot segments, extra slashes), under Gin settings
// drawn per check, some from clients that give up; faults act at reply
// granularity on one process's Redis client (a script command delayed
// before it is sent, its reply held after it ran — each until the client
// gives up on the reply as its socket would, the delayed command reaching
// Redis all the same —, its reply dropped, the command failed unsent), each
// process's clients with ContextTimeoutEnabled or go-redis's socket
// timeouts alone (drawn), a lock key is lost in Redis (on one node), Redis
// (its first node) is paused (SIGSTOP) or restarted without persistence. The handlers
// are the oracle's probes; the oracle trusts no code of ours:
//
//   - a handler runs only for a target whose id parses as an integer (as
//     the handler itself parses it), and only with its lock held: its
//     Lock's TTL (the local clock, never more than Redis keeps) positive
//     when Lock returned it;
//   - at no instant do two requests' handlers of one resource (the id as
//     the handler parses it) both hold its lock, unless its key was lost in
//     Redis after either request was sent;
//   - a handler whose lock's TTL has run out sees its context cancelled
//     with locks.ErrLost within 2 s (a starved -race host's slack);
//   - every answer is what the outcome says: 200 from a handler that
//     finished, 500 from one that panicked, 409 (Retry-After ≥ 1) when it
//     did not run for contention or ran and lost its lock, 404 for an id
//     that is not an integer, 503 for Redis errors — only when a fault
//     struck the request's process or Redis was paused or restarted since
//     it was sent, or the process or a server stood still (a starved host)
//     for as long as a command's timeout since then (gen.Stalls) —,
//     nothing written for a client that went away;
//   - a request waits for its lock (until its handler runs, or it is
//     answered without it) no longer than its wait budget (or its client's
//     timeout) and the Lock attempts the budget does not cut (see
//     lockProc.attempt), past 400 ms only by a stall of the process;
//   - once every request returned and the processes closed, Redis keeps no
//     lock of the check's resources beyond the longest lease.
func TestGenLock(t *testing.T) {
	servers := redistest.StartN(t, 3)
	var mon []*redis.Client
	for _, s := range servers {
		mon = append(mon, s.Client())
	}
	var checks int
	st := &genLockStats{}
	stalls := []*gen.Stalls{gen.WatchStalls(t)} // the process, then each server
	for _, s := range servers {
		stalls = append(stalls, gen.WatchRedis(t, s.Addr()))
	}
	gen.Check(t, 60, func(rt *rapid.T) {
		checks++
		genLockRun(rt, servers, mon, fmt.Sprintf("genlock%d", checks), st, stalls)
	})
	t.Logf("gen: %d checks; %s", checks, st)
}

type genLockStats struct {
	mu     sync.Mutex
	counts map[string]int
	// The longest a request waited past its bound (see waited; below 0 when
	// none did), and for which; apart, the waits a stall of the process
	// excused.
	worst           time.Duration
	worstOf         string
	seen            bool // worst is set
	excused, judged int
}

// waited records how far past its bound a request waited (over), and
// whether a stall of the process excused it.
func (s *genLockStats) waited(over time.Duration, stalled bool, of string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.judged++
	if stalled {
		s.excused++
		return
	}
	if !s.seen || over > s.worst { // below 0: every wait within its bound, the closest by -worst
		s.worst, s.worstOf, s.seen = over, of, true
	}
}

func (s *genLockStats) add(what string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.counts == nil {
		s.counts = map[string]int{}
	}
	s.counts[what]++
}

func (s *genLockStats) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return fmt.Sprintf("%v; %d waits judged, %d excused by a stall of the process, the longest past its bound by %v: %s",
		s.counts, s.judged, s.excused, s.worst.Round(time.Millisecond), s.worstOf)
}

// lockFault is a go-redis hook that acts on the script commands (the
// locks' acquire, renew, release) of one client, at reply granularity.
type lockFault struct {
	// socket is how long its client's socket waits for a reply (ReadTimeout)
	// when the client does not bound it by the command's context deadline
	// (ContextTimeoutEnabled off); 0 when it does.
	socket time.Duration

	mu    sync.Mutex
	mode  string // "delay", "late", "drop", "fail"; "" none
	d     time.Duration
	left  int
	slept sync.WaitGroup // delays and held replies under way
	until time.Time      // when the effect of the last fault that struck ends, at the latest
}

func (f *lockFault) set(mode string, d time.Duration, n int) {
	f.mu.Lock()
	f.mode, f.d, f.left = mode, d, n
	f.mu.Unlock()
}

func (f *lockFault) take(cmds []redis.Cmder) (string, time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.left == 0 {
		return "", 0
	}
	for _, c := range cmds {
		if n := c.Name(); n == "evalsha" || n == "eval" {
			f.left--
			f.slept.Add(1)
			f.until = time.Now().Add(f.d + time.Second) // the command's bound is 2 × 200 ms
			return f.mode, f.d
		}
	}
	return "", 0
}

var errInjected = errors.New("gen: injected failure")

func (f *lockFault) around(ctx context.Context, cmds []redis.Cmder, send func(context.Context, []redis.Cmder) error) error {
	mode, d := f.take(cmds)
	if mode == "" {
		return send(ctx, cmds)
	}
	defer f.slept.Done()
	switch mode {
	case "delay": // the command reaches Redis late
		sent := time.Now()
		if err := f.wait(ctx, d); err != nil {
			// Its client gave up on the reply first (its socket's deadline):
			// the command reaches Redis all the same, d after it was sent.
			copies := make([]redis.Cmder, len(cmds))
			for i, c := range cmds {
				copies[i] = redis.NewCmd(context.Background(), c.Args()...)
				c.SetErr(err)
			}
			f.slept.Add(1)
			go func() {
				defer f.slept.Done()
				time.Sleep(time.Until(sent.Add(d))) // the fault: the request is slow to arrive
				sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				defer cancel()
				_ = send(sctx, copies)
			}()
			return err
		}
		return send(ctx, cmds)
	case "late": // it ran; its reply comes late
		err := send(ctx, cmds)
		if werr := f.wait(ctx, d); werr != nil {
			for _, c := range cmds {
				c.SetErr(werr)
			}
			return werr
		}
		return err
	case "drop": // it ran; its reply is lost
		_ = send(ctx, cmds)
		for _, c := range cmds {
			c.SetErr(errInjected)
		}
		return errInjected
	default: // "fail": never sent
		for _, c := range cmds {
			c.SetErr(errInjected)
		}
		return errInjected
	}
}

// wait waits d for a reply that comes late, or until the client gives up on
// it as its socket would: at the command's context deadline (or end) on a
// client with ContextTimeoutEnabled (gen.ReplyGivenUp), else after its read
// timeout. It returns the error the command then fails with, or nil.
func (f *lockFault) wait(ctx context.Context, d time.Duration) error {
	late := time.NewTimer(d)
	defer late.Stop()
	var givenUp <-chan struct{}
	why := func() error { return os.ErrDeadlineExceeded }
	var socket <-chan time.Time
	if f.socket == 0 {
		done, err, stop := gen.ReplyGivenUp(ctx)
		defer stop()
		givenUp, why = done, err
	} else {
		t := time.NewTimer(f.socket)
		defer t.Stop()
		socket = t.C
	}
	select {
	case <-late.C:
		return nil
	case <-givenUp:
	case <-socket:
	}
	return fmt.Errorf("gen: reply given up: %w", why())
}

// struckSince reports whether a fault struck since from, or struck before
// with an effect lasting past it.
func (f *lockFault) struckSince(from time.Time) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return !f.until.Before(from)
}

func (f *lockFault) DialHook(next redis.DialHook) redis.DialHook { return next }
func (f *lockFault) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		return f.around(ctx, []redis.Cmder{cmd}, func(ctx context.Context, cmds []redis.Cmder) error { return next(ctx, cmds[0]) })
	}
}
func (f *lockFault) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		return f.around(ctx, cmds, next)
	}
}

// lockWorld is one check of TestGenLock.
type lockWorld struct {
	rt      *rapid.T
	kind    string
	redlock bool            // the processes lock with a Redlock over every server, else a Client on the first
	mon     []*redis.Client // one per server
	procs   []*lockProc
	calls   sync.WaitGroup

	mu             sync.Mutex
	active         map[int64][]*lockProbe // by resource id: the handlers running
	lostAt         map[int64]time.Time    // by resource id: when its key was last deleted
	shaken         time.Time              // when the last pause or restart of Redis ends, at the latest
	stalls         []*gen.Stalls          // when the process, and each server in use, stood still
	commandTimeout time.Duration          // the shortest a command is given (see genLockRun)
	failures       []string
	log            []string
	start          time.Time
}

type lockProc struct {
	// attempt bounds one Lock attempt on its clients: the command timeout,
	// Patience times, with ContextTimeoutEnabled; without it go-redis's own
	// socket timeouts, for the command and a new connection's handshake.
	attempt time.Duration
	rdbs    []*redis.Client // one per server it locks on
	fault   *lockFault      // on each of them
	l       interface {
		locks.Locker
		Close() error
	}
	eng *gin.Engine
}

// lockProbe is one handler while it runs.
type lockProbe struct {
	req    int
	lk     *locks.Lock
	sent   time.Time // when its request was sent: before its Lock was asked for
	lostAt time.Time // when it first saw its TTL at 0 (zero: it did not)
}

func (w *lockWorld) note(format string, args ...any) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.log = append(w.log, fmt.Sprintf("%8.1fms ", float64(time.Since(w.start).Microseconds())/1000)+fmt.Sprintf(format, args...))
}

func (w *lockWorld) violate(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	w.note("VIOLATION %s", msg)
	w.mu.Lock()
	w.failures = append(w.failures, msg)
	w.mu.Unlock()
}

// probe checks the exclusion rule for p, a handler of resource id: p's
// lock is held (TTL > 0) and no other handler of id holds its own, unless
// id's key was lost since either began.
func (w *lockWorld) probe(id int64, p *lockProbe) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if p.lk.TTL() <= 0 {
		return
	}
	for _, o := range w.active[id] {
		if o == p || o.lk.TTL() <= 0 {
			continue
		}
		if lost := w.lostAt[id]; !lost.IsZero() && (lost.After(p.sent) || lost.After(o.sent)) {
			continue
		}
		w.failures = append(w.failures, fmt.Sprintf("resource %d: requests %d and %d both hold its lock (%s fence %d TTL %v sent at %v; %s fence %d TTL %v sent at %v)",
			id, p.req, o.req, p.lk.Name(), p.lk.Fence(), p.lk.TTL(), p.sent.Sub(w.start), o.lk.Name(), o.lk.Fence(), o.lk.TTL(), o.sent.Sub(w.start)))
	}
}

func (w *lockWorld) enter(id int64, p *lockProbe) {
	w.mu.Lock()
	if w.active == nil {
		w.active = map[int64][]*lockProbe{}
	}
	w.active[id] = append(w.active[id], p)
	w.mu.Unlock()
	w.probe(id, p)
}

func (w *lockWorld) leave(id int64, p *lockProbe) {
	w.mu.Lock()
	defer w.mu.Unlock()
	as := w.active[id]
	for i, o := range as {
		if o == p {
			w.active[id] = append(as[:i], as[i+1:]...)
			break
		}
	}
}

// probedLocker is the processes' Locker as Lock sees it: it checks each
// Lock it returns the instant it returns it (a handler would run under it).
type probedLocker struct {
	locks.Locker
	w *lockWorld
}

func (p probedLocker) Lock(ctx context.Context, name string, opts ...locks.CallOption) (*locks.Lock, error) {
	lk, err := p.Locker.Lock(ctx, name, opts...)
	if err == nil && lk.TTL() <= 0 {
		p.w.violate("Lock(%s) returned a lock whose TTL is 0: a handler would run without it", name)
	}
	return lk, err
}

// handlerPlan is what a request's handler does: how long it works, in how
// many steps, and whether it panics.
type handlerPlan struct {
	work  time.Duration
	steps int
	panic bool
}

// outcome is what a request's handler did.
type outcome struct {
	sent, started                    time.Time // the request's; its handler's start
	ran, finished, panicked, sawLost bool
}

func (w *lockWorld) handler(req int, plan handlerPlan, out *outcome, clientCtx context.Context) gin.HandlerFunc {
	return func(c *gin.Context) {
		out.ran, out.started = true, time.Now()
		id, err := strconv.ParseInt(c.Param("id"), 10, 64)
		if err != nil {
			w.violate("request %d: the handler ran for id %q, which is not an integer", req, c.Param("id"))
			return
		}
		ctx := c.Request.Context()
		lk, ok := ginmw.LockFromContext(ctx)
		if !ok {
			w.violate("request %d: the handler ran without a lock in its context", req)
			return
		}
		p := &lockProbe{req: req, lk: lk, sent: out.sent}
		w.enter(id, p)
		defer w.leave(id, p)
		for i := 0; i < plan.steps; i++ {
			time.Sleep(plan.work / time.Duration(plan.steps))
			w.probe(id, p)
			if lk.TTL() <= 0 && p.lostAt.IsZero() {
				p.lostAt = time.Now()
			}
		}
		if !p.lostAt.IsZero() { // its lease ran out: the context must end, and soon
			select {
			case <-ctx.Done():
			case <-time.After(time.Until(p.lostAt.Add(2 * time.Second))):
				w.violate("request %d: its lock's TTL has been 0 for 2s, its context is live", req)
			}
		}
		if plan.panic {
			out.panicked = true
			panic("gen: the handler panics")
		}
		if ctx.Err() != nil { // a handler that saw its lock lost, or its client gone, writes nothing
			out.sawLost = errors.Is(context.Cause(ctx), locks.ErrLost)
			if !out.sawLost && clientCtx.Err() == nil {
				w.violate("request %d: its context ended with %v: neither locks.ErrLost nor its client's", req, context.Cause(ctx))
			}
			return
		}
		out.finished = true
		c.String(http.StatusOK, "ok")
	}
}

// genLockIDs are the spellings of a resource id a target may carry.
var genLockIDs = []string{"1", "01", "+1", "001", "2", "02", "%31", "%2B1", "1%2F", "x", "-0", "0", "1.0", " 1", "1/", "9223372036854775808"}

func genLockRun(rt *rapid.T, servers []*redistest.Server, mon []*redis.Client, kind string, st *genLockStats, stalls []*gen.Stalls) {
	w := &lockWorld{rt: rt, kind: kind, mon: mon, lostAt: map[int64]time.Time{}, start: time.Now(), stalls: stalls}
	w.redlock = rapid.Bool().Draw(rt, "redlock")
	if w.redlock {
		st.add("redlock")
	} else {
		servers, w.mon = servers[:1], mon[:1]
	}
	w.stalls = w.stalls[:1+len(servers)]
	cfg := routingConfig{
		rawPath: rapid.Bool().Draw(rt, "UseRawPath"), unescape: rapid.Bool().Draw(rt, "UnescapePathValues"),
		removeSlash: rapid.Bool().Draw(rt, "RemoveExtraSlash"), trailing: rapid.Bool().Draw(rt, "RedirectTrailingSlash"),
		fixed: rapid.Bool().Draw(rt, "RedirectFixedPath"),
	}
	leases := []time.Duration{150 * time.Millisecond, 400 * time.Millisecond, 2 * time.Second}
	lease := rapid.SampledFrom(leases).Draw(rt, "lease")
	// DELETE's own lease: a waiter whose lease is shorter than its holder's
	// sleeps past its own between commands.
	deleteLease := rapid.SampledFrom(leases).Draw(rt, "DELETE's lease")
	// The shortest timeout of a command: a Redlock node's (locks' default, a
	// twentieth of the lease, 5–250 ms), else the client's CommandTimeout.
	w.commandTimeout = 200 * time.Millisecond
	if w.redlock {
		w.commandTimeout = min(max(min(lease, deleteLease)/20, 5*time.Millisecond), 250*time.Millisecond)
	}
	budget := rapid.SampledFrom([]time.Duration{100 * time.Millisecond, 700 * time.Millisecond}).Draw(rt, "wait budget")
	plans := map[int]handlerPlan{}
	outs := map[int]*outcome{}
	ctxs := map[int]context.Context{} // each request's own, as its client sent it
	var plansMu sync.Mutex
	for range 2 {
		// A client with ContextTimeoutEnabled (as the README's) or one with
		// go-redis's socket timeouts alone (short ones: see CommandTimeout).
		cte := rapid.Bool().Draw(rt, "ContextTimeoutEnabled")
		p := &lockProc{fault: &lockFault{}, attempt: rcmd.Patience * w.commandTimeout}
		if !cte {
			p.fault.socket = genSocketTimeout
			p.attempt = 2 * (genSocketTimeout + genSocketTimeout)
		}
		var clients []redis.UniversalClient
		for _, s := range servers {
			c := s.Client(func(o *redis.Options) {
				if o.ContextTimeoutEnabled = cte; !cte {
					o.ReadTimeout, o.WriteTimeout = genSocketTimeout, genSocketTimeout
				}
			})
			c.AddHook(p.fault)
			p.rdbs, clients = append(p.rdbs, c), append(clients, c)
		}
		if w.redlock {
			p.l = locks.NewRedlock(clients, locks.CommandTimeout(200*time.Millisecond))
		} else {
			p.l = locks.New(p.rdbs[0], locks.CommandTimeout(200*time.Millisecond))
		}
		r := gin.New()
		r.UseRawPath, r.UnescapePathValues = cfg.rawPath, cfg.unescape
		r.RemoveExtraSlash, r.RedirectTrailingSlash, r.RedirectFixedPath = cfg.removeSlash, cfg.trailing, cfg.fixed
		r.Use(gin.CustomRecoveryWithWriter(io.Discard, func(c *gin.Context, _ any) { c.AbortWithStatus(http.StatusInternalServerError) }))
		repo := ginmw.Resource(kind, ginmw.Int(ginmw.Param("id")))
		lk := ginmw.Lock(probedLocker{p.l, w}, repo, ginmw.LockOptions(locks.Lease(lease), locks.WaitBudget(budget)))
		lkDelete := ginmw.Lock(probedLocker{p.l, w}, repo, ginmw.LockOptions(locks.Lease(deleteLease), locks.WaitBudget(budget)))
		run := func(c *gin.Context) {
			req, _ := strconv.Atoi(c.GetHeader("X-Req"))
			plansMu.Lock()
			plan, out, cctx := plans[req], outs[req], ctxs[req]
			plansMu.Unlock()
			w.handler(req, plan, out, cctx)(c)
		}
		r.PUT("/repos/:id/settings", lk, run)
		r.DELETE("/repos/:id", lkDelete, run)
		r.PATCH("/repos/:id/nested", lk, lk, run) // the same resource locked twice: a re-entry
		p.eng = r
		w.procs = append(w.procs, p)
	}
	wound := false
	windDown := func() {
		for _, p := range w.procs {
			p.fault.set("", 0, 0)
		}
		w.calls.Wait()
		for _, p := range w.procs {
			p.fault.slept.Wait()
			_ = p.l.Close()
			for _, c := range p.rdbs {
				_ = c.Close()
			}
		}
		wound = true
	}
	defer func() {
		if !wound {
			windDown()
		}
	}()
	reqs := 0
	rt.Repeat(map[string]func(*rapid.T){
		"request": func(rt *rapid.T) {
			reqs++
			req := reqs
			proc := rapid.IntRange(0, len(w.procs)-1).Draw(rt, "proc")
			route := rapid.SampledFrom([]string{"PUT /repos/%s/settings", "DELETE /repos/%s", "PATCH /repos/%s/nested"}).Draw(rt, "route")
			id := rapid.SampledFrom(genLockIDs).Draw(rt, "id")
			prefix := rapid.SampledFrom([]string{"", "", "", "/x/..", "/", "/./"}).Draw(rt, "prefix")
			method, pattern, _ := strings.Cut(route, " ")
			target := prefix + fmt.Sprintf(pattern, id)
			plan := handlerPlan{
				work:  rapid.SampledFrom([]time.Duration{0, 20 * time.Millisecond, 300 * time.Millisecond, 900 * time.Millisecond}).Draw(rt, "work"),
				steps: rapid.IntRange(1, 6).Draw(rt, "steps"),
				panic: rapid.IntRange(0, 7).Draw(rt, "panic") == 0,
			}
			gone := rapid.SampledFrom([]time.Duration{0, 0, 50 * time.Millisecond, 400 * time.Millisecond}).Draw(rt, "client gives up after")
			out := &outcome{sent: time.Now()}
			hr := httptest.NewRequest(method, "http://svc.test/", nil)
			hr.URL.Path, hr.URL.RawPath, hr.RequestURI = "", "", target
			u, err := hr.URL.Parse(target)
			if err != nil {
				rt.Skip("unparsable target")
			}
			hr.URL = u
			hr.Header.Set("X-Req", strconv.Itoa(req))
			ctx, cancel := context.Background(), context.CancelFunc(func() {})
			if gone > 0 {
				ctx, cancel = context.WithTimeout(ctx, gone)
			}
			hr = hr.WithContext(ctx)
			plansMu.Lock()
			plans[req], outs[req], ctxs[req] = plan, out, ctx
			plansMu.Unlock()
			st.add("request")
			w.note("request %d: p%d %s %s %+v gone=%v", req, proc, method, target, plan, gone)
			w.calls.Add(1)
			go func() {
				defer w.calls.Done()
				defer cancel()
				rec := httptest.NewRecorder()
				w.procs[proc].eng.ServeHTTP(rec, hr)
				w.checkWait(req, target, out, budget, gone, w.procs[proc].attempt, st)
				w.checkAnswer(req, id, target, rec, out, ctx, w.procs[proc].fault)
				st.add(fmt.Sprint(rec.Code))
			}()
		},
		"fault": func(rt *rapid.T) {
			proc := rapid.IntRange(0, len(w.procs)-1).Draw(rt, "proc")
			mode := rapid.SampledFrom([]string{"delay", "late", "drop", "fail"}).Draw(rt, "mode")
			// Delays well apart from the leases (150, 400 ms, 2 s): a grant whose
			// reply comes within a few ms of its lease's end could run out
			// between Lock's return and the handler's first look.
			d := rapid.SampledFrom([]time.Duration{10 * time.Millisecond, 60 * time.Millisecond, 100 * time.Millisecond,
				200 * time.Millisecond, 300 * time.Millisecond, 500 * time.Millisecond}).Draw(rt, "delay")
			n := rapid.IntRange(1, 3).Draw(rt, "count")
			st.add("fault:" + mode)
			w.note("p%d fault %s %v x%d", proc, mode, d, n)
			w.procs[proc].fault.set(mode, d, n)
		},
		"lose": func(rt *rapid.T) {
			if rapid.IntRange(0, 3).Draw(rt, "lose now") != 0 {
				rt.Skip("keys are lost rarely")
			}
			id := rapid.SampledFrom([]int64{1, 2}).Draw(rt, "resource")
			st.add("lose")
			w.mu.Lock()
			w.lostAt[id] = time.Now()
			w.mu.Unlock()
			node := rapid.IntRange(0, len(w.mon)-1).Draw(rt, "node")
			w.note("DEL resource %d's key on node %d", id, node)
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			w.mon[node].Del(ctx, w.lockKey(id))
		},
		"redis": func(rt *rapid.T) {
			if rapid.IntRange(0, 5).Draw(rt, "now") != 0 {
				rt.Skip("Redis is paused or restarted rarely")
			}
			if rapid.Bool().Draw(rt, "restart") {
				// Without persistence: every key is lost.
				st.add("redis-restart")
				w.mu.Lock()
				for _, id := range []int64{0, 1, 2} {
					w.lostAt[id] = time.Now()
				}
				w.mu.Unlock()
				w.note("Redis restarts")
				w.shake(time.Hour)
				if err := servers[0].Restart(); err != nil {
					rt.Fatalf("restart: %v", err)
				}
				w.shake(time.Second) // the clients' breakers and redials settle
				w.note("Redis restarted")
				return
			}
			d := rapid.SampledFrom([]time.Duration{50 * time.Millisecond, 250 * time.Millisecond, 600 * time.Millisecond}).Draw(rt, "pause")
			st.add("redis-sigstop")
			w.note("Redis paused for %v", d)
			w.shake(time.Hour)
			servers[0].Pause()
			time.Sleep(d)
			servers[0].Resume()
			w.shake(time.Second)
		},
		"wait": func(rt *rapid.T) {
			time.Sleep(time.Duration(rapid.IntRange(0, 300).Draw(rt, "ms")) * time.Millisecond)
		},
		"": func(rt *rapid.T) { w.fail(rt) },
	})
	windDown()
	w.fail(rt)
	// Liveness: every lock of the check's resources is released, or expires
	// within its lease.
	deadline := time.Now().Add(max(lease, deleteLease) + time.Second)
	for _, id := range []int64{0, 1, 2} {
		key := w.lockKey(id)
		for i, m := range w.mon {
			for m.Exists(context.Background(), key).Val() == 1 {
				if time.Now().After(deadline) {
					w.violate("resource %d: node %d keeps its lock (%v of its lease left) %v after every request returned and the processes closed",
						id, i, m.PTTL(context.Background(), key).Val(), max(lease, deleteLease)+time.Second)
					break
				}
				time.Sleep(10 * time.Millisecond)
			}
		}
	}
	w.fail(rt)
}

// lockKey is the Redis key of resource id's lock.
func (w *lockWorld) lockKey(id int64) string {
	prefix := "cg:lock:{"
	if w.redlock {
		prefix = "cg:rlock:{"
	}
	return prefix + w.kind + ":" + strconv.FormatInt(id, 10) + "}"
}

// shake records that Redis is shaken (paused or restarting) until at least
// d from now.
func (w *lockWorld) shake(d time.Duration) {
	w.mu.Lock()
	w.shaken = time.Now().Add(d)
	w.mu.Unlock()
}

// checkAnswer checks a request's answer against what its handler did.
func (w *lockWorld) checkAnswer(req int, id, target string, rec *httptest.ResponseRecorder, out *outcome, ctx context.Context, fault *lockFault) {
	w.note("request %d: %d %q ran=%v finished=%v panicked=%v lost=%v", req, rec.Code, rec.Body.String(), out.ran, out.finished, out.panicked, out.sawLost)
	bad := func(why string) {
		w.violate("request %d (%s): answered %d %q, %s", req, target, rec.Code, rec.Body.String(), why)
	}
	switch {
	case out.finished:
		if rec.Code != http.StatusOK {
			bad("its handler finished with 200")
		}
	case out.panicked:
		if rec.Code != http.StatusInternalServerError {
			bad("its handler panicked")
		}
	case out.ran:
		// It saw its lock lost (409), or its client gone (nothing written, or
		// 409 when the lock was lost too).
		gone := ctx.Err() != nil && rec.Body.Len() == 0
		if rec.Code != http.StatusConflict && !(gone && !out.sawLost) {
			bad("its handler saw its lock lost or its client gone and wrote nothing: want 409, or nothing for a client gone")
		}
	case rec.Code == http.StatusNotFound:
		// Int refuses the id; so does the handler's own parse (checked when
		// it runs), or no route matched.
	case rec.Code == http.StatusConflict:
		if ra, err := strconv.Atoi(rec.Header().Get("Retry-After")); err != nil || ra < 1 {
			bad("a 409 needs Retry-After of at least 1 second")
		}
	case rec.Code == http.StatusServiceUnavailable:
		w.mu.Lock()
		shaken := !w.shaken.Before(out.sent)
		w.mu.Unlock()
		if !shaken && !fault.struckSince(out.sent) && !w.stoodStill(out.sent) {
			bad(fmt.Sprintf("no fault struck its process, Redis was neither paused nor restarted, and neither the process nor a server stood still for %v since it was sent", w.commandTimeout))
		}
	case rec.Code == http.StatusMovedPermanently || rec.Code == http.StatusTemporaryRedirect || rec.Code == http.StatusPermanentRedirect:
		// Gin's redirects (RedirectTrailingSlash, RedirectFixedPath).
	case rec.Code == http.StatusMethodNotAllowed:
	case ctx.Err() != nil && rec.Body.Len() == 0:
		// The client went away while waiting: nothing written.
	default:
		bad("its handler did not run")
	}
}

// checkWait checks that a request waited for its lock — until its handler
// ran, or until it was answered without it — no longer than its bound (the
// wait budget, or its client's timeout gone when sooner) and the command's
// own bound (a Lock's attempt is bounded by the command timeout, Patience
// times, or its client's socket timeouts: see lockProc.attempt; not by the
// budget; a nested route's second Lock makes one more),
// past genWaitSlack only by as long as the process stood still meanwhile.
func (w *lockWorld) checkWait(req int, target string, out *outcome, budget, gone, attempt time.Duration, st *genLockStats) {
	end := out.started
	if !out.ran {
		end = time.Now()
	}
	bound := budget
	if gone > 0 {
		bound = min(bound, gone)
	}
	bound += attempt
	if strings.HasSuffix(target, "/nested") {
		bound += attempt // its second Lock, a re-entry: one attempt
	}
	over := end.Sub(out.sent) - bound
	stalled := over > genWaitSlack && w.stalls[0].Since(out.sent, over-genWaitSlack)
	st.waited(over, stalled, fmt.Sprintf("request %d (%s), bound %v", req, target, bound))
	if over > genWaitSlack && !stalled {
		w.violate("request %d (%s): waited %v for its lock, %v past its bound %v", req, target, end.Sub(out.sent), over, bound)
	}
}

// genSocketTimeout is the read and write timeout of a client without
// ContextTimeoutEnabled: go-redis's bound of each of its commands.
const genSocketTimeout = 200 * time.Millisecond

// genWaitSlack is how long past its bound a request may wait for its lock
// beyond how long the process stood still (the locks generator's slack).
const genWaitSlack = 400 * time.Millisecond

// stoodStill reports whether the process or a server in use stood still for
// as long as a command's timeout since from (see gen.Stalls).
func (w *lockWorld) stoodStill(from time.Time) bool {
	for _, s := range w.stalls {
		if s.Since(from, w.commandTimeout) {
			return true
		}
	}
	return false
}

func (w *lockWorld) fail(rt *rapid.T) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.failures) > 0 {
		rt.Fatalf("%s\nlog:\n%s", strings.Join(w.failures, "\n"), strings.Join(w.log, "\n"))
	}
}
