package gormplugin

import (
	"context"
	"log/slog"
	"time"

	"github.com/cacheguard/cacheguard/internal/ratelog"
	"github.com/cacheguard/cacheguard/locks"
)

// Invalidator deletes cached copies of rows; *cacheguard.Guard implements it.
type Invalidator interface {
	Invalidate(ctx context.Context, keys ...string) error
}

// InvalidatorFunc adapts a function to Invalidator.
type InvalidatorFunc func(ctx context.Context, keys ...string) error

// Invalidate calls f.
func (f InvalidatorFunc) Invalidate(ctx context.Context, keys ...string) error {
	return f(ctx, keys...)
}

// Option configures a Plugin.
type Option func(*config)

// UnkeyedPolicy says what a guarded Update or Delete does when its model
// carries no primary key, so that its rows are those its WHERE matches: a
// write with conditions (Where("id = ?", id), Where("name = ?"),
// db.Delete(&Repo{}, 42)), a db.Table(...) write, a global write with
// AllowGlobalUpdate, and the writes GORM's association API makes by foreign
// key.
type UnkeyedPolicy int

const (
	// LockMatched, the default, reads the primary keys of the rows the
	// write's conditions match (in the write's transaction, if any), locks
	// them like named rows (in name order, fenced), and restricts the write to
	// them (AND pk IN (...)), so it excludes, and is excluded by, every writer
	// of those rows. A row that starts to match between that read and the
	// write is left out, as if the write had run first. A write matching more
	// than MaxMatchedRows rows fails with ErrUnkeyed; one on a table without
	// a primary key too.
	LockMatched UnkeyedPolicy = iota
	// Refuse fails such writes with ErrUnkeyed before they are sent. GORM's
	// association operations are several statements: run them in a
	// transaction so that a refusal rolls the whole operation back.
	Refuse
	// PassThrough sends such writes without a lock or fence.
	PassThrough
)

const defaultMaxMatchedRows = 1000

// MaxMatchedRows bounds how many rows a write whose rows are not named may
// lock under LockMatched (one Redis round trip each); a write matching more
// fails with ErrUnkeyed before anything is written. The default is 1000.
func MaxMatchedRows(n int) Option {
	return func(c *config) {
		if n <= 0 {
			c.fail(invalid("MaxMatchedRows %d must be positive", n))
			return
		}
		c.maxMatched = n
	}
}

type config struct {
	inv     Invalidator
	keys    func(table string, pk any) []string
	again   time.Duration
	unkeyed UnkeyedPolicy
	// maxMatched bounds the rows LockMatched locks for one write.
	maxMatched int
	// attempts and backoff shape the retries of a failed invalidation.
	attempts int
	backoff  time.Duration
	observer func(context.Context, Event)
	log      *ratelog.Logger
	failOpen bool
	noFence  bool
	lockOpts []locks.CallOption
	// unavailableAfter bounds the first attempt at a row lock.
	unavailableAfter time.Duration
	err              error // the first invalid option
}

const defaultUnavailableAfter = 500 * time.Millisecond

func (c *config) fail(err error) {
	if c.err == nil {
		c.err = err
	}
}

// Invalidate makes every committed guarded write invalidate, through inv, the
// cache keys that keys returns for each written row: pk is the row's primary
// key value ([]any in schema order for a composite key), or nil for a write
// whose rows are unknown (see Unkeyed). Invalidation happens after COMMIT
// succeeds (or fails with an unknown outcome), never on rollback, so the next
// read reloads the committed row once. The default is no invalidation.
func Invalidate(inv Invalidator, keys func(table string, pk any) []string) Option {
	return func(c *config) {
		if inv == nil || keys == nil {
			c.fail(invalid("Invalidate needs an Invalidator and a key function"))
			return
		}
		c.inv, c.keys = inv, keys
	}
}

