package cacheguard

import (
	"context"
	"log/slog"
	"math"
	"strings"
	"time"

	leases "github.com/cacheguard/cacheguard/internal/lease"
	"github.com/cacheguard/cacheguard/internal/rcmd"
)

// defaultCommandTimeout is CommandTimeout's default, package locks' too.
// Before a command's deadline was chosen from whether Redis answered
// (internal/rcmd), it had to be 5s: at 500ms the real-PostgreSQL mix on a
// starved 2-core host (cgbench -only pg-mix -busy) completed 1,092-1,722
// requests/s with 2,272-7,645 failed, against 1,818-1,918 and 670-1,761 at
// 5s, each cut costing a connection and its handshake.
const defaultCommandTimeout = rcmd.DefaultTimeout

// Limits.
const (
	// MinLease is the shortest fill lease accepted: a renewal must fit in a third of it.
	MinLease = 30 * time.Millisecond
	// MaxKeyLen bounds keys; longer keys are refused with ErrInvalid.
	MaxKeyLen = 1024
	// MaxDuration bounds every duration an option sets (TTL, ServeStale's
	// window, StaleGrace, WaitBudget, NegativeTTL, LoadTimeout, Lease,
	// FailSafe's max age and back-off, SoftTimeout, CommandTimeout,
	// NearCache's ttl): a longer one is refused with ErrInvalid, in New and
	// in a call, so that no time the Guard adds up from them overflows.
	MaxDuration = 10 * 365 * 24 * time.Hour
)

// Option configures a Guard, in New: the Guard-wide options (Prefix,
// CommandTimeout, MaxConcurrentLoads, NearCache, Observer, Logger), and every
// Setting, which then is the default of each call.
type Option interface{ applyGuard(*config) }

// CallOption configures one Get call: the call-only options (Variant,
// ReportTo), and every Setting, which then overrides the Guard's default for
// this call.
type CallOption interface{ applyCall(*config) }

// Setting is a knob that makes sense both as a Guard's default and for one
// call: it is an Option and a CallOption.
type Setting func(*config)

func (s Setting) applyGuard(c *config) { s(c) }
func (s Setting) applyCall(c *config)  { s(c) }

type guardOption func(*config)

func (o guardOption) applyGuard(c *config) { o(c) }

type callOption func(*config)

func (o callOption) applyCall(c *config) { o(c) }

type policy uint8

const (
	policyWait policy = iota
	policyStale
	policyFailFast
)

// TimeoutAction is what a call does when its wait budget ends before a fresh
// value arrived (see OnWaitTimeout).
type TimeoutAction uint8

const (
	// TimeoutFail returns ErrWaitTimeout (the default).
	TimeoutFail TimeoutAction = iota
	// TimeoutLoad runs the loader without the fill lease (coalesced within the
	// process) and returns its result without storing it.
	TimeoutLoad
)

type config struct {
	ttl         time.Duration
	staleWindow time.Duration
	wait        time.Duration
	negTTL      time.Duration
	loadTimeout time.Duration
	lease       time.Duration
	beta        float64
	graceD      time.Duration // StaleGrace, when graceSet
	graceSet    bool
	jitter      float64
	policy      policy
	onTimeout   TimeoutAction
	failClosed  bool
	failSafeAge time.Duration // FailSafe: how long past fresh-until a value can stand in for a failed load
	failSafeOff time.Duration // FailSafe: no reload is tried for this long after a failed one
	softTimeout time.Duration
	codec       Codec
	report      *Result // call only
	variant     string  // call only
	tags        *tagSet // call only

	// Guard only.
	prefix   string
	cmdTime  time.Duration // each Redis command's own bound
	maxLoads int
	observer func(context.Context, Event)
	logger   *slog.Logger
	nearSize int
	nearTTL  time.Duration
}

func defaults() config {
	return config{
		ttl:         time.Minute,
		wait:        10 * time.Second,
		negTTL:      5 * time.Second,
		loadTimeout: 10 * time.Second,
		lease:       3 * time.Second,
		beta:        1,
		jitter:      0.1,
		codec:       JSON{},
		prefix:      "cg:",
		cmdTime:     defaultCommandTimeout,
	}
}

// TTL sets how long a loaded value stays fresh (before jitter, see Jitter),
// from when it is encoded and sent to Redis, as Redis's own expiry would
// count it. The default is 1 minute; it must be positive.
func TTL(d time.Duration) Setting { return func(c *config) { c.ttl = d } }

