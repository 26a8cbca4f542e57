package gormplugin

import (
	"context"
	"fmt"
	"runtime/debug"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"

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
// Before fn runs, the transaction claims each row (see the package
// documentation): an UPDATE that stamps the row's fence with its lock's token
// (SET pk = pk on a row without a fence column), so that it waits for a
// previous holder's uncommitted write to commit or roll back, and fn reads
// what was committed. A row whose fence is already above the token (a newer
// holder wrote it) fails the claim with a *StaleWriteError; a missing row is
// not claimed.
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

	claimed := func(tx *gorm.DB) error {
		if err := p.claim(tx, want); err != nil {
			return err
		}
		return fn(tx)
	}
	if outer := txOf(db.Statement.ConnPool); outer != nil {
		if err := outer.locks.lock(ctx, want); err != nil {
			return err
		}
		return db.WithContext(ctx).Transaction(claimed)
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
	return db.WithContext(context.WithValue(ctx, seedKey{}, r)).Transaction(claimed)
}

// declared is what a row declared to Transaction needs for its claim.
type declared struct {
	table  string
	pkCols []string
	strict []string // how pkCols compare byte for byte (strictKeys), or nil
	fence  string   // the fence column, or ""
}

// claim is a transaction's first statements, for each declared row in name
// order: an UPDATE that sets a column to itself, which takes the database's
// lock on the row before fn reads it (a previous holder paused after its
// UPDATE and before its COMMIT still holds that row lock, so the claim
// waits for its COMMIT or ROLLBACK, and fn then reads what it committed);
// on a fenced row, a read of its fence, now stable, and an UPDATE that
// stamps the row's lock token. A fence above the token means a newer holder
// has written the row: the claim fails with a *StaleWriteError. The fence
// read is the row's version before the transaction, which with the token is
// all a struct written in fn may carry (see txLocks.checkVersions): the stamp
// must not vouch for a struct read before another writer's commit. A row
// that does not exist is not claimed; the cache keys of every declared row
// are invalidated after COMMIT, since fn may write it (with GORM's methods,
// or with Exec, an INSERT included).
func (p *Plugin) claim(tx *gorm.DB, rows []row) error {
	reg := txOf(tx.Statement.ConnPool)
	for _, r := range rows {
		d := r.decl
		if d == nil {
			continue
		}
		if reg != nil && p.cfg.keys != nil {
			// The rows declared are the rows fn writes, also with Exec: an
			// INSERT of one that did not exist too.
			reg.locks.addKeys(p.cfg.keys(d.table, r.pk()))
		}
		where, key := keyEquals(d.pkCols, d.strict, r.vals)
		col := d.pkCols[0]
		if d.fence != "" {
			col = d.fence
		}
		// The database's row lock first: it waits for a previous holder's
		// COMMIT or ROLLBACK, after which the row's fence is stable.
		q := tx.Session(&gorm.Session{NewDB: true})
		res := q.Exec("UPDATE ? SET ? = ? WHERE"+where, append([]any{clause.Table{Name: d.table}, clause.Column{Name: col}, clause.Column{Name: col}}, key...)...)
		if res.Error != nil {
			return fmt.Errorf("gormplugin: claiming %q: %w", r.name, res.Error)
		}
		if d.fence == "" || res.RowsAffected == 0 {
			continue
		}
		stored, _, err := readFence(q, d.table, d.fence, d.pkCols, d.strict, r.vals)
		switch {
		case err != nil:
			return fmt.Errorf("gormplugin: reading the fence of %q: %w", r.name, err)
		case stored > r.fence:
			return &StaleWriteError{Name: r.name, Fence: r.fence, Stored: stored}
		}
		if reg != nil {
			reg.locks.setBase(r.name, stored)
		}
		res = q.Exec("UPDATE ? SET ? = ? WHERE"+where, append([]any{clause.Table{Name: d.table}, clause.Column{Name: d.fence}, int64(r.fence)}, key...)...)
		if res.Error != nil {
			return fmt.Errorf("gormplugin: claiming %q: %w", r.name, res.Error)
		}
	}
	return nil
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
		sets, pin := structKeys(stmt, stmt.Schema, m, true)
		if pin != pinRows {
			return nil, invalid("row %T: no primary key value set (on some element)", m)
		}
		rows, err := p.spelled(tx, stmt.Schema, stmt.Table, stmt.Table, namesFor(stmt.Table, sets))
		if err != nil {
			return nil, err
		}
		d := &declared{table: stmt.Table, pkCols: stmt.Schema.PrimaryFieldDBNames}
		d.strict = p.strictKeys(tx, stmt.Table, d.pkCols, rows)
		if f := p.fenceOf(stmt.Schema); f != nil {
			d.fence = f.DBName
		}
		for i := range rows {
			rows[i].decl = d
		}
		out = append(out, rows...)
	}
	return sortRows(out), nil
}