// InvalidateAgain repeats each invalidation after d (a delayed double
// delete), so that a read served by a lagging replica between the commit and
// the replica catching up cannot leave a stale copy cached for long. Pending
// repeats are dropped by Close. The default is no repeat.
func InvalidateAgain(d time.Duration) Option {
	return func(c *config) {
		if d <= 0 {
			c.fail(invalid("InvalidateAgain delay %v must be positive", d))
			return
		}
		c.again = d
	}
}

// Unkeyed sets what happens to writes whose rows are not named by primary
// key. The default is LockMatched.
func Unkeyed(p UnkeyedPolicy) Option {
	return func(c *config) {
		if p < LockMatched || p > PassThrough {
			c.fail(invalid("unknown UnkeyedPolicy %d", p))
			return
		}
		c.unkeyed = p
	}
}

// FailOpen lets guarded writes proceed without a lock (and without a fence)
// when the lock service is unavailable (locks.ErrUnavailable, or no answer
// within UnavailableAfter), logging a warning (see Logger) and reporting
// EventWroteUnguarded to the Observer. A lock held by another writer is
// never failed open. By default such writes fail with ErrLock and nothing is
// written.
func FailOpen() Option { return func(c *config) { c.failOpen = true } }

// NoFencing ignores fence columns: writes are still locked, but no fence is
// checked or written, and the plugin's locks keep no fence counters in Redis
// (locks.NoFencing). It is required to use a Locker that issues no fence
// tokens (locks.Redlock); by default New refuses a Redlock, and a write under
// a lock without a token fails with ErrInvalid.
func NoFencing() Option { return func(c *config) { c.noFence = true } }

// RetryInvalidation shapes the retries of an invalidation that failed after
// its COMMIT (the write itself has committed and returned nil): up to
// attempts attempts in all, the second backoff after the first, each wait
// twice the one before, at most 5 s — or sooner: an invalidation that
// succeeds (another write's, or a retry) makes every pending retry due at
// once, since the cache answers again. The retries run in the background,
// owned by the plugin; Shutdown flushes them, Close drops them, and each is
// reported to the Observer. The default is 8 attempts from 100 ms (about 16 s
// in all); attempts 1 turns retries off.
func RetryInvalidation(attempts int, backoff time.Duration) Option {
	return func(c *config) {
		if attempts < 1 || backoff <= 0 {
			c.fail(invalid("RetryInvalidation(%d, %v): want at least 1 attempt and a positive backoff", attempts, backoff))
			return
		}
		c.attempts, c.backoff = attempts, backoff
	}
}

// UnavailableAfter sets how long the plugin's first attempt at a row lock (a
// TryLock; only a lock held by another owner is then awaited) may go
// unanswered before the lock service counts as unavailable: the write then
// fails with ErrLock matching locks.ErrUnavailable, or with FailOpen goes
// through unguarded. It bounds what an unreachable Redis costs each write,
// where go-redis would retry its dials for a second or more and a Redlock
// would retry until its wait budget ends. The default is 500ms.
func UnavailableAfter(d time.Duration) Option {
	return func(c *config) {
		if d <= 0 {
			c.fail(invalid("UnavailableAfter %v must be positive", d))
			return
		}
		c.unavailableAfter = d
	}
}

// LockOptions are passed to every Lock and TryLock call of the plugin, e.g.
// locks.WaitBudget(5*time.Second) to bound how long a write waits for a row.
// The default is none: the Locker's own defaults apply.
func LockOptions(opts ...locks.CallOption) Option {
	return func(c *config) { c.lockOpts = append(c.lockOpts, opts...) }
}

// Logger sets where the plugin's warnings go — an invalidation that failed
// after COMMIT or was given up, a write let through unguarded by FailOpen, a
// row lock whose release failed — each kind at most once a second, with the
// count of those suppressed. The default (and nil) is slog.Default() (GORM's
// logger is not used: it writes to standard output by default); silence them
// with Logger(slog.New(slog.DiscardHandler)). The Observer sees every event
// regardless.
func Logger(l *slog.Logger) Option {
	return func(c *config) { c.log = ratelog.New(l, time.Second) }
}
