package gormplugin

import (
	"context"
	"fmt"
	"log/slog"
	"reflect"
	"slices"
	"strings"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"
	"gorm.io/gorm/schema"

	"github.com/cacheguard/cacheguard/locks"
)

// guardKey holds a statement's *guard (gorm.DB.InstanceSet).
const guardKey = "gormplugin:guard"

type unguardedKey struct{}

// Unguarded returns a context under which writes (updates, deletes, upserts)
// are sent without row locks or fence, whatever the Unkeyed policy;
// invalidation after their commit still happens. Use it for a batch write known to be safe
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

// guard is the plugin's state for one guarded statement: the one place
// that decides, for every way GORM writes a row (see writeKind), which rows
// the statement may change, whose locks it takes, how it is fenced and
// which cache keys are invalidated after its COMMIT.
type guard struct {
	table       string
	kind        writeKind
	pkCols      []string
	strict      []string        // how pkCols compare byte for byte where the database does not (strictKeys), or nil
	rows        []row           // the existing rows written, sorted by name (empty when unknown)
	fromModel   bool            // rows are named by the statement's model or values (rowsOf)
	from        string          // what a read of the table's rows selects FROM (the table, or "table AS alias")
	ref         string          // the name the statement's SQL knows the table by (see column)
	real        string          // the table as the catalogue knows it (see exactKeys)
	resolved    bool            // rows were read from the database (LockMatched)
	restricted  bool            // the statement is restricted to the rows locked
	tableLock   bool            // LockMatched on a table without a primary key: "<table>:*" is locked
	locked      []row           // the locks taken (the rows, or none)
	fence       *schema.Field   // the fence column, or nil
	fencing     bool            // the statement carries the fence condition
	unstamp     func()          // puts back the structs' fences stamped by a write that then rolled back
	tx          *txLocks        // non-nil: the locks belong to the surrounding transaction
	own         *txLocks        // the transaction GORM opened for this statement, if any
	keys        []string        // cache keys to invalidate after COMMIT
	locking     bool            // the statement's rows are locked (not PassThrough, Unguarded or FailOpen)
	moved       []row           // the rows an assignment of the primary key moves, at their new names
	moveUnnamed bool            // a row moves to a key moveRows cannot name
	sig         string          // what the rows were named from before GORM's before-hooks ran (see renameAfterHooks)
	conflict    []*schema.Field // an upsert on another key: its conflict target's fields (resolveConflict)
}

func guardOf(db *gorm.DB) *guard {
	if db == nil || db.Statement == nil {
		return nil
	}
	v, _ := db.InstanceGet(guardKey)
	g, _ := v.(*guard)
	return g
}

