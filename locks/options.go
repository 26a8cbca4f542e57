package locks

import (
	"context"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/cacheguard/cacheguard/internal/ratelog"
)

// Defaults (each option's doc states its own). The lease is short enough that
// a crashed holder's lock frees itself quickly, and the watchdog renews it
// every third of the lease while held.
const (
	defaultLease          = 10 * time.Second
	defaultWait           = 30 * time.Second
	defaultPrefix         = "cg:"
	defaultFenceRetention = 10 * time.Minute
	defaultDrift          = 2 * time.Millisecond
)

// Limits on input, refused with ErrInvalid.
const (
	// MinLease is the shortest lease accepted: a renewal must fit in a third of it.
	MinLease = 30 * time.Millisecond
	// MaxNameLen bounds lock names.
	MaxNameLen = 1024
)

// Options come in three types, by where they apply: an Option configures a
// Locker as a whole (New and NewRedlock take its defaults), a CallOption one
// Lock or TryLock call (overriding the defaults) or one Optimistic call, and
// a Setting is both. A misplaced option does not compile; an option of the
// other kind of Locker (Fair on a Redlock, Drift on a Client) is refused at
// run time: New and NewRedlock panic, a call fails with ErrInvalid. Each
// option's doc states its default.
type (
	// Option configures a Locker: New and NewRedlock take its defaults.
	Option interface {
		apply(*config)
		option()
	}
	// CallOption configures one Lock, TryLock or Optimistic call.
	CallOption interface {
		apply(*config)
		callOption()
	}
	// Setting is an option valid both ways: as a Locker's default and for
	// one call.
	Setting interface {
		Option
		CallOption
	}
)

// opt implements every option interface; the constructors' declared result
// types restrict where each option compiles.
type opt func(*config)

func (o opt) apply(c *config) { o(c) }
func (opt) option()           {}
func (opt) callOption()       {}

type config struct {
	lease          time.Duration
	renew          bool
	wait           time.Duration
	fair           bool
	replicas       int
	replicaTimeout time.Duration
	prefix         string
	fenceRetention time.Duration
	noFencing      bool // keep no fence counter; Fence reports 0
	observer       func(context.Context, Event)
	log            *ratelog.Logger
	cmdTimeout     time.Duration // how long one Redis command may go unanswered (0 = rcmd.DefaultTimeout)
	drift          time.Duration // Redlock: fixed part of the clock drift allowance
	nodeTimeout    time.Duration // Redlock: per-node attempt timeout (0 = derived from the lease)

	// Script arguments derived from the above by pack, boxed once: computed
	// once per Client (and per call only when the call has options).
	leaseV, retentionV  any // the lease and the fence retention in ms
	argsTryV, argsWaitV any // acquire.lua's "queue place ms,fair", without and with a place
	argsReleaseV        any // release.lua's "fence retention ms,queue-place ms"
}

// packFrom derives the packed arguments, reusing base's when the values they
// pack are the same (a call that only sets its wait, as ginmw's do, then
// formats nothing).
func (c *config) packFrom(base *config) {
	if c.lease == base.lease && c.fenceRetention == base.fenceRetention && c.noFencing == base.noFencing && c.fair == base.fair {
		c.leaseV, c.retentionV = base.leaseV, base.retentionV
		c.argsTryV, c.argsWaitV, c.argsReleaseV = base.argsTryV, base.argsWaitV, base.argsReleaseV
		return
	}
	c.pack()
}

// pack derives the scripts' packed numeric arguments.
func (c *config) pack() {
	fair := "0"
	if c.fair {
		fair = "1"
	}
	ms := func(d time.Duration) string { return strconv.FormatInt(d.Milliseconds(), 10) }
	c.leaseV, c.retentionV = ms(c.lease), ms(c.retention())
	c.argsTryV, c.argsWaitV = "0,"+fair, ms(placeTTL)+","+fair
	c.argsReleaseV = ms(c.retention()) + "," + ms(placeTTL)
}

func defaults() config {
	return config{
		lease:  defaultLease,
		renew:  true,
		wait:   defaultWait,
		prefix: defaultPrefix,
		drift:  defaultDrift,
		log:    ratelog.New(nil, time.Second), // slog.Default(), limited per Client
	}
}

// Lease sets the lease: how long the lock outlives a holder that stops
// renewing it (crashed, paused, partitioned). The default is 10s; at least 30ms.
func Lease(d time.Duration) Setting { return opt(func(c *config) { c.lease = d }) }

