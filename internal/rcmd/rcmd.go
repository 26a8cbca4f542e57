// Package rcmd runs this module's Redis commands and Lua scripts, so that
// every one of them is bounded on its own and every script is run one way.
//
// A Runner bounds each command, pipeline and script call by a command timeout
// (DefaultTimeout unless set), separately from how long its caller is willing
// to wait for anything else (another process's lock or fill): the command's
// context ends at the earlier of the caller's deadline and the command
// timeout. A command that the command timeout ended fails with an error
// matching ErrTimeout (not context.DeadlineExceeded: the caller's context did
// not end, Redis did not answer), and its context's cause is ErrTimeout, which
// is how a go-redis hook such as locks.Breaker tells a stalled Redis from a
// caller that gave up. The deadline reaches the socket only on a client with
// ContextTimeoutEnabled (go-redis otherwise bounds a command by its
// ReadTimeout and WriteTimeout alone): a package that must return within its
// caller's context on any client waits for the reply off the caller's
// goroutine there.
//
// A command timeout is evidence of a stall only when Redis is silent, and a
// command cut on a client with ContextTimeoutEnabled costs its connection
// (go-redis closes a connection whose read timed out; a new one costs a
// handshake, ~150 ms on a CPU-starved host, so cuts there feed themselves).
// So the deadline a command gets is chosen when it is sent, from what Redis
// did meanwhile: while Redis answers the Runner's commands, a command may
// wait Patience times the command timeout (the process or the host may be
// too busy to send it or read its reply in time: a starved CPU, a -race test
// run, a database beside Redis saturating the cores); once a command has
// waited a quarter of the command timeout with no answer to any command of
// the Runner since it was sent, Redis is quiet, and commands sent then get
// the command timeout (a command that ended sooner without an answer, its
// caller gone or Redis never reached, is no such evidence). The command timeout is never less than the smoothed
// reply time plus four times its variation (RFC 6298's retransmission
// timeout), up to Patience times the one set. On a stalled Redis, calls sent
// in the first quarter timeout of the stall wait up to Patience command
// timeouts; every later one fails within one, which is what a circuit
// breaker counts.
//
// A Script is sent as EVALSHA, alone or in a pipeline. A node that has not
// seen it yet (new, restarted, promoted) answers NOSCRIPT; the call is then
// sent once more as EVAL, which also caches the script there. SCRIPT LOAD is
// never used: on a cluster it goes to every master and fails while one is down.
package rcmd

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// DefaultTimeout is the command timeout of a Runner made with none: long
// enough that a healthy Redis on a loaded machine (a script, a pipeline of a
// few hundred commands, a test run with -race) never meets it, short enough
// that a stalled Redis (paused, black-holed) turns into errors, and a
// circuit breaker's count, within about a second (see Patience).
const DefaultTimeout = 500 * time.Millisecond

// Patience is how many times its command timeout a command sent while Redis
// answers the Runner may wait for its reply (see the package doc): 1 s for
// DefaultTimeout.
const Patience = 2

// CleanupHorizon is how long a clean-up that Redis has not answered — the
// give-back of a call whose outcome is unknown (a lock attempt, a fill
// lease's request), a release — is sent again, by locks and cacheguard
// alike. It is not a lease: a request of the call it cleans up after,
// written into a stall, runs whenever Redis resumes and sets its lease from
// then, so only Redis answering the clean-up ends what that request did.
// Past the horizon the client gives up on that Redis.
const CleanupHorizon = time.Minute

// ErrTimeout is the error of a command that got no answer within its command
// timeout, and the cause (context.Cause) of its context once that ended it.
var ErrTimeout = errors.New("rcmd: redis command timed out")

// ErrUnavailable is the one error value, across the module's packages, for
// "Redis could not be asked": locks.ErrUnavailable and
// cacheguard.ErrUnavailable are this value, so one errors.Is check covers a
// lock, a cache read and a ginmw answer.
var ErrUnavailable = errors.New("cacheguard: redis unavailable")