// lockStep names the statement's rows (rowsOf, or else by reading the rows
// its WHERE, or an upsert's conflict target, matches), restricts it to them,
// computes their cache keys and takes their locks: held to the end of the
// statement (and of the transaction GORM opens for it), or, inside a
// transaction, to its COMMIT or ROLLBACK. An insert of new rows takes no
// lock (no existing row can change); its rows' keys are invalidated after
// COMMIT all the same.
func (p *Plugin) lockStep(processor writeKind) func(*gorm.DB) {
	return func(db *gorm.DB) {
		kind := processor
		db.InstanceSet(guardKey, nil) // a reused statement must not see an earlier guard
		stmt := db.Statement
		if db.Error != nil || db.DryRun {
			return
		}
		t := tableOf(stmt)
		table := t.table
		if table == "" {
			if kind != writeInsert && !unguarded(stmt.Context) && p.cfg.unkeyed != PassThrough {
				// Default deny: a write whose table cannot be named cannot name its rows.
				db.AddError(fmt.Errorf("%w: this %s names no table the plugin can read (use Model or Table(\"name\"))", ErrUnnamedRows, processor))
			}
			return
		}
		if kind == writeInsert {
			if kind = createKind(stmt); kind == writeInsert && p.cfg.keys == nil {
				return // new rows only, and nothing to invalidate
			}
		}
		g := &guard{table: table, from: t.from, ref: t.ref, real: t.real, kind: kind}
		if s := stmt.Schema; s != nil && len(s.PrimaryFields) > 0 {
			g.pkCols = s.PrimaryFieldDBNames
			g.fence = p.fenceOf(s)
		}
		named, lock := true, !unguarded(stmt.Context) && kind != writeInsert
		if kind != writeInsert {
			var err error
			if g.rows, named, err = rowsOf(stmt, kind, t); err != nil && lock && p.cfg.unkeyed != PassThrough {
				db.AddError(err)
				return
			}
			g.rows, g.fromModel = sortRows(g.rows), named
			g.sig = namesOf(g.rows)
		}
		tx := txOf(stmt.ConnPool)
		if tx != nil {
			g.tx = tx.locks
		}

		if lock && !named {
			if _, where := stmt.Clauses["WHERE"]; kind != writeUpsert && !where && !db.AllowGlobalUpdate {
				return // GORM refuses it with gorm.ErrMissingWhereClause
			}
			switch p.cfg.unkeyed {
			case Refuse:
				db.AddError(fmt.Errorf("%w: this %s on table %q does not name its rows by its model's primary key (set the model's primary key, choose gormplugin.Unkeyed(LockMatched or PassThrough), or send it with a gormplugin.Unguarded context)", ErrUnkeyed, kind, table))
				return
			case PassThrough:
				lock = false
			}
		}
		if tx == nil && isTx(stmt.ConnPool) && (lock || p.cfg.keys != nil) {
			db.AddError(fmt.Errorf("%w: %s on %q: use db.Transaction or gormplugin.Transaction on the database the plugin is registered on", ErrForeignTx, kind, table))
			return
		}
		if named && (lock || p.cfg.keys != nil) {
			var err error
			if g.rows, err = p.spelled(db, stmt.Schema, table, t.real, g.rows); err != nil {
				db.AddError(err)
				return
			}
		}
		if lock && !named {
			var rows []row
			var err error
			if kind == writeUpsert {
				rows, err = p.resolveConflict(db, g)
			} else {
				rows, err = p.resolve(db, g)
			}
			if err != nil {
				db.AddError(err)
				return
			}
			g.rows, g.resolved = rows, true
		}
		if lock {
			// Read before GORM's transaction begins (the catalogue is read
			// once per table), for the restriction and the fence reads.
			g.strict = p.strictKeys(db, t.real, g.pkCols, g.rows)
		}
		upsertWhere := slices.Contains(upsertDialects, db.Dialector.Name())
		if kind == writeUpsert && lock && (g.resolved || g.fence != nil && len(g.rows) > 0) && !upsertWhere {
			db.AddError(invalid("an upsert on %q needs ON CONFLICT DO UPDATE ... WHERE to be fenced or restricted to the rows locked, which the %s dialect does not have", table, db.Dialector.Name()))
			return
		}
		if kind != writeInsert && kind != writeUpsert {
			g.keys = p.keysOf(g) // an insert's rows are named once it has run (checkStep)
		}
		db.InstanceSet(guardKey, g)
		if g.tx == nil {
			p.begin() // ended by releaseStep
		}
		if !lock {
			return
		}
		g.locked, g.locking = g.rows, true
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
					p.emit(stmt.Context, Event{Kind: EventWroteUnguarded, Table: table, Err: err})
					g.locked, g.locking = nil, false
					g.resolved = false
					return
				}
				db.AddError(err)
				return
			}
		}
		// The database itself never changes a row the statement did not
		// lock: its WHERE (an upsert's DO UPDATE) is restricted to them
		// (fenceStep adds it, once the hooks have run).
		g.restricted = !g.tableLock && (g.resolved || len(g.rows) > 0) && (kind != writeUpsert || upsertWhere)
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
		if r.given != nil { // a cache may hold the row under the key as callers spell it
			keys = append(keys, p.cfg.keys(g.table, row{vals: r.given}.pk())...)
		}
	}
	return keys
}

// fenceStep runs just before the statement is built and sent, after GORM's
// before-hooks: the rows are named again if a hook changed what named them
// (renameAfterHooks), the statement is restricted to the rows locked, a lock
// known lost by now refuses the write; otherwise a fenced write gets the fence
// condition (through the SET builder for an UPDATE, the ON CONFLICT builder
// for an upsert, also the new fence) and the version of the struct it
// writes.
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
	if db.Error != nil {
		return
	}
	if err := p.renameAfterHooks(db, g); err != nil {
		db.AddError(err)
		return
	}
	if g.restricted && g.kind != writeUpsert {
		groupWhere(db.Statement)
		db.Statement.AddClause(clause.Where{Exprs: g.restriction()})
	}
	if len(g.locked) == 0 {
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
	if g.fence == nil || len(g.rows) == 0 || g.tableLock {
		return
	}
	stmt := db.Statement
	switch g.kind {
	case writeUpsert:
		if g.fromModel {
			g.versionElements(stmt)
		}
	default:
		if g.fromModel && len(g.rows) == 1 {
			if v, ok := g.fenceOfModel(stmt); ok {
				// A zero fence is a version too when the struct is written
				// back whole (Save(&s), Updates(&s) on Model(&s)): it is
				// the fence of a row no guarded write had touched when it
				// was read. Built structs written by column carry none.
				g.rows[0].version = v
				g.rows[0].versioned = v != 0 || g.kind == writeUpdate && samePointer(stmt.Dest, stmt.Model)
			}
		}
		stmt.AddClause(clause.Where{Exprs: g.fenceConds()})
	}
	if g.tx != nil {
		if err := g.tx.checkVersions(g.rows); err != nil {
			db.AddError(err)
			return
		}
	}
	g.fencing = true
}