// ServeStale selects the serve-stale policy and sets the stale window: after
// its TTL a value stays servable for window more. A call that finds a stale
// value returns it at once (Result Stale) and the first such call refreshes it
// in the background under the fill lease, one load across every process. With
// nothing servable the call waits as under Wait, for the wait budget. The
// window is stored with each value, so values written by any call carry the
// window of that call's configuration. The default policy is Wait and the
// default window 0.
func ServeStale(window time.Duration) Setting {
	return func(c *config) { c.policy, c.staleWindow = policyStale, window }
}

// Wait selects the wait policy, the default: a miss waits for the one load
// across the fleet, within the wait budget (see WaitBudget), and returns its
// value within milliseconds of it being stored; a hot key is refreshed before
// it expires, and served for at most TTL/4 past it while a late refresh runs
// (TTL/2 when its load took more than TTL/8: see EarlyRefresh). Passed to
// Get, it overrides a Guard whose default policy is ServeStale or FailFast.
func Wait() Setting { return func(c *config) { c.policy = policyWait } }

// WaitBudget sets how long a call may wait for a value, whatever the policy:
// no call waits longer than its context and this budget, counted from the
// start of the call (a call's own load included). What happens when it ends
// is set by OnWaitTimeout. 0 waits for no load, as TryLock does for a lock:
// the call reads the cache (within the command timeout), is served what it
// finds servable (a hit, or a stale value as its policy allows), and on a
// miss its budget has ended. The default is 10s.
func WaitBudget(d time.Duration) Setting { return func(c *config) { c.wait = d } }

// FailFast selects the fail-fast policy: a call never waits for a load. It
// returns a fresh value, or a stale one within the stale window, or else
// ErrMiss at once, having started one fill in the background (under the fill
// lease, so still one load across the fleet). While Redis cannot be reached,
// fail-open still runs the loader for the call (see FailClosed). The default
// policy is Wait.
func FailFast() Setting { return func(c *config) { c.policy = policyFailFast } }

// OnWaitTimeout sets what a call does when its wait budget ends. The default
// is TimeoutFail (ErrWaitTimeout).
func OnWaitTimeout(a TimeoutAction) Setting { return func(c *config) { c.onTimeout = a } }

// NegativeTTL sets how long a load that returned (or wrapped) ErrNotFound is
// cached as absent. The default is 5s; 0 turns negative caching off.
func NegativeTTL(d time.Duration) Setting { return func(c *config) { c.negTTL = d } }

// EarlyRefresh sets β of early refresh, which keeps a key being read from
// expiring under its readers. A hit refreshes the value in the background,
// under the fill lease (one load across every process), once it is within the
// value's lead of fresh-until: Δ·β·(2 + 2u), Δ the measured duration of the
// value's last load, its encoding included — at least twice Δ, three times on
// average — and never more than a point between an eighth and a quarter of the
// TTL, u and that point drawn once per value (the same in every process). Keys
// loaded together — at a cold start, against a database slowed by it — thus
// refresh apart, and a hot key is refreshed no earlier for being read more
// (XFetch, which draws per hit, refreshes it at the largest of many draws). A
// refresh that is late all the same — its load slower than that — does not make
// the calls after expiry wait: for a grace past fresh-until a value is served
// marked Stale while its refresh runs, whatever the policy (the first such call
// starts the refresh if no hit did). The grace is twice the value's own load Δ,
// so that a refresh as slow as that load ends within it however late it began,
// and never less than a quarter of the TTL nor more than half. A refresh slower
// still — a database slowed down at once, by a wave of misses or a failover —
// does not make readers wait either: past the grace, up to the TTL past expiry,
// a call that finds a reload of the value running that it did not start (in its
// process, or another's fill lease) is served the value, Stale, instead of
// waiting for it; a call that finds none waits for its own load, as on any
// miss. That is the staleness it costs: a value served at most TTL/4 past its
// TTL (TTL/2 when its load took more than TTL/8) unless a reload is under way,
// and at most the TTL past it while one is, so at most 2 × TTL after it was
// encoded and stored (the TTL counts from then: see TTL). Values are kept in
// Redis the TTL past their TTL for it. An invalidated value is never served
// (Invalidate voids it at once), and a key no call reads expires at its TTL.
// Loads: a key read without pause is loaded about once per TTL − lead + Δ. The
// default is 1; 0 turns off the early refresh, the grace and the serving past
// it (every call after expiry then waits for the reload); StaleGrace sets the
// grace on its own.
func EarlyRefresh(beta float64) Setting { return func(c *config) { c.beta = beta } }

