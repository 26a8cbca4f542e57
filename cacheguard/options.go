package cacheguard

import (
	"math"
	"strings"
	"time"
)

// Defaults of a Guard; each option's doc names its default too.
const (
	DefaultTTL         = time.Minute
	DefaultWait        = 10 * time.Second
	DefaultNegativeTTL = 5 * time.Second
	DefaultLoadTimeout = 10 * time.Second
	DefaultFillLease   = 3 * time.Second
	DefaultBeta        = 1.0
	DefaultJitter      = 0.1
	DefaultPrefix      = "cg:"
	// MinFillLease is the shortest fill lease accepted: a renewal must fit in a third of it.
	MinFillLease = 30 * time.Millisecond
	// MaxKeyLen bounds keys; longer keys are refused with ErrInvalid.
	MaxKeyLen = 1024
)

// Option configures a Guard (as the default of every call, in New) or one Get
// call (overriding the Guard's default). Prefix, MaxConcurrentLoads and
// WithObserver are Guard options only, ReportTo and Variant are call options
// only; passing them in the wrong place is an ErrInvalid (a panic in New).
type Option func(*config)

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
	jitter      float64
	policy      policy
	onTimeout   TimeoutAction
	failClosed  bool
	codec       Codec
	report      *Result // call only
	variant     string  // call only

	// Guard only.
	prefix    string
	maxLoads  int
	observer  func(Event)
	guardOnly bool // a Guard-only option was applied
}

func defaults() config {
	return config{
		ttl:         DefaultTTL,
		wait:        DefaultWait,
		negTTL:      DefaultNegativeTTL,
		loadTimeout: DefaultLoadTimeout,
		lease:       DefaultFillLease,
		beta:        DefaultBeta,
		jitter:      DefaultJitter,
		codec:       JSON{},
		prefix:      DefaultPrefix,
	}
}

// TTL sets how long a loaded value stays fresh (before jitter, see Jitter).
// The default is 1 minute; it must be positive.
func TTL(d time.Duration) Option { return func(c *config) { c.ttl = d } }

// ServeStale selects the serve-stale policy and sets the stale window: after
// its TTL a value stays servable for window more. A call that finds a stale
// value returns it at once (Result Stale) and the first such call refreshes it
// in the background under the fill lease, one load across every process. With
// nothing servable the call waits as under Wait, for the wait budget. The
// window is stored with each value, so values written by any call carry the
// window of that call's configuration. The default policy is Wait and the
// default window 0.
func ServeStale(window time.Duration) Option {
	return func(c *config) { c.policy, c.staleWindow = policyStale, window }
}

// Wait selects the wait policy (the default) and sets the wait budget (see
// WaitBudget): a miss waits for the one load across the fleet and returns its
// value within milliseconds of it being stored.
func Wait(budget time.Duration) Option {
	return func(c *config) { c.policy, c.wait = policyWait, budget }
}

// WaitBudget sets how long a call may wait for a value without changing the
// policy: no call waits longer than its context and this budget, counted from
// the start of the call (a call's own load included). What happens when it ends
// is set by OnWaitTimeout. The default is 10s.
func WaitBudget(d time.Duration) Option { return func(c *config) { c.wait = d } }

// FailFast selects the fail-fast policy: a call never waits for a load. It
// returns a fresh value, or a stale one within the stale window, or else
// ErrMiss at once, having started one fill in the background (under the fill
// lease, so still one load across the fleet). While Redis cannot be reached,
// fail-open still runs the loader for the call (see FailClosed). The default
// policy is Wait.
func FailFast() Option { return func(c *config) { c.policy = policyFailFast } }

// OnWaitTimeout sets what a call does when its wait budget ends. The default
// is TimeoutFail (ErrWaitTimeout).
func OnWaitTimeout(a TimeoutAction) Option { return func(c *config) { c.onTimeout = a } }

// LoadOnTimeout is OnWaitTimeout(TimeoutLoad): when the wait budget ends the
// call loads without the fill lease (coalesced in the process, not stored).
func LoadOnTimeout() Option { return OnWaitTimeout(TimeoutLoad) }

// NegativeTTL sets how long a load that returned (or wrapped) ErrNotFound is
// cached as absent. The default is 5s; 0 turns negative caching off.
func NegativeTTL(d time.Duration) Option { return func(c *config) { c.negTTL = d } }

// EarlyRefresh sets β of probabilistic early refresh (XFetch): a hit refreshes
// the value in the background when now − Δ·β·ln(rand) ≥ fresh-until, Δ being
// the stored duration of its last load, so a hot key is usually refreshed
// before it expires, by one caller. Larger β refreshes earlier, but never
// more than a twentieth of the TTL before expiry: the refreshed value is
// stored fresh for a full TTL from the end of its load, so a key read without
// pause costs at most about 5% more loads than one refreshed exactly at
// expiry (a refresh that cannot finish within that twentieth — a load slower
// than TTL/20 — makes the calls after expiry wait for it, or under
// ServeStale serves them the stale value). The default is 1; 0 turns it off.
func EarlyRefresh(beta float64) Option { return func(c *config) { c.beta = beta } }