// Runner runs commands on one go-redis client, each bounded by the command
// timeout. The zero value is not usable: see New. A Runner is safe for
// concurrent use and holds no goroutines.
type Runner struct {
	rdb     redis.UniversalClient
	cluster *redis.ClusterClient // rdb, when it is one: its single commands go as pipelines (see Do)
	timeout time.Duration
	retries bool    // rdb sends a failed command again on its own (see MayHaveRun)
	quiet   Silence // how long Redis has left r's commands unanswered

	// srtt and rttvar (ns) estimate how long Redis takes to answer r's
	// commands, from the answers that came (see sample); 0 before any.
	srtt, rttvar atomic.Int64

	tick atomic.Pointer[tick] // the deadline that commands under contexts that cannot be cancelled share now (see Bound)
}

// New returns a Runner on rdb with the given command timeout (DefaultTimeout
// when timeout <= 0).
func New(rdb redis.UniversalClient, timeout time.Duration) *Runner {
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	r := &Runner{rdb: rdb, timeout: timeout, retries: retries(rdb)}
	r.cluster, _ = rdb.(*redis.ClusterClient)
	r.quiet.Start()
	return r
}

// note records cmds' answers, if any came from Redis, and, when timed (a
// call sent at sent, on r.quiet's clock; a WAIT's is not, it waits by
// design), how long it took; it reports whether any came.
func (r *Runner) note(sent time.Duration, timed bool, cmds ...redis.Cmder) bool {
	for _, c := range cmds {
		if err := c.Err(); err == nil || answered(err) {
			now := r.quiet.Now()
			r.quiet.Answered(now)
			if timed {
				r.sample(now - sent)
			}
			return true
		}
	}
	return false
}

// forget withdraws the mark (see Silence.Sent) of a call that got no answer
// and did not meet its command timeout — its caller gave up, or it never
// reached Redis — within a quarter timeout: it is no evidence that Redis is
// quiet.
func (r *Runner) forget(mark int64) { r.quiet.Withdraw(mark, r.quiet.Now(), r.limit()/4) }

// answered reports whether err, a command's error, came from Redis (nil, or
// an error reply); a function of its own so that its errors.As target does
// not escape to the heap on every call that succeeded.
func answered(err error) bool {
	var re redis.Error
	return errors.Is(err, redis.Nil) || errors.As(err, &re)
}

// sample adds a reply time d to r's estimate of how long Redis takes to
// answer (RFC 6298's smoothed time and its variation, d capped at the
// Patience bound). Concurrent samples may overwrite one another.
func (r *Runner) sample(d time.Duration) {
	d = min(d, Patience*r.timeout)
	s := time.Duration(r.srtt.Load())
	if s == 0 {
		r.srtt.Store(int64(d))
		r.rttvar.Store(int64(d / 2))
		return
	}
	dev := s - d
	if dev < 0 {
		dev = -dev
	}
	v := time.Duration(r.rttvar.Load())
	r.rttvar.Store(int64(v - v/4 + dev/4))
	r.srtt.Store(int64(s - s/8 + d/8))
}

// Client returns the client r runs on.
func (r *Runner) Client() redis.UniversalClient { return r.rdb }

// Timeout returns how long a command sent now may wait for its answer:
// Patience times the command timeout while Redis answers, the command
// timeout (raised to the reply time's estimate) once it is quiet (see the
// package doc).
func (r *Runner) Timeout() time.Duration { return r.timeoutAt(r.quiet.Now()) }

// Base returns r's command timeout as made.
func (r *Runner) Base() time.Duration { return r.timeout }

// timeoutAt returns how long a command sent at now (on r.quiet's clock) may
// wait.
func (r *Runner) timeoutAt(now time.Duration) time.Duration {
	t := r.limit()
	if r.quiet.Length(now) > t/4 {
		return t // quiet: a command has waited a quarter timeout, nothing answered since
	}
	return Patience * r.timeout
}

// limit is the command timeout of a command sent to a quiet Redis: the one
// set, raised to the reply time's estimate when answers come slowly.
func (r *Runner) limit() time.Duration {
	t := r.timeout
	if rto := time.Duration(r.srtt.Load() + 4*r.rttvar.Load()); rto > t {
		t = min(rto, Patience*r.timeout) // answers come slowly: wait for them
	}
	return t
}