// StaleGrace sets how long past its TTL a value is served, marked Stale, while
// its refresh runs (see EarlyRefresh), and nothing is served past it while a
// reload runs. By default it is twice the value's load, between a quarter and
// half of the TTL, then up to the TTL while a reload runs, with early refresh
// on, and 0 with it off. 0 makes every call after expiry wait for the reload
// (ginmw.Cache sets 0: an HTTP response is never served past its freshness
// unless ServeStale says so).
func StaleGrace(d time.Duration) Setting { return func(c *config) { c.graceD, c.graceSet = d, true } }

// Jitter shortens the TTL of a value loaded on a miss or served stale by a
// random fraction in [0, frac), so that keys loaded together (at a cold
// start, or after an invalidation of many keys) do not expire together. A
// value refreshed early (see EarlyRefresh) keeps the whole TTL: its refresh
// began within its own lead of expiry, drawn per value, so keys refreshed
// early drift apart without it, and a hot key pays no loads for it. Keys
// loaded on misses cost about frac/2 more loads. The default is 0.1; 0 turns
// it off; it must be below 1.
func Jitter(frac float64) Setting { return func(c *config) { c.jitter = frac } }

// LoadTimeout bounds the context a loader runs under. That context is detached
// from every caller (a caller that gives up never cancels a shared load) but
// keeps the values of the context of the call that started the load. The
// default is 10s.
func LoadTimeout(d time.Duration) Setting { return func(c *config) { c.loadTimeout = d } }

// Lease sets the fill lease: how long a process that took the lease and
// then died (or stopped renewing) keeps the others waiting before one of them
// takes over. The lease is renewed every third of it while the loader runs
// and until its value is stored (encoding and sending it included); a
// renewal that finds the key invalidated by another process also lets the
// calls of this process waiting for that load read the key instead, so a
// third of the lease bounds how long they wait for a load that cannot store.
// The default is 3s; at least 30ms (MinLease).
func Lease(d time.Duration) Setting { return func(c *config) { c.lease = d } }

// readBound is the wait budget's bound on the reads of a call that began at
// start: start plus the budget, or none (the zero Time) for a budget of 0,
// which waits for no load but reads the cache all the same (see WaitBudget),
// bounded by the command timeout and the caller's context.
func (c *config) readBound(start time.Time) time.Time {
	if c.wait == 0 {
		return time.Time{}
	}
	return start.Add(c.wait)
}

// spent reports whether a fill lease granted to a request sent at sent has
// run out on the local clock — the one rule for a lease's local deadline
// (internal/lease), as locks' grants follow it: Redis may already have let
// another process take the fill over, so a grant read this late is given
// back, never loaded under (one load per expiry), and asked for again (see
// Guard.lease).
func (c *config) spent(sent time.Time) bool {
	return leases.Grant{Sent: sent, Lease: c.lease}.Spent()
}

// FailSafe keeps a value standing in when its reload fails: when the loader
// returns an error (other than ErrNotFound) or runs out of its LoadTimeout,
// and the key has a value that stopped being fresh less than maxAge ago (past
// its stale window too), that value is returned instead of the error —
// marked Stale (Result, EventFailSafe, ginmw's X-Cache: STALE) — and stored
// again for backoff, so that no process tries the load again before then
// (one attempt per back-off across the fleet, not one per request, against a
// failing database). Values are kept in Redis maxAge past their TTL for it.
// The default is off.
func FailSafe(maxAge, backoff time.Duration) Setting {
	return func(c *config) { c.failSafeAge, c.failSafeOff = maxAge, backoff }
}

// SoftTimeout bounds how long a call that has a stale value to fall back on
// (within its stale window, or FailSafe's max age) waits for its load: then
// it returns that value (Stale) while the load goes on in the background
// under the fill lease, bounded by LoadTimeout (the hard timeout, which frees
// the lease). Calls with nothing to fall back on wait as before. The default
// is off.
func SoftTimeout(d time.Duration) Setting { return func(c *config) { c.softTimeout = d } }

// Encoding sets the Codec values are encoded with inside the envelope. The
// default is JSON. Readers must use the codec the writers used.
func Encoding(cd Codec) Setting { return func(c *config) { c.codec = cd } }

// FailClosed makes a call fail with ErrUnavailable (joined with the Redis
// error) when Redis cannot be reached. By default a call fails open: the loader
// runs (coalesced within the process, bounded by MaxConcurrentLoads) and its
// result is returned uncached.
func FailClosed() Setting { return func(c *config) { c.failClosed = true } }

// Prefix sets the prefix of every key and channel; it must not contain
// braces. The default is "cg:".
func Prefix(p string) Option { return guardOption(func(c *config) { c.prefix = p }) }

