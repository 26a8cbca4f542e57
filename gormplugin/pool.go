package gormplugin

import (
	"context"
	"database/sql"
	"errors"

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
func (g *guardPool) BeginTx(ctx context.Context, opts *sql.TxOptions) (gorm.ConnPool, error) {
	var inner gorm.Tx
	switch b := g.ConnPool.(type) {
	case gorm.TxBeginner:
		tx, err := b.BeginTx(ctx, opts)
		if err != nil {
			return nil, err
		}
		inner = tx
	case gorm.ConnPoolBeginner:
		cp, err := b.BeginTx(ctx, opts)
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
