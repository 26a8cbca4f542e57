package locks

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/internal/ratelog"
	"github.com/cacheguard/cacheguard/internal/rcmd"
)

// ErrCircuitOpen is the error of a Redis command a Breaker refused to send
// because Redis has been failing. It matches ErrUnavailable, so a lock
// attempt refused by the breaker is classified as the lock service being
// unavailable (ginmw answers 503, gormplugin fails the write or with
// FailOpen lets it through, cacheguard fails open or closed as configured).
var ErrCircuitOpen = fmt.Errorf("locks: redis circuit breaker open: %w", ErrUnavailable)

// Breaker is a circuit breaker for one Redis client, installed as a go-redis
// hook, so that every package using the client — locks, cacheguard, ginmw,
// gormplugin — shares it:
//
//	rdb := redis.NewClient(opts)
//	rdb.AddHook(&locks.Breaker{})
//
// After Threshold consecutive failures (connection errors, timeouts —
// go-redis's own, or the command timeout with which locks and cacheguard
// bound each of their commands, so a stalled Redis trips it as a refused
// connection does; not redis.Nil, not error replies, which prove Redis
// answered, and not the caller's context ending) it opens, and so it does
// on any failure once Redis has been silent for Silence: it answered no
// command of the client since the first one sent after its last answer,
// that long ago (a process whose callers wait in line for one lock or one
// fill sends few commands into a stall, and would otherwise wait for
// Threshold of them to time out one after another). Then a command whose
// caller gave up on it unanswered (its context ended) opens it too: a
// process whose first command in a stall is a read under a short request
// deadline would otherwise learn nothing from it, however long Redis had
// been silent. Before it opens, it
// checks: one PING, sent past it at once, must get no answer within Cooldown
// either, while callers' commands still go through. A process that was
// stopped while its commands waited (SIGSTOP, a VM frozen, a long
// stop-the-world) finds them past their deadlines when it resumes, with
// Redis's answers in its sockets, and so does one starved of CPU for that
// long; their failures are its own, the check's PING is answered, and the
// breaker stays closed (the outcomes of the commands sent before the check
// no longer count). Open, every command and
// pipeline fails at once with ErrCircuitOpen, without touching the network. After Cooldown
// it sends a probe PING (half-open), on a goroutine of its own, while
// callers keep failing at once, and another every Cooldown while none has
// answered (each may take four Cooldowns, re-dialling included); the first
// answer closes the breaker. A caller therefore learns that Redis is away
// in microseconds instead of after go-redis's dial retries and timeouts,
// never waits for a probe, and the breaker closes within two Cooldowns plus
// a round trip of Redis answering again (a fresh connection's: dial,
// handshake and PING, up to four Cooldowns), with or without traffic; the
// probe's bound reaches the socket on a client with ContextTimeoutEnabled. Only the outcomes of
// commands admitted since the last change of state count: commands sent
// into a stall before the breaker opened, which fail after a probe closed
// it, cannot reopen it on a Redis that answers. Only an answer from Redis
// ends a run of failures: a caller giving up meanwhile does not.
//
// Its fields are read when the Breaker is first used; the zero value is a
// Breaker with the defaults. Install one per client; on a ClusterClient one
// Breaker covers the cluster as a whole. A Breaker is safe for concurrent
// use. Its goroutines run only while it checks (one PING, at most a
// Cooldown) or is open (the probe loop, which ends when Redis answers or the
// client is closed).
type Breaker struct {
	// Threshold is how many consecutive failures open the breaker. The
	// default is 5.
	Threshold int
	// Cooldown is how long the breaker stays open before it lets one probe
	// through. The default is 250ms.
	Cooldown time.Duration
	// Silence is how long Redis may leave the client's commands unanswered
	// before a single failure opens the breaker (after the check: see
	// Breaker). The default is 750ms:
	// longer than the 500ms that locks and cacheguard let a command sent to a
	// quiet Redis wait, shorter than the 1s a command sent while Redis
	// answered may (so the commands in flight when a stall begins open the
	// breaker as they fail). A negative Silence leaves it to Threshold.
	// Blocking commands (BLPOP, XREAD, WAIT and the like), which wait by
	// design, do not start the silence.
	Silence time.Duration
	// Observer, if set, is called with EventBreakerOpened (Err: the
	// failure that opened it) and EventBreakerClosed events, synchronously: it must not block.
	// A panic in it is recovered and logged (Logger).
	Observer func(ctx context.Context, e Event)
	// Logger gets a warning when the breaker opens (at most one a second,
	// with the count of those suppressed). Nil means slog.Default(); silence
	// it with slog.New(slog.DiscardHandler).
	Logger *slog.Logger

	once      sync.Once
	threshold int32
	cooldown  time.Duration
	silence   time.Duration
	log       *ratelog.Logger
	quiet     rcmd.Silence // how long Redis has left the client's commands unanswered

	failures atomic.Int32                      // consecutive failures while closed
	state    atomic.Int32                      // breakerClosed, breakerChecking or breakerOpen
	epoch    atomic.Uint64                     // counts state changes: a command's outcome counts only in the epoch that admitted it
	next     atomic.Pointer[redis.ProcessHook] // the client's command path below the breaker, for probes
}