// CommandTimeout bounds each Redis command (a read, a script call, a
// pipeline) on its own, whatever the call's wait budget, counted from when
// the command is sent (a read that waits behind another one in flight does
// not count that wait): a Redis that does not answer within it (paused,
// black-holed) counts as unreachable, and a locks.Breaker on the client
// counts it as it counts a refused connection. The bound is chosen when the
// command is sent (see internal/rcmd): while Redis answers the Guard's other
// commands, a command may wait twice d (a busy host that sends a command
// or reads its answer late is no stall, and a cut costs the connection);
// once a command has waited d/4 with nothing answered since, Redis is quiet
// and commands get d. A timeout is not taken as proof of a stall on its own,
// for a false alarm would cost a load: a call whose read timed out asks once
// more through its fill flight's get-or-lease script (which returns the
// value when there is one), and that script is sent again while Redis
// answers the Guard's other commands (or when this process saw its timeout
// late); the call fails open — or closed — when it times out with Redis
// silent. So a Get answers within about two command timeouts of a stall's
// start (three when it was sent in the stall's first d/4), and at once when the
// breaker is open. The default is 500ms (measured: see locks/DESIGN.md,
// "Stalls"). It must be positive.
func CommandTimeout(d time.Duration) Option {
	return guardOption(func(c *config) { c.cmdTime = d })
}

// MaxConcurrentLoads bounds how many loads a Guard runs at once: set it near
// what the database serves at once without slowing every query (its cores,
// divided among the processes), so that a wave of misses queues here instead
// of making every query slow. A load waits for a slot holding its fill lease
// (renewed), the wait counting against LoadTimeout but not as the load's own
// time (which times its early refresh and grace); a miss's fill that waited
// renews its lease once more as it gets the slot, and loads nothing if the key
// was invalidated meanwhile, by any process (its callers then wait for a fill
// begun after the invalidation, as after a local Invalidate); a fail-open
// load (Redis unreachable) waits within its call's wait budget. A freed slot goes to the
// loads callers wait for (a miss, a load without the lease) before refreshes
// in the background (after ServeStale served a stale value, EarlyRefresh),
// first come first served within each. A Get that a loader makes under its
// load's context takes no slot (its load would wait for the one its caller
// holds), and neither does a fill of the same entry it joins, however far that
// fill got in the queue; it shares no read and no load without the lease (Redis
// unreachable) with other callers. A loader that starts loads on other
// contexts must not wait for them. The default is 0:
// no bound (a database connection pool bounds loads too, but without that
// order).
func MaxConcurrentLoads(n int) Option {
	return guardOption(func(c *config) { c.maxLoads = n })
}

// Observer sets a function called with every outcome (see EventKind), e.g.
// to feed a metrics library or a trace: ctx is the context of the call that
// produced the event (for a load or refresh in the background, a context
// detached from that call that keeps its values). It is called synchronously,
// from the calling goroutine or a background one, and must not block. A panic
// in it is recovered and logged (Logger), and the call goes on. The default
// is none.
func Observer(f func(ctx context.Context, e Event)) Option {
	return guardOption(func(c *config) { c.observer = f })
}

// NearCache keeps up to entries decoded values in this process, in front of
// Redis, each for at most ttl (and never past its own TTL): a hit on it costs
// no round trip and allocates nothing. Every fill, Invalidate and
// InvalidateTags, in any process sharing the Redis, drops the entries it
// concerns in every process's near cache through one pub/sub channel,
// within milliseconds (see the package documentation, Near cache, for the
// guarantees and what it costs on a cluster); while that subscription is
// down the near cache is bypassed, and flushed when it is back. ttl is the
// safety net should a message be lost unseen. Values are shared by the calls
// that get them: treat them as read-only. The default is off.
func NearCache(entries int, ttl time.Duration) Option {
	return guardOption(func(c *config) { c.nearSize, c.nearTTL = entries, ttl })
}

// Logger sets where the Guard's warnings go — a fail-open load, a failed
// Redis call, an unreadable cached value — each kind at most once a second,
// with the count of those suppressed since. The default (and nil) is
// slog.Default(); silence them with Logger(slog.New(slog.DiscardHandler)).
func Logger(l *slog.Logger) Option { return guardOption(func(c *config) { c.logger = l }) }

// Variant keeps the value as one representation of key among others, next to
// the values cached under key by calls with another Variant or another type T:
// each has an entry and a fill of its own, and Invalidate(key) voids them all.
// ginmw.Cache, for instance, keeps the GET and the HEAD response of a resource
// as two variants of the resource's name. The default is none; the type T
// always sets one representation apart from another.
func Variant(name string) CallOption { return callOption(func(c *config) { c.variant = name }) }