// versionElements records the version of each named row an upsert writes
// (the fence its value carries: for UpdateAll, as for Save, zero included;
// for DoUpdates, which may assign other values than the struct's, only a
// fence that is set) and stamps each value with its row's token, so that an
// inserted row carries it too. A rollback puts the fences back.
func (g *guard) versionElements(stmt *gorm.Statement) {
	oc, _ := onConflictOf(stmt)
	byName := map[string]int{}
	for i, r := range g.rows {
		byName[r.name] = i
		if r.given != nil {
			byName[RowName(g.table, r.given...)] = i
		}
	}
	for _, e := range elements(stmt) {
		if !e.rv.IsValid() {
			continue
		}
		vals, ok := e.key(stmt, stmt.Schema)
		if !ok {
			continue
		}
		i, ok := byName[RowName(g.table, vals...)]
		if !ok {
			continue
		}
		v := fenceValue(stmt.Context, g.fence, e.rv)
		r := &g.rows[i]
		r.version, r.versioned = v, v != 0 || oc.UpdateAll
		g.stamp(stmt.Context, e.rv, r.fence)
	}
}

// samePointer reports whether a and b are the same pointer.
func samePointer(a, b any) bool {
	va, vb := reflect.ValueOf(a), reflect.ValueOf(b)
	return va.Kind() == reflect.Pointer && vb.Kind() == reflect.Pointer && va.Pointer() == vb.Pointer() && va.Type() == vb.Type()
}

// checkStep runs after the statement: it tells a fenced-out write from a
// missing row, and names the rows an insert or upsert wrote for their
// invalidation.
func (p *Plugin) checkStep(db *gorm.DB) {
	g := guardOf(db)
	if g == nil || db.Error != nil || db.DryRun {
		return
	}
	want := len(g.rows)
	if g.kind == writeUpsert {
		want = len(elements(db.Statement))
	}
	if g.fencing {
		g.checkFence(db, want)
	}
	if db.Error != nil {
		return
	}
	if g.kind == writeInsert || g.kind == writeUpsert {
		p.nameWritten(db, g)
	}
	if p.cfg.keys != nil && (g.kind == writeUpdate || g.kind == writeUpsert) {
		g.keys = append(g.keys, p.rekeyed(g)...)
	}
}

// rekeyed lists the cache keys of the new key of each row an update or
// upsert moved (SET id = ...): the row now answers there, where a "not found" may be
// cached. A new key moveRows could not name is unknown rows.
func (p *Plugin) rekeyed(g *guard) []string {
	if g.moveUnnamed {
		return p.cfg.keys(g.table, nil)
	}
	var keys []string
	for _, r := range g.moved {
		keys = append(keys, p.cfg.keys(g.table, r.pk())...)
	}
	return keys
}

