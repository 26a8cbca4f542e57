package locks

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/internal/ratelog"
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
// After Threshold consecutive failures (connection errors, timeouts; not
// redis.Nil, not error replies, which prove Redis answered, and not the
// caller's context ending) it opens: every command and pipeline fails
// at once with ErrCircuitOpen, without touching the network. After Cooldown
// the next command starts a probe (half-open): a PING sent on a goroutine of
// its own, while callers keep failing at once; if Redis answers, the breaker
// closes, if not, it stays open for another Cooldown. A caller therefore
// learns that Redis is away in microseconds instead of after go-redis's dial
// retries and timeouts, never waits for a probe, and the breaker closes
// within Cooldown plus a round trip of Redis answering again (given traffic).
//
// Its fields are read when the Breaker is first used; the zero value is a
// Breaker with the defaults. Install one per client; on a ClusterClient one
// Breaker covers the cluster as a whole. A Breaker is safe for concurrent
// use. A probe's goroutine lives at most for the client's timeouts, and ends
// when the client is closed.
type Breaker struct {
	// Threshold is how many consecutive failures open the breaker. The
	// default is 5.
	Threshold int
	// Cooldown is how long the breaker stays open before it lets one probe
	// through. The default is 250ms.
	Cooldown time.Duration
	// Observer, if set, is called with BreakerOpened (Err: the failure that
	// opened it) and BreakerClosed events, synchronously: it must not block.
	Observer func(ctx context.Context, e Event)
	// Logger, if set, gets a warning when the breaker opens (at most one a
	// second, with the count of those suppressed).
	Logger *slog.Logger

	once      sync.Once
	threshold int32
	cooldown  time.Duration
	log       *ratelog.Logger

	failures atomic.Int32 // consecutive failures while closed
	state    atomic.Int32 // breakerClosed, breakerOpen, breakerProbing
	reopen   atomic.Int64 // open: when a probe may go, in time.Since(epoch) ns
	epoch    time.Time
}

const (
	breakerClosed int32 = iota
	breakerOpen
	breakerProbing // open, with one probe in flight
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
		b.log = ratelog.New(b.Logger, time.Second)
		b.epoch = time.Now()
	})
}

// Open reports whether the breaker is refusing commands.
func (b *Breaker) Open() bool {
	b.init()
	return b.state.Load() != breakerClosed
}

// admit reports whether a command may be sent: while the breaker is
// closed. An open breaker whose cooldown has passed starts one probe (a PING
// through next, on a goroutine of its own) and still refuses the command:
// callers never wait for a probe.
func (b *Breaker) admit(next redis.ProcessHook) bool {
	switch b.state.Load() {
	case breakerClosed:
		return true
	case breakerOpen:
		if next != nil && time.Since(b.epoch).Nanoseconds() >= b.reopen.Load() && b.state.CompareAndSwap(breakerOpen, breakerProbing) {
			go b.probe(next)
		}
	}
	return false
}

// probe sends one PING past the breaker: an answer closes it, anything else
// keeps it open for another cooldown. It is bounded by its context (for a
// client with ContextTimeoutEnabled) or by the client's own timeouts, and
// ends when the client is closed.
func (b *Breaker) probe(next redis.ProcessHook) {
	ctx, cancel := context.WithTimeout(context.WithValue(context.Background(), probeKey{}, b), max(b.cooldown, time.Second))
	defer cancel()
	cmd := redis.NewStatusCmd(ctx, "ping")
	if err := next(ctx, cmd); err != nil {
		b.trip(ctx, err, breakerProbing)
		return
	}
	b.failures.Store(0)
	if b.state.CompareAndSwap(breakerProbing, breakerClosed) {
		b.emit(ctx, Event{Kind: BreakerClosed})
	}
}

// probeKey marks a probe's context: the commands go-redis sends for it (the
// PING, and a new connection's handshake) pass the breaker.
type probeKey struct{}

// probing reports whether ctx is one of b's probes.
func (b *Breaker) probing(ctx context.Context) bool {
	p, _ := ctx.Value(probeKey{}).(*Breaker)
	return p == b
}

// done records the outcome of a command sent while the breaker was closed.
func (b *Breaker) done(ctx context.Context, err error) {
	switch {
	case b.failure(ctx, err):
		if b.failures.Add(1) >= b.threshold {
			b.trip(ctx, err, breakerClosed)
		}
	case b.failures.Load() != 0:
		b.failures.Store(0)
	}
}

// trip opens the breaker from state from (closed, or probing after a failed
// probe) for a cooldown.
func (b *Breaker) trip(ctx context.Context, err error, from int32) {
	b.reopen.Store(time.Since(b.epoch).Nanoseconds() + b.cooldown.Nanoseconds())
	if !b.state.CompareAndSwap(from, breakerOpen) {
		return
	}
	b.failures.Store(0)
	if from == breakerClosed {
		b.emit(ctx, Event{Kind: BreakerOpened, Err: err})
		b.log.Warn(ctx, "breaker", "locks: redis circuit breaker opened: commands fail at once until redis answers a probe",
			slog.Any("cause", err))
	}
}

func (b *Breaker) emit(ctx context.Context, e Event) {
	if b.Observer != nil {
		b.Observer(ctx, e)
	}
}

// failure reports whether err says that Redis could not be reached or did
// not answer in time. An error reply (redis.Error: a script error, WRONGTYPE,
// NOSCRIPT) came from a live server, except for the states in which a
// server cannot serve (LOADING, MASTERDOWN, CLUSTERDOWN). The caller's own
// context ending is not Redis's failure.
func (b *Breaker) failure(ctx context.Context, err error) bool {
	switch {
	case err == nil, errors.Is(err, redis.Nil), errors.Is(err, redis.ErrClosed), errors.Is(err, ErrCircuitOpen):
		return false
	case ctx.Err() != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)):
		return false
	}
	var re redis.Error
	if errors.As(err, &re) {
		msg := re.Error()
		return strings.HasPrefix(msg, "LOADING") || strings.HasPrefix(msg, "MASTERDOWN") || strings.HasPrefix(msg, "CLUSTERDOWN")
	}
	var ne net.Error
	return errors.As(err, &ne) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, context.DeadlineExceeded) || errors.Is(err, net.ErrClosed) || errors.Is(err, redis.ErrPoolTimeout)
}

// DialHook counts failed dials as failures while the breaker is closed. It
// never refuses a dial: commands are refused before they need one, and
// go-redis's pool, which keeps retrying dials after repeated errors, must be
// able to reconnect for the probe.
func (b *Breaker) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		b.init()
		conn, err := next(ctx, network, addr)
		if err != nil && b.state.Load() == breakerClosed && !b.probing(ctx) {
			b.done(ctx, err)
		}
		return conn, err
	}
}

// ProcessHook refuses commands while the breaker is open.
func (b *Breaker) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		b.init()
		if b.probing(ctx) {
			return next(ctx, cmd)
		}
		if !b.admit(next) {
			cmd.SetErr(ErrCircuitOpen)
			return ErrCircuitOpen
		}
		err := next(ctx, cmd)
		b.done(ctx, err)
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
		if !b.admit(nil) {
			for _, cmd := range cmds {
				cmd.SetErr(ErrCircuitOpen)
			}
			return ErrCircuitOpen
		}
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
		b.done(ctx, err)
		return err
	}
}
