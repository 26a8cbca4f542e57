package gormplugin

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"sync"

	"gorm.io/gorm"
)

// guardPool wraps the database's connection pool so that every transaction
// GORM begins on it (db.Transaction, db.Begin, and the one GORM opens around a
// single write) is a *guardTx, whose COMMIT and ROLLBACK the plugin sees.
type guardPool struct {
	gorm.ConnPool
	p *Plugin
}

type seedKey struct{}

// BeginTx begins a transaction on the wrapped pool. The transaction takes
// over the registry that Transaction put on ctx, or starts its own.
//
// ctx's cancellation reaches the transaction until its COMMIT is sent, not
// after: database/sql rolls a transaction back when the context it was begun
// with ends (GORM's DefaultTransactionTimeout relies on it), but pgx also runs
// COMMIT under that context, so a cancellation arriving while COMMIT was on
// the wire made Commit fail after the database had committed — a committed
// write reported as failed (and answered "nothing was written" by a handler
// whose lock was lost meanwhile). A cancellation before COMMIT still rolls
// back; one during it no longer interrupts it.
func (g *guardPool) BeginTx(ctx context.Context, opts *sql.TxOptions) (gorm.ConnPool, error) {
	var inner gorm.Tx
	txCtx := newBeginCtx(ctx)
	ok := false
	defer func() {
		if !ok {
			_ = txCtx.detach()
		}
	}()
	switch b := g.ConnPool.(type) {
	case gorm.TxBeginner:
		tx, err := b.BeginTx(txCtx, opts)
		if err != nil {
			return nil, err
		}
		inner = tx
	case gorm.ConnPoolBeginner:
		cp, err := b.BeginTx(txCtx, opts)
		if err != nil {
			return nil, err
		}
		tx, ok := cp.(gorm.Tx)
		if !ok {
			return nil, gorm.ErrInvalidTransaction
		}
		inner = tx
	default:
		return nil, gorm.ErrInvalidTransaction
	}
	r, seeded := ctx.Value(seedKey{}).(*txLocks)
	if !seeded || !r.adopt() {
		r = g.p.newTxLocks(ctx)
	}
	ok = true
	return &guardTx{Tx: inner, pool: g, locks: r, ctx: txCtx}, nil
}

// beginCtx carries a context's values, and its cancellation until detach:
// the context a transaction is begun with, detached when its COMMIT is sent.
type beginCtx struct {
	context.Context // the parent without its cancellation
	parent          context.Context
	done            chan struct{}
	stop            func() bool

	mu       sync.Mutex
	err      error // the parent's, once done is closed
	detached bool
}

func newBeginCtx(parent context.Context) *beginCtx {
	c := &beginCtx{Context: context.WithoutCancel(parent), parent: parent, done: make(chan struct{})}
	if err := parent.Err(); err != nil {
		c.err = err
		close(c.done)
		c.stop = func() bool { return false }
		return c
	}
	c.stop = context.AfterFunc(parent, func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		if !c.detached {
			c.err = parent.Err()
			close(c.done)
		}
	})
	return c
}

// detach stops passing the parent's cancellation on, and returns it if the
// parent had ended before (passed on already, or not yet).
func (c *beginCtx) detach() error {
	c.stop()
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.detached && c.err == nil {
		if err := c.parent.Err(); err != nil {
			c.err = err
			close(c.done)
		}
	}
	c.detached = true
	return c.err
}

func (c *beginCtx) Done() <-chan struct{} { return c.done }

func (c *beginCtx) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// GetDBConn returns the *sql.DB underneath, for gorm.DB.DB.
func (g *guardPool) GetDBConn() (*sql.DB, error) {
	switch c := g.ConnPool.(type) {
	case *sql.DB:
		return c, nil
	case gorm.GetDBConnector:
		return c.GetDBConn()
	}
	return nil, gorm.ErrInvalidDB
}