// NoRenewal makes the lease fixed: the lock expires after the lease even
// while held, unless renewed by hand with Extend. By default a held lock renews
// itself in the background every third of the lease until Unlock.
func NoRenewal() Setting { return opt(func(c *config) { c.renew = false }) }

// WaitBudget sets how long Lock waits for a held lock before giving up with
// ErrNotObtained (the caller's context can end it sooner). The default is 30s;
// zero makes Lock behave like TryLock.
func WaitBudget(d time.Duration) Setting { return opt(func(c *config) { c.wait = d }) }

// Fair makes Lock grant the lock in arrival order across every caller and
// process (FIFO). The default already hands a released lock to the process that
// has waited longest; fair mode queues each caller individually, so no caller
// can overtake another, even inside one process. A waiter that dies loses its
// place after a few seconds. Off by default; a Redlock has no fair mode.
func Fair() Setting { return opt(func(c *config) { c.fair = true }) }

// Replicas makes an acquisition wait (Redis WAIT, on the connection that
// wrote the lock, on the master that owns its slot) until n replicas have the
// lock, for at most timeout. With fewer acknowledgements the lock is released
// and the call fails with a *ReplicaError. The default is 0: no WAIT is sent.
// A WAIT on the wire is answered and its grant kept or given back even when
// the caller's context ended first, so Close may wait up to timeout for it.
// A Redlock's servers have no replicas: it refuses this option.
func Replicas(n int, timeout time.Duration) Setting {
	return opt(func(c *config) { c.replicas, c.replicaTimeout = n, timeout })
}

// Prefix sets the prefix of every key and channel. The default is "cg:".
// A prefix with a complete hash tag ("{app}:") puts every lock in that one
// slot of a cluster; one that opens a tag without closing it ("app{:", or
// an empty "{}") would split a lock's keys over slots and is refused.
func Prefix(p string) Option { return opt(func(c *config) { c.prefix = p }) }

// FenceRetention sets how long a lock name's fence counter lives after the
// name was last taken: what a name leaves behind in Redis once nobody uses it.
// A token is the larger of the counter plus one and the server's clock in
// microseconds, so tokens keep increasing without the counter — after it
// expired, was evicted or lost in a restart, or went stale in a failover —
// as long as the server's clock has not gone back; the counter adds
// tolerance of a clock that steps back by less than the retention (and of
// more than one token per microsecond). The cost is one counter per name
// taken within the retention, about 60 bytes of Redis memory each (plus the
// key's share of the keyspace tables; MEMORY USAGE reports ~70). The
// default is 10 minutes, or the lease when that is longer; a retention
// shorter than the lease is refused. A Redlock issues no fence tokens and
// refuses this option.
func FenceRetention(d time.Duration) Option {
	return opt(func(c *config) { c.fenceRetention = d })
}

// NoFencing makes an acquisition keep no fence counter in Redis: its Lock's
// Fence is 0 (no token to fence with), and nothing is left behind once the
// lock is released. Use it where no write is fenced (gormplugin.NoFencing
// passes it). One cost: a release retried by go-redis after its reply was
// lost, on a lock nobody took since, is reported as ErrNotHeld (the counter
// is how a retry is told from a lease that ran out first).
func NoFencing() Setting { return opt(func(c *config) { c.noFencing = true }) }

// retention is the fence counter's TTL: the one set, or the default; 0
// (no counter) under NoFencing.
func (c *config) retention() time.Duration {
	if c.noFencing {
		return 0
	}
	if c.fenceRetention > 0 {
		return c.fenceRetention
	}
	return max(defaultFenceRetention, c.lease)
}

// Observer sets a function called with every lock outcome (EventAcquired,
// EventReentered, EventNotObtained, EventReleased, EventLost,
// EventRenewalFailed), e.g. to feed metrics and traces; every acquisition or
// re-entry ends in one EventReleased or EventLost. ctx is the context of the
// call that produced the event (Lock, TryLock, Unlock), or a background
// context for the renewal loop's events (EventLost, EventRenewalFailed). It
// is called synchronously and must not block. A panic in f is recovered and
// logged (Logger), and the call that reported the event goes on as if f had
// returned. The default is none.
func Observer(f func(ctx context.Context, e Event)) Option {
	return opt(func(c *config) { c.observer = f })
}

// Logger sets where warnings go — a lock lost while held, a renewal that
// failed — each kind at most once a second, with the count of those
// suppressed. The default (and nil) is slog.Default(); silence them with
// Logger(slog.New(slog.DiscardHandler)).
func Logger(l *slog.Logger) Option {
	return opt(func(c *config) { c.log = ratelog.New(l, time.Second) })
}