// send records a command sent now: it returns now (on r.quiet's clock) and
// the command's mark, when it started the wait that tells Redis quiet.
func (r *Runner) send() (sent time.Duration, mark int64) {
	now := r.quiet.Now()
	return now, r.quiet.Sent(now)
}

// noCancel is the cancel func of a context Bound did not derive.
func noCancel() {}

// Bound returns ctx bounded by the command timeout plus extra (for a command
// that waits on the server by design, such as WAIT n timeout: extra is that
// timeout), with ErrTimeout as the cause when that bound ends it; ctx itself
// when its own deadline comes first. Every command of r runs under such a
// context; call cancel when done.
//
// Under a ctx that can be cancelled, the bound is a context of the command's
// own (context.WithDeadlineCause: a timer and a channel per command), unless
// the caller gives up ctx's cancellation for the command (Uncancelled). Under
// one that cannot (context.Background, context.WithoutCancel's: the Guard's
// background work, callers with no request to follow), the commands sent
// within Slack of one another share one deadline, the latest of theirs, and
// its context: a hit then costs no timer of its own, and on
// context.Background no allocation.
func (r *Runner) Bound(ctx context.Context, extra time.Duration) (context.Context, context.CancelFunc) {
	d, slack := time.Now().Add(r.Timeout()+extra), Slack(r.timeout)
	_, detached := ctx.(uncancelled)
	if dl, ok := ctx.Deadline(); ok && !detached && (!dl.After(d) || extra == 0 && shared(ctx) && !dl.After(d.Add(slack))) {
		return ctx, noCancel // a shared deadline may be up to Slack later
	}
	if extra > 0 || ctx.Done() != nil {
		return context.WithDeadlineCause(ctx, d, ErrTimeout)
	}
	t := r.tick.Load()
	if dl, _ := t.Deadline(); t == nil || dl.Before(d) || dl.Sub(d) > slack {
		t = newTick(d.Add(slack))
		r.tick.Store(t)
	}
	if ctx == context.Background() {
		return t, noCancel
	}
	return &tickCtx{Context: ctx, t: t}, noCancel
}

// Cuts reports whether ctx's deadline comes before the bound of a command
// sent now with extra (see Bound): ctx, not the bound, would end it. On a
// client that bounds its socket calls by the context's deadline
// (ContextTimeoutEnabled) go-redis then closes the command's connection, so
// the callers of this module send such a command detached from ctx (a
// cacheguard worker, a locks batcher's pipeline, a locks grant that WAITs
// for replicas) and stop waiting at ctx's deadline.
func (r *Runner) Cuts(ctx context.Context, extra time.Duration) bool {
	d, _ := ctx.Deadline()
	return r.CutsAt(d, extra)
}

// CutsAt is Cuts for a deadline d kept apart from its context (zero: none):
// a caller that queued its command asks it again when the command is about
// to be sent on its goroutine (a locks batcher's leader, a cacheguard hit's),
// since its deadline came closer meanwhile and it waits for that command's
// reply, its context notwithstanding.
func (r *Runner) CutsAt(d time.Time, extra time.Duration) bool {
	return !d.IsZero() && time.Until(d) < r.Timeout()+extra
}

// Slack is how much later than its own a command's deadline may be when it
// shares one (see Bound): a 32nd of the command timeout.
func Slack(timeout time.Duration) time.Duration { return timeout / 32 }

// A tick is a deadline that the commands a Runner sends within Slack of one
// another under contexts that cannot be cancelled share (see Bound): a context
// of context.Background that ends then, with ErrTimeout as its cause. It is
// never cancelled before: its timer ends at the deadline, at most Patience
// command timeouts and Slack after the last command that used it was sent.
type tick struct {
	context.Context
	cancel context.CancelFunc // never called: the deadline ends it
}

func newTick(at time.Time) *tick {
	ctx, cancel := context.WithDeadlineCause(context.Background(), at, ErrTimeout)
	return &tick{Context: ctx, cancel: cancel}
}

