package gormplugin

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"
	"gorm.io/gorm/schema"

	"github.com/cacheguard/cacheguard/internal/isnil"
	"github.com/cacheguard/cacheguard/internal/ratelog"
	"github.com/cacheguard/cacheguard/locks"
)

// pluginName is the plugin's name in gorm.DB.Plugins.
const pluginName = "cacheguard:gormplugin"

// releaseTimeout bounds the Redis calls made after a statement or a COMMIT
// (unlock, invalidate), which must run even when the caller's context ended.
const releaseTimeout = 5 * time.Second

var _ gorm.Plugin = (*Plugin)(nil)

// Plugin is the GORM plugin; register it with db.Use(gormplugin.New(l)). One
// Plugin serves one *gorm.DB. Its background work (retried and delayed
// invalidations) is flushed by Shutdown or stopped by Close.
type Plugin struct {
	l   locks.Locker
	cfg config

	fences      sync.Map // *schema.Schema → *schema.Field (nil when none)
	pks         sync.Map // table name → []string, primary key columns read from the catalogue
	exact       sync.Map // dialect + "\x00" + table → map[string]keyColumn: how its columns compare (exactKeys)
	constraints sync.Map // table name + "\x00" + constraint name → []clause.Column, read from the catalogue

	mu          sync.Mutex               // guards the fields below
	timers      map[*time.Timer]struct{} // delayed invalidations (InvalidateAgain) not yet done
	running     int                      // delayed invalidations running
	pending     []*pendingInvalidation   // failed invalidations waiting for a retry
	pendingKeys int                      // keys in pending
	looping     bool                     // the retry loop runs
	inflight    int                      // guarded statements and transactions not yet ended
	flushing    bool                     // Shutdown: retry everything at once
	stopping    bool                     // Close: the retry loop ends
	closed      bool                     // Close: no more background work is accepted
	changed     chan struct{}            // closed (and replaced) when the above change
	wake        chan struct{}            // wakes the retry loop (buffer 1)
	loops       sync.WaitGroup           // retry loops running
	bg          context.Context          // background invalidations; cancelled by Close
	stopBg      context.CancelFunc

	attempts  sync.WaitGroup // lock attempts in flight (see attempt)
	abandoned atomic.Int32   // attempts whose caller stopped waiting, still unanswered
}

// New returns the plugin guarding writes with locks taken from l. It panics
// with a "gormplugin:" message on programmer error: a nil l, an invalid
// option, or a locks.Redlock (which issues no fence tokens) without
// NoFencing. Errors that depend on the database are Initialize's, returned by
// db.Use.
func New(l locks.Locker, opts ...Option) *Plugin {
	p := &Plugin{l: l, timers: map[*time.Timer]struct{}{}, changed: make(chan struct{}), wake: make(chan struct{}, 1)}
	p.cfg.unavailableAfter = defaultUnavailableAfter
	p.cfg.attempts, p.cfg.backoff = defaultInvalidateAttempts, defaultInvalidateBackoff
	p.cfg.maxMatched = defaultMaxMatchedRows
	p.cfg.log = ratelog.New(nil, time.Second) // slog.Default(), limited per Plugin
	for _, o := range opts {
		if o != nil {
			o(&p.cfg)
		}
	}
	switch {
	case p.cfg.err != nil:
		panic(p.cfg.err.Error())
	case l == nil || isnil.Pointer(l):
		panic("gormplugin: New called with a nil Locker")
	case !p.cfg.noFence && isRedlock(l):
		panic("gormplugin: a locks.Redlock issues no fence tokens: fencing would not be safe; use a locks.Client, or the NoFencing option")
	}
	if p.cfg.noFence {
		// Nothing compares tokens: the locks keep no fence counters in Redis.
		p.cfg.lockOpts = append(p.cfg.lockOpts[:len(p.cfg.lockOpts):len(p.cfg.lockOpts)], locks.NoFencing())
	}
	p.bg, p.stopBg = context.WithCancel(context.Background())
	return p
}

// Name returns "cacheguard:gormplugin"; registering the plugin twice on one
// database makes db.Use return gorm.ErrRegistered.
func (p *Plugin) Name() string { return pluginName }

