package gormplugin

import (
	"context"
	"runtime/debug"

	"gorm.io/gorm"

	"github.com/cacheguard/cacheguard/locks"
)

// Transaction runs fn in a database transaction that holds the locks of rows
// (models with their primary key set, or slices of them) from before BEGIN
// until after COMMIT or ROLLBACK, taken in name order so that two
// transactions never deadlock on each other. Use it for read-modify-write:
// the plugin's write guard covers the write statement only, so a value read
// before the write is only certain to be current when the lock spans the
// read too. Writes in fn re-enter the locks (same owner) and add the locks
// of other rows they touch; see ErrLockOrder.
//
// ctx carries the lock owner: when it has one (locks.WithOwner, as ginmw
// sets on a request) the transaction re-enters the request's locks; else a
// new owner is set for the transaction. After COMMIT the rows' cache keys
// are invalidated (Invalidate), never after ROLLBACK. fn returning an error
// or panicking rolls back; a panic is returned as a *PanicError. Called with
// a db that is already a transaction, it takes the rows' locks into that
// transaction and runs fn in a nested one (a SAVEPOINT).
func Transaction(ctx context.Context, db *gorm.DB, fn func(tx *gorm.DB) error, rows ...any) (err error) {
	switch {
	case ctx == nil:
		return invalid("nil context")
	case db == nil || db.Config == nil || db.Statement == nil:
		return invalid("nil database")
	case fn == nil:
		return invalid("nil transaction function")
	}
	p, ok := db.Plugins[pluginName].(*Plugin)
	if !ok {
		return invalid("the plugin is not registered on this database: db.Use(gormplugin.New(l))")
	}
	want, err := p.modelRows(db, rows)
	if err != nil {
		return err
	}
	if _, ok := locks.OwnerFrom(ctx); !ok {
		ctx = locks.WithOwner(ctx, locks.NewOwnerID())
	}
	defer func() {
		if v := recover(); v != nil {
			err = &PanicError{Value: v, Stack: debug.Stack()}
		}
	}()

	if outer := txOf(db.Statement.ConnPool); outer != nil {
		if err := outer.locks.lock(ctx, want); err != nil {
			return err
		}
		return db.WithContext(ctx).Transaction(fn)
	}
	if isTx(db.Statement.ConnPool) {
		return invalid("db is a transaction the plugin did not begin")
	}
	r := p.newTxLocks(ctx)
	// Normally the transaction's COMMIT or ROLLBACK finishes r; this covers
	// BEGIN failing.
	defer r.finish(false)
	if err := r.lock(ctx, want); err != nil {
		return err
	}
	return db.WithContext(context.WithValue(ctx, seedKey{}, r)).Transaction(fn)
}

// modelRows names the rows of the given models, sorted.
func (p *Plugin) modelRows(db *gorm.DB, models []any) ([]row, error) {
	var out []row
	for _, m := range models {
		tx := db.Session(&gorm.Session{NewDB: true}).Model(m)
		stmt := tx.Statement
		if err := stmt.Parse(m); err != nil {
			return nil, invalid("row %T: %v", m, err)
		}
		if len(stmt.Schema.PrimaryFields) == 0 {
			return nil, invalid("row %T: the model has no primary key", m)
		}
		rows := modelRows(stmt, stmt.Schema, stmt.Table, m)
		if len(rows) == 0 {
			return nil, invalid("row %T: no primary key value set", m)
		}
		out = append(out, rows...)
	}
	return sortRows(out), nil
}
