package locks

import (
	"strconv"
	"strings"
	"time"
)

// Defaults. The lease is short enough that a crashed holder's lock frees itself
// quickly, and the watchdog renews it every third of the lease while held.
const (
	DefaultLease          = 10 * time.Second
	DefaultWait           = 30 * time.Second
	DefaultPrefix         = "cg:"
	DefaultFenceRetention = 10 * time.Minute
	// MinLease is the shortest lease accepted: a renewal must fit in a third of it.
	MinLease = 30 * time.Millisecond
	// MaxNameLen bounds lock names; longer names are refused with ErrInvalid.
	MaxNameLen = 1024
)

// Option configures a Client (as its default for every call) or one Lock/TryLock
// call (overriding the Client's default). The same options apply to Redlock.
type Option func(*config)

type config struct {
	lease          time.Duration
	renew          bool
	wait           time.Duration
	fair           bool
	replicas       int
	replicaTimeout time.Duration
	prefix         string
	fenceRetention time.Duration
	observer       func(Event)
	drift          time.Duration // Redlock: fixed part of the clock drift allowance
	nodeTimeout    time.Duration // Redlock: per-node attempt timeout (0 = derived from the lease)

	// Script arguments derived from the above by pack: computed once per
	// Client (and per call only when the call has options).
	argsTry, argsWait, argsRelease    string
	argsTryV, argsWaitV, argsReleaseV any // the same, boxed once
}

// packFrom derives the packed arguments, reusing base's when the values they
// pack are the same (a call that only sets its wait, as ginmw's do, then
// formats nothing).
func (c *config) packFrom(base *config) {
	if c.lease == base.lease && c.fenceRetention == base.fenceRetention && c.fair == base.fair {
		c.argsTry, c.argsWait, c.argsRelease = base.argsTry, base.argsWait, base.argsRelease
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
	head := ms(c.lease) + ","
	tail := "," + ms(c.retention()) + "," + fair
	c.argsTry = head + "0" + tail
	c.argsWait = head + ms(placeTTL) + tail
	c.argsRelease = ms(c.retention()) + "," + ms(min(c.lease, placeTTL))
	c.argsTryV, c.argsWaitV, c.argsReleaseV = c.argsTry, c.argsWait, c.argsRelease
}

func defaults() config {
	return config{
		lease:  DefaultLease,
		renew:  true,
		wait:   DefaultWait,
		prefix: DefaultPrefix,
		drift:  2 * time.Millisecond,
	}
}

// WithLease sets the lease: how long the lock outlives a holder that stops
// renewing it (crashed, paused, partitioned). The default is 10s; at least 30ms.
func WithLease(d time.Duration) Option { return func(c *config) { c.lease = d } }

// WithoutRenewal makes the lease fixed: the lock expires after the lease even
// while held, unless renewed by hand with Extend. By default a held lock renews
// itself in the background every third of the lease until Unlock.
func WithoutRenewal() Option { return func(c *config) { c.renew = false } }

// WithWait sets how long Lock waits for a held lock before giving up with
// ErrNotObtained (the caller's context can end it sooner). The default is 30s;
// zero makes Lock behave like TryLock.
func WithWait(d time.Duration) Option { return func(c *config) { c.wait = d } }

// WithFair makes Lock grant the lock in arrival order across every caller and
// process (FIFO). The default already hands a released lock to the process that
// has waited longest; fair mode queues each caller individually, so no caller
// can overtake another, even inside one process. A waiter that dies loses its
// place after a few seconds.
func WithFair() Option { return func(c *config) { c.fair = true } }

// WithReplicas makes an acquisition wait (Redis WAIT, on the connection that
// wrote the lock, on the master that owns its slot) until n replicas have the
// lock, for at most timeout. With fewer acknowledgements the lock is released
// and the call fails with a *ReplicaError. The default is 0: no WAIT is sent.
func WithReplicas(n int, timeout time.Duration) Option {
	return func(c *config) { c.replicas, c.replicaTimeout = n, timeout }
}

// WithPrefix sets the prefix of every key and channel. The default is "cg:".
// A prefix with a complete hash tag ("{app}:") puts every lock in that one
// slot of a cluster; one that opens a tag without closing it ("app{:", or
// an empty "{}") would split a lock's keys over slots and is refused.
func WithPrefix(p string) Option { return func(c *config) { c.prefix = p } }

// WithFenceRetention sets how long a lock name's fence counter lives after the
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
// shorter than the lease is refused.
func WithFenceRetention(d time.Duration) Option { return func(c *config) { c.fenceRetention = d } }

// retention is the fence counter's TTL: the one set, or the default.
func (c *config) retention() time.Duration {
	if c.fenceRetention > 0 {
		return c.fenceRetention
	}
	return max(DefaultFenceRetention, c.lease)
}

// WithObserver sets a function called with every lock outcome (acquired,
// timed out, lost, renewal failed, released), e.g. to feed a metrics library.
// It is called synchronously and must not block.
func WithObserver(f func(Event)) Option { return func(c *config) { c.observer = f } }

// WithDrift sets the fixed part of Redlock's clock-drift allowance; the total
// is lease×1% + d. The default d is 2ms. It does nothing on a Client.
func WithDrift(d time.Duration) Option { return func(c *config) { c.drift = d } }

// WithNodeTimeout sets how long Redlock waits for one node's answer. The
// default is lease/20, clamped to [5ms, 250ms]. It does nothing on a Client.
func WithNodeTimeout(d time.Duration) Option { return func(c *config) { c.nodeTimeout = d } }

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