// nameWritten lists the cache keys of the rows an insert or upsert wrote:
// those it locked and those it inserted, whose keys the database may have
// just generated.
func (p *Plugin) nameWritten(db *gorm.DB, g *guard) {
	if p.cfg.keys == nil {
		return
	}
	written := createdRows(db.Statement, g.table)
	if len(written) == 0 && len(g.rows) == 0 {
		g.keys = p.cfg.keys(g.table, nil) // not named: the key function's "unknown rows"
		return
	}
	seen := map[string]bool{}
	for _, r := range append(slices.Clone(g.rows), written...) {
		if !seen[r.name] {
			seen[r.name] = true
			g.keys = append(g.keys, p.cfg.keys(g.table, r.pk())...)
		}
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
			if g.fencing {
				g.tx.wrote(g.rows)
			}
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

// sameKind reports whether values of type a are written like those of key
// type b in a lock name and a cache key: both integers, or both strings, or
// the same type.
func sameKind(a, b reflect.Type) bool {
	for b.Kind() == reflect.Pointer {
		b = b.Elem()
	}
	integer := func(t reflect.Type) bool { return t.Kind() >= reflect.Int && t.Kind() <= reflect.Uint64 }
	return a == b || integer(a) && integer(b) || a.Kind() == reflect.String && b.Kind() == reflect.String
}

// guardMoves is the one place an assignment of a primary key column passes
// through (an UPDATE's SET, an upsert's DO UPDATE), when the statement is
// built and its values are final: a row moved to a new key is written under
// two names, so a guarded statement locks the new one too (after those it
// holds, so a busy name that sorts before them fails with ErrLockOrder rather
// than wait), and is refused with ErrUnnamedRows when a new key cannot be
// named.
func (p *Plugin) guardMoves(stmt *gorm.Statement, g *guard, set clause.Set, target []clause.Column) error {
	moved, named := g.moveRows(stmt, set, target)
	g.moved, g.moveUnnamed = moved, !named
	if !g.locking {
		return nil
	}
	if !named {
		return fmt.Errorf("%w: this %s on table %q sets its primary key to a value the plugin cannot name (an expression, a column, or a value of another kind than the key's): set it to a plain value, or send it with a gormplugin.Unguarded context", ErrUnnamedRows, g.kind, g.table)
	}
	return p.lockMore(stmt, g, moved)
}

// moveRows names, at their new keys, the rows set moves by assigning
// primary key columns: each row g writes with those parts replaced. named is
// false when a new part is not a plain value of the key's kind ("07" for an
// integer key would be matched as 7) or the rows are not known. In an
// upsert's DO UPDATE (target: its conflict columns), c = excluded.c for a
// key column c of the target moves nothing (the row conflicted on that
// value; GORM's association and join-table upserts write these), unless the
// row stores the key in another spelling, which it then takes.
func (g *guard) moveRows(stmt *gorm.Statement, set clause.Set, target []clause.Column) (moved []row, named bool) {
	parts := map[int]any{}
	respell := map[int]bool{} // c = excluded.c: the row takes the value's spelling of its key
	for _, a := range set {
		i := slices.IndexFunc(g.pkCols, func(c string) bool { return sameColumn(a.Column, c) })
		if i < 0 {
			continue
		}
		if v, ok := a.Value.(clause.Column); ok && strings.EqualFold(v.Table, "excluded") && sameColumn(v, g.pkCols[i]) &&
			slices.ContainsFunc(target, func(c clause.Column) bool { return sameColumn(c, g.pkCols[i]) }) {
			respell[i] = true
			continue
		}
		kind := g.keyType(stmt, i)
		if !literal(a.Value) || kind == nil || !sameKind(reflect.TypeOf(a.Value), kind) {
			return nil, false
		}
		parts[i] = a.Value
	}
	// A key stored in another spelling than the value's (see spelled) is
	// rewritten to the value's by c = excluded.c: the row moves to it.
	respelled := len(respell) > 0 && slices.ContainsFunc(g.rows, func(r row) bool { return r.given != nil })
	if len(parts) == 0 && !respelled {
		return nil, true
	}
	if len(g.rows) == 0 && !g.resolved {
		return nil, false
	}
	for _, r := range g.rows {
		vals := slices.Clone(r.vals)
		for i := range respell {
			if r.given != nil {
				vals[i] = r.given[i]
			}
		}
		for i, v := range parts {
			vals[i] = v
		}
		moved = append(moved, row{name: RowName(g.table, vals...), vals: vals})
	}
	return sortRows(moved), true
}

// keyType is the type of part i of g's primary key: the model's field, or,
// for a write without a model, the type its rows were read with.
func (g *guard) keyType(stmt *gorm.Statement, i int) reflect.Type {
	if s := stmt.Schema; s != nil && i < len(s.PrimaryFields) {
		return s.PrimaryFields[i].FieldType
	}
	if len(g.rows) > 0 && g.rows[0].vals[i] != nil {
		return reflect.TypeOf(g.rows[0].vals[i])
	}
	return nil
}

// sameColumn reports whether c names column name: as written, qualified or
// quoted, in any case (unquoted identifiers are matched without case).
func sameColumn(c clause.Column, name string) bool {
	return strings.EqualFold(bareName(c.Name), name)
}

// renameAfterHooks names the statement's rows again once GORM's
// before-hooks (BeforeSave, BeforeCreate, BeforeUpdate, BeforeDelete) have
// run, when what named them has changed: a hook may set or change the key
// GORM then writes into the WHERE, or an upsert's values (a key derived from
// a title, a key normalized to lower case). lockStep names them before the
// hooks, so that the locks are taken before GORM's transaction begins; this
// is the one place a change by a hook passes through. The rows named now
// are locked after those the statement holds (lockMore), and the statement
// is restricted to them. A hook that leaves a model's key unnamed is
// refused with ErrUnnamedRows.
func (p *Plugin) renameAfterHooks(db *gorm.DB, g *guard) error {
	stmt := db.Statement
	var rows []row
	switch {
	case g.fromModel:
		named, ok, err := rowsOf(stmt, g.kind, tableName{table: g.table, from: g.from, ref: g.ref, real: g.real})
		if err == nil && !ok {
			err = fmt.Errorf("%w: a hook of this %s on table %q cleared the key by which the plugin named its rows before the hooks ran: keep the key in the hook, or send it with a gormplugin.Unguarded context", ErrUnnamedRows, g.kind, g.table)
		}
		if err != nil {
			if !g.locking {
				g.rows, g.fromModel = nil, false
				g.keys = p.keysOf(g)
				return nil
			}
			return err
		}
		if named = sortRows(named); namesOf(named) == g.sig {
			return nil
		}
		if rows, err = p.spelled(db, stmt.Schema, g.table, g.real, named); err != nil {
			return err
		}
	case g.conflict != nil && g.locking:
		if conflictSig(stmt, g.conflict) == g.sig {
			return nil
		}
		var err error
		if rows, err = p.resolveConflict(db, g); err != nil {
			return err
		}
	default:
		return nil
	}
	upsertWhere := slices.Contains(upsertDialects, db.Dialector.Name())
	if g.kind == writeUpsert && g.locking && g.fence != nil && len(rows) > 0 && !upsertWhere {
		return invalid("an upsert on %q needs ON CONFLICT DO UPDATE ... WHERE to be fenced or restricted to the rows locked, which the %s dialect does not have", g.table, db.Dialector.Name())
	}
	if g.locking {
		if err := p.lockMore(stmt, g, rows); err != nil {
			return err
		}
		g.restricted = !g.tableLock && (g.resolved || len(rows) > 0) && (g.kind != writeUpsert || upsertWhere)
		g.strict = p.strictKeys(db, g.real, g.pkCols, rows)
	}
	g.rows = rows
	if g.kind != writeInsert && g.kind != writeUpsert {
		g.keys = p.keysOf(g)
	}
	return nil
}

// lockMore gives each of rows its lock and token, taking those the
// statement does not hold yet: after those it holds, in name order, so a
// busy name that sorts before them fails with ErrLockOrder rather than wait
// (the rule of takeAfter). It serves the names known only once the
// statement is under way: a key set by a hook, the new key of a row moved.
func (p *Plugin) lockMore(stmt *gorm.Statement, g *guard, rows []row) error {
	var fresh []row
	for i := range rows {
		if j := slices.IndexFunc(g.locked, func(l row) bool { return l.name == rows[i].name }); j >= 0 {
			rows[i].lock, rows[i].fence = g.locked[j].lock, g.locked[j].fence
		} else {
			fresh = append(fresh, rows[i])
		}
	}
	if len(fresh) == 0 {
		return nil
	}
	var err error
	if g.tx != nil {
		err = g.tx.lock(stmt.Context, fresh)
	} else {
		if _, ok := locks.OwnerFrom(stmt.Context); !ok {
			stmt.Context = locks.WithOwner(stmt.Context, locks.NewOwnerID())
		}
		last := ""
		for _, l := range g.locked {
			last = max(last, l.name)
		}
		err = p.lockAfter(stmt.Context, fresh, last)
	}
	if err != nil {
		return err
	}
	for i := range rows {
		if j := slices.IndexFunc(fresh, func(f row) bool { return f.name == rows[i].name }); j >= 0 {
			rows[i].lock, rows[i].fence = fresh[j].lock, fresh[j].fence
		}
	}
	g.locked = append(g.locked, fresh...)
	return nil
}

// namesOf is the lock names of rows, in their order.
func namesOf(rows []row) string {
	var b strings.Builder
	for _, r := range rows {
		b.WriteString(r.name)
		b.WriteByte(0)
	}
	return b.String()
}