// Initialize registers the plugin's callbacks on db's Create, Update and
// Delete processors, its SET and ON CONFLICT clause builders, and wraps db's
// connection pool so the plugin sees every transaction's COMMIT, ROLLBACK
// and savepoint. GORM calls it from
// db.Use; call db.Use right after gorm.Open, before deriving sessions.
func (p *Plugin) Initialize(db *gorm.DB) error {
	switch {
	case db == nil || db.ConnPool == nil:
		return invalid("database without a connection pool")
	}
	if _, ok := db.ConnPool.(gorm.TxCommitter); ok {
		return invalid("db.Use on a transaction: register the plugin on the database")
	}

	p.wrapPool(db)
	if db.ClauseBuilders == nil {
		db.ClauseBuilders = map[string]clause.ClauseBuilder{}
	}
	db.ClauseBuilders["SET"] = p.setBuilder(db.ClauseBuilders["SET"])
	db.ClauseBuilders["ON CONFLICT"] = p.conflictBuilder(db.ClauseBuilders["ON CONFLICT"])

	crt, upd, del := db.Callback().Create(), db.Callback().Update(), db.Callback().Delete()
	// One registration function per processor: GORM's processor and callback
	// types are unexported, so they cannot be named in a shared helper.
	regUpdate := func(name, before, after string, fn func(*gorm.DB)) error {
		c := upd.Before(before)
		if after != "" {
			c = c.After(after)
		}
		return c.Register(name, fn)
	}
	regDelete := func(name, before, after string, fn func(*gorm.DB)) error {
		c := del.Before(before)
		if after != "" {
			c = c.After(after)
		}
		return c.Register(name, fn)
	}
	regCreate := func(name, before, after string, fn func(*gorm.DB)) error {
		c := crt.Before(before)
		if after != "" {
			c = c.After(after)
		}
		return c.Register(name, fn)
	}
	if err := p.register(upd.Get, regUpdate, "gorm:update", "gorm:after_update", writeUpdate); err != nil {
		return err
	}
	if err := p.register(del.Get, regDelete, "gorm:delete", "gorm:after_delete", writeDelete); err != nil {
		return err
	}
	// Inserts and upserts: lockStep tells them apart by their ON CONFLICT.
	return p.register(crt.Get, regCreate, "gorm:create", "gorm:after_create", writeInsert)
}

// wrapPool puts the plugin's pool under db, so that it sees every
// transaction begin and end. With PrepareStmt, GORM's *gorm.PreparedStmtDB
// stays on top, where GORM and its users look for it (db.ConnPool.(*gorm.
// PreparedStmtDB)), and the plugin's pool goes beneath it: its transactions
// are then *gorm.PreparedStmtTX around the plugin's.
func (p *Plugin) wrapPool(db *gorm.DB) {
	if pdb, ok := db.ConnPool.(*gorm.PreparedStmtDB); ok {
		if _, ok := pdb.ConnPool.(*guardPool); !ok {
			pdb.ConnPool = &guardPool{ConnPool: pdb.ConnPool, p: p}
		}
		return
	}
	if _, ok := db.ConnPool.(*guardPool); ok {
		return
	}
	pool := &guardPool{ConnPool: db.ConnPool, p: p}
	if db.Statement != nil && db.Statement.ConnPool == db.ConnPool {
		db.Statement.ConnPool = pool
	}
	db.ConnPool = pool
}

// register places the plugin's steps around GORM's own for one processor:
//
//	gormplugin:lock     before gorm:begin_transaction (first without one): take the row locks
//	gormplugin:fence    before the write: lost-lock check, fence condition
//	gormplugin:check    after the write, before the after-hooks: zero rows → stale or missing
//	gormplugin:release  after gorm:commit_or_rollback_transaction (last without one): invalidate, unlock
func (p *Plugin) register(get func(string) func(*gorm.DB), reg func(name, before, after string, fn func(*gorm.DB)) error, write, afterHooks string, kind writeKind) error {
	begin, commit := "gorm:begin_transaction", "gorm:commit_or_rollback_transaction"
	if get(begin) == nil { // SkipDefaultTransaction: GORM opens no transaction
		begin = "*"
	}
	if get(commit) == nil {
		commit = "*"
	}
	if err := reg("gormplugin:lock", begin, "", p.lockStep(kind)); err != nil {
		return err
	}
	if err := reg("gormplugin:fence", write, "", p.fenceStep); err != nil {
		return err
	}
	if err := reg("gormplugin:check", afterHooks, write, p.checkStep); err != nil {
		return err
	}
	return reg("gormplugin:release", "", commit, p.releaseStep)
}

// fenceOf returns the fence column of s, or nil (always nil with NoFencing).
func (p *Plugin) fenceOf(s *schema.Schema) *schema.Field {
	if s == nil || p.cfg.noFence {
		return nil
	}
	if f, ok := p.fences.Load(s); ok {
		return f.(*schema.Field)
	}
	f := fenceField(s)
	p.fences.Store(s, f)
	return f
}

// warn logs a warning through the Logger, at most once a second per key.
func (p *Plugin) warn(ctx context.Context, key, msg string, attrs ...slog.Attr) {
	p.cfg.log.Warn(ctx, key, msg, attrs...)
}

// isRedlock reports whether l is a locks.Redlock, whose locks carry no fence
// token. Other Lockers are checked at each lock (a Fence of 0 is refused).
func isRedlock(l locks.Locker) bool {
	_, ok := l.(*locks.Redlock)
	return ok
}
