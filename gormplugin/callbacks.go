package gormplugin

import (
	"context"
	"fmt"
	"log/slog"

	"gorm.io/gorm"
	"gorm.io/gorm/schema"

	"github.com/cacheguard/cacheguard/locks"
)

// guardKey holds a statement's *guard (gorm.DB.InstanceSet).
const guardKey = "gormplugin:guard"

type unguardedKey struct{}

// Unguarded returns a context under which Update and Delete statements are
// sent without row locks or fence, whatever the Unkeyed policy; invalidation
// after their commit still happens. Use it for a batch write known to be safe
// that matches too many rows to lock (MaxMatchedRows), or under
// Unkeyed(Refuse):
//
//	db.WithContext(gormplugin.Unguarded(ctx)).Where("created_at < ?", cutoff).Delete(&Event{})
func Unguarded(ctx context.Context) context.Context {
	return context.WithValue(ctx, unguardedKey{}, true)
}

func unguarded(ctx context.Context) bool {
	v, _ := ctx.Value(unguardedKey{}).(bool)
	return v
}

// guard is the plugin's state for one Update or Delete statement.
type guard struct {
	table     string
	pkCols    []string
	rows      []row         // the rows written, sorted by name (empty when unknown)
	fromModel bool          // rows are the statement's model (a struct or slice of them)
	resolved  bool          // rows were read from the database (LockMatched)
	tableLock bool          // LockMatched on a table without a primary key: "<table>:*" is locked
	locked    []row         // the locks taken (the rows, or none)
	fence     *schema.Field // the fence column, or nil
	fencing   bool          // the statement carries the fence condition
	version   uint64        // the fence the written struct carried (its version), or 0
	unstamp   func()        // puts back the struct's fence stamped by a write that then rolled back
	delete    bool
	tx        *txLocks // non-nil: the locks belong to the surrounding transaction
	own       *txLocks // the transaction GORM opened for this statement, if any
	keys      []string // cache keys to invalidate after COMMIT
}

func guardOf(db *gorm.DB) *guard {
	if db == nil || db.Statement == nil {
		return nil
	}
	v, _ := db.InstanceGet(guardKey)
	g, _ := v.(*guard)
	return g
}

// lockStep names the statement's rows (from its model or its WHERE, or else
// by reading the rows its WHERE matches), computes their cache keys and takes
// their locks: held to the end of the statement (and of the transaction GORM
// opens for it), or, inside a transaction, to its COMMIT or ROLLBACK.
func (p *Plugin) lockStep(isDelete bool) func(*gorm.DB) {
	return func(db *gorm.DB) {
		db.InstanceSet(guardKey, nil) // a reused statement must not see an earlier guard
		stmt := db.Statement
		if db.Error != nil || db.DryRun {
			return
		}
		table := stmt.Table
		if table == "" && stmt.Schema != nil {
			table = stmt.Schema.Table
		}
		if table == "" {
			return
		}
		g := &guard{table: table, delete: isDelete}
		if s := stmt.Schema; s != nil && len(s.PrimaryFields) > 0 {
			g.pkCols = s.PrimaryFieldDBNames
			g.fence = p.fenceOf(s)
			if g.rows = sortRows(modelRows(stmt, s, table, stmt.Model)); len(g.rows) > 0 {
				g.fromModel = true
			} else {
				g.rows = sortRows(whereRows(stmt, s, table))
			}
		}
		tx := txOf(stmt.ConnPool)
		if tx != nil {
			g.tx = tx.locks
		}

		lock := !unguarded(stmt.Context)
		if lock && len(g.rows) == 0 {
			if _, where := stmt.Clauses["WHERE"]; !where && !db.AllowGlobalUpdate {
				return // GORM refuses it with gorm.ErrMissingWhereClause
			}
			switch p.cfg.unkeyed {
			case Refuse:
				db.AddError(fmt.Errorf("%w: this %s on table %q does not name its rows by primary key (set the model's primary key, choose gormplugin.Unkeyed(LockMatched or PassThrough), or send it with a gormplugin.Unguarded context)", ErrUnkeyed, opName(isDelete), table))
				return
			case PassThrough:
				lock = false
			}
		}
		if tx == nil && isTx(stmt.ConnPool) && (lock || p.cfg.keys != nil) {
			db.AddError(fmt.Errorf("%w: %s on %q: use db.Transaction or gormplugin.Transaction on the database the plugin is registered on", ErrForeignTx, opName(isDelete), table))
			return
		}
		if lock && len(g.rows) == 0 {
			rows, err := p.resolve(db, g)
			if err != nil {
				db.AddError(err)
				return
			}
			g.rows, g.resolved = rows, true
		}
		g.keys = p.keysOf(g)
		db.InstanceSet(guardKey, g)
		if g.tx == nil {
			p.begin() // ended by releaseStep
		}
		if !lock {
			return
		}
		g.locked = g.rows
		if g.tableLock {
			g.locked = []row{{name: RowName(table, "*")}}
		}
		if len(g.locked) > 0 {
			var err error
			if tx != nil {
				err = tx.locks.lock(stmt.Context, g.locked)
			} else {
				// One owner for the statement's locks and for any write its
				// hooks make in the transaction GORM opens (which reads it
				// from the statement's context), so such a nested write
				// re-enters.
				if _, ok := locks.OwnerFrom(stmt.Context); !ok {
					stmt.Context = locks.WithOwner(stmt.Context, locks.NewOwnerID())
				}
				err = p.lockAll(stmt.Context, g.locked)
			}
			if err != nil {
				if p.cfg.failOpen && unavailable(err) {
					p.warn(stmt.Context, "unguarded", "gormplugin: writing without a lock (FailOpen): the lock service is unavailable",
						slog.String("table", table), slog.Any("cause", err))
					p.emit(stmt.Context, Event{Kind: WroteUnguarded, Table: table, Err: err})
					g.locked = nil
					return
				}
				db.AddError(err)
				return
			}
		}
		if g.resolved && !g.tableLock {
			g.restrict(stmt)
		}
	}
}