// Deadline is that of t's context; a nil tick (none made yet) has none.
func (t *tick) Deadline() (time.Time, bool) {
	if t == nil {
		return time.Time{}, false
	}
	return t.Context.Deadline()
}

// tickCtx is a command's context under a parent that cannot be cancelled and
// is not context.Background: the tick's deadline, channel and cause, the
// parent's values.
type tickCtx struct {
	context.Context
	t *tick
}

// Deadline is the tick's, or the parent's when earlier (an Uncancelled
// caller's deadline within Slack of the command's bound).
func (c *tickCtx) Deadline() (time.Time, bool) {
	d, ok := c.t.Deadline()
	if pd, pok := c.Context.Deadline(); pok && pd.Before(d) {
		return pd, true
	}
	return d, ok
}

func (c *tickCtx) Done() <-chan struct{} { return c.t.Done() }
func (c *tickCtx) Err() error            { return c.t.Err() }

// Value is the parent's value for key, but for the key under which the
// context package finds a context's cause (context.Cause) and its cancel
// state, where the tick's context answers: it has no other values (its
// parent is context.Background), so anything it answers is that.
func (c *tickCtx) Value(key any) any {
	if v := c.t.Value(key); v != nil {
		return v
	}
	return c.Context.Value(key)
}

// Uncancelled returns ctx without its cancellation: its values and its
// deadline, and no Done. It is for a command sent on its caller's goroutine
// whose caller waits for the reply whatever happens (go-redis's socket calls
// follow a context's deadline, never its cancellation, so the wait for a
// reply ends at the same time either way): Bound then gives it a deadline
// shared with the commands sent about then (see tick), where a cancellable
// context costs a context, a timer and a registration with ctx of its own per
// command (about 9 µs, 0.2 context switches and 6 allocations per lock
// cycle; BenchmarkCycleLone). What ctx's cancellation no longer ends is what
// a command does before it is written: a wait for a pooled connection, a
// dial, a sleep between retries; those end at the command's bound instead.
func Uncancelled(ctx context.Context) context.Context {
	if ctx.Done() == nil {
		return ctx
	}
	return uncancelled{ctx}
}

type uncancelled struct{ context.Context }

func (uncancelled) Done() <-chan struct{} { return nil }
func (uncancelled) Err() error            { return nil }

// shared reports whether ctx is a command's context under a shared deadline.
func shared(ctx context.Context) bool {
	switch ctx.(type) {
	case *tick, *tickCtx:
		return true
	}
	return false
}

// TimedOut reports whether ctx, a context returned by Bound, was ended by its
// command timeout rather than by its parent.
func TimedOut(ctx context.Context) bool {
	return ctx.Err() != nil && context.Cause(ctx) == ErrTimeout
}

// Do runs one command (args is its command line; a Script's Args for a
// script), bounded by the command timeout. A script the server does not have
// is sent again as EVAL (args is rewritten in place).
//
// On a cluster (New's rdb a *redis.ClusterClient, whether NewClusterClient
// or NewUniversalClient made it) Do sends the command as a pipeline of one.
// go-redis's single command path on a cluster looks the command up in its
// command-info cache, under an exclusive lock; while that cache is cold, or
// its last fill failed, the lookup fetches COMMAND from a node under a
// context of its own (5s with ContextTimeoutEnabled, the read timeout
// otherwise), so with that node stalled every single command of the client
// waits on the lock, whatever its own context and node. Its pipelines route
// without it (a lock-free peek at the cache), and follow MOVED and ASK
// themselves. (Not with ReadOnly set: a pipeline then asks the cache too.)
//
// A pipeline does not send a command again on every error reply that the
// single path does (go-redis's shouldRetry): after an ASK it looks at the
// ASKING's reply, not the command's, and it does not reload the slot map on
// READONLY. So Do sends the command again on those replies — TRYAGAIN,
// CLUSTERDOWN, LOADING, READONLY (after asking for the slot map again),
// MASTERDOWN, NOREPLICAS, max number of clients — Redis refused it, it did
// not run: up to MaxRedirects times (none when it is -1, as in go-redis),
// each after the client's MinRetryBackoff/MaxRetryBackoff backoff (go-redis's:
// random, doubling, capped), and only while the command's bound (see Bound)
// and ctx both outlast the wait: a command never waits past either for a
// retry; it returns the refusal instead. Connection errors (a dial, EOF, a
// network timeout, a pool timeout) the pipeline sends again on its own, as
// the single path does; they are not sent again here.
func (r *Runner) Do(ctx context.Context, args ...any) *redis.Cmd {
	bctx, cancel := r.Bound(ctx, 0)
	sent, mark := r.send()
	var cmd *redis.Cmd
	if r.cluster == nil {
		cmd = r.do(bctx, args)
		if NoScript(cmd.Err()) && ToEval(args) {
			cmd = r.do(bctx, args)
		}
	} else {
		cmd = r.clusterDo(ctx, bctx, args)
		if NoScript(cmd.Err()) && ToEval(args) {
			cmd = r.clusterDo(ctx, bctx, args)
		}
	}
	heard := r.note(sent, true, cmd)
	switch timedOut := settle(ctx, bctx, cmd); {
	case timedOut && r.missed(sent, bctx):
		markBusy(cmd)
	case !timedOut && !heard:
		r.forget(mark)
	}
	cancel()
	return cmd
}