// ReportTo makes the call store how it was served in *r: NearHit, Hit, Miss,
// Stale or Coalesced (GetMany: the least favourable of its keys', in that
// order). It is left unchanged when the call fails before reading the
// cache (bad input, closed guard).
func ReportTo(r *Result) CallOption { return callOption(func(c *config) { c.report = r }) }

// CheckCallOptions reports the error a Get of g with opts would fail with
// because of them, before reading the cache: one matching ErrInvalid (an
// invalid value, more than 16 tags or an invalid one, a nil option), checked
// against g's defaults by the very check Get runs; ErrClosed once g is
// closed; else nil. Code that is given options once for many calls checks
// them when it is given them: ginmw.Cache panics on options it refuses.
func (g *Guard) CheckCallOptions(opts ...CallOption) error {
	_, err := g.callConfig(opts, true)
	return err
}

func (c *config) validate() error {
	for _, d := range [...]struct {
		name string
		d    time.Duration
	}{{"TTL", c.ttl}, {"ServeStale", c.staleWindow}, {"StaleGrace", c.graceD}, {"WaitBudget", c.wait},
		{"NegativeTTL", c.negTTL}, {"LoadTimeout", c.loadTimeout}, {"Lease", c.lease},
		{"FailSafe max age", c.failSafeAge}, {"FailSafe back-off", c.failSafeOff}, {"SoftTimeout", c.softTimeout},
		{"CommandTimeout", c.cmdTime}, {"NearCache ttl", c.nearTTL}} {
		if d.d > MaxDuration {
			return invalid("%s %v exceeds MaxDuration (%v)", d.name, d.d, MaxDuration)
		}
	}
	switch {
	case c.ttl <= 0:
		return invalid("TTL %v must be positive", c.ttl)
	case c.staleWindow < 0:
		return invalid("negative stale window %v", c.staleWindow)
	case c.graceD < 0:
		return invalid("negative StaleGrace %v", c.graceD)
	case c.wait < 0:
		return invalid("negative wait budget %v", c.wait)
	case c.negTTL < 0:
		return invalid("negative NegativeTTL %v", c.negTTL)
	case c.loadTimeout <= 0:
		return invalid("load timeout %v must be positive", c.loadTimeout)
	case c.lease < MinLease:
		return invalid("fill lease %v is shorter than %v", c.lease, MinLease)
	case !(c.beta >= 0) || math.IsInf(c.beta, 1):
		return invalid("early refresh beta %v must be a finite number ≥ 0", c.beta)
	case !(c.jitter >= 0 && c.jitter < 1):
		return invalid("jitter %v must be in [0, 1)", c.jitter)
	case c.onTimeout > TimeoutLoad:
		return invalid("unknown TimeoutAction %d", c.onTimeout)
	case c.codec == nil:
		return invalid("nil Codec")
	case c.failSafeAge < 0 || c.failSafeOff < 0 || c.failSafeAge > 0 && c.failSafeOff == 0:
		return invalid("fail-safe max age %v, back-off %v", c.failSafeAge, c.failSafeOff)
	case c.softTimeout < 0:
		return invalid("negative soft timeout %v", c.softTimeout)
	case c.tags.validate() != nil:
		return c.tags.validate()
	case c.nearSize < 0 || c.nearSize > 0 && c.nearTTL <= 0:
		return invalid("near cache of %d entries for %v", c.nearSize, c.nearTTL)
	case c.cmdTime <= 0:
		return invalid("CommandTimeout %v must be positive", c.cmdTime)
	case c.maxLoads < 0:
		return invalid("negative MaxConcurrentLoads %d", c.maxLoads)
	case len(c.variant) > MaxKeyLen:
		return invalid("variant of %d bytes exceeds %d", len(c.variant), MaxKeyLen)
	case strings.ContainsAny(c.prefix, "{}"):
		return invalid("prefix %q holds a brace: the hash tag of every name must be the key's", c.prefix)
	}
	return nil
}

func validKey(key string) error { return validName("key", key) }

// validName checks a key or a tag (what says which): the one rule for both,
// reported as ErrInvalid.
func validName(what, name string) error {
	switch {
	case name == "":
		return invalid("empty %s", what)
	case len(name) > MaxKeyLen:
		return invalid("%s of %d bytes exceeds %d", what, len(name), MaxKeyLen)
	}
	return nil
}
