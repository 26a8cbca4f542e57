package gormplugin

import (
	"context"
	"database/sql"
	"errors"
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
// ctx's cancellation reaches the transaction only while it is being begun
// (waiting for a connection): database/sql rolls a transaction back when the
// context it was begun with ends, and pgx runs COMMIT under that context, so
// a cancellation arriving while COMMIT was on the wire made Commit fail after
// the database had committed — a committed write reported as failed (and
// answered "nothing was written" by a handler whose lock was lost
// meanwhile). Statements still run under their own contexts, so a cancelled
// context fails the next statement and GORM rolls back; only a COMMIT
// already decided on is never interrupted.
func (g *guardPool) BeginTx(ctx context.Context, opts *sql.TxOptions) (gorm.ConnPool, error) {
	var inner gorm.Tx
	txCtx := newBeginCtx(ctx)
	defer txCtx.detach()
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
	r, ok := ctx.Value(seedKey{}).(*txLocks)
	if !ok || !r.adopt() {
		r = g.p.newTxLocks(ctx)
	}
	return &guardTx{Tx: inner, pool: g, locks: r}, nil
}

// beginCtx carries a context's values, and its cancellation until detach:
// the context a transaction is begun with.
type beginCtx struct {
	context.Context // the parent without its cancellation
	done            chan struct{}
	stop            func() bool

	mu       sync.Mutex
	err      error // the parent's, once done is closed
	detached bool
}

func newBeginCtx(parent context.Context) *beginCtx {
	c := &beginCtx{Context: context.WithoutCancel(parent), done: make(chan struct{})}
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

// detach stops passing the parent's cancellation on.
func (c *beginCtx) detach() {
	c.stop()
	c.mu.Lock()
	c.detached = true
	c.mu.Unlock()
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
}

// Commit commits, then invalidates and releases. A COMMIT that fails may
// still have committed (its reply lost), so it invalidates all the same.
func (t *guardTx) Commit() error {
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
	t.locks.finish(false)
	return err
}

// GetDBConn returns the *sql.DB underneath, for gorm.DB.DB.
func (t *guardTx) GetDBConn() (*sql.DB, error) { return t.pool.GetDBConn() }

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