// Ping pings the wrapped pool.
func (g *guardPool) Ping() error {
	if p, ok := g.ConnPool.(interface{ Ping() error }); ok {
		return p.Ping()
	}
	return nil
}

// guardTx is a transaction whose end releases its row locks, and whose
// COMMIT invalidates the cache keys of the rows it wrote.
type guardTx struct {
	gorm.Tx
	pool  *guardPool
	locks *txLocks
	ctx   *beginCtx // the context it was begun with; detached at COMMIT
}

// Commit commits, then invalidates and releases. A COMMIT that fails may
// still have committed (its reply lost), so it invalidates all the same.
func (t *guardTx) Commit() error {
	// A cancellation from now on must not interrupt COMMIT; one that came
	// before ends the transaction as database/sql would: rolled back.
	if err := t.ctx.detach(); err != nil {
		_ = t.Tx.Rollback() // database/sql may have rolled it back already
		t.locks.finish(false)
		return err
	}
	err := t.Tx.Commit()
	if errors.Is(err, sql.ErrTxDone) {
		// Rolled back already (its context ended) or ended twice: nothing
		// was committed by this call.
		t.locks.finish(false)
		return err
	}
	t.locks.finish(true)
	return err
}

// Rollback rolls back and releases, without invalidating.
func (t *guardTx) Rollback() error {
	err := t.Tx.Rollback()
	_ = t.ctx.detach()
	t.locks.finish(false)
	return err
}

// GetDBConn returns the *sql.DB underneath, for gorm.DB.DB.
func (t *guardTx) GetDBConn() (*sql.DB, error) { return t.pool.GetDBConn() }

// ExecContext runs a statement of the transaction, and follows its
// savepoints (GORM's SavePoint, RollbackTo and nested Transaction send them
// here): a ROLLBACK TO SAVEPOINT puts back the fences that the writes
// rolled back had stamped into their structs.
func (t *guardTx) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	res, err := t.Tx.ExecContext(ctx, query, args...)
	if err == nil && len(args) == 0 {
		if op, name, ok := savepointOp(query); ok {
			t.locks.savepoint(op, name)
		}
	}
	return res, err
}

// Savepoint operations.
const (
	spSet      = "SAVEPOINT"
	spRollback = "ROLLBACK TO"
	spRelease  = "RELEASE"
)

// savepointOp reads "SAVEPOINT n", "ROLLBACK TO [SAVEPOINT] n" and
// "RELEASE [SAVEPOINT] n".
func savepointOp(query string) (op, name string, ok bool) {
	f := strings.Fields(strings.TrimSuffix(strings.TrimSpace(query), ";"))
	up := func(i int) string {
		if i < len(f) {
			return strings.ToUpper(f[i])
		}
		return ""
	}
	switch {
	case len(f) == 2 && up(0) == "SAVEPOINT":
		op = spSet
	case len(f) >= 3 && up(0) == "ROLLBACK" && up(1) == "TO":
		op, f = spRollback, f[2:]
	case len(f) >= 2 && up(0) == "RELEASE":
		op, f = spRelease, f[1:]
	default:
		return "", "", false
	}
	if op != spSet {
		if len(f) == 2 && up(0) == "SAVEPOINT" {
			f = f[1:]
		}
		if len(f) != 1 {
			return "", "", false
		}
	} else {
		f = f[1:]
	}
	return op, strings.Trim(f[0], "\"`[]"), true
}

// txOf returns the plugin's transaction behind a statement's pool, or nil.
func txOf(pool gorm.ConnPool) *guardTx {
	switch t := pool.(type) {
	case *guardTx:
		return t
	case *gorm.PreparedStmtTX:
		return txOf(t.Tx)
	}
	return nil
}

// isTx reports whether pool is a transaction.
func isTx(pool gorm.ConnPool) bool {
	_, ok := pool.(gorm.TxCommitter)
	return ok
}