// keysOf lists the cache keys of the rows g writes; nil primary key when they
// are unknown.
func (p *Plugin) keysOf(g *guard) []string {
	if p.cfg.keys == nil {
		return nil
	}
	if len(g.rows) == 0 && (!g.resolved || g.tableLock) {
		return p.cfg.keys(g.table, nil)
	}
	var keys []string
	for _, r := range g.rows {
		keys = append(keys, p.cfg.keys(g.table, r.pk())...)
	}
	return keys
}

func opName(isDelete bool) string {
	if isDelete {
		return "Delete"
	}
	return "Update"
}

// fenceStep runs just before the statement is built and sent: a lock known
// lost by now refuses the write; otherwise a fenced model gets the fence
// condition (and, through the SET builder, the new fence).
func (p *Plugin) fenceStep(db *gorm.DB) {
	g := guardOf(db)
	if g == nil {
		return
	}
	if g.tx == nil {
		if tx := txOf(db.Statement.ConnPool); tx != nil {
			g.own = tx.locks // GORM's own transaction, begun after lockStep
		}
	}
	if db.Error != nil || len(g.locked) == 0 {
		return
	}
	for _, r := range g.locked {
		if r.lock == nil {
			continue
		}
		select {
		case <-r.lock.Lost():
			db.AddError(&StaleWriteError{Name: r.name, Fence: r.fence, Lost: true})
			return
		default:
		}
	}
	if g.fence != nil && len(g.rows) > 0 {
		if g.fromModel && len(g.rows) == 1 {
			g.version = g.modelFence(db.Statement)
		}
		g.addFenceCondition(db.Statement)
		g.fencing = true
	}
}

// checkStep tells a fenced-out write from a missing row.
func (p *Plugin) checkStep(db *gorm.DB) {
	if g := guardOf(db); g != nil && g.fencing && db.Error == nil && !db.DryRun {
		g.checkFence(db)
	}
}

// releaseStep runs last. Inside a transaction it hands the statement's cache
// keys to the transaction, which invalidates them after its COMMIT; otherwise
// the statement has committed (or not), so it invalidates and unlocks now.
// Committed means: GORM's own transaction for the statement ran COMMIT (one
// that failed may still have committed, so it counts), or, without one, the
// statement succeeded.
func (p *Plugin) releaseStep(db *gorm.DB) {
	g := guardOf(db)
	if g == nil {
		return
	}
	db.InstanceSet(guardKey, nil)
	ok := db.Error == nil
	if g.own != nil {
		ok = g.own.committed()
	}
	if g.tx != nil {
		if db.Error == nil {
			g.tx.addKeys(g.keys)
			g.tx.addUnstamp(g.unstamp)
		} else if g.unstamp != nil {
			g.unstamp()
		}
		return
	}
	defer p.end()
	if !ok && g.unstamp != nil {
		g.unstamp()
	}
	ctx := context.WithoutCancel(db.Statement.Context)
	if ok {
		p.invalidate(ctx, g.keys)
	}
	p.unlockAll(ctx, g.locked)
}