const (
	breakerClosed   int32 = iota
	breakerChecking       // failures would open it: a PING decides (see check); commands still go through
	breakerOpen
)

var _ redis.Hook = (*Breaker)(nil)

func (b *Breaker) init() {
	b.once.Do(func() {
		b.threshold = int32(b.Threshold)
		if b.threshold <= 0 {
			b.threshold = 5
		}
		b.cooldown = b.Cooldown
		if b.cooldown <= 0 {
			b.cooldown = 250 * time.Millisecond
		}
		b.silence = b.Silence
		if b.silence == 0 {
			b.silence = 750 * time.Millisecond
		}
		b.quiet.Start()
		b.log = ratelog.New(b.Logger, time.Second)
	})
}

// Open reports whether the breaker is refusing commands.
func (b *Breaker) Open() bool {
	b.init()
	return b.state.Load() == breakerOpen
}

// admit reports whether a command may be sent: unless the breaker is open.
func (b *Breaker) admit() bool { return b.state.Load() != breakerOpen }

// probeLoop runs while the breaker is open: every cooldown it sends one PING
// past the breaker through next; an answer closes the breaker and ends the
// loop, and so does the client being closed (redis.ErrClosed), so the client
// owns the goroutine. Callers never wait for a probe, and a process that
// gets no traffic still learns when Redis is back.
//
// A probe is given maxProbes cooldowns to answer, not one: on a slow link a
// fresh connection (dial and handshake, then the PING) takes several round
// trips, and a probe cut sooner would never succeed. Probes therefore
// overlap — a new one every cooldown, at most maxProbes on the wire — so one
// sent into a black hole just before it healed delays nothing: the next,
// sent a cooldown later, answers within its round trip. The breaker thus
// closes within two cooldowns plus a fresh connection's round trip of Redis
// answering again (up to maxProbes cooldowns).
func (b *Breaker) probeLoop(next redis.ProcessHook) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel() // the probes still on the wire end with the loop
	t := time.NewTicker(b.cooldown)
	defer t.Stop()
	answers := make(chan error, maxProbes)
	inFlight := 0
	for {
		select {
		case <-t.C:
			if inFlight == maxProbes {
				continue
			}
			inFlight++
			wg.Go(func() { answers <- b.ping(ctx, next, maxProbes*b.cooldown) })
		case err := <-answers:
			inFlight--
			switch {
			case err == nil:
				if b.heard(breakerOpen) {
					b.emit(context.Background(), Event{Kind: EventBreakerClosed})
				}
				return
			case errors.Is(err, redis.ErrClosed):
				return
			}
		}
	}
}

// maxProbes is how many probes a Breaker keeps on the wire at most, and how
// many cooldowns each may take to answer.
const maxProbes = 4

// probeKey marks a probe's context: the commands go-redis sends for it (the
// PING, and a new connection's handshake) pass the breaker.
type probeKey struct{}

// ping sends one PING past the breaker through next, under ctx and given d
// to answer: a probe's, or a check's (see check).
func (b *Breaker) ping(ctx context.Context, next redis.ProcessHook, d time.Duration) error {
	pctx, cancel := context.WithTimeout(context.WithValue(ctx, probeKey{}, b), d)
	defer cancel()
	return next(pctx, redis.NewStatusCmd(pctx, "ping"))
}

// heard records a probe's or a check's answer: what was admitted before no
// longer counts, the silence is over, and the breaker moves from state from
// to closed; it reports whether it did.
func (b *Breaker) heard(from int32) bool {
	b.epoch.Add(1)
	b.failures.Store(0)
	b.quiet.Answered(b.quiet.Now())
	return b.state.CompareAndSwap(from, breakerClosed)
}

// probing reports whether ctx is one of b's probes.
func (b *Breaker) probing(ctx context.Context) bool {
	p, _ := ctx.Value(probeKey{}).(*Breaker)
	return p == b
}