// CommandTimeout sets how long one Redis command (a script call, or a
// pipeline of them) may go unanswered before it fails; the default is
// 500ms. It is separate from how long Lock waits for another holder
// (WaitBudget) and from the caller's context, both of which can only end a
// call sooner: a stalled Redis (paused, black-holed) turns into an error
// matching ErrUnavailable within it — and, with a Breaker on the client, into
// an open breaker once Threshold commands failed so, or one did after a
// Silence — instead of a call that lasts the stall. The bound reaches the socket only on a client with
// ContextTimeoutEnabled (as the README's client sets); without it go-redis
// bounds each command by its ReadTimeout and WriteTimeout instead (3s by
// default). The bound is chosen when the command is sent: while Redis
// answers the client's other commands, a command may wait twice d (a slow
// answer then is the process's slowness, not a stall, and a cut costs the
// connection); once a command has waited d/4 with nothing answered since,
// Redis is quiet and commands get d — at least the answers' smoothed time
// plus four times its variation (see locks/DESIGN.md, "Stalls").
func CommandTimeout(d time.Duration) Option {
	return opt(func(c *config) { c.cmdTimeout = d })
}

// Drift sets the fixed part of Redlock's clock-drift allowance; the total
// is lease×1% + d. The default d is 2ms. A Redlock option: New refuses it.
func Drift(d time.Duration) Option { return opt(func(c *config) { c.drift = d }) }

// NodeTimeout sets how long Redlock waits for one node's answer. The
// default is lease/20, clamped to [5ms, 250ms]. A Redlock option: New
// refuses it, and a Client's call fails with ErrInvalid.
func NodeTimeout(d time.Duration) Setting {
	return opt(func(c *config) { c.nodeTimeout = d })
}

// CheckCallOptions reports whether opts are valid call options of l: the
// error matching ErrInvalid that a Lock or TryLock call of l with them would
// fail with before any Redis call, or nil. It runs that call's own check
// against l's defaults, so that a Redlock refuses Fair and a Client Drift;
// for a Locker of another type (a wrapper of one of these) it checks the
// rules every Locker of this package applies, against the package's
// defaults. Code that is given options once for many calls checks them when
// it is given them: ginmw.Lock panics on options it refuses.
func CheckCallOptions(l Locker, opts ...CallOption) error {
	const name = "check" // a valid name: the check is about the options
	var err error
	switch l := l.(type) {
	case *Client:
		_, err = l.callConfig(name, opts)
	case *Redlock:
		_, err = l.callConfig(name, opts)
	default:
		cfg := defaults()
		if err = applyAll(&cfg, opts); err == nil {
			err = cfg.validate()
		}
	}
	return err
}

// applyAll applies opts (a Locker's or a call's) to cfg; a nil one is bad
// input: New and NewRedlock panic with the error, a call returns it.
func applyAll[O interface{ apply(*config) }](cfg *config, opts []O) error {
	for i, o := range opts {
		if any(o) == nil {
			return invalid("option %d is nil", i)
		}
		o.apply(cfg)
	}
	return nil
}

func (c *config) validate() error {
	switch {
	case c.lease < MinLease:
		return invalid("lease %v is shorter than %v", c.lease, MinLease)
	case c.wait < 0:
		return invalid("negative wait %v", c.wait)
	case c.replicas < 0:
		return invalid("negative replica count %d", c.replicas)
	case c.replicas > 0 && c.replicaTimeout <= 0:
		return invalid("replica timeout %v must be positive", c.replicaTimeout)
	case c.fenceRetention != 0 && c.fenceRetention < c.lease:
		return invalid("fence retention %v is shorter than the lease %v", c.fenceRetention, c.lease)
	case c.cmdTimeout < 0:
		return invalid("negative command timeout %v", c.cmdTimeout)
	case c.drift < 0 || c.nodeTimeout < 0:
		return invalid("negative drift or node timeout")
	case !prefixTagSafe(c.prefix):
		return invalid("prefix %q opens a hash tag it does not close", c.prefix)
	}
	return nil
}

func validName(name string) error {
	switch {
	case name == "":
		return invalid("empty lock name")
	case len(name) > MaxNameLen:
		return invalid("lock name of %d bytes exceeds %d", len(name), MaxNameLen)
	}
	return nil
}

// prefixTagSafe reports whether prefix leaves the keys' hash tags whole: no
// '{', or a '{' closed by a later '}' with something in between.
func prefixTagSafe(prefix string) bool {
	i := strings.IndexByte(prefix, '{')
	if i < 0 {
		return true
	}
	j := strings.IndexByte(prefix[i+1:], '}')
	return j > 0
}