// do sends one command on r's client, as go-redis's Do does, marked when it
// is a grant's (see Grant).
func (r *Runner) do(ctx context.Context, args []any) *redis.Cmd {
	cmd := redis.NewCmd(ctx, args...)
	_ = r.rdb.Process(ctx, sendable(cmd))
	return cmd
}

// clusterDo sends one command on r's ClusterClient as a pipeline of one,
// and sends it again, as Do says, while a node refuses it for now.
func (r *Runner) clusterDo(ctx, bctx context.Context, args []any) *redis.Cmd {
	o := r.cluster.Options() // resolved: MaxRedirects 0 when set to -1, the backoffs set
	for retry := 1; ; retry++ {
		pipe := r.cluster.Pipeline()
		cmd := redis.NewCmd(bctx, args...)
		_ = pipe.Process(bctx, sendable(cmd))
		_, _ = pipe.Exec(bctx) // cmd carries its error
		err := cmd.Err()
		if retry > o.MaxRedirects || !refused(err) {
			return cmd
		}
		if redis.IsReadOnlyError(err) {
			r.cluster.ReloadState(bctx) // a failover made the slot's master a replica: learn the new one
		}
		if !pause(ctx, bctx, backoff(retry, o.MinRetryBackoff, o.MaxRetryBackoff)) {
			return cmd
		}
	}
}

// refused reports whether err is an error reply that go-redis's single
// command path sends again (its shouldRetry) and its pipelines may not: a
// node that cannot serve the command for now (a slot being migrated, a
// cluster or a master down, a dataset loading, a replica where a master was,
// too few replicas, too many clients). Redis refused the command: it did not
// run.
func refused(err error) bool {
	return err != nil && (redis.IsTryAgainError(err) || redis.IsClusterDownError(err) ||
		redis.IsLoadingError(err) || redis.IsReadOnlyError(err) || redis.IsMasterDownError(err) ||
		redis.IsNoReplicasError(err) || redis.IsMaxClientsError(err))
}

// backoff is how long go-redis waits before its retry-th retry (its
// internal.RetryBackoff): a random time from lo to lo<<retry, capped at hi; 0
// when lo is.
func backoff(retry int, lo, hi time.Duration) time.Duration {
	if lo <= 0 {
		return 0
	}
	d := lo << uint(retry)
	if d < lo { // overflowed
		return hi
	}
	if d = lo + rand.N(d); d > hi || d < lo {
		d = hi
	}
	return d
}

// pause waits d and reports whether it did: it does not, and reports false at
// once, when d would end at or past ctx's deadline or bctx's, and it stops,
// reporting false, when either ends meanwhile.
func pause(ctx, bctx context.Context, d time.Duration) bool {
	end := time.Now().Add(d)
	if dl, ok := ctx.Deadline(); ok && !end.Before(dl) || ctx.Err() != nil {
		return false
	}
	if dl, ok := bctx.Deadline(); ok && !end.Before(dl) || bctx.Err() != nil {
		return false
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
	case <-bctx.Done():
	}
	return false
}

