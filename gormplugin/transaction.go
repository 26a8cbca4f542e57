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
	fence  string // the fence column, or ""
}

// claim is a transaction's first statements: one UPDATE per declared row,
// in name order, that takes the database's lock on the row before fn reads
// it. On a fenced row it stamps the row's lock token:
//
//	UPDATE t SET fence = <token> WHERE pk = ? AND COALESCE(fence, 0) <= <token>
//
// (on another, SET pk = pk). A previous holder paused after its UPDATE and
// before its COMMIT still holds that row lock, so the claim waits for its
// COMMIT or ROLLBACK, and fn then reads what it committed; a fence above the
// token means a newer holder has written the row, and the claim fails with a
// *StaleWriteError. A row that does not exist is not claimed. A claimed row
// is one fn writes (with GORM's methods, or with Exec), and a fenced claim
// changes the row's fence, so the row's cache keys are invalidated after
// COMMIT like those of a write.
func (p *Plugin) claim(tx *gorm.DB, rows []row) error {
	reg := txOf(tx.Statement.ConnPool)
	for _, r := range rows {
		d := r.decl
		if d == nil {
			continue
		}
		set := []any{clause.Table{Name: d.table}}
		sql := "UPDATE ? SET ? = "
		if d.fence != "" {
			sql += "?"
			set = append(set, clause.Column{Name: d.fence}, int64(r.fence))
		} else {
			sql += "?"
			set = append(set, clause.Column{Name: d.pkCols[0]}, clause.Column{Name: d.pkCols[0]})
		}
		sql += " WHERE"
		for i, col := range d.pkCols {
			if i > 0 {
				sql += " AND"
			}
			sql += " ? = ?"
			set = append(set, clause.Column{Name: col}, r.vals[i])
		}
		if d.fence != "" {
			sql += " AND COALESCE(?, 0) <= ?"
			set = append(set, clause.Column{Name: d.fence}, int64(r.fence))
		}
		res := tx.Session(&gorm.Session{NewDB: true}).Exec(sql, set...)
		if res.Error != nil {
			return fmt.Errorf("gormplugin: claiming %q: %w", r.name, res.Error)
		}
		if d.fence == "" {
			if reg != nil && p.cfg.keys != nil && res.RowsAffected > 0 {
				// The rows declared are the rows fn writes, also with Exec.
				reg.locks.addKeys(p.cfg.keys(d.table, r.pk()))
			}
			continue
		}
		if res.RowsAffected == 0 {
			stored, found, err := readFence(tx.Session(&gorm.Session{NewDB: true}), d.table, d.fence, d.pkCols, r.vals)
			switch {
			case err != nil:
				return fmt.Errorf("gormplugin: reading the fence of %q: %w", r.name, err)
			case found && stored > r.fence:
				return &StaleWriteError{Name: r.name, Fence: r.fence, Stored: stored}
			}
			continue
		}
		if reg != nil && p.cfg.keys != nil {
			reg.locks.addKeys(p.cfg.keys(d.table, r.pk()))
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
		rows := modelRows(stmt, stmt.Schema, stmt.Table, m)
		if len(rows) == 0 {
			return nil, invalid("row %T: no primary key value set", m)
		}
		d := &declared{table: stmt.Table, pkCols: stmt.Schema.PrimaryFieldDBNames}
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