// done records the outcome of a command sent while the breaker was closed,
// in epoch: the outcome of a command admitted before the breaker last changed
// state says nothing about Redis now (commands sent into a black hole before
// it opened time out after a probe closed it) and is not counted.
func (b *Breaker) done(ctx context.Context, err error, epoch uint64) {
	if b.epoch.Load() != epoch {
		return
	}
	switch {
	case b.failure(ctx, err):
		if b.failures.Add(1) >= b.threshold || b.silent() {
			b.trip(ctx, err)
		}
	case redisAnswered(err):
		if b.failures.Load() != 0 {
			b.failures.Store(0)
		}
	case ctxEnded(err) && b.silent():
		// Its caller gave up on it, which alone says nothing of Redis (it
		// is not counted), but Redis has now been silent for Silence: the
		// evidence a failure would add. The check's PING decides.
		b.trip(ctx, err)
	}
}

// send marks commands sent now (see rcmd.Silence): the first sent since
// Redis last answered starts the silence, unless every one of them waits by
// design (a blocking command). It returns the mark it set, or 0.
func (b *Breaker) send(cmds []redis.Cmder) int64 {
	if b.silence < 0 || !slices.ContainsFunc(cmds, func(c redis.Cmder) bool { return !blocks(c.Name()) }) {
		return 0
	}
	return b.quiet.Sent(b.quiet.Now())
}

// ended records how a command marked m (see send) ended: an answer from Redis
// ends the silence; a command that ended otherwise without failing (its
// caller gave up) within a quarter Silence of its send is no evidence of
// silence, and withdraws its mark.
func (b *Breaker) ended(ctx context.Context, err error, m int64) {
	switch {
	case b.silence < 0:
	case redisAnswered(err):
		b.quiet.Answered(b.quiet.Now())
	case !b.failure(ctx, err):
		b.quiet.Withdraw(m, b.quiet.Now(), b.silence/4)
	}
}

// silent reports whether Redis has answered nothing for b.silence while a
// command waited.
func (b *Breaker) silent() bool {
	return b.silence >= 0 && b.quiet.Length(b.quiet.Now()) >= b.silence
}

// blocks reports whether the command named name waits on the server by
// design (its wait is no silence): BLPOP and the other blocking pops, XREAD
// and XREADGROUP, WAIT and WAITAOF.
func blocks(name string) bool {
	if name == "" || name[0] != 'b' && name[0] != 'x' && name[0] != 'w' {
		return false
	}
	switch name {
	case "blpop", "brpop", "brpoplpush", "blmove", "blmpop", "bzpopmin", "bzpopmax", "bzmpop",
		"xread", "xreadgroup", "wait", "waitaof":
		return true
	}
	return false
}

// redisAnswered reports whether err (nil included) is an answer from Redis, which
// ends a run of failures. A command that ended otherwise without being a
// failure — the caller's context ended, the client closed, no connection was
// free — says nothing about Redis: while Redis stalls, callers giving up
// must not keep resetting the count of the commands that timed out.
func redisAnswered(err error) bool {
	var re redis.Error
	return err == nil || errors.Is(err, redis.Nil) || errors.As(err, &re)
}

// trip starts the check that opens the breaker (see check), if it is closed,
// for the failure err of a command sent under ctx.
func (b *Breaker) trip(ctx context.Context, err error) {
	if !b.state.CompareAndSwap(breakerClosed, breakerChecking) {
		return
	}
	ctx = context.WithoutCancel(ctx) // for the event, if it opens
	if next := b.next.Load(); next != nil {
		go b.check(ctx, *next, err)
		return
	}
	b.open(ctx, err)
}

// check runs while the breaker is checking: it sends one PING past the
// breaker through next, given a cooldown to answer. An answer shows Redis
// answering now, and the failures that started the check the process's own
// (it was stopped or starved while its commands waited, so their deadlines
// passed with the answers in its sockets): the breaker goes back to closed,
// and what was admitted before no longer counts, as after a probe. No answer
// opens it, with cause as the failure that opened it; the client being closed
// leaves it closed.
func (b *Breaker) check(ctx context.Context, next redis.ProcessHook, cause error) {
	if err := b.ping(context.Background(), next, b.cooldown); err != nil && !errors.Is(err, redis.ErrClosed) {
		b.open(ctx, cause)
		return
	}
	b.heard(breakerChecking)
}

// open opens the checking breaker and starts its probe loop.
func (b *Breaker) open(ctx context.Context, err error) {
	if !b.state.CompareAndSwap(breakerChecking, breakerOpen) {
		return
	}
	b.epoch.Add(1)
	b.failures.Store(0)
	b.emit(ctx, Event{Kind: EventBreakerOpened, Err: err})
	b.log.Warn(ctx, "breaker", "locks: redis circuit breaker opened: commands fail at once until redis answers a probe",
		slog.Any("cause", err))
	if next := b.next.Load(); next != nil {
		go b.probeLoop(*next)
	}
}

func (b *Breaker) emit(ctx context.Context, e Event) { notify(ctx, b.Observer, b.log, e) }