// Run runs script s with keys and args, bounded by the command timeout.
func (r *Runner) Run(ctx context.Context, s *Script, keys []string, args ...any) *redis.Cmd {
	kv := make([]any, len(keys))
	for i, k := range keys {
		kv[i] = k
	}
	return r.Do(ctx, s.Args(kv, args...)...)
}

// Pipeliner is what Exec needs to send a pipeline: a go-redis client (a
// *redis.Client of one node, for a pipeline that must stay on one
// connection) or anything that hands out a Pipeliner to reuse.
type Pipeliner interface {
	Pipeline() redis.Pipeliner
}

// Exec sends cmds in one pipeline on p (r's client when p is nil), bounded by
// the command timeout plus extra (see Bound), made with ctx (the context the
// commands were made with is not used). Each command carries its own outcome.
// Script calls (made with Script.Cmd) that failed with NOSCRIPT are sent
// again as EVAL in a second pipeline and their outcome copied back into them,
// or, when whole is set, every command of cmds is sent again with them (a
// WAIT must follow the write it waits for on the same connection; whole
// needs every command to be a *redis.Cmd).
func (r *Runner) Exec(ctx context.Context, p Pipeliner, cmds []redis.Cmder, extra time.Duration, whole bool) {
	if p == nil {
		p = r.rdb
	}
	bctx, cancel := r.Bound(ctx, extra)
	defer cancel()
	sent, mark := r.send()
	send := func(cs []redis.Cmder) {
		pipe := p.Pipeline()
		for _, c := range cs {
			_ = pipe.Process(bctx, sendable(c))
		}
		_, _ = pipe.Exec(bctx) // each command carries its own error
	}
	send(cmds)
	var again, orig []redis.Cmder
	for _, c := range cmds {
		if sc, ok := AsCmd(c); ok && NoScript(c.Err()) {
			args := append([]any(nil), c.Args()...)
			if ToEval(args) {
				again = append(again, redis.NewCmd(bctx, args...))
				orig = append(orig, sc)
			}
		}
	}
	if len(again) > 0 {
		if whole {
			again, orig = again[:0], orig[:0]
			for _, c := range cmds {
				args := append([]any(nil), c.Args()...)
				ToEval(args)
				again = append(again, redis.NewCmd(bctx, args...))
				orig = append(orig, c)
			}
		}
		send(again)
		for i, c := range again {
			copyCmd(orig[i], c.(*redis.Cmd))
		}
	}
	heard := r.note(sent, extra == 0, cmds...)
	timedOut := false
	for _, c := range cmds {
		timedOut = settle(ctx, bctx, c) || timedOut
	}
	switch {
	case timedOut && r.missed(sent, bctx):
		markBusy(cmds...)
	case !timedOut && !heard:
		r.forget(mark)
	}
}

// copyCmd sets dst's outcome to src's.
func copyCmd(dst redis.Cmder, src *redis.Cmd) {
	d, ok := AsCmd(dst)
	if !ok {
		dst.SetErr(fmt.Errorf("rcmd: cannot re-send a %T in a whole pipeline", dst))
		return
	}
	d.SetVal(src.Val())
	d.SetErr(src.Err())
}

// settle gives a command that the command timeout ended ErrTimeout as its
// error: ctx (the caller's) did not end, bctx (the command's) did, or the
// socket's deadline, which is bctx's, came a moment before bctx counted as
// ended. It reports whether it did.
func settle(ctx, bctx context.Context, cmd redis.Cmder) bool {
	err := cmd.Err()
	if err == nil || bctx == ctx || ctx.Err() != nil || !IsTimeout(err) {
		return false
	}
	if dl, ok := bctx.Deadline(); TimedOut(bctx) || ok && !time.Now().Before(dl) {
		cmd.SetErr(timeoutError{err: err})
		return true
	}
	return false
}