// Jitter shortens the TTL of a value loaded after a miss by a random fraction
// in [0, frac), so that keys loaded together (at a cold start, or after an
// invalidation of many keys) do not expire together. A refresh — early, or of
// a stale value — stores a full TTL: its moment already comes from the
// requests that triggered it, and a shorter TTL would only cost loads. The
// default is 0.1; 0 turns it off; it must be below 1.
func Jitter(frac float64) Option { return func(c *config) { c.jitter = frac } }

// LoadTimeout bounds the context a loader runs under. That context is detached
// from every caller (a caller that gives up never cancels a shared load) but
// keeps the values of the context of the call that started the load. The
// default is 10s.
func LoadTimeout(d time.Duration) Option { return func(c *config) { c.loadTimeout = d } }

// FillLease sets the fill lease: how long a process that took the lease and
// then died (or stopped renewing) keeps the others waiting before one of them
// takes over. The lease is renewed every third of it while the loader runs.
// The default is 3s; at least 30ms.
func FillLease(d time.Duration) Option { return func(c *config) { c.lease = d } }

// WithCodec sets how values are encoded inside the envelope. The default is
// JSON. Readers must use the codec the writers used.
func WithCodec(cd Codec) Option { return func(c *config) { c.codec = cd } }

// FailClosed makes a call fail with ErrUnavailable (joined with the Redis
// error) when Redis cannot be reached. By default a call fails open: the loader
// runs (coalesced within the process, bounded by MaxConcurrentLoads) and its
// result is returned uncached.
func FailClosed() Option { return func(c *config) { c.failClosed = true } }

// Prefix sets the prefix of every key and channel (Guard only). The default is "cg:".
func Prefix(p string) Option { return func(c *config) { c.prefix, c.guardOnly = p, true } }

// MaxConcurrentLoads bounds how many fail-open loads (run while Redis is
// unreachable) a Guard runs at once; a call waits for a slot within its wait
// budget. Guard only. The default is 0: no bound.
func MaxConcurrentLoads(n int) Option {
	return func(c *config) { c.maxLoads, c.guardOnly = n, true }
}

// WithObserver sets a function called with every outcome (see EventKind), e.g.
// to feed a metrics library. Guard only. It is called synchronously, from the
// calling goroutine or a background one, and must not block. The default is none.
func WithObserver(f func(Event)) Option {
	return func(c *config) { c.observer, c.guardOnly = f, true }
}

// Variant keeps the value as one representation of key among others, next to
// the values cached under key by calls with another Variant or another type T
// (call only): each has an entry and a fill of its own, and Invalidate(key)
// voids them all. ginmw.Cache, for instance, keeps the GET and the HEAD
// response of a resource as two variants of the resource's name. The default
// is none; the type T always sets one representation apart from another.
func Variant(name string) Option { return func(c *config) { c.variant = name } }

// ReportTo makes the call store how it was served in *r (call only): Hit,
// Miss, Stale or Coalesced. It is left unchanged when the call fails before
// reading the cache (bad input, closed guard).
func ReportTo(r *Result) Option { return func(c *config) { c.report = r } }

func (c *config) validate() error {
	switch {
	case c.ttl <= 0:
		return invalid("TTL %v must be positive", c.ttl)
	case c.staleWindow < 0:
		return invalid("negative stale window %v", c.staleWindow)
	case c.wait < 0:
		return invalid("negative wait budget %v", c.wait)
	case c.negTTL < 0:
		return invalid("negative NegativeTTL %v", c.negTTL)
	case c.loadTimeout <= 0:
		return invalid("load timeout %v must be positive", c.loadTimeout)
	case c.lease < MinFillLease:
		return invalid("fill lease %v is shorter than %v", c.lease, MinFillLease)
	case !(c.beta >= 0) || math.IsInf(c.beta, 1):
		return invalid("early refresh beta %v must be a finite number ≥ 0", c.beta)
	case !(c.jitter >= 0 && c.jitter < 1):
		return invalid("jitter %v must be in [0, 1)", c.jitter)
	case c.onTimeout > TimeoutLoad:
		return invalid("unknown TimeoutAction %d", c.onTimeout)
	case c.codec == nil:
		return invalid("nil Codec")
	case c.maxLoads < 0:
		return invalid("negative MaxConcurrentLoads %d", c.maxLoads)
	case len(c.variant) > MaxKeyLen:
		return invalid("variant of %d bytes exceeds %d", len(c.variant), MaxKeyLen)
	case strings.ContainsAny(c.prefix, "{}"):
		return invalid("prefix %q holds a brace: the hash tag of every name must be the key's", c.prefix)
	}
	return nil
}

func validKey(key string) error {
	switch {
	case key == "":
		return invalid("empty key")
	case len(key) > MaxKeyLen:
		return invalid("key of %d bytes exceeds %d", len(key), MaxKeyLen)
	}
	return nil
}