// failure reports whether err says that Redis could not be reached or did
// not answer in time: a connection error, go-redis's own read or write
// timeout, or the command timeout of our runner (internal/rcmd: the
// command's context ended with rcmd.ErrTimeout as its cause) — a stall. An
// error reply (redis.Error: a script error, WRONGTYPE, NOSCRIPT) came from a
// live server, except for the states in which a server cannot serve
// (LOADING, MASTERDOWN, CLUSTERDOWN). The caller's own context ending
// (cancelled, or its own deadline) is not Redis's failure, nor is the
// client's pool having no free connection (redis.ErrPoolTimeout: under a
// stall the commands holding the connections fail, and count, themselves).
func (b *Breaker) failure(ctx context.Context, err error) bool {
	switch {
	case err == nil, errors.Is(err, redis.Nil), errors.Is(err, redis.ErrClosed), errors.Is(err, ErrCircuitOpen),
		errors.Is(err, redis.ErrPoolTimeout): // the client's own connections all busy: its load, not Redis failing
		return false
	case ctxEnded(err) && settled(ctx) && !rcmd.TimedOut(ctx):
		return false
	}
	var re redis.Error
	if errors.As(err, &re) {
		msg := re.Error()
		return strings.HasPrefix(msg, "LOADING") || strings.HasPrefix(msg, "MASTERDOWN") || strings.HasPrefix(msg, "CLUSTERDOWN")
	}
	var ne net.Error
	return errors.As(err, &ne) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, context.DeadlineExceeded) || errors.Is(err, net.ErrClosed)
}

// settleWait bounds how long settled waits for a context past its deadline
// to count as ended: its timer is due (a shared deadline's, rcmd.Slack of a
// command timeout later at most).
const settleWait = 50 * time.Millisecond

// settled reports whether ctx has ended, waiting for it when its deadline has
// passed and it does not count as ended yet (up to settleWait): a socket
// deadline taken from ctx's fires a moment before ctx's own timer, and until
// that runs neither ctx.Err nor its cause says whose deadline ended the
// command — the caller's, or the command timeout's (rcmd.TimedOut). Without
// the wait a caller's deadline often counted as a failure of Redis
// (TestBreakerIgnoresCallerDeadlines).
func settled(ctx context.Context) bool {
	if ctx.Err() != nil {
		return true
	}
	dl, ok := ctx.Deadline()
	done := ctx.Done()
	if !ok || done == nil || time.Now().Before(dl) {
		return false
	}
	t := time.NewTimer(settleWait)
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
		return false
	}
}

// ctxEnded reports an error that a context ending produces: cancelled, or a
// deadline passing (which with ContextTimeoutEnabled reaches the socket as an
// i/o timeout).
func ctxEnded(err error) bool {
	var ne net.Error
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout()
}

// DialHook counts failed dials as failures while the breaker is closed. It
// never refuses a dial: commands are refused before they need one, and
// go-redis's pool, which keeps retrying dials after repeated errors, must be
// able to reconnect for the probe.
func (b *Breaker) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		b.init()
		epoch := b.epoch.Load()
		conn, err := next(ctx, network, addr)
		if err != nil && b.admit() && !b.probing(ctx) {
			b.done(ctx, err, epoch)
		}
		return conn, err
	}
}

// ProcessHook refuses commands while the breaker is open.
func (b *Breaker) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	b.next.CompareAndSwap(nil, &next)
	return func(ctx context.Context, cmd redis.Cmder) error {
		b.init()
		if b.probing(ctx) {
			return next(ctx, cmd)
		}
		epoch := b.epoch.Load()
		if !b.admit() {
			cmd.SetErr(ErrCircuitOpen)
			return ErrCircuitOpen
		}
		one := [1]redis.Cmder{cmd}
		m := b.send(one[:])
		err := next(ctx, cmd)
		b.ended(ctx, err, m)
		b.done(ctx, err, epoch)
		return err
	}
}

// ProcessPipelineHook refuses pipelines and transactions while the breaker
// is open.
func (b *Breaker) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		b.init()
		if b.probing(ctx) {
			return next(ctx, cmds)
		}
		epoch := b.epoch.Load()
		if !b.admit() {
			for _, cmd := range cmds {
				cmd.SetErr(ErrCircuitOpen)
			}
			return ErrCircuitOpen
		}
		m := b.send(cmds)
		err := next(ctx, cmds)
		if err == nil {
			// A connection failure fails every command; an error reply only its own.
			for _, cmd := range cmds {
				if e := cmd.Err(); e != nil && b.failure(ctx, e) {
					err = e
					break
				}
			}
		}
		b.ended(ctx, err, m)
		b.done(ctx, err, epoch)
		return err
	}
}