// missed reports whether a call sent at sent (on r.quiet's clock) under bctx, which
// the command timeout ended, shows the process rather than Redis slow (see
// Busy): Redis answered another command after this one was sent, or the
// timeout was noticed more than half a command timeout late.
func (r *Runner) missed(sent time.Duration, bctx context.Context) bool {
	dl, ok := bctx.Deadline()
	return ok && (time.Since(dl) > r.timeout/2 || r.quiet.AnsweredAfter(sent))
}

// markBusy marks the commands of cmds that the command timeout ended as
// ended while the process was busy (see Busy).
func markBusy(cmds ...redis.Cmder) {
	for _, c := range cmds {
		if e, ok := c.Err().(timeoutError); ok {
			e.busy = true
			c.SetErr(e)
		}
	}
}

// Busy reports whether err is a command timeout that shows the process, not
// Redis, slow: Redis answered another command of the Runner after this one
// was sent, or the runtime noticed the timeout more than half a timeout late.
// Such a command may be asked again (Redis answers: it gets Patience
// command timeouts); any other timeout is a stall.
func Busy(err error) bool {
	var e timeoutError
	return errors.As(err, &e) && e.busy
}

// timeoutError is the error of a command the command timeout ended: it
// matches ErrTimeout, is a net.Error whose Timeout is true, and keeps what
// go-redis said as text only — it must not match context.DeadlineExceeded,
// which would say that the caller's context ended.
type timeoutError struct {
	err  error
	busy bool // see Busy
}

func (e timeoutError) Error() string        { return ErrTimeout.Error() + ": " + e.err.Error() }
func (e timeoutError) Is(target error) bool { return target == ErrTimeout }
func (timeoutError) Timeout() bool          { return true }
func (timeoutError) Temporary() bool        { return true }

// IsTimeout reports an error that a deadline passing produces (the context's,
// a socket's, or the command timeout's): the command may have run on the
// server.
func IsTimeout(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	var t interface{ Timeout() bool }
	return errors.As(err, &t) && t.Timeout()
}

// MayHaveRun reports whether a command that r sent, and that failed with
// err, may have run in Redis in any of its attempts, or may still; what it
// took (a lease, a lock) must then be given back. It is the one rule of it.
//
// One attempt's error says what that attempt did: anything but a reply of
// Redis's (an error reply says what happened) and a command never sent for
// want of a free connection in the client's pool may have run — a timeout,
// the caller's context ending, a connection that broke or closed after the
// write — and what a command never sent was to end must be given back too,
// since the same error (a broken connection) comes before the write as after
// it. But err is the last attempt's only: go-redis sends a failed command
// again (MaxRetries; MaxRedirects on a cluster) and an attempt that timed
// out may have run though the next was refused (LOADING, READONLY,
// CLUSTERDOWN after a failover), so on a client that retries every failure
// may have run. (A grant's request is never sent again once written: see
// Script.Grant. A caller that asks again does so under a new identity, after
// the give-back of the one it asked under.)
func (r *Runner) MayHaveRun(err error) bool {
	return err != nil && !errors.Is(err, redis.Nil) && (r.retries || mayHaveRun(err))
}

// mayHaveRun is MayHaveRun for one attempt.
func mayHaveRun(err error) bool {
	return err != nil && !answered(err) && !errors.Is(err, redis.ErrPoolTimeout)
}

// retries reports whether rdb sends a failed command again on its own.
func retries(rdb redis.UniversalClient) bool {
	switch c := rdb.(type) {
	case *redis.Client: // options resolved: 0 retries none
		return c.Options().MaxRetries > 0
	case *redis.ClusterClient: // resolved too: redirects are its attempts, and its nodes' retries
		o := c.Options()
		return o.MaxRedirects > 0 || o.MaxRetries > 0
	case *redis.Ring: // resolved too
		return c.Options().MaxRetries > 0
	}
	return true // unknown: assume it does
}

// Script is a Lua script, run as EVALSHA. Make it once, with NewScript, at
// package initialisation or in a constructor.
type Script struct {
	sha any // its SHA1 in hex, boxed once
	src string
}

// grants holds the SHA1s and sources of the scripts marked with Grant.
var grants sync.Map // string -> struct{}

// Grant marks s as a grant — a script that takes something in Redis for its
// caller's call (a lock, a fill lease) — and returns s. Every command of a
// grant that a Runner sends, alone or in a pipeline, goes to go-redis as a
// OnceCmd: go-redis does not send it again on its own (MaxRetries, a
// pipeline's retry) once it may have been written. A request written and
// sent again may run twice, the first copy late (stuck on the wire, in a
// proxy, behind a connection go-redis gave up on) and after the grant the
// second copy took was used and released; that copy would take the grant
// again for a call that has ended. Sent once, a request's outcome is known
// to its caller or given back by it (the one clean-up of a call whose
// outcome is unknown, with its tombstone: see MayHaveRun); its caller sends
// again, if at all, under a new identity, after that give-back. go-redis
// then does not send the command again after a dial error either (only
// after a connection it found desynchronised before the write), and it
// retries no pipeline that carries such a command: those calls fail, and
// give back what they never took. Call Grant at package initialisation.
func (s *Script) Grant() *Script {
	grants.Store(s.sha.(string), struct{}{})
	grants.Store(s.src, struct{}{})
	return s
}

// OnceCmd is a command of a grant (see Script.Grant) as go-redis is given
// it: its *redis.Cmd, which go-redis fills, with NoRetry. A hook of
// go-redis's sees it in place of the *redis.Cmd: see AsCmd.
type OnceCmd struct{ *redis.Cmd }

// NoRetry tells go-redis not to send the command again once it may have
// been written.
func (OnceCmd) NoRetry() bool { return true }

// AsCmd returns c's *redis.Cmd: c itself, or the command a OnceCmd carries.
func AsCmd(c redis.Cmder) (*redis.Cmd, bool) {
	switch c := c.(type) {
	case *redis.Cmd:
		return c, true
	case OnceCmd:
		return c.Cmd, true
	}
	return nil, false
}

// sendable is c as go-redis is given it: a OnceCmd when c is a grant's
// command (EVALSHA, or the EVAL that follows a NOSCRIPT), else c.
func sendable(c redis.Cmder) redis.Cmder {
	cmd, ok := c.(*redis.Cmd)
	if !ok {
		return c
	}
	if args := cmd.Args(); len(args) > 1 && (args[0] == "evalsha" || args[0] == "eval") {
		if code, _ := args[1].(string); code != "" {
			if _, grant := grants.Load(code); grant {
				return OnceCmd{cmd}
			}
		}
	}
	return c
}

// sources maps every Script's SHA1 to its source, for the EVAL that follows a
// NOSCRIPT (ToEval). It only ever grows, and a SHA1 always maps to the same
// source.
var sources sync.Map // string -> string

// NewScript returns the Script of src.
func NewScript(src string) *Script {
	sum := sha1.Sum([]byte(src))
	sha := hex.EncodeToString(sum[:])
	sources.Store(sha, src)
	return &Script{sha: sha, src: src}
}

// SHA returns the script's SHA1 in hex.
func (s *Script) SHA() string { return s.sha.(string) }

// Source returns the script's source.
func (s *Script) Source() string { return s.src }

// Args returns the EVALSHA command line of a call with keys (boxed by the
// caller, who may reuse them across calls) and args.
func (s *Script) Args(keys []any, args ...any) []any {
	a := make([]any, 0, 3+len(keys)+len(args))
	a = append(a, "evalsha", s.sha, len(keys))
	a = append(a, keys...)
	return append(a, args...)
}

// Cmd returns the EVALSHA command of a call, for Exec.
func (s *Script) Cmd(ctx context.Context, keys []any, args ...any) *redis.Cmd {
	return redis.NewCmd(ctx, s.Args(keys, args...)...)
}

// ToEval turns the EVALSHA command line of a Script's call into EVAL, in
// place; it reports false (changing nothing) for any other command line.
func ToEval(args []any) bool {
	if len(args) < 2 || args[0] != "evalsha" {
		return false
	}
	sha, _ := args[1].(string)
	src, ok := sources.Load(sha)
	if ok {
		args[0], args[1] = "eval", src
	}
	return ok
}

// NoScript reports whether err is Redis's NOSCRIPT reply.
func NoScript(err error) bool { return err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT") }
